"""A network built on the meta device to check a config (`workloads.networks.meta`): what the
libraries that build it say meanwhile stays out of the check's one line, and is said as usual
where a worker builds the network for real."""

from __future__ import annotations

import logging
import warnings

import pytest

from workloads.datasets.spec import DATASET_SPECS
from workloads.networks import build_network, layer_count
from workloads.networks.check import check_network
from workloads.networks.meta import library_chatter_kept_aside
from workloads.networks.ref import NetworkRef, canonical_json

CIFAR = DATASET_SPECS["cifar10"]
TOKENS = DATASET_SPECS["tokens"]
# torchvision warns (FutureWarning) that GoogLeNet's weight initialisation will change.
GOOGLENET = NetworkRef(name="googlenet", source="torchvision", arch="googlenet")
# transformers' logger warns that BertForMaskedLM wants `is_decoder=False`.
BERT_AS_A_DECODER = NetworkRef(
    name="bert",
    source="hf",
    arch="bert",
    options_json=canonical_json(
        {
            "hidden_size": 32,
            "num_hidden_layers": 2,
            "num_attention_heads": 2,
            "intermediate_size": 64,
            "is_decoder": True,
        }
    ),
)


class _Kept(logging.Handler):
    """Every record that reaches the logger it is added to."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


@pytest.fixture
def transformers_said() -> list[logging.LogRecord]:
    """What reaches transformers' own logger (whose handler writes to stderr)."""
    kept = _Kept()
    logger = logging.getLogger("transformers")
    logger.addHandler(kept)
    yield kept.records
    logger.removeHandler(kept)


def test_what_the_libraries_say_while_a_network_is_checked_is_kept_aside(
    transformers_said: list[logging.LogRecord], capfd: pytest.CaptureFixture[str]
) -> None:
    """The check of a GoogLeNet (a torchvision FutureWarning) and of a BERT built as a decoder
    (a transformers warning), its layer count included, says nothing: a refusal after it
    stays one line. Built for real, as a worker builds them, they say what they say."""
    with warnings.catch_warnings(record=True) as shown:
        warnings.simplefilter("always")
        check_network(GOOGLENET, CIFAR)
        layer_count(GOOGLENET, CIFAR)
        check_network(BERT_AS_A_DECODER, TOKENS)
        layer_count(BERT_AS_A_DECODER, TOKENS)
    assert [str(warning.message) for warning in shown] == []
    assert transformers_said == []
    assert capfd.readouterr().err == ""
    with warnings.catch_warnings(record=True) as shown:
        warnings.simplefilter("always")
        build_network(GOOGLENET, CIFAR)
        build_network(BERT_AS_A_DECODER, TOKENS)
    assert any(issubclass(warning.category, FutureWarning) for warning in shown)
    assert any("is_decoder=False" in record.getMessage() for record in transformers_said)


def test_a_logger_configured_inside_the_block_is_quiet_too() -> None:
    """A library configures its logger as it is first imported, often during the check
    (transformers sets its level then): it passes only CRITICAL records there; Python's
    warnings are recorded, not shown; both are as they were afterwards."""
    kept = _Kept()
    logger = logging.getLogger("distbench-test.a_library_imported_now")
    disabled, filters = logging.root.manager.disable, list(warnings.filters)
    try:
        with library_chatter_kept_aside() as caught:
            logger.addHandler(kept)
            logger.setLevel(logging.WARNING)
            logger.warning("said while a network is checked")
            warnings.warn("a deprecated argument", FutureWarning, stacklevel=1)
            logger.critical("said whatever happens")
        assert [record.getMessage() for record in kept.records] == ["said whatever happens"]
        assert [str(warning.message) for warning in caught] == ["a deprecated argument"]
        assert (logging.root.manager.disable, warnings.filters) == (disabled, filters)
        logger.warning("said afterwards")
        assert kept.records[-1].getMessage() == "said afterwards"
    finally:
        logger.removeHandler(kept)
