"""The plan search: what it enumerates is what distbench trains, what it ranks fits, and the
error it prints is the one the published tables give today."""

from __future__ import annotations

import json

import pytest

from harness.commands.compose import compose_config
from harness.commands.plans import planning_config, train_command, with_planning_defaults
from harness.config.schema import validate
from harness.costs.plan_step import GIB
from harness.distributions.mesh.plan_shape import plan_label, plan_of, plan_overrides
from harness.predict.plans.cluster import cluster_of
from harness.predict.plans.published import compare, predict_row, tables
from harness.predict.plans.search import search, tied_with_best
from harness.predict.plans.shape import remember_network, shape_of
from harness.predict.plans.source import VALIDATION, data_sheet_error

SMALL = ["network=llama_tiny", "hardware=h100_node", "run.global_batch=16"]


@pytest.fixture(scope="module")
def small():  # type: ignore[no-untyped-def]
    config = planning_config(SMALL)
    return config, shape_of(config), cluster_of(config.hardware)


def test_every_kind_of_plan_the_search_enumerates_is_a_config_distbench_trains(small) -> None:  # type: ignore[no-untyped-def]
    config, shape, cluster = small
    found = search(shape, cluster, 8, 16)
    assert found.priced > 100
    kinds = {}
    for one in found.ranked:
        plan = one.plan
        kinds.setdefault(
            (plan.tp, plan.pp, plan.schedule, plan.virtual, plan.dp_replicate, plan.dp_shard),
            plan,
        )
    assert {plan.schedule for plan in kinds.values()} >= {"1f1b", "gpipe", "zbv", "dualpipev"}
    for plan in kinds.values():
        cell = validate(compose_config(with_planning_defaults([*SMALL, *plan_overrides(plan)])))
        # ... and reads back as the same plan
        assert plan_of(cell) == plan, plan_label(plan)


def test_the_search_ranks_by_time_and_keeps_only_what_fits(small) -> None:  # type: ignore[no-untyped-def]
    _, shape, cluster = small
    found = search(shape, cluster, 8, 16)
    times = [one.step.seconds for one in found.ranked if one.step is not None]
    assert times == sorted(times) and len(times) == len(found.ranked)
    assert all(one.memory.total <= cluster.memory_bytes for one in found.ranked)
    tied = tied_with_best(found.ranked, 0.05)
    assert tied[0] is found.ranked[0]
    assert all(one.step and one.step.seconds <= times[0] * 1.05 for one in tied)


def test_nothing_fits_when_the_gpus_are_too_small() -> None:
    config = planning_config(
        ["network=llama3_70b", "hardware=h100_node", "hardware.device_memory_gb=8"]
    )
    found = search(shape_of(config), cluster_of(config.hardware), 8, 8)
    assert not found.ranked and found.smallest_too_big is not None
    assert found.smallest_too_big.memory.total > 8 * GIB


def test_the_command_trains_the_plan_on_the_asked_network_and_hardware(small) -> None:  # type: ignore[no-untyped-def]
    config, shape, cluster = small
    best = search(shape, cluster, 8, 16).ranked[0]
    command = train_command(config, [*SMALL, "distribution=ddp"], best.plan)
    assert command.startswith("python -m harness dataset=tokens optimizer.name=adamw")
    assert "network=llama_tiny" in command and "distribution=mesh" in command
    assert "distribution=ddp" not in command


def test_every_published_row_reads_and_prices() -> None:
    every = [row for _, rows in tables().values() for row in rows]
    assert len(every) >= 18
    for row in every:
        config = validate(
            compose_config(
                [f"hardware={row.hardware}", f"hardware.nodes={row.nodes}"]
                + ["hydra/launcher=submitit_slurm"]
            )
        )
        assert row.plan.world == config.hardware.nodes * config.hardware.workers_per_node
        assert row.measured_step is not None and row.measured_step > 0
        predicted = predict_row(row, cluster_of(config.hardware))
        assert predicted.step_s > 0 and predicted.memory_gib > 0
    assert {comparison.group for comparison in compare([])} == set()


def test_the_error_the_planner_prints_is_todays() -> None:
    """validation.json is what scripts/published_tables.py measures with the model as it is:
    a change to the costs that moves it must rewrite it (--write)."""
    import statistics

    errors = []
    for _, rows in tables().values():
        for row in rows:
            config = validate(
                compose_config(
                    [f"hardware={row.hardware}", f"hardware.nodes={row.nodes}"]
                    + ["hydra/launcher=submitit_slurm"]
                )
            )
            error = predict_row(row, cluster_of(config.hardware)).step_error
            assert error is not None
            errors.append(abs(error))
    kept = json.loads(VALIDATION.read_text())
    assert kept["rows"] == len(errors)
    assert kept["mape"] == pytest.approx(statistics.mean(errors), abs=1e-4)
    assert kept["worst"] == pytest.approx(max(errors), abs=1e-4)
    assert data_sheet_error().line().startswith("source: data sheets")


def test_a_price_prices_a_million_tokens() -> None:
    from harness.commands.plans import cost_per_million_tokens

    priced = planning_config([*SMALL, "hardware.price_per_device_hour=3.6"])
    # 3.6 an hour is 0.001 a second: a million tokens at 1,000 tokens/s a GPU take 1,000 s
    assert cost_per_million_tokens(priced, 1000.0) == pytest.approx(1.0)
    assert cost_per_million_tokens(planning_config(SMALL), 1000.0) is None


def test_a_network_planned_once_is_planned_again_without_building_it(
    tmp_path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The planner remembers a network's shape and input check (importing transformers to
    read them costs seconds); another cluster's plans read them back, a damaged entry is read
    again."""
    import workloads.networks.check as check
    import workloads.networks.lm as lm

    network = ["network=llama_tiny", "run.global_batch=16", f"dataset.cache_dir={tmp_path}"]
    config = planning_config([*network, "hardware=h100_node"])
    first = shape_of(config)
    remember_network(config)

    def built_again(*args: object) -> None:
        raise AssertionError("the network was built again")

    with monkeypatch.context() as patched:
        patched.setattr(check, "check_network", built_again)
        patched.setattr(lm, "decoder_shape", built_again)
        assert shape_of(planning_config([*network, "hardware=b200_node"])) == first
    for entry in tmp_path.rglob("*.json"):
        entry.write_text("{")
    assert shape_of(planning_config([*network, "hardware=b200_node"])) == first
