"""A fuzzer of the config: for every field of every config group (the distribution models' settings
included), values of the wrong type, out of range, non-finite, empty, huge, with path separators,
'..', newlines and non-ASCII, composed in this process as the commands compose them and validated.
Each ends as a valid config whose numbers are finite and within what the fields declare
(harness.config.accepts), or as one line of bad input (harness.cli); never as another exception. A
short profile runs in the suite; the long one is a benchmark
(tests/benchmarks/test_fuzz_config_long.py, `-m perf`). tests/faults/test_bad_input.py stays the
readable list of promises; what this finds is kept below as `@example`s."""

from __future__ import annotations

import dataclasses
import math
import typing
from typing import Any

from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from harness.cli.bad_input import BAD_INPUT_ERRORS, bad_input_message
from harness.commands.compose import compose_config
from harness.config.accepts import allowed, declared
from harness.config.schema import DistbenchConfig, DistributionConfig, validate
from harness.distributions.registry import register_configs

# A tiny valid cell: a drawn value is the only thing wrong with it.
BASE = (
    "network=mobilenetv2",
    "dataset.num_samples=64",
    "distribution.batch_size=8",
    "run.epochs=1",
)
GROUPS = ("dataset", "network", "optimizer", "hardware", "run", "tracking", "probe")


def _fields(schema: type) -> list[str]:
    return [f.name for f in dataclasses.fields(schema) if not f.name.startswith("_")]


def setting_keys() -> list[tuple[str, str]]:
    """(extra override, key) for every field of every group, each model's settings with
    `distribution=<model>` (its name is left out: it is chosen by the config file)."""
    register_configs()
    types = typing.get_type_hints(DistbenchConfig)
    keys = [("", f"{group}.{name}") for group in GROUPS for name in _fields(types[group])]
    for model, schema in sorted(DistributionConfig.models.items()):
        keys += [
            (f"distribution={model}", f"distribution.{name}")
            for name in _fields(schema)
            if name != "name"
        ]
    return keys


KEYS = setting_keys()
SPECIAL = [
    "inf",
    "-inf",
    "nan",
    "1e15",
    "1e308",
    "-1",
    "0",
    "1099511627776",
    "2**64",
    "''",
    "null",
    "abc",
    "[1,2]",
    "[]",
    "{}",
    "true",
    "../../escaped",
    "a/b",
    "..",
    "/",
    "/proc/x",
    "x" * 300,
    "d/" * 2100,
    "é" * 200,
    "'a\nb'",
    "'\\x00'",
    " ",
]
_TEXT = st.text(alphabet=st.sampled_from("ab/.\\\n\x00é中 -_:'\"$"), max_size=40)


def _quoted(value: str) -> str:
    """`value` as a Hydra quoted string (whatever it holds reaches the config)."""
    return "'" + value.replace("\\", "\\\\").replace("'", "\\'") + "'"


VALUES = st.one_of(
    st.sampled_from(SPECIAL),
    st.floats(allow_nan=True, allow_infinity=True).map(repr),
    st.integers(min_value=-(2**70), max_value=2**70).map(str),
    _TEXT,
    _TEXT.map(_quoted),
    st.tuples(
        st.sampled_from(["x", "é", "/", "..", "a"]), st.integers(min_value=1, max_value=5000)
    ).map(lambda pair: _quoted(pair[0] * pair[1])),
)


def _numbers_within_declarations(node: Any, prefix: str = "") -> None:
    """Every number of a valid config is finite and every field holds what it declares."""
    for item in dataclasses.fields(node):
        value = getattr(node, item.name)
        if dataclasses.is_dataclass(value) and not isinstance(value, type):
            _numbers_within_declarations(value, f"{prefix}{item.name}.")
            continue
        numbers = value if isinstance(value, list) else [value]
        assert all(math.isfinite(v) for v in numbers if isinstance(v, float)), (item.name, value)
        accepts = declared(item.metadata)
        assert accepts is None or allowed(accepts, value) is None, (prefix + item.name, value)


def check_one_setting(key: tuple[str, str], value: str) -> None:
    """The property: `key=value` on a tiny cell is valid within the declarations, or refused
    as one line of bad input."""
    extra, name = key
    overrides = [*BASE, *([extra] if extra else []), f"{name}={value}"]
    try:
        config = validate(compose_config(overrides))
    except BAD_INPUT_ERRORS as err:
        line = bad_input_message(err)
        assert line and "\n" not in line, (overrides, line)
        return
    _numbers_within_declarations(config)


# The suite's profile: ~150 draws in ~20 s on 2 cores; derandomized, so a run repeats the last.
FUZZ = settings(
    max_examples=150,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.too_slow],
)


@FUZZ
@given(key=st.sampled_from(KEYS), value=VALUES)
# Found by the fuzzer or by hand, kept as regression cases.
@example(key=("", "optimizer.weight_decay"), value="inf")
@example(key=("", "hardware.device_memory_gb"), value="1e15")
@example(key=("", "hardware.cpu_threads"), value="1099511627776")
@example(key=("distribution=ddp", "distribution.bucket_cap_mb"), value="inf")
@example(key=("distribution=horovod", "distribution.fusion_threshold_mb"), value="inf")
@example(key=("", "tracking.experiment"), value="../../escaped")
@example(key=("", "run.output_dir"), value="''")
@example(key=("", "hardware.name"), value="x" * 300)
def test_every_setting_is_valid_or_refused_in_one_line(key: tuple[str, str], value: str) -> None:
    check_one_setting(key, value)


def test_the_fuzzer_reaches_every_group_and_model() -> None:
    """Every group and every model's own settings are among the fuzzed keys."""
    names = {name.split(".")[0] for _, name in KEYS}
    assert names == {*GROUPS, "distribution"}
    models = {extra for extra, _ in KEYS if extra}
    assert models == {f"distribution={model}" for model in DistributionConfig.models}


# A plan's settings drawn together on a four-worker language-model cell: the degrees, the
# schedule, virtual stages, the micro-batch and the global batch (the combinations no table
# lists: a product that is not the world size, a schedule over more stages than layers, a
# batch that does not divide).
PLAN_BASE = (
    "distribution=mesh",
    "hardware=local_4cpu",
    "network=llama_tiny",
    "dataset=tokens",
    "dataset.num_samples=256",
    "run.epochs=1",
)
_DEGREES = st.sampled_from(["1", "2", "3", "4", "8", "null"])


@settings(max_examples=40, deadline=None, derandomize=True, database=None)
@given(
    dp_replicate=st.sampled_from(["1", "2", "4"]),
    dp_shard=_DEGREES,
    tp=st.sampled_from(["1", "2", "4"]),
    pp=st.sampled_from(["1", "2", "4"]),
    schedule=st.sampled_from(
        ["gpipe", "1f1b", "interleaved_1f1b", "looped_bfs", "interleaved_zb", "zbv", "dualpipev"]
    ),
    stages_per_rank=st.sampled_from(["null", "1", "2", "3"]),
    micro_batch_size=st.sampled_from(["null", "1", "2", "3", "16"]),
    global_batch=st.sampled_from(["null", "4", "6", "8", "16", "64"]),
    sequence_parallel=st.booleans(),
)
def test_every_plan_is_valid_or_refused_in_one_line(**plan: Any) -> None:
    overrides = [
        *PLAN_BASE,
        *(
            f"{'run' if key == 'global_batch' else 'distribution'}.{key}={str(value).lower()}"
            for key, value in plan.items()
        ),
    ]
    try:
        config = validate(compose_config(overrides))
    except BAD_INPUT_ERRORS as err:
        line = bad_input_message(err)
        assert line and "\n" not in line, (overrides, line)
        return
    settings_ = config.distribution
    degrees = settings_.dp_replicate * settings_.shards(config) * settings_.tp * settings_.pp
    assert degrees == config.world_size, overrides
    assert config.batch_size % settings_.micro_batch(config) == 0, overrides
    assert config.global_batch_size == config.batch_size * settings_.data_parallel(config)
