"""A network built on PyTorch's meta device to check a config: once, and without a word.

Checking a cell builds its network on the meta device, where nothing is allocated: once to
run it on the dataset's input and count its parameters (`workloads.networks.check`), and for
a pipeline or sharded cell once more to count its layer list (`workloads.networks.layers.
layer_count`). Two promises of bad input depend on how that is done:

- a network's factory runs once per check: a user's factory (`network=module`) is the user's
  code, which may print, write or wait, and its failure is the refusal (`workloads.networks.
  zoo`); so the model built for the input check is the one whose layers are counted
  (`meta_network`, a few models kept per process: on the meta device a model is only its
  modules' Python objects);
- the refusal is one line: the libraries that build networks speak while they do
  (torchvision's `FutureWarning` for GoogLeNet's and Inception's weight initialisation,
  transformers' logger for a BERT built as a decoder), which would add lines to it. What they
  say while a network is checked is kept aside (`library_chatter_kept_aside`): Python's
  warnings are recorded instead of shown, and loggers pass only CRITICAL records. A worker
  that builds the network for real builds it as written, and its log shows what they say.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import warnings
from collections.abc import Iterator

import torch
from torch import nn

from workloads.datasets.spec import DatasetSpec
from workloads.networks.ref import NetworkRef
from workloads.networks.registry import source_of

# Models kept built on the meta device: those of the cells one check is working through.
_KEPT_MODELS = 4


@contextlib.contextmanager
def library_chatter_kept_aside() -> Iterator[list[warnings.WarningMessage]]:
    """While the block runs, Python's warnings are recorded into the list it yields (none is
    shown, none turns into an error under `-W error`), and no logger passes a record below
    CRITICAL; both are put back afterwards. Every logger, not the libraries' by name: a
    library configures its logger as it is first imported, which is often inside the block
    (transformers sets its level then, over one set before)."""
    previous = logging.root.manager.disable
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        logging.disable(logging.ERROR)
        try:
            yield caught
        finally:
            logging.disable(previous)


@functools.lru_cache(maxsize=_KEPT_MODELS)
def meta_network(ref: NetworkRef, dataset: DatasetSpec) -> nn.Module:
    """`ref` built for `dataset` on the meta device, what its builders say kept aside; built
    once per process for the checks that need it (the module's docstring). A build that
    fails raises (NetworkError) and is not kept: a check that fails stops the config there."""
    with torch.device("meta"), library_chatter_kept_aside():
        return source_of(ref).build(ref, dataset)  # `layers.build_network`, which counts on it
