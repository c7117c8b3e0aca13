"""A network checked against a dataset's input on the meta device (`workloads.networks.check`):
the check counts the parameters it built, and a remembered check keeps the count with it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import workloads.networks.check as check
from workloads.datasets.spec import DATASET_SPECS
from workloads.networks import build_network
from workloads.networks.check import NetworkSize, check_network, check_network_remembered
from workloads.networks.ref import NetworkRef, canonical_json

TOKENS = DATASET_SPECS["tokens"]
SMALL_GPT2 = NetworkRef(
    name="gpt2",
    source="hf",
    arch="gpt2",
    options_json=canonical_json({"n_embd": 32, "n_layer": 2, "n_head": 2}),
)


def test_the_check_counts_the_parameters_of_the_network_it_built() -> None:
    size = check_network(SMALL_GPT2, TOKENS)
    model = build_network(SMALL_GPT2, TOKENS)  # as a worker builds it
    parameters = sum(parameter.numel() for parameter in model.parameters())
    assert size == NetworkSize(parameters=parameters, trainable=parameters)


def test_a_remembered_check_keeps_the_size_and_answers_unbuilt(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    size = check_network_remembered(SMALL_GPT2, TOKENS, tmp_path, keep=True)
    (entry,) = (tmp_path / "network-checks").glob("*.json")
    assert json.loads(entry.read_text())["parameters"] == size.parameters

    def built_again(*args: object) -> None:
        raise AssertionError("the network was built again")

    with monkeypatch.context() as patched:
        patched.setattr(check, "check_network", built_again)
        assert check_network_remembered(SMALL_GPT2, TOKENS, tmp_path, keep=True) == size
    # an entry without the counts (kept by older code), or with damaged ones: checked again
    for kept in ({"takes_input": True}, {"takes_input": True, "parameters": -1, "trainable": 0}):
        entry.write_text(json.dumps(kept))
        assert check_network_remembered(SMALL_GPT2, TOKENS, tmp_path, keep=True) == size
        assert json.loads(entry.read_text())["trainable"] == size.trainable


@pytest.mark.parametrize(
    "fact",
    [
        None,
        {},
        {"takes_input": False, "parameters": 3, "trainable": 3},
        {"takes_input": True, "parameters": 3},
        {"takes_input": True, "parameters": 3, "trainable": 4},
        {"takes_input": True, "parameters": True, "trainable": 0},
        {"takes_input": True, "parameters": "3", "trainable": 3},
    ],
)
def test_an_entry_that_is_no_passed_check_with_both_counts_gives_no_size(
    fact: dict | None,
) -> None:
    assert NetworkSize.from_entry(fact) is None


def test_a_passed_checks_entry_gives_its_size() -> None:
    kept = {"takes_input": True, "parameters": 10, "trainable": 4, "network": "x"}
    assert NetworkSize.from_entry(kept) == NetworkSize(parameters=10, trainable=4)
