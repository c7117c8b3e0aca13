"""`python -m harness ... --dry-run` (harness.commands.dryrun): every cell a command would run,
listed with its distribution, workers, nodes, device, batch and micro-batches, and where an analysis
fitted its hardware its predicted seconds per epoch and the sweep's total; nothing launched, nothing
written. And the thesis' grid it lists (conf/sweep/imagenet_resnet.yaml, thesis_grid.yaml,
conf/sweep/scaling/)."""

from __future__ import annotations

import contextlib
import io
import json
import re
from dataclasses import dataclass
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from harness.commands.compose import CONF_DIR, compose_config
from harness.config.batch_sizes import default_batch_size
from harness.config.schema import ConfigError
from harness.distributions.gpipe import TABLE_3_3
from harness.records.resume import cell_key
from launchers.hydra_main import check_hydra_main
from tests.helpers import run_module


# (distribution, workers, nodes) of every network's cells in the thesis' grid, as it runs them.
def _scaling_cells() -> list[tuple[str, int, int]]:
    """(model, workers, nodes) of every option of conf/sweep/scaling/ in file-name order (the
    flagship takes them all by glob; each model brings its own files): the distribution
    model it overrides and its node layout, one worker for the one-device baseline."""
    cells = []
    for path in sorted((CONF_DIR / "sweep" / "scaling").glob("*.yaml")):
        option = OmegaConf.load(path)
        (override,) = [entry for entry in option.defaults if "override /distribution" in entry]
        model = override["override /distribution"]
        hardware = option.get("hardware", {})
        nodes, per_node = hardware.get("nodes", 1), hardware.get("workers_per_node", 1)
        cells.append((model, 1, 1) if model == "sequential" else (model, nodes * per_node, nodes))
    return cells


THESIS_CELLS = _scaling_cells()


COLUMNS = (
    "#",
    "cell",
    "distribution",
    "workers",
    "nodes",
    "device",
    "batch",
    "micro-batches",
    "stage plan",
    "can run",
    "s/epoch",
)


@dataclass(frozen=True)
class Listing:
    """What a dry run printed: its header line, one dict per table row, the lines after."""

    header: str
    rows: list[dict[str, str]]
    notes: list[str]

    @classmethod
    def parse(cls, text: str) -> Listing:
        """Columns are left-aligned under their names (a cell's name holds spaces)."""
        lines = text.strip().splitlines()
        header = lines[1]
        names = [name for name in COLUMNS if f" {name}" in f" {header}"]
        starts = sorted((header.index(name), name) for name in names)
        bounds = [
            (start, end, name) for (start, name), (end, _) in zip(starts, [*starts[1:], (None, "")])
        ]
        rows = [
            {name: line[start:end].strip() for start, end, name in bounds}
            for line in lines[2:]
            if line.split()[0].isdigit()
        ]
        return cls(lines[0], rows, lines[2 + len(rows) :])


def workload(row: dict[str, str]) -> str:
    """ "resnet18-mnist", from the cell's name."""
    found = re.search(r"([a-z0-9]+-(mnist|cifar10|imagenet|highres))", row["cell"])
    assert found is not None, row
    return found.group(1)


def dry_run(*overrides: str) -> Listing:
    """`python -m harness overrides --dry-run`, in this process (no interpreter start-up)."""
    out = io.StringIO()
    with contextlib.redirect_stdout(out), pytest.raises(SystemExit) as ended:
        check_hydra_main([*overrides, "--dry-run"])
    assert ended.value.code == 0, out.getvalue()
    return Listing.parse(out.getvalue())


def cuda_here() -> bool:
    import torch

    return torch.cuda.is_available()


@pytest.fixture(scope="module")
def flagship(tmp_path_factory: pytest.TempPathFactory) -> tuple[Listing, Path]:
    root = tmp_path_factory.mktemp("flagship") / "outputs"
    return dry_run("+sweep=imagenet_resnet", f"run.output_dir={root}"), root


def test_the_flagship_sweep_is_the_thesis_grid(flagship: tuple[Listing, Path]) -> None:
    """ImageNet x ResNet-18/50/152 x every model at 1, 2, 4 GPUs of a node then 2 and 4
    nodes, at Table 3.3's batch sizes (it used to be 3 sequential cells)."""
    listing, root = flagship
    assert listing.header.startswith(
        "python -m harness +sweep=imagenet_resnet "
        f"run.output_dir={root}: {3 * len(THESIS_CELLS)} cells"
    )
    expected = [
        (network, *cell)
        for network in ("resnet18", "resnet50", "resnet152")
        for cell in THESIS_CELLS
    ]
    assert [
        (
            workload(row).removesuffix("-imagenet"),
            row["distribution"],
            int(row["workers"]),
            int(row["nodes"]),
        )
        for row in listing.rows
    ] == expected
    assert [int(row["#"]) for row in listing.rows] == list(range(3 * len(THESIS_CELLS)))
    for row in listing.rows:
        assert row["device"] == "cuda"
        gpipe = row["distribution"] == "gpipe"
        assert int(row["batch"]) == (
            TABLE_3_3["imagenet"].batch_size if gpipe else default_batch_size("imagenet")
        )
        assert row["micro-batches"] == (str(TABLE_3_3["imagenet"].micro_batches) if gpipe else "-")
    assert not root.exists()  # nothing written: no output dir, no mlflow.db


def test_the_dry_run_lists_cuda_cells_on_a_machine_without_cuda(
    flagship: tuple[Listing, Path],
) -> None:
    """The point of a dry run: a cluster's grid listed where it cannot run, with why (the
    sweep itself stops before its first cell here: test_bad_input)."""
    if cuda_here():
        pytest.skip("this machine has CUDA: the cells can run here")
    listing, _ = flagship
    assert {row["can run"] for row in listing.rows} == {"no"}
    assert any(
        note.startswith(
            "cannot run every cell: hardware.device='cuda' is invalid: torch sees no CUDA device"
        )
        for note in listing.notes
    )
    assert "no prediction for every cell: no analysis in" in "\n".join(listing.notes)


def test_the_thesis_grid_is_the_flagship_for_every_dataset_and_network(tmp_path: Path) -> None:
    grid = compose_config(["+sweep=thesis_grid"], with_hydra=True)
    flagship = compose_config(["+sweep=imagenet_resnet"], with_hydra=True)
    assert grid.hydra.sweeper.params["dataset"] == "mnist,cifar10,imagenet,highres"
    assert set(grid.hydra.sweeper.params["network"].split(",")) == {
        "resnet18",
        "resnet50",
        "resnet152",
        "vgg11",
        "vgg16",
        "mobilenetv2",
    }
    for key in ("+sweep/scaling", "hardware"):
        assert grid.hydra.sweeper.params[key] == flagship.hydra.sweeper.params[key]
    # One experiment: the cells they share have one cell key, so neither measures them twice.
    assert grid.tracking.experiment == flagship.tracking.experiment == "thesis"
    shared = [
        "dataset=imagenet",
        "network=resnet50",
        "+sweep/scaling=ddp_2x4",
        "hardware=titanrtx_cluster",
    ]
    assert cell_key(compose_config(["+sweep=thesis_grid", *shared])) == cell_key(
        compose_config(["+sweep=imagenet_resnet", *shared])
    )
    # A slice of it on another row of Table 3.3, and the network with the fewest layers.
    listing = dry_run(
        "+sweep=thesis_grid",
        "dataset=mnist",
        "network=resnet18",
        f"run.output_dir={tmp_path / 'outputs'}",
    )
    assert [
        (row["distribution"], int(row["workers"]), int(row["nodes"])) for row in listing.rows
    ] == THESIS_CELLS
    assert {
        (row["distribution"], row["batch"], row["micro-batches"])
        for row in listing.rows
        if row["distribution"] in ("gpipe", "ddp")
    } == {("gpipe", "3072", "24"), ("ddp", "128", "-")}


def test_a_dry_run_of_a_local_sweep_lists_its_cells_and_writes_nothing(tmp_path: Path) -> None:
    """As a user types it: exit status 0, the cells, no output dir, no .hydra, no mlflow.db."""
    done = run_module(
        "harness",
        ["+sweep=smoke", "--dry-run", f"run.output_dir={tmp_path / 'outputs'}"],
        cwd=tmp_path,
        timeout=180,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    listing = Listing.parse(done.stdout)
    assert ": 4 cells, launcher serial_local" in listing.header
    assert [
        (workload(row), row["distribution"], row["workers"], row["batch"]) for row in listing.rows
    ] == [
        ("resnet18-mnist", "sequential", "1", "128"),
        ("mobilenetv2-mnist", "sequential", "1", "128"),
        ("resnet18-cifar10", "sequential", "1", "64"),
        ("mobilenetv2-cifar10", "sequential", "1", "64"),
    ]
    assert "can run" not in listing.rows[0]  # every cell can run here: no column for it
    assert listing.notes == [
        f"no prediction for every cell: no analysis in "
        f"{tmp_path / 'outputs'}/analysis fitted hardware=local_cpu"
    ]
    assert list(tmp_path.iterdir()) == []


def _fitted(
    root: Path,
    hardware: str,
    params: dict[str, float],
    *,
    device: str,
    threads: int | None,
    batches: tuple[int, ...],
    seconds: float,
    machines: tuple[str, ...] = (),
    step_machine: str | None = None,
) -> Path:
    """A fit of `hardware` under `root` (3 cells, `params`, run on `machines`) and
    ResNet-18/MNIST's step time at `batches` (measured on `step_machine`), as an analysis and
    a probe leave them; the fit's path."""
    from harness.predict.facts.store import FactsStore, facts_path

    fit = root / "analysis" / "calibrated" / "fit.json"
    fit.parent.mkdir(parents=True)
    fit.write_text(
        json.dumps(
            {
                "hardware": {
                    hardware: {
                        "params": params,
                        "runtime_mb": 0.0,
                        "cells": 3,
                        "machines": list(machines),
                    }
                }
            }
        )
    )
    store = FactsStore.load(facts_path(root, hardware), hardware)
    for batch in batches:
        store.record_step(
            network="resnet18",
            dataset="mnist",
            device=device,
            threads=threads,
            batch=batch,
            seconds=seconds,
            device_name=step_machine,
        )
    store.save()
    return fit


def test_a_dry_run_predicts_each_cell_and_the_sweep_from_the_hardware_fit(tmp_path: Path) -> None:
    """With a fit of the hardware and a step time measured earlier, each cell's seconds per
    epoch and the sweep's total (x epochs x repeats); nothing is timed or written."""
    root = tmp_path / "outputs"
    fit = _fitted(
        root,
        "local_2cpu",
        {"contention": 1.5, "communication": 2.0},
        device="cpu",
        threads=1,
        batches=(128,),
        seconds=0.25,
    )
    before = sorted(root.rglob("*"))
    listing = dry_run(
        "-m",
        "distribution=sequential,ddp,pipedream",
        "hardware=local_2cpu",
        "dataset.num_samples=512",
        "run.epochs=2",
        f"run.output_dir={root}",
    )
    seconds = {row["distribution"]: row["s/epoch"] for row in listing.rows}
    assert seconds["sequential"] == "1.000"  # 4 batches of 128 x 0.25 s, no parameter
    # 2 batches per worker x 0.25 s x contention 1.5, and the allreduces
    assert float(seconds["ddp"]) > 0.75
    assert seconds["pipedream"] == "-"  # no layer profile kept, and none is taken
    assert (
        f"s/epoch predicted with {fit} (hardware=local_2cpu, 3 cells; networks not "
        f"recorded; models not recorded)" in listing.notes
    )
    assert any(
        note.startswith("no prediction for cell 2: pipelines: no layer profile")
        for note in listing.notes
    )
    total = (1.0 + float(seconds["ddp"])) * 2
    assert (
        f"predicted training time: {total:.1f} s for 2 of 3 cells (2 epochs x 1 repeat "
        f"each; warm-up, start-up and data generation not included)"
    ) in listing.notes
    assert sorted(root.rglob("*")) == before  # no mlflow.db, no facts measured


def test_a_dry_run_names_step_times_measured_on_another_machine_than_the_fits_cells(
    tmp_path: Path,
) -> None:
    """A dry run reads whatever facts were kept: where its step times were measured on another
    machine than the fit's cells (this VM's hosts all read "AMD EPYC", 3-5x apart), it says so
    under the predictions, as the recommender does, with the commands that fit this machine."""
    from harness.analysis.calibration import calibrate_commands
    from harness.commands.compose import compose_config
    from harness.config.schema import validate

    root = tmp_path / "outputs"
    fit = _fitted(
        root,
        "local_2cpu",
        {"contention": 1.5, "communication": 2.0},
        device="cpu",
        threads=1,
        batches=(128,),
        seconds=0.25,
        machines=("AMD EPYC (AVX512)",),
        step_machine="AMD EPYC (AVX2)",
    )
    listing = dry_run(
        "-m",
        "distribution=sequential,ddp",
        "hardware=local_2cpu",
        "dataset.num_samples=512",
        f"run.output_dir={root}",
    )
    assert {row["s/epoch"] for row in listing.rows} != {"-"}  # predicted all the same
    hardware = validate(compose_config(["hardware=local_2cpu"])).hardware
    assert (
        f"machine changed since the fit: its cells ran on AMD EPYC (AVX512), the step "
        f"times used on another (resnet18/mnist, batch 128 on AMD EPYC (AVX2)); its "
        f"parameters were learnt at the former's speed: {calibrate_commands(hardware)} on "
        f"this machine fit them for it (the fit: {fit})"
    ) in listing.notes
    # The same machine, or a fit that does not name its machines: no line.
    for machines in (("AMD EPYC (AVX2)",), ()):
        again = tmp_path / f"again{len(machines)}"
        _fitted(
            again,
            "local_2cpu",
            {"contention": 1.5, "communication": 2.0},
            device="cpu",
            threads=1,
            batches=(128,),
            seconds=0.25,
            machines=machines,
            step_machine="AMD EPYC (AVX2)",
        )
        listing = dry_run(
            "-m",
            "distribution=sequential,ddp",
            "hardware=local_2cpu",
            "dataset.num_samples=512",
            f"run.output_dir={again}",
        )
        assert not any(note.startswith("machine changed") for note in listing.notes)


def test_a_dry_run_takes_no_layer_profile_for_collectives_that_hide_behind_the_compute(
    tmp_path: Path,
) -> None:
    """A GPU's DDP cell is predicted from a profile of its network's layers (what its buckets
    hide behind), as a pipeline's is: with none kept, the dry run says so and trains no layer
    here (it once profiled the network on this CPU for every such cell)."""
    root = tmp_path / "outputs"
    _fitted(
        root,
        "titanrtx_cluster",
        {"contention": 1.0, "communication": 1.0},
        device="cuda",
        threads=None,
        batches=(128, 256),
        seconds=0.01,
    )
    listing = dry_run(
        "-m",
        "distribution=sequential,ddp",
        "hardware=titanrtx_cluster",
        "hardware.nodes=1",
        "hardware.workers_per_node=2",
        "network=resnet18",
        "dataset=mnist",
        "distribution.batch_size=128",
        f"run.output_dir={root}",
    )
    seconds = {row["distribution"]: row["s/epoch"] for row in listing.rows}
    assert seconds["ddp"] == "-" and seconds["sequential"] != "-"
    assert any(
        note.startswith(
            "no prediction for cell 1: collectives beside the compute: no "
            "layer profile of resnet18/mnist"
        )
        for note in listing.notes
    )


def test_cfg_of_a_sweep_says_it_shows_the_base_config(capsys: pytest.CaptureFixture[str]) -> None:
    check_hydra_main(["+sweep=smoke", "--cfg", "job"])  # then Hydra prints the config
    assert capsys.readouterr().err == (
        "distbench: --cfg job shows the sweep's base config, "
        "without any cell's overrides; --dry-run lists the "
        "cells\n"
    )
    check_hydra_main(["--cfg", "job"])  # a single run: its config is the run's
    assert capsys.readouterr().err == ""
    with pytest.raises(ConfigError, match="--dry-run is invalid with --cfg"):
        check_hydra_main(["+sweep=smoke", "--cfg", "job", "--dry-run"])


def test_the_scaling_options_are_the_cells_of_the_flagship() -> None:
    """sweep/scaling holds exactly the options the flagship lists (none left out of it)."""

    listed = OmegaConf.load(CONF_DIR / "sweep" / "imagenet_resnet.yaml").hydra.sweeper.params[
        "+sweep/scaling"
    ]
    assert listed == "glob(*)"
    # The thesis' 16: every model of the thesis at 1x2, 1x4, 2x4, 4x4 (GPipe: 8 workers at
    # most, ResNet-18 has 15 layers), and the baseline.
    thesis = [
        ("sequential", 1, 1),
        *[
            (model, workers, nodes)
            for model in ("horovod", "ddp", "gpipe", "pipedream")
            for workers, nodes in ((2, 1), (4, 1), (8, 2), (16, 4))
            if not (model == "gpipe" and workers == 16)
        ],
    ]
    assert set(thesis) <= set(THESIS_CELLS)
