"""A distribution model is one package and one config file (`harness.distributions.spec`).

The test lists every file of the code (harness/, launchers/, workloads/, hydra_plugins/, conf/,
scripts/) that names each model: in a string of the code (not a comment or docstring) or a
value of a config file. A model's own files are its package `harness/distributions/<name>/`
(its spec in `__init__.py`, its trainer in `trainer.py`), its config file
`conf/distribution/<name>.yaml` (and variants `<name>_*.yaml`), and its options in the sweeps
that take every model's (`conf/sweep/<group>/<name>[_*].yaml`). A model added the new way
touches nothing else; the thesis' five models are also named where listed below, each for a
reason given.
"""

from __future__ import annotations

import ast
import dataclasses
import re
from fnmatch import fnmatch
from pathlib import Path

import pytest

from harness.commands.compose import compose_config
from harness.config.schema import ConfigError, validate
from harness.distributions.registry import baseline, specs
from tests.helpers import REPO_ROOT

ROOT = REPO_ROOT
CODE_DIRS = ("harness", "launchers", "workloads", "hydra_plugins", "conf", "scripts")
OWN = (
    "harness/distributions/{name}/*.py",
    "conf/distribution/{name}.yaml",
    "conf/distribution/{name}_*.yaml",
    "conf/sweep/*/{name}.yaml",
    "conf/sweep/*/{name}_*.yaml",
)

# Where the thesis' models are named besides their own files, and why.
NAMED_ELSEWHERE: dict[str, set[str]] = {
    "sequential": {
        "conf/config.yaml",  # the default model of a cell
        "conf/sweep/calibrate_local_memory.yaml",
        "conf/sweep/local_data_parallel.yaml",
        # the probe's step is a sequential step (the code asks `registry.baseline()`; these
        # name it in their messages and help)
        "harness/commands/facts_options.py",
        "harness/predict/facts/gather.py",
        "harness/recommend.py",
        # its errors: one stage is distribution=sequential
        "harness/distributions/gpipe/__init__.py",
        "harness/distributions/gpipe/trainer.py",
    },
    # the CUDA check runs each model that can train on one GPU (scripts/gpu_check.sh;
    # docs/benchmarks/2026-11-25-cuda-h100-h200.md, "CUDA on one H100, then on one H200
    # (2026-11-25 to 2026-11-28)")
    "ddp": {
        "conf/sweep/calibrate_local_memory.yaml",
        "conf/sweep/local_data_parallel.yaml",
        "scripts/gpu_check.sh",
    },
    # a plan's label names its FSDP2 sharding "fsdp<n>" (harness/distributions/mesh)
    "fsdp": {
        "scripts/gpu_check.sh",
        "harness/distributions/mesh/settings.py",
        "harness/distributions/mesh/plan_shape.py",
    },
    "horovod": {
        "harness/runtime/environment.py",  # its version, in the record
        "scripts/build_horovod.sh",
        "scripts/setup.sh",  # it is built from source
    },
    # a plan's schedule may be torch's ScheduleGPipe (`distribution.schedule=gpipe`), which
    # the schedules' cost model prices
    "gpipe": {
        "conf/sweep/calibrate_local_memory.yaml",
        "scripts/gpu_check.sh",
        "harness/distributions/mesh/settings.py",
        "harness/costs/schedules.py",
    },
    "pipedream": set(),
    # the sweep over plans takes one option per plan
    "mesh": {
        "conf/sweep/plans/dp2_pp2_interleaved.yaml",
        "conf/sweep/plans/fsdp2_pp2_zero_bubble.yaml",
        "conf/sweep/plans/fsdp2_tp2.yaml",
        "conf/sweep/plans/tp2_pp2_1f1b.yaml",
    },
}


def _docstrings(tree: ast.AST) -> set[int]:
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            first = node.body[0] if node.body else None
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                found.add(id(first.value))
    return found


def names(path: Path, name: str) -> bool:
    """Whether the file's code names model `name` (a whole word, in any case)."""
    word = re.compile(rf"(?<![A-Za-z0-9]){re.escape(name)}(?![A-Za-z0-9])", re.IGNORECASE)
    if path.suffix == ".py":
        tree = ast.parse(path.read_text())
        docstrings = _docstrings(tree)
        return any(
            isinstance(node, ast.Constant)
            and isinstance(node.value, str)
            and id(node) not in docstrings
            and word.search(node.value)
            for node in ast.walk(tree)
        )
    return bool(
        word.search("\n".join(line.split("#")[0] for line in path.read_text().splitlines()))
    )


def files_naming(name: str) -> set[str]:
    return {
        str(path.relative_to(ROOT))
        for folder in CODE_DIRS
        for path in (ROOT / folder).rglob("*")
        if path.suffix in (".py", ".yaml", ".sh") and names(path, name)
    }


def own(path: str, name: str) -> bool:
    return any(fnmatch(path, pattern.format(name=name)) for pattern in OWN)


@pytest.mark.parametrize("name", list(specs()))
def test_every_file_a_model_touches(name: str) -> None:
    named = files_naming(name)
    elsewhere = {path for path in named if not own(path, name)}
    assert elsewhere == NAMED_ELSEWHERE.get(name, set()), (
        f"{name} is named outside its own files: {sorted(elsewhere)}"
    )
    assert (ROOT / "harness" / "distributions" / name / "__init__.py").is_file()
    assert (ROOT / "harness" / "distributions" / name / "trainer.py").is_file()
    assert (ROOT / "conf" / "distribution" / f"{name}.yaml").is_file()


def test_the_thesis_models_are_there() -> None:
    assert set(NAMED_ELSEWHERE) <= set(specs())


def test_one_model_is_the_baseline_the_others_are_measured_against() -> None:
    # what speedups are over, what the predictions' probe times: asked of the specs by code
    assert [spec.name for spec in specs().values() if spec.baseline] == ["sequential"]
    assert baseline() is specs()["sequential"]


@pytest.mark.parametrize("name", list(specs()))
def test_a_models_settings_are_the_schema_of_its_config_file(name: str) -> None:
    spec = specs()[name]
    config = validate(
        compose_config([f"distribution={name}", "hardware=local_2cpu", "dataset.num_samples=8192"])
    )
    assert type(config.distribution) is spec.settings
    assert config.distribution.name == name
    # another model's own key (one of each) is refused, in one line that names what is allowed
    allowed = [field.name for field in dataclasses.fields(spec.settings)]
    for other in specs().values():
        for key in [
            field.name for field in dataclasses.fields(other.settings) if field.name not in allowed
        ][:1]:
            with pytest.raises(ConfigError) as refused:
                validate(
                    compose_config(
                        [f"distribution={name}", "hardware=local_2cpu", f"+distribution.{key}=1"]
                    )
                )
            message = str(refused.value)
            assert "\n" not in message and f"distribution.{key}: unknown key" in message
            # ... and which models have it, with the form that sets it in a sweep over models
            assert (
                f"unknown key; allowed: {', '.join(allowed)}; {key} is a setting of "
                "distribution=" in message
            )
            assert ": in a sweep over models use +per_model." in message


def test_every_config_file_of_the_group_is_a_model() -> None:
    """conf/distribution/ holds each model's file and variants of one (pipedream_straight)."""
    for path in (ROOT / "conf" / "distribution").glob("*.yaml"):
        config = validate(
            compose_config(
                [f"distribution={path.stem}", "hardware=local_2cpu", "dataset.num_samples=8192"]
            )
        )
        assert own(f"conf/distribution/{path.name}", config.distribution.name)


def test_a_models_own_free_parameters_join_the_fit() -> None:
    # Horovod's background thread, FSDP's copies, a plan's wait per collective call and
    # PipeDream's flattening are terms their specs declare, not fields of the shared equations:
    # the fit fits the shared parameters, then every model's own.
    from harness.predict.parameters import PARAMETERS

    declared = [parameter.name for spec in specs().values() for parameter in spec.free_parameters]
    assert declared == [
        "fsdp_copies",
        "horovod_background",
        "plan_collective_wait",
        "pipedream_flatten",
    ]
    assert list(PARAMETERS) == ["contention", "communication", *declared]


def test_the_probe_measures_what_the_models_declare() -> None:
    # Each model names the transfers its terms read from a hardware profile; the probe
    # measures their union (`registry.probed_collectives`), which for distbench's own models
    # is every figure it has measured so far.
    from harness.distributions.registry import probed_collectives
    from harness.profiles.collectives import Collective

    declared = {name: set(spec.probed_collectives) for name, spec in specs().items()}
    assert declared["sequential"] == set()
    assert declared["gpipe"] == {Collective.point_to_point}
    assert {Collective.all_gather, Collective.reduce_scatter} <= declared["fsdp"]
    assert Collective.allreduce_beside_compute in declared["ddp"] & declared["horovod"]
    assert probed_collectives() == frozenset(Collective) == frozenset().union(*declared.values())
