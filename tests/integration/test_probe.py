"""The hardware probe and the hardware profile the performance models read."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st
from mlflow.tracking import MlflowClient

from harness.commands.compose import compose_config
from harness.config.schema import ConfigError, validate
from harness.profiles.hardware import (
    Cost,
    HardwareProfile,
    MeasuredCurve,
    fit_cost,
    link_line,
    profile_path,
)
from harness.profiles.rounds import (
    ROUNDS_FACT,
    largest_spread,
    median_across_rounds,
    rounds_fact,
    spread_across_rounds,
    spread_line,
)
from harness.records.mlflow_store import DEFAULT_STORE_FILE
from harness.runtime.environment import machine_name
from tests.helpers import run_module

SMALL_PROBE = [
    "probe.repeats=3",
    "probe.warmup=1",
    "probe.message_bytes=[8,65536,1048576]",
    "probe.rounds=2",
]


def test_the_fit_reads_latency_at_the_smallest_message_and_bandwidth_from_the_slope() -> None:
    sizes = [8.0, 1e6, 1e7]
    seconds = [50e-6 + size / 2e9 for size in sizes]  # 50 us, 2 GB/s
    cost = fit_cost(sizes, seconds)
    assert cost.latency_s == pytest.approx(50e-6 + 8 / 2e9)
    assert cost.bandwidth_bytes_per_s == pytest.approx(2e9)
    assert cost.seconds(1e6) == pytest.approx(50e-6 + 8 / 2e9 + 1e6 / 2e9)


def test_a_flat_fit_falls_back_to_the_largest_message_rate() -> None:
    cost = fit_cost([8.0, 1e6], [2e-3, 1e-3])  # noise: the larger message was faster
    assert cost.bandwidth_bytes_per_s == pytest.approx(1e6 / 1e-3)


def test_a_measured_curve_prices_between_its_sizes_on_straight_lines() -> None:
    # an emulated link's shape: a small message within the bucket, a large one's losses
    curve = MeasuredCurve((8.0, 1e6, 8e6), (0.0035, 0.03, 0.5))
    assert [curve.seconds_at(n) for n in (8.0, 1e6, 8e6)] == [0.0035, 0.03, 0.5]
    assert curve.seconds_at(1.0) == 0.0035  # below the smallest: its time
    assert curve.seconds_at(4.5e6) == pytest.approx(0.03 + 0.47 / 2)
    assert curve.seconds_at(16e6) == pytest.approx(0.5 + 0.47 / 7e6 * 8e6)  # the last slope
    with pytest.raises(ValueError, match="two or more distinct sizes"):
        MeasuredCurve((1e6, 1e6), (0.1, 0.2))


@given(
    st.lists(
        st.tuples(st.floats(1.0, 1e9), st.floats(1e-6, 10.0)),
        min_size=2,
        max_size=6,
        unique_by=lambda point: point[0],
    ),
    st.floats(0.0, 2e9),
)
def test_a_measured_curve_is_continuous_and_never_leaves_its_neighbours(
    points: list[tuple[float, float]], nbytes: float
) -> None:
    points.sort()
    curve = MeasuredCurve(tuple(n for n, _ in points), tuple(s for _, s in points))
    seconds = curve.seconds_at(nbytes)
    if nbytes >= points[-1][0]:  # beyond the largest: at least its time
        assert seconds >= points[-1][1]
        return
    below = [s for n, s in points if n <= nbytes] or [points[0][1]]
    above = [s for n, s in points if n >= nbytes]
    low, high = below[-1], above[0]
    assert min(low, high) - 1e-12 <= seconds <= max(low, high) + 1e-12
    nudged = curve.seconds_at(nbytes * (1 + 1e-9))
    assert nudged == pytest.approx(seconds, rel=1e-6, abs=1e-9)


def test_the_collectives_timed_after_compute_round_trip_through_the_profile() -> None:
    measured = {
        "workers": 2,
        "compute_before_ms": 20.0,
        "bytes": [8e6, 8.0],
        "all_gather": [0.5, 0.001],
        "reduce_scatter": [0.7, 0.002],
    }
    profile = HardwareProfile.from_json(
        HardwareProfile(
            "emulated_2nodes_1gbit",
            "measured",
            2,
            2,
            [],
            [],
            {"collectives_after_compute": measured},
        ).to_json()
    )
    assert profile.collective_after_compute("all_gather", 2) == MeasuredCurve(
        (8.0, 8e6), (0.001, 0.5)
    )  # in order of size
    assert profile.collective_after_compute("reduce_scatter", 2).seconds == (0.002, 0.7)
    assert profile.collective_after_compute("all_gather", 4) is None  # measured among 2
    assert (
        HardwareProfile("local_2cpu", "measured", 2, 1, [], []).collective_after_compute(
            "all_gather", 2
        )
        is None
    )
    one_size = {**measured, "bytes": [8.0, 8.0]}  # probe.message_bytes=[8,8]
    assert (
        HardwareProfile(
            "local_2cpu", "measured", 2, 1, [], [], {"collectives_after_compute": one_size}
        ).collective_after_compute("all_gather", 2)
        is None
    )


def test_a_profile_from_the_configured_speeds_uses_intra_and_inter_node_links() -> None:
    hardware = validate(compose_config(["hardware=titanrtx_cluster"])).hardware
    profile = HardwareProfile.from_config(hardware)
    assert profile.workers == 16 and profile.source == "config"
    assert len(profile.links) == 16 * 15 // 2
    same_node, other_node = profile.link(0, 3), profile.link(3, 4)
    assert same_node.as_json() == pytest.approx({"latency_us": 10, "bandwidth_mbps": 10_000})
    assert other_node.as_json() == pytest.approx({"latency_us": 50, "bandwidth_mbps": 5_000})
    assert HardwareProfile.from_json(json.loads(json.dumps(profile.to_json()))) == profile


def test_nodes_of_one_worker_need_only_the_inter_node_speeds() -> None:
    """Two emulated nodes of one worker each have no intra-node link: their configs give no
    intra-node speed, and the profile before any probe comes from the inter-node one."""
    hardware = validate(compose_config(["hardware=emulated_2nodes_100mbit"])).hardware
    assert hardware.intra_node_bandwidth_mbps is None
    (link,) = HardwareProfile.from_config(hardware).links
    assert not link.same_node
    assert link.cost.as_json() == pytest.approx({"latency_us": 61, "bandwidth_mbps": 12.5})


def test_a_profile_needs_both_speeds_of_a_link_kind() -> None:
    hardware = validate(
        compose_config(["hardware=local_2cpu", "hardware.intra_node_bandwidth_mbps=null"])
    ).hardware
    with pytest.raises(ConfigError, match=r"hardware.intra_node_bandwidth_mbps=None"):
        HardwareProfile.from_config(hardware)


def test_the_probe_measures_two_local_workers_and_records_the_profile(output_root: Path) -> None:
    done = run_module(
        "harness.probe",
        ["hardware=local_2cpu", *SMALL_PROBE, f"run.output_dir={output_root}"],
        cwd=output_root.parent,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert "allreduce among 2" in done.stdout
    profile = HardwareProfile.load(profile_path(output_root, "local_2cpu"))
    assert profile.source == "measured" and profile.workers == 2
    (link,) = profile.links
    assert (link.src, link.dst, link.same_node) == (0, 1, True)
    assert link.samples["bytes"] == [8, 65536, 1048576] and len(link.samples["seconds"]) == 3
    assert 0 < link.cost.latency_s < 0.1 and link.cost.bandwidth_bytes_per_s > 1e6
    assert [entry.workers for entry in profile.allreduce] == [2]
    assert isinstance(profile.allreduce_cost(2), Cost)
    # Workers of one machine take turns: what a collective takes from the compute beside it
    # is not measured there (it is measured between nodes,
    # tests/integration/test_emulated_nodes.py).
    assert profile.compute_lost_s_per_mb() == 0.0
    # FSDP's collectives, timed after compute as FSDP runs them, at each size
    for collective in ("all_gather", "reduce_scatter"):
        timed = profile.collective_after_compute(collective, 2)
        assert timed is not None and timed.nbytes == (8.0, 65536.0, 1048576.0)
        assert all(seconds > 0 for seconds in timed.seconds)
    assert "after 20 ms of compute, an all-gather of 1.0 MB among 2 takes" in done.stdout
    # Every figure measured in two rounds, kept at their median, their spread beside it
    rounds = profile.facts[ROUNDS_FACT]
    figures = {
        "link 0-1",
        "allreduce among 2",
        "all_gather after compute",
        "reduce_scatter after compute",
    }
    assert rounds["rounds"] == 2 and set(rounds["values"]) == set(rounds["spread"]) == figures
    assert all(
        len(values) == 2 and all(len(sizes) == 3 for sizes in values)
        for values in rounds["values"].values()
    )
    assert link.samples["seconds"] == pytest.approx(
        [sum(sizes) / 2 for sizes in zip(*rounds["values"]["link 0-1"])]
    )
    assert "measured in 2 rounds, each figure the median across them" in done.stdout
    # The machine it measured (loopback's speed is the host's), named where the links are used
    machine = machine_name("cpu")
    assert profile.facts["machine"] == machine and f"gloo on cpu ({machine})" in done.stdout
    line = link_line(validate(compose_config(["hardware=local_2cpu"])).hardware, profile)
    assert line is not None and line.startswith(f"links: measured by harness.probe on {machine}, ")
    assert ", in 2 rounds (their spread up to" in line
    client = MlflowClient(f"sqlite:///{output_root / DEFAULT_STORE_FILE}")
    (run,) = client.search_runs([client.get_experiment_by_name("hardware_probe").experiment_id])
    assert run.data.metrics["link_latency_us_max"] == pytest.approx(link.cost.latency_s * 1e6)
    assert run.data.metrics["rounds"] == 2
    assert run.data.metrics["rounds_spread_max"] == pytest.approx(max(rounds["spread"].values()))
    assert run.data.params["hardware.name"] == "local_2cpu"
    assert run.data.tags["machine"] == machine
    assert [a.path for a in client.list_artifacts(run.info.run_id)] == ["hardware_profile.json"]


def test_a_round_disturbed_for_seconds_does_not_move_the_probes_figures() -> None:
    """One round of three met a disturbance (the 8-byte ping-pong at 1620 us, as a probe
    started at a sweep's end read it, against 84 us): each size's median across the rounds is
    a quiet round's, and the rounds' spread says that they disagreed."""
    quiet, disturbed = [84e-6, 1.0e-3, 9.0e-3], [1620e-6, 1.2e-3, 9.5e-3]
    rounds = [quiet, disturbed, [90e-6, 1.1e-3, 8.8e-3]]
    assert median_across_rounds(rounds) == [90e-6, 1.1e-3, 9.0e-3]
    spread = spread_across_rounds(rounds)
    assert spread == pytest.approx((1.2e-3 - 1.0e-3) / 1.1e-3)  # the median size's spread
    assert spread_across_rounds([quiet]) is None  # one round: its noise is unknown
    fact = rounds_fact({"link 0-1": rounds})
    assert fact["rounds"] == 3 and largest_spread(fact) == pytest.approx(spread)
    assert "link 0-1 18%" in spread_line(fact)
    one = rounds_fact({"link 0-1": [quiet]})
    assert largest_spread(one) is None and "its spread is not known" in spread_line(one)
    with pytest.raises(ValueError, match="one value per size"):
        median_across_rounds([quiet, quiet[:2]])


@given(st.lists(st.lists(st.floats(1e-7, 10.0), min_size=3, max_size=3), min_size=1, max_size=7))
def test_a_figures_median_across_rounds_lies_within_them(rounds: list[list[float]]) -> None:
    medians = median_across_rounds(rounds)
    for size, median in enumerate(medians):
        values = [values[size] for values in rounds]
        assert min(values) <= median <= max(values)
    spread = spread_across_rounds(rounds)
    assert (spread is None) == (len(rounds) == 1)
    assert spread is None or spread >= 0


def test_the_probe_refuses_a_single_worker(output_root: Path) -> None:
    done = run_module(
        "harness.probe",
        ["hardware=local_cpu", f"run.output_dir={output_root}"],
        cwd=output_root.parent,
    )
    assert done.returncode == 2
    assert "hardware=local_cpu is invalid for the probe" in done.stderr
    assert "Traceback" not in done.stderr


def test_a_round_measures_only_what_the_registered_models_declare(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The probe holds no code of a model: each figure is measured where a declared collective
    needs it (`harness.distributions.registry.probed_collectives`), each only on the hardware
    its terms read it on."""
    import torch

    from harness.profiles.collectives import Collective
    from harness.worker import probe_worker

    measured: list[str] = []

    def record(name: str, value: object) -> object:
        def measure(*args: object) -> object:
            measured.append(name)
            return value

        return measure

    monkeypatch.setattr(probe_worker, "measure_links", record("links", {(0, 1): [1.0]}))
    monkeypatch.setattr(probe_worker, "measure_allreduce", record("allreduce", {2: [1.0]}))
    monkeypatch.setattr(probe_worker, "measure_compute_lost", record("lost", 0.5))

    def after_compute(probe: object, timed: tuple[Collective, ...]) -> dict[str, list[float]]:
        measured.extend(collective.value for collective in timed)
        return {collective.value: [1.0] for collective in timed}

    monkeypatch.setattr(probe_worker, "measure_collectives_after_compute", after_compute)

    class OnePeer:  # a worker alone: its all_gather is its own value
        def all_gather(self, value: object) -> list[object]:
            return [value]

    nodes = validate(compose_config(["hardware=emulated_2nodes_1gbit"]))
    cpu = torch.device("cpu")

    def round_of(*collectives: Collective, config: object = nodes) -> probe_worker.ProbeRound:
        measured.clear()
        return probe_worker.measure_round(OnePeer(), cpu, config, frozenset(collectives))

    everything = round_of(*Collective)
    assert measured == ["links", "allreduce", "lost", "all_gather", "reduce_scatter"]
    assert set(probe_worker.round_figures([everything])) == {
        "link 0-1",
        "allreduce among 2",
        "compute lost",
        "all_gather after compute",
        "reduce_scatter after compute",
    }
    pipelines_only = round_of(Collective.point_to_point)
    assert measured == ["links"] and pipelines_only.after_compute is None
    assert set(probe_worker.round_figures([pipelines_only])) == {"link 0-1"}
    round_of(Collective.reduce_scatter, Collective.allreduce)
    assert measured == ["allreduce", "reduce_scatter"]
    # between the processes of one machine no allreduce is timed beside compute
    round_of(*Collective, config=validate(compose_config(["hardware=local_2cpu"])))
    assert "lost" not in measured and "all_gather" in measured
