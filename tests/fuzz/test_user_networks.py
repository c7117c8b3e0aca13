"""A fuzzer of what a user brings: a network module's factory drawn from misbehaviours (it
prints, raises any exception, exits, returns what is not a network, takes arguments it is not
given), and a transformers model's own config values (`network.config.*`: sizes, rates,
epsilons, activations, of the wrong type, out of range, non-finite, huge). Each is composed and
validated in this process as the commands do: a valid config, or one line of bad input
(harness.cli), never another exception, and nothing the user's code printed reaches the
command's own output (`workloads.networks.user_code` keeps it aside). tests/faults/
test_bad_input.py stays the readable list of promises; this covers what no table lists."""

from __future__ import annotations

import contextlib
import importlib
import io
import itertools
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from harness.cli.bad_input import BAD_INPUT_ERRORS, bad_input_message
from harness.commands.compose import compose_config
from harness.config.schema import validate
from tests.fuzz.test_config import SPECIAL

FUZZ = settings(
    max_examples=60,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)


def valid_or_one_line(overrides: list[str]) -> None:
    """The property: the config composed of `overrides` is valid, or refused as one line of
    bad input; whatever the user's code printed stays out of this process' output."""
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed), contextlib.redirect_stderr(printed):
        try:
            validate(compose_config(overrides))
        except BAD_INPUT_ERRORS as err:
            line = bad_input_message(err)
            assert line and "\n" not in line, (overrides, line)
    assert "from the factory" not in printed.getvalue(), (overrides, printed.getvalue()[:500])


# ---------------------------------------------------------------------------------------------
# A network module's factory.

# A factory's body, in parts drawn one after another: what it prints, what it does, and
# what it returns. The printed lines carry a marker that must never reach the output.
PRINTS = [
    "",
    "print('a line from the factory')",
    "print('from the factory\\n' * 3000)",
    "sys.stderr.write('from the factory on stderr\\n')",
]
DOES = [
    "",
    "raise ValueError('no model today')",
    "raise KeyError('depth')",
    "raise RuntimeError('from the factory: ' + 'x' * 5000)",
    "raise MemoryError()",
    "raise RecursionError('too deep')",
    "raise NotImplementedError",
    "raise AssertionError('a check of its own')",
    "raise OSError(28, 'No space left on device')",
    "raise SystemExit(0)",
    "sys.exit(3)",
    "sys.exit('from the factory: a message')",
    "raise type('OddError', (Exception,), {'__str__': lambda self: 1 / 0})()",
    "torch.zeros(3).tolist()",
]
RETURNS = [
    "nn.Sequential(nn.Flatten(), nn.Linear(784, 10))",
    "nn.Linear(3, 10)",
    "None",
    "42",
    "'a network'",
    "nn.Sequential",
    "[nn.Linear(784, 10)]",
    "nn.Module()",
    "nn.Sequential(nn.Flatten(), nn.Linear(784, 0))",
]
SIGNATURES = ["", "depth", "depth=2", "*, dataset", "**kwargs"]

_names = itertools.count()


@pytest.fixture(scope="module")
def module_folder(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """A folder on sys.path where each drawn factory is written as a module of its own."""
    folder = tmp_path_factory.mktemp("user_networks")
    sys.path.insert(0, str(folder))
    try:
        yield folder
    finally:
        sys.path.remove(str(folder))


def _factory_module(folder: Path, signature: str, prints: str, does: str, returns: str) -> str:
    """Write a module with one factory `build`; its name, importable."""
    name = f"drawn_network_{next(_names)}"
    body = "\n".join(f"    {line}" for line in (prints, does) if line)
    (folder / f"{name}.py").write_text(
        "import sys\nimport torch\nfrom torch import nn\n\n\n"
        f"def build({signature}):\n{body}\n    return {returns}\n"
    )
    importlib.invalidate_caches()
    return name


@FUZZ
@given(
    signature=st.sampled_from(SIGNATURES),
    prints=st.sampled_from(PRINTS),
    does=st.sampled_from(DOES),
    returns=st.sampled_from(RETURNS),
    kwargs=st.sampled_from(["", "+network.kwargs.depth=3", "+network.kwargs.width=nan"]),
)
def test_every_drawn_factory_is_valid_or_refused_in_one_line(
    module_folder: Path, signature: str, prints: str, does: str, returns: str, kwargs: str
) -> None:
    name = _factory_module(module_folder, signature, prints, does, returns)
    overrides = [
        "network=module",
        f"network.target={name}:build",
        "dataset=mnist",
        "dataset.num_samples=64",
        "distribution.batch_size=8",
        "run.epochs=1",
        *([kwargs] if kwargs else []),
    ]
    valid_or_one_line(overrides)


# ---------------------------------------------------------------------------------------------
# A transformers model's own config values.

GPT2_BASE = [
    "network=gpt2_tiny",
    "dataset=tokens",
    "dataset.num_samples=64",
    "distribution.batch_size=8",
    "run.epochs=1",
]
GPT2_KEYS = [
    "n_embd",
    "n_layer",
    "n_head",
    "n_inner",
    "n_positions",
    "vocab_size",
    "layer_norm_epsilon",
    "activation_function",
    "resid_pdrop",
    "embd_pdrop",
    "attn_pdrop",
    "initializer_range",
    "scale_attn_weights",
    "bos_token_id",
    "no_such_key",
]
CONFIG_VALUES = st.one_of(
    st.sampled_from(SPECIAL),
    st.sampled_from(["gelu", "gelu_new", "relu", "nosuch", "1e-5", "0.5", "1.5", "3", "7"]),
    st.integers(min_value=-(2**40), max_value=2**40).map(str),
    st.floats(allow_nan=True, allow_infinity=True).map(repr),
)


@FUZZ
@given(key=st.sampled_from(GPT2_KEYS), value=CONFIG_VALUES)
def test_every_transformers_config_value_is_valid_or_refused_in_one_line(
    key: str, value: str
) -> None:
    valid_or_one_line([*GPT2_BASE, f"++network.config.{key}={value}"])
