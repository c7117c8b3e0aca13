"""A cell's network as the plan costs see it: a decoder's shape at the dataset's sequence
length, read from its config without building it."""

from __future__ import annotations

from harness.config.schema import ConfigError, DistbenchConfig
from harness.costs.transformer import TransformerShape


def shape_of(config: DistbenchConfig) -> TransformerShape:
    """The decoder `config` trains, at `dataset.seq_len` (null: the network's context, e.g.
    8192 for Llama 3); refused in one line for a network that is not one (an image network,
    BERT)."""
    from workloads.networks.lm import decoder_shape
    from workloads.networks.ref import NetworkError

    ref = config.network.ref
    try:
        return TransformerShape(**decoder_shape(ref, config.dataset.spec, config.dataset.seq_len))
    except NetworkError as err:
        raise ConfigError(str(err)) from None
