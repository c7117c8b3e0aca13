"""A cell's network as the plan costs see it: a decoder's shape at the dataset's sequence
length, read from its config without building it.

Reading a transformers config imports transformers, and with it torch and torchvision (4-5 s
of a planning command that otherwise computes for a tenth of a second). The planner therefore
remembers the shape, and that the network takes the dataset's input, as
`workloads.networks.remembered` keeps a network's facts: asked again about the same network
(another cluster, batch or plan), it loads none of them."""

from __future__ import annotations

import contextlib
from typing import Any

from harness.config.schema import ConfigError, DistbenchConfig
from harness.costs.transformer import TransformerShape

_REMEMBERED = "decoder-shapes"


def shape_of(config: DistbenchConfig) -> TransformerShape:
    """The decoder `config` trains, at `dataset.seq_len` (null: the network's context, e.g.
    8192 for Llama 3); refused in one line for a network that is not one (an image network,
    BERT)."""
    from workloads.networks.ref import NetworkError

    try:
        sizes = _decoder_sizes(config)
    except NetworkError as err:
        raise ConfigError(str(err)) from None
    return TransformerShape(**(sizes | {"seq_len": config.dataset.seq_len or sizes["seq_len"]}))


def remember_network(config: DistbenchConfig) -> None:
    """Keep the facts a later planning of `config`'s network reads instead of building it:
    that it takes the dataset's input (checked when `config` was validated) and its shape."""
    from workloads.networks.check import check_network_remembered

    dataset = config.dataset
    if config.network.source_spec.input_check is None:
        check_network_remembered(config.network.ref, dataset.spec, dataset.cache_dir, keep=True)
    _decoder_sizes(config, keep=True)


def _decoder_sizes(config: DistbenchConfig, *, keep: bool = False) -> dict[str, Any]:
    """`workloads.networks.lm.decoder_shape` at the network's own context, remembered."""
    from workloads.networks.remembered import entry_path, keep_entry, read_entry

    ref, spec = config.network.ref, config.dataset.spec
    entry = entry_path(_REMEMBERED, ref, spec, config.dataset.cache_dir)
    kept = (read_entry(entry) or {}).get("sizes")
    if isinstance(kept, dict):
        with contextlib.suppress(TypeError):  # a damaged entry: the shape is read again
            TransformerShape(**kept)
            return kept
    from workloads.networks.lm import decoder_shape

    sizes = decoder_shape(ref, spec, None)
    if keep:
        keep_entry(entry, {"sizes": sizes, "network": ref.key, "dataset": spec.name})
    return sizes
