"""Results that know their noise: every cell records how steady the machine was while it ran; a
disturbed cell is flagged in its record, the sweep table and MLflow, and can be measured again; the
analysis states the noise floor beside every error; the recommender calls options tied within the
models' error and the noise, and says how it broke the tie."""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st
from mlflow.tracking import MlflowClient

from harness.analysis.grid import MeasuredCell
from harness.analysis.noise import EXPECTED_DIFFERENCE_PER_STD, noise_floor
from harness.commands.compose import compose_config
from harness.config.schema import validate
from harness.measure.steadiness import (
    UNSTEADY_FOOTNOTE,
    Steadiness,
    memory_reference_seconds,
    reference_seconds,
    unsteady_note,
)
from harness.predict.ties import break_tie, memory_margin_percent, tie_with_fastest
from harness.recommend import Option, overlapping, verdict_lines
from harness.records.mlflow_store import DEFAULT_STORE_FILE
from launchers.cells import summary_table
from tests.helpers import run_module

TINY = [
    "dataset=mnist",
    "network=mobilenetv2",
    "distribution.batch_size=8",
    "run.warmup_batches=1",
    "run.progress=false",
    "run.eval=false",
]


def test_drift_or_spread_beyond_the_threshold_makes_a_cell_unsteady() -> None:
    steady = Steadiness([0.010, 0.011], [0.0104, 0.0112], [[2.0, 2.05, 1.98]], threshold=0.10)
    assert steady.steady and steady.reasons == []
    assert steady.metrics()["steady"] == 1.0
    assert steady.drift == pytest.approx(0.04)
    slowed = Steadiness([0.010], [0.0125], [[2.0, 2.05]], threshold=0.10)
    assert not slowed.steady
    assert slowed.reasons == ["the reference kernel ran 25% slower after the cell than before it"]
    varied = Steadiness([0.010], [0.010], [[2.0, 3.0, 2.0]], threshold=0.10)
    assert varied.reasons == ["its epochs varied by 25% (coefficient of variation)"]
    assert varied.text().startswith("unsteady: its epochs varied by 25%")
    one_epoch = Steadiness([0.010], [0.010], [[2.0]], threshold=0.10)
    assert one_epoch.epoch_cv is None and one_epoch.steady


def test_a_cells_summary_says_it_was_unsteady_and_why() -> None:
    slowed = Steadiness([0.010], [0.0175], [[2.0]], threshold=0.10)
    note = unsteady_note(slowed.metrics(), slowed.text())
    assert note == (
        "; UNSTEADY (~ in tables): the reference kernel ran 75% slower after the cell than "
        "before it; measure it again on a quiet machine (a sweep: "
        "hydra.launcher.remeasure_unsteady=true)"
    )
    steady = Steadiness([0.010], [0.0101], [[2.0]], threshold=0.10)
    assert unsteady_note(steady.metrics(), steady.text()) == ""
    assert unsteady_note({}, None) == ""  # recorded before steadiness was measured


def test_the_memory_bound_kernel_is_recorded_not_judged() -> None:
    """The streaming kernel's snapshot before and after a cell moved by up to 18 % around cells
    whose epochs held within 4 %: it is recorded beside the products, and flags nothing."""
    held = Steadiness(
        [0.027],
        [0.027],
        [[2.0, 2.0]],
        threshold=0.10,
        memory_before=[0.029, 0.028],
        memory_after=[0.030, 0.0385],
    )
    assert held.drift == 0.0 and held.memory_drift == pytest.approx(0.375)
    assert held.steady and held.reasons == []
    metrics = held.metrics()
    assert metrics["memory_kernel_ms_after"] == pytest.approx(38.5)
    assert metrics["memory_kernel_drift"] == pytest.approx(0.375) and metrics["steady"] == 1.0
    assert "memory-bound kernel +37.5%" in held.text()
    # a cell recorded without it (a result of before): nothing said
    untimed = Steadiness([0.027], [0.027], [[2.0, 2.0]], threshold=0.10)
    assert untimed.steady and "memory_kernel_drift" not in untimed.metrics()
    assert "memory-bound" not in untimed.text()


def test_the_reference_kernels_are_timed_on_the_device() -> None:
    assert reference_seconds("cpu") > 0
    assert memory_reference_seconds("cpu") > 0


def test_the_sweep_table_marks_an_unsteady_cell_and_says_why() -> None:
    metrics = {
        "seconds_per_epoch": 2.5,
        "images_per_second": 100.0,
        "peak_memory_mb": 900.0,
        "repeats": 1.0,
    }
    rows = [
        {"run_name": "ddp 1x2 b8", "status": "ok", "metrics": {**metrics, "steady": 1.0}},
        {
            "run_name": "gpipe 1x2 b8",
            "status": "ok",
            "metrics": {**metrics, "steady": 0.0},
            "environment": {
                "steadiness": "unsteady: its epochs varied by 30% (coefficient of variation)"
            },
        },
    ]
    table = summary_table(rows).splitlines()
    assert "2.500~" not in table[1] and "2.500~" in table[2]
    assert table[3].strip().startswith("unsteady: its epochs varied by 30%")
    assert table[-1] == UNSTEADY_FOOTNOTE


# A competing process: it waits (SIGUSR1 blocked, so that the signal cannot end it) until the
# test signals it, then keeps a core busy until it is killed.
_BURNER = """
import signal
signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGUSR1})
print("ready", flush=True)
signal.sigwait({signal.SIGUSR1})
while True:
    pass
"""


@pytest.mark.slow
def test_a_cell_disturbed_mid_run_is_flagged_unsteady(output_root: Path) -> None:
    """A competing process started on every core after the cell's first epoch, ended once
    the cell has timed its reference kernel again (so that its recording runs at full speed):
    the cell is recorded ok but unsteady, with the reason, in result.json and MLflow.

    The competitors are started beside the cell, idle, and set spinning at the moment the
    epoch ends: a short cell (two batches an epoch) is disturbed from that moment on, with no
    interpreter's start-up between the epoch line and the disturbance."""
    burners = [
        subprocess.Popen([sys.executable, "-c", _BURNER], stdout=subprocess.PIPE, text=True)
        for _ in range(2 * (os.cpu_count() or 1))
    ]
    disturbed = False
    cell = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "harness",
            *TINY,
            "dataset.num_samples=16",
            "run.epochs=3",
            f"run.output_dir={output_root}",
        ],
        cwd=output_root.parent,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=dict(os.environ, PYTHONUNBUFFERED="1"),
    )
    try:
        assert cell.stdout is not None
        for line in cell.stdout:
            if "epoch 2/" in line and not disturbed:  # the first timed epoch is over
                for burner in burners:  # each is waiting for the signal (it said so)
                    assert burner.stdout is not None and burner.stdout.readline() == "ready\n"
                    burner.send_signal(signal.SIGUSR1)
                disturbed = True
            if "recording the cell" in line:  # timed after the reference kernel's last trial
                break
        for burner in burners:
            burner.kill()
        rest, _ = cell.communicate(timeout=600)
    finally:
        for burner in burners:
            burner.kill()
            burner.communicate()
        cell.kill()
    assert disturbed, "the cell never reached its second epoch"
    (path,) = (output_root / "runs").glob("*/result.json")
    result = json.loads(path.read_text())
    assert result["status"] == "ok", result["error"]
    assert result["metrics"]["steady"] == 0.0, result["environment"]["steadiness"]
    assert result["environment"]["steadiness"].startswith("unsteady: ")
    # ... and said so in the cell's one-line summary, with why and what to do
    (summary,) = [line for line in rest.splitlines() if " s/epoch" in line]
    why = result["environment"]["steadiness"].removeprefix("unsteady: ").split(" (reference")[0]
    assert f"; UNSTEADY (~ in tables): {why}; measure it again on a quiet machine" in summary
    for kernel in ("reference_kernel", "memory_kernel"):  # both witnesses timed around it
        assert result["metrics"][f"{kernel}_ms_before"] > 0
        assert result["metrics"][f"{kernel}_ms_after"] > 0
    client = MlflowClient(f"sqlite:///{output_root / DEFAULT_STORE_FILE}")
    run = client.get_run(result["mlflow_run_id"])
    assert run.data.metrics["steady"] == 0.0
    assert run.data.tags["steadiness"].startswith("unsteady: ")


@pytest.mark.slow
def test_a_rerun_measures_unsteady_cells_again_only_when_asked(output_root: Path) -> None:
    """A threshold no real machine meets makes the cell unsteady every time: a plain re-run
    reuses it, hydra.launcher.remeasure_unsteady=true measures it again."""
    sweep = [
        "-m",
        *TINY,
        "dataset.num_samples=16",
        "run.epochs=2",
        "run.steadiness_threshold=1e-9",
        f"run.output_dir={output_root}",
    ]
    # Asked on the first run, the setting says that it acts on the next.
    first = run_module(
        "harness", [*sweep, "hydra.launcher.remeasure_unsteady=true"], cwd=output_root.parent
    )
    assert first.returncode == 0, first.stderr[-3000:]
    assert "~" in first.stdout and UNSTEADY_FOOTNOTE in first.stdout
    assert "no cell of this sweep was measured earlier" in first.stdout, first.stdout
    again = run_module("harness", sweep, cwd=output_root.parent)
    assert "already measured, nothing to run" in again.stdout, again.stdout
    remeasured = run_module(
        "harness", [*sweep, "hydra.launcher.remeasure_unsteady=true"], cwd=output_root.parent
    )
    assert remeasured.returncode == 0, remeasured.stderr[-3000:]
    assert (
        "1 cell(s) measured earlier while the machine was unsteady run again" in remeasured.stdout
    )
    assert len(list((output_root / "sweeps").glob("*/*/*/result.json"))) == 2
    # A random sample of the finished cells (here the one) is measured again when asked.
    sampled = run_module(
        "harness", [*sweep, "hydra.launcher.remeasure_sample=1"], cwd=output_root.parent
    )
    assert sampled.returncode == 0, sampled.stderr[-3000:]
    assert (
        "1 cell(s) finished earlier, chosen at random (hydra.launcher.remeasure_sample=1, "
        "remeasure_seed=0), run again: 0 (" in sampled.stdout
    ), sampled.stdout
    assert len(list((output_root / "sweeps").glob("*/*/*/result.json"))) == 3


@dataclass(frozen=True)
class _Named:
    run_name: str


@dataclass(frozen=True)
class _Prepared:
    job_num: int
    cell: _Named


def test_a_random_sample_of_finished_cells_is_chosen_by_its_seed(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """The same seed and results choose the same cells, another seed others; never more than
    finished, never one that did not finish; each chosen cell leaves the reused ones."""
    from launchers.cells import remeasured_at_random

    prepared = [_Prepared(number, _Named(f"cell {number}")) for number in range(20)]

    def finished() -> dict[int, dict]:
        return {index: {"status": "ok"} for index in range(0, 20, 2)}  # 10 of 20 finished

    chosen = {
        seed: remeasured_at_random(prepared, finished(), 4, seed)  # type: ignore[arg-type]
        for seed in (0, 0, 1)
    }
    assert len(chosen) == 2 and all(len(cells) == 4 for cells in chosen.values())
    assert chosen[0] <= set(finished()) and chosen[0] != chosen[1]
    assert remeasured_at_random(prepared, finished(), 4, 0) == chosen[0]  # type: ignore[arg-type]
    done = finished()
    assert remeasured_at_random(prepared, done, 50, 7) == set(range(0, 20, 2))  # type: ignore[arg-type]
    assert done == {}
    assert remeasured_at_random(prepared, finished(), 0, 7) == set()  # type: ignore[arg-type]
    assert (
        "10 cell(s) finished earlier, chosen at random (hydra.launcher.remeasure_sample=50, "
        "remeasure_seed=7), run again: 0 (cell 0), 2 (cell 2)" in capsys.readouterr().out
    )


def _cell(
    seconds: float,
    *,
    key: str,
    repeat_std: float | None = None,
    model: str = "ddp",
    steady: bool = True,
) -> MeasuredCell:
    config = validate(compose_config([f"distribution={model}", "hardware=local_2cpu"]))
    return MeasuredCell(
        f"run-{key}-{seconds}",
        key,
        config,
        seconds,
        100.0,
        steady=steady,
        repeat_std=repeat_std,
        cell_key=key,
    )


def test_the_noise_floor_comes_from_repeats_and_from_cells_measured_twice() -> None:
    repeated = _cell(10.0, key="a", repeat_std=0.2)  # 2 % std: 2.26 % expected difference
    twice = [_cell(4.0, key="b"), _cell(4.4, key="b")]  # 0.4 s apart: 9.5 %
    once = _cell(3.0, key="c")  # measured once, one repeat: no noise figure
    floor = noise_floor([repeated, *twice, once])
    assert floor.cells == 2
    expected = sorted([EXPECTED_DIFFERENCE_PER_STD * 2.0, 0.4 / 4.2 * 100])
    assert floor.percent == pytest.approx(sum(expected) / 2)
    assert not noise_floor([once]).measured and math.isnan(noise_floor([once]).percent)
    # Each kind apart: back-to-back repeats share the machine's state, separate runs do not.
    assert (floor.repeats.cells, floor.runs.cells) == (1, 1)
    assert floor.repeats.percent == pytest.approx(EXPECTED_DIFFERENCE_PER_STD * 2.0)
    assert floor.runs.percent == pytest.approx(0.4 / 4.2 * 100)
    assert (
        "between repeats of one run 2.3 % (1 cell(s)), between runs 9.5 % (1 cell(s))"
        in floor.text()
    )
    # A cell measured in two runs, each with repeats: one figure of each kind, both averaged.
    both = [_cell(4.0, key="d", repeat_std=0.04), _cell(4.4, key="d", repeat_std=0.044)]
    floor = noise_floor(both)
    assert floor.repeats.percent == pytest.approx(EXPECTED_DIFFERENCE_PER_STD * 1.0)
    assert floor.runs.percent == pytest.approx(0.4 / 4.2 * 100)
    assert floor.percent == pytest.approx((2 * EXPECTED_DIFFERENCE_PER_STD + 0.4 / 4.2 * 100) / 3)
    assert "between runs not measured" in noise_floor([repeated]).text()


@dataclass(frozen=True)
class _Option:
    label: str
    workers: int
    seconds_per_epoch: float
    memory_mb: float
    cost_per_epoch: float | None = None
    calibrated: bool = True
    error_percent: float | None = 3.0
    memory_error_percent: float | None = None


def test_the_floor_between_runs_leaves_out_a_run_measured_while_the_machine_was_unsteady() -> None:
    """A cell re-measured because its first run was unsteady was chosen for being noisy: its
    two runs say nothing of the noise between steady runs."""
    flagged = [_cell(4.0, key="a", steady=False), _cell(5.0, key="a")]
    steady = [_cell(4.0, key="b"), _cell(4.2, key="b")]
    floor = noise_floor([*flagged, *steady])
    assert floor.runs.cells == 1
    assert floor.runs.percent == pytest.approx(0.2 / 4.1 * 100)


@pytest.mark.parametrize(
    ("runs", "expected"),
    [
        ({"percent": 4.0, "cells": 5}, (4.0, "between runs (5 cells)")),
        ({"percent": 30.0, "cells": 2}, (1.0, "between any two measurements")),  # too few cells
        ({"percent": None, "cells": 0}, (1.0, "between any two measurements")),
    ],
)
def test_ties_use_the_noise_between_runs_where_enough_cells_measured_it(
    tmp_path: Path, runs: dict, expected: tuple[float, str]
) -> None:
    """A recommendation is compared with another run: its ties take the floor between runs
    (fit.json's noise_floor_by_kind) where five cells or more measured it."""
    from harness.analysis.calibration import Fitted

    fit = tmp_path / "fit.json"
    fit.write_text(
        json.dumps(
            {
                "hardware": {"local_2cpu": {"params": {}, "runtime_mb": 0.0, "cells": 8}},
                "noise_floor_percent": {"all": 1.0},
                "noise_floor_by_kind": {
                    "all": {"repeats": {"percent": 0.9, "cells": 8}, "runs": runs}
                },
            }
        )
    )
    fitted = Fitted.load(fit, "local_2cpu")
    assert (fitted.noise_percent, fitted.noise_kind) == expected
    assert fitted.noise_text == f"{expected[0]:.1f} % {expected[1]}"


def test_options_within_the_error_and_noise_are_tied_and_fewer_workers_win() -> None:
    options = [
        _Option("ddp x4", 4, 10.0, 800),
        _Option("ddp x2", 2, 10.3, 900),
        _Option("gpipe x2", 2, 10.4, 700),
        _Option("sequential", 1, 14.0, 600),
    ]
    found = tie_with_fastest(options, noise_percent=2.0)
    assert found is not None
    assert [o.label for o in found.tied] == ["ddp x4", "ddp x2", "gpipe x2"]
    # Two of them have 2 workers; of those, the one with less memory per worker.
    assert (found.chosen.label, found.decided_by) == ("gpipe x2", "less memory per worker")
    assert found.margin_percent == pytest.approx(math.sqrt(3**2 + 3**2 + 2 * 2**2))
    assert "tied within the models' error and the measurement noise" in found.line()
    assert "(up to 5.1 %; noise 2.0 % between runs (6 cells)): ddp x4" in found.line(
        "2.0 % between runs (6 cells)"
    )


def test_a_clear_winner_or_an_uncalibrated_one_is_no_tie() -> None:
    apart = [_Option("ddp x2", 2, 10.0, 800), _Option("gpipe x2", 2, 12.0, 700)]
    assert tie_with_fastest(apart, noise_percent=2.0) is None
    uncalibrated = [
        _Option("ddp x2", 2, 10.0, 800, calibrated=False, error_percent=None),
        _Option("gpipe x2", 2, 10.1, 700, calibrated=False, error_percent=None),
    ]
    assert tie_with_fastest(uncalibrated, noise_percent=2.0) is None


def _uncalibrated(label: str, workers: int, seconds: float) -> Option:
    """An option before any fit: its range the raw equations' factor of 3 either way."""
    return Option(
        label=label,
        distribution=label.split()[0],
        workers=workers,
        seconds_per_epoch=seconds,
        seconds_low=seconds / 3,
        seconds_high=seconds * 3,
        memory_mb=500.0,
        fits_memory=None,
        cost_per_epoch=None,
        overrides=[f"distribution={label.split()[0]}"],
        own_overrides=[],
        batch_size=8,
        settings={},
        stages=None,
        balance=None,
    )


def test_before_calibration_overlapping_ranges_are_said_not_told_apart() -> None:
    """ddp x2 0.028 (0.009-0.087) beside sequential 0.054 (0.018-0.162): no bare
    "recommended", but which options the prediction cannot order and what would."""
    options = [
        _uncalibrated("ddp x2", 2, 0.028),
        _uncalibrated("pipedream 2", 2, 0.029),
        _uncalibrated("sequential", 1, 0.054),
        _uncalibrated("gpipe x2", 2, 0.5),  # its range starts above the fastest's end
    ]
    lines = verdict_lines(options, "time")
    (apart,) = [line for line in lines if line.startswith("not told apart: ")]
    assert "ddp x2 0.028 s (0.009-0.084), pipedream 2 0.029 s" in apart
    assert "sequential 0.054 s" in apart and "gpipe" not in apart
    assert "a fit of this hardware's cells" in apart and "run.epochs=1" in apart
    assert lines[-1].startswith(
        "recommended: ddp x2 (by time, uncalibrated; not told apart from 2 other(s)): "
    )
    assert overlapping(options[:1] + options[3:], "time") == []  # ranges apart: nothing said


def test_less_memory_breaks_a_tie_only_beyond_the_memory_models_error() -> None:
    """PipeDream `1-1` predicted 4 % below DDP's memory, its memory model 11.7 % off on an
    unseen network and DDP's 4.8 %: that is no difference the predictions can tell, so the
    tie goes on to cost, then the shortest predicted time; 30 % less is one."""
    ddp = _Option("ddp x2", 2, 10.0, 1000, memory_error_percent=4.8)
    pipedream = _Option("pipedream x2 st1-1", 2, 10.2, 960, memory_error_percent=11.7)
    assert memory_margin_percent(ddp, pipedream) == pytest.approx(math.hypot(4.8, 11.7))
    assert break_tie([ddp, pipedream]) == (
        ddp,
        "the shortest predicted time (the tie-breaks left them equal)",
    )
    lean = _Option("pipedream x2 st1-1", 2, 10.2, 700, memory_error_percent=11.7)
    assert break_tie([ddp, lean]) == (lean, "less memory per worker")
    found = tie_with_fastest([ddp, lean], noise_percent=1.0)
    assert found is not None and found.line().endswith(
        "taking pipedream x2 st1-1, the one with less memory per worker (700 MB against ddp "
        "x2's 1000 MB, 30 % less; the memory models' error 12.6 %)"
    )
    # within the memory models' error, the cheaper of the two
    priced = [
        _Option("a", 2, 10.0, 1000, cost_per_epoch=0.02, memory_error_percent=5.0),
        _Option("b", 2, 10.1, 980, cost_per_epoch=0.01, memory_error_percent=5.0),
    ]
    assert break_tie(priced) == (priced[1], "lower cost")


@given(
    st.lists(
        st.tuples(st.integers(1, 8), st.floats(1.0, 1e5), st.floats(0.0, 50.0)),
        min_size=1,
        max_size=6,
    )
)
def test_a_tie_is_broken_in_favour_of_an_option_no_other_beats_for_certain(
    drawn: list[tuple[int, float, float]],
) -> None:
    """Whatever the options, the one chosen has the fewest workers, and the least memory of
    those within the two memory models' error."""
    options = [
        _Option(f"o{i}", workers, 10.0 + i / 100, memory, memory_error_percent=error)
        for i, (workers, memory, error) in enumerate(drawn)
    ]
    chosen, _ = break_tie(options)
    assert chosen.workers == min(option.workers for option in options)
    least = min(
        (option for option in options if option.workers == chosen.workers),
        key=lambda option: option.memory_mb,
    )
    margin = max(least.memory_mb * memory_margin_percent(chosen, least) / 100, 0.5)
    assert chosen.memory_mb - least.memory_mb <= margin


def test_a_tie_of_equal_workers_and_memory_goes_to_the_cheaper() -> None:
    tied = [
        _Option("a", 2, 10.0, 800, cost_per_epoch=0.02),
        _Option("b", 2, 10.1, 800, cost_per_epoch=0.01),
    ]
    assert break_tie(tied)[0].label == "b"
    assert break_tie(tied)[1] == "lower cost"
