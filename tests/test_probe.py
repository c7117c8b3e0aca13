"""The hardware probe and the hardware profile the performance models read."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

from harness.compose import compose_config
from harness.config import ConfigError, validate
from harness.hardware_profile import Cost, HardwareProfile, fit_cost, profile_path
from harness.records.mlflow_store import DEFAULT_STORE_FILE
from tests.helpers import run_module

SMALL_PROBE = ["probe.repeats=3", "probe.warmup=1", "probe.message_bytes=[8,65536,1048576]"]


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
    hardware = validate(compose_config(["hardware=local_2cpu",
                                        "hardware.intra_node_bandwidth_mbps=null"])).hardware
    with pytest.raises(ConfigError, match=r"hardware.intra_node_bandwidth_mbps=None"):
        HardwareProfile.from_config(hardware)


def test_the_probe_measures_two_local_workers_and_records_the_profile(
        output_root: Path) -> None:
    done = run_module("harness.probe", ["hardware=local_2cpu", *SMALL_PROBE,
                                        f"run.output_dir={output_root}"], cwd=output_root.parent)
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
    # is not measured there (it is measured between nodes, tests/test_emulated_nodes.py).
    assert profile.compute_lost_s_per_mb() == 0.0
    client = MlflowClient(f"sqlite:///{output_root / DEFAULT_STORE_FILE}")
    (run,) = client.search_runs([client.get_experiment_by_name("hardware_probe").experiment_id])
    assert run.data.metrics["link_latency_us_max"] == pytest.approx(link.cost.latency_s * 1e6)
    assert run.data.params["hardware.name"] == "local_2cpu"
    assert [a.path for a in client.list_artifacts(run.info.run_id)] == ["hardware_profile.json"]


def test_the_probe_refuses_a_single_worker(output_root: Path) -> None:
    done = run_module("harness.probe", ["hardware=local_cpu", f"run.output_dir={output_root}"],
                      cwd=output_root.parent)
    assert done.returncode == 2
    assert "hardware=local_cpu is invalid for the probe" in done.stderr
    assert "Traceback" not in done.stderr
