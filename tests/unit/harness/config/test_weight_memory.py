"""A network whose weights cannot fit a worker's memory is bad input (`harness.config.
weight_memory`, `DistbenchConfig.check_weights_fit`): refused when the config is validated, in
one line naming the network's settings, what its weights need per worker and the memory there
is; a cell that fits, however tightly, is not refused, nor one whose memory is unknown."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

import pytest

import harness.config.weight_memory as weight_memory
from harness.commands.compose import compose_config
from harness.config.schema import ConfigError, DistbenchConfig, validate
from harness.config.units import BYTES_PER_GB
from harness.config.weight_memory import least_state_bytes, shared_machine_memory

GPT2_TINY = ["dataset=tokens", "network=gpt2_tiny"]
HUGE_VOCABULARY = [*GPT2_TINY, "+network.config.vocab_size=1000000000"]
MACHINE_BYTES = 64 * BYTES_PER_GB


@pytest.fixture(autouse=True)
def a_64_gb_machine(monkeypatch: pytest.MonkeyPatch) -> None:
    """This machine's memory and swap, as the check reads it: 64 GB, whatever runs the test."""
    monkeypatch.setattr(weight_memory, "machine_memory_bytes", lambda: MACHINE_BYTES)


def _validated(overrides: Sequence[str], **kwargs: bool) -> DistbenchConfig:
    return validate(compose_config(list(overrides)), **kwargs)


def _refusal(overrides: Sequence[str]) -> str:
    with pytest.raises(ConfigError) as refused:
        _validated(overrides)
    message = str(refused.value)
    assert "\n" not in message and "cannot fit in memory" in message, message
    return message


def _need_gb(overrides: Sequence[str]) -> float:
    """What the check reckons one worker of the cell needs, in GB (the config checked without
    it)."""
    config = _validated(overrides, weights_must_fit=False)
    size = config.check_network()
    assert size is not None
    need = least_state_bytes(
        size.parameters,
        size.trainable,
        state_buffers=config.optimizer.state_buffers,
        value_bytes=config.distribution.weight_bytes,
        shards=config.distribution.weight_shards(config),
    )
    return need / BYTES_PER_GB


def test_the_least_a_worker_holds_is_weights_gradients_and_state_over_its_shards() -> None:
    # 10 weights, 4 of them trainable (a gradient and AdamW's two moments each), 2 shards
    assert least_state_bytes(10, 4, state_buffers=2, value_bytes=4, shards=2) == 44
    assert least_state_bytes(10, 10, state_buffers=1, value_bytes=2, shards=1) == 60
    assert least_state_bytes(10, 0, state_buffers=1, value_bytes=4, shards=1) == 40


def test_this_machines_memory_is_its_memory_and_swap(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    meminfo = tmp_path / "meminfo"
    meminfo.write_text("MemTotal:       1000 kB\nMemFree:  10 kB\nSwapTotal:   24 kB\n")
    monkeypatch.undo()  # the real function, reading the file below
    monkeypatch.setattr(weight_memory, "_MEMINFO", meminfo)
    weight_memory.machine_memory_bytes.cache_clear()
    try:
        assert weight_memory.machine_memory_bytes() == 1024 * 1024
    finally:
        monkeypatch.undo()
        weight_memory.machine_memory_bytes.cache_clear()
    machine = shared_machine_memory(4)
    assert machine is not None and machine.bytes == weight_memory.machine_memory_bytes() / 4


def _cgroups(root: Path, files: dict[str, str]) -> Path:
    """A control-group mount under `root`: each file of `files` (path: text) written."""
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)
    return root


def test_a_control_groups_memory_limit_is_read_on_v1_and_v2(tmp_path: Path) -> None:
    """The least limit along the process's group and its ancestors; "max" and v1's largest
    value are none; a group not visible in the mount (a container's) is looked for above."""
    unlimited_v1 = "9223372036854771712\n"
    v1 = _cgroups(
        tmp_path / "v1",
        {
            "memory/memory.limit_in_bytes": unlimited_v1,
            "memory/jobs/memory.limit_in_bytes": "4294967296\n",
            "memory/jobs/job_7/memory.limit_in_bytes": "1073741824\n",
        },
    )
    own = tmp_path / "self_cgroup"
    own.write_text("5:cpu,cpuacct:/jobs/job_7\n4:memory:/jobs/job_7\n0::/\n")
    assert weight_memory.cgroup_memory_limit(own, v1) == 1024**3
    own.write_text("4:memory:/jobs/not_visible_here\n")  # the group above limits it
    assert weight_memory.cgroup_memory_limit(own, v1) == 4 * 1024**3
    own.write_text("4:memory:/\n")
    assert weight_memory.cgroup_memory_limit(own, v1) is None

    v2 = _cgroups(
        tmp_path / "v2",
        {
            "cgroup.controllers": "cpu memory\n",
            "memory.max": "max\n",
            "box/memory.max": "2147483648\n",
            "box/inner/memory.max": "max\n",
        },
    )
    own.write_text("0::/box/inner\n")
    assert weight_memory.cgroup_memory_limit(own, v2) == 2 * 1024**3
    own.write_text("0::/\n")
    assert weight_memory.cgroup_memory_limit(own, v2) is None
    assert weight_memory.cgroup_memory_limit(tmp_path / "none", v2) is None


_WRITABLE_CGROUPS = Path("/sys/fs/cgroup/memory")


@pytest.mark.skipif(
    not os.access(_WRITABLE_CGROUPS, os.W_OK),
    reason="needs a writable cgroup v1 memory controller (root on this machine kind)",
)
def test_a_process_in_a_limited_control_group_takes_its_limit_for_the_machines_memory() -> None:
    """A real control group limited to 1 GiB, a real process in it: the memory the weight
    check takes for this machine is the group's, not /proc/meminfo's whole host, and its
    refusal says so."""
    group = _WRITABLE_CGROUPS / f"distbench-test-{os.getpid()}"
    group.mkdir()
    try:
        (group / "memory.limit_in_bytes").write_text(str(1024**3))
        done = subprocess.run(
            [
                "sh",
                "-c",
                f'echo $$ > {group}/cgroup.procs && exec "$0" -c "$1"',
                sys.executable,
                "from harness.config.weight_memory import machine_memory_bytes as m, "
                "shared_machine_memory as s; print(m()); print(s(1).named)",
            ],
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert done.returncode == 0, done.stderr
        meminfo_swap = int(
            next(
                line.split()[1]
                for line in Path("/proc/meminfo").read_text().splitlines()
                if line.startswith("SwapTotal:")
            )
        )
        taken, named = done.stdout.splitlines()
        assert int(taken) == 1024**3 + meminfo_swap * 1024
        assert "(its control group's memory limit, with the swap)" in named
    finally:
        group.rmdir()  # empty again: its one process has ended


def test_a_network_whose_weights_cannot_fit_is_refused_naming_what_each_needs() -> None:
    """GPT-2 with a billion-token vocabulary: 256 B parameters (the embedding and the head),
    3 TB of float32 weights, gradients and momentum for its one worker, on a CPU without a
    limit: this machine's memory is what it has."""
    said = _refusal(HUGE_VOCABULARY)
    assert said.startswith("network gpt2_tiny (network.arch=gpt2, network.config.n_embd=128")
    assert "network.config.vocab_size=1000000000)" in said
    assert "its 256.0 B parameters need 3,072.0 GB per worker for their float32 weights, " in said
    assert "gradients and SGD's momentum alone (distribution=sequential: each worker " in said
    assert "more than this machine's 64.0 GB of memory and swap" in said
    # the recommender and the planner describe such a cell: what fits is their answer
    assert _validated(HUGE_VOCABULARY, weights_must_fit=False).network.name == "gpt2_tiny"


def test_a_cell_that_fits_however_tightly_is_not_refused() -> None:
    need = _need_gb(GPT2_TINY)
    _validated([*GPT2_TINY, f"hardware.device_memory_gb={need * (1 + 1e-6)!r}"])
    said = _refusal([*GPT2_TINY, f"hardware.device_memory_gb={need * 0.99!r}"])
    assert f"more than hardware.device_memory_gb={need * 0.99:g};" in said
    # AdamW keeps two buffers per weight where SGD keeps one: a worker needs 4/3 as much
    adamw = [*GPT2_TINY, "optimizer.name=adamw"]
    assert _need_gb(adamw) == pytest.approx(need * 4 / 3)
    said = _refusal([*adamw, f"hardware.device_memory_gb={need * 1.2!r}"])
    assert "gradients and AdamW's two moments alone" in said


def test_a_model_that_divides_the_weights_needs_its_share_only() -> None:
    """Between half and all of the network's need per worker, on two workers: a model that
    shards or pipelines the weights fits, one that keeps a replica on each worker does not;
    bfloat16 parameters need half."""
    need = _need_gb(GPT2_TINY)
    two = [*GPT2_TINY, "hardware=local_2cpu", f"hardware.device_memory_gb={need * 0.6!r}"]
    for model in (
        ["distribution=fsdp"],
        ["distribution=gpipe", "distribution.batch_size=8", "distribution.micro_batches=2"],
        ["distribution=mesh", "distribution.dp_shard=2"],
        ["distribution=ddp", "distribution.precision=bf16"],
    ):
        _validated([*two, *model])
    said = _refusal([*two, "distribution=ddp"])
    assert "(distribution=ddp: each worker holds them whole)" in said
    assert (
        "or a distribution model that divides the weights among the workers (sharded or pipelined)"
        in said
    )
    said = _refusal([*two, "distribution=mesh", "distribution.dp_replicate=2"])
    assert "distribution=mesh: each worker holds them whole" in said


@pytest.mark.parametrize(
    "unknown",
    [
        # a GPU of unknown memory
        ["hardware.device=cuda"],
        # CPU nodes of their own, not this machine
        ["hardware.nodes=2", "distribution=ddp", "distribution.batch_size=8"],
    ],
    ids=["gpu-memory-unknown", "cpu-nodes-elsewhere"],
)
def test_nothing_is_refused_where_the_memory_is_unknown(unknown: list[str]) -> None:
    _validated([*HUGE_VOCABULARY, *unknown])


def test_a_network_not_built_to_check_it_is_not_refused() -> None:
    """A built-in network's source answers the input check without building it: its size is
    not known before the cell, which reports `oom` as before (tests/faults/test_memory_limit)."""
    _validated(["network=vgg16", "dataset=imagenet", "hardware.device_memory_gb=0.001"])


def test_the_cpu_workers_of_one_machine_share_its_memory(monkeypatch: pytest.MonkeyPatch) -> None:
    need = _need_gb(GPT2_TINY)
    monkeypatch.setattr(weight_memory, "machine_memory_bytes", lambda: need * 1.5 * BYTES_PER_GB)
    _validated([*GPT2_TINY, "hardware=local_2cpu", "distribution=fsdp"])
    said = _refusal([*GPT2_TINY, "hardware=local_2cpu", "distribution=ddp"])
    assert "for each of its 2 workers" in said
