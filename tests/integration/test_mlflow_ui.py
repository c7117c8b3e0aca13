"""The MLflow UI as a user sees it: a real 2-cell sweep, `mlflow server` on its store (bound to
127.0.0.1), and headless Chromium (Debian's, installed by scripts/browser.sh, driven by the
playwright package) opening the link the sweep printed and comparing the two cells.

What is checked is what a person reads: the cells' names, their seconds per epoch, images/s,
peak memory and Duration (the training's wall time) in the runs table without a click, the
sweep's summary on its parent run's page, the same figures in the compare view.

Screenshots (mlflow-ui-{runs,sweep,compare}.png) go to $DISTBENCH_UI_SCREENSHOTS, else to
mlflow-ui/ under pytest's base temporary directory; the test prints where.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from decimal import ROUND_HALF_UP, Decimal
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

from harness.records.mlflow_store import DEFAULT_STORE_FILE, DEFAULT_UI_URL
from tests.helpers import REPO_ROOT, run_module
from tests.helpers import mlflow_server as running_mlflow_server

BROWSER_SCRIPT = REPO_ROOT / "scripts" / "browser.sh"
SCREENSHOTS_ENV = "DISTBENCH_UI_SCREENSHOTS"
# Headless on a machine without a display, a GPU or a user namespace sandbox (root in a
# container), and with nothing fetched from the network behind the test's back.
CHROMIUM_FLAGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]
UI_WAIT_MS = 60_000
# Wide enough for the key columns beside MLflow 3.17's assistant panel.
VIEWPORT = {"width": 2200, "height": 1000}
# Two cells that differ in the batch only: their names must tell them apart.
TINY_SWEEP = [
    "+sweep=smoke",
    "dataset=mnist",
    "network=mobilenetv2",
    "distribution.batch_size=8,16",
    "dataset.num_samples=16",
    "run.epochs=1",
    "run.warmup_batches=0",
    "run.progress=false",
]
NAMES = ("sequential 1x1 b16 mobilenetv2-mnist", "sequential 1x1 b8 mobilenetv2-mnist")
LINK = re.compile(re.escape(DEFAULT_UI_URL) + r"(/#/experiments/\S+)")


@dataclass(frozen=True)
class Cell:
    """A cell's run as the store holds it: what the UI must show."""

    run_id: str
    name: str
    seconds_per_epoch: float
    images_per_second: float
    peak_memory_mb: float
    duration_ms: int  # end_time - start_time
    steady: float  # 1: measured on a steady machine, 0: not (harness.measure.steadiness)


@dataclass(frozen=True)
class Sweep:
    experiment_id: str
    parent_run_id: str
    cells: list[Cell]
    link: str  # the path the sweep printed, to open on the server's address


@pytest.fixture(scope="module")
def chromium() -> str:
    """The browser's path, installed with scripts/browser.sh where it is missing (as the
    SLURM tests install SLURM)."""
    pytest.importorskip("playwright.sync_api")
    path = subprocess.run(
        ["bash", str(BROWSER_SCRIPT), "path"], capture_output=True, text=True, check=True
    ).stdout.strip()
    if not os.access(path, os.X_OK):
        if os.geteuid() != 0 or shutil.which("apt-get") is None:
            pytest.skip(
                "chromium is not installed and this machine cannot install it (needs "
                "root and apt-get)"
            )
        installed = subprocess.run(
            ["bash", str(BROWSER_SCRIPT), "install"], capture_output=True, text=True, timeout=900
        )
        assert installed.returncode == 0, installed.stdout + installed.stderr
    return path


@pytest.fixture
def screenshots(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = Path(os.environ.get(SCREENSHOTS_ENV) or tmp_path_factory.getbasetemp() / "mlflow-ui")
    folder.mkdir(parents=True, exist_ok=True)
    print(f"MLflow UI screenshots: {folder}")
    return folder


@pytest.fixture
def sweep(output_root: Path) -> Sweep:
    """Run the tiny sweep; what its store holds and the link it printed."""
    done = run_module(
        "harness", [*TINY_SWEEP, f"run.output_dir={output_root}"], cwd=output_root.parent
    )
    assert done.returncode == 0, done.stderr[-3000:]
    links = LINK.findall(done.stdout + done.stderr)
    assert len(links) == 1, (done.stdout + done.stderr)[-3000:]
    client = MlflowClient(f"sqlite:///{output_root / DEFAULT_STORE_FILE}")
    experiment = client.get_experiment_by_name("smoke")
    assert experiment is not None
    runs = client.search_runs([experiment.experiment_id])
    (parent,) = [run for run in runs if "mlflow.parentRunId" not in run.data.tags]
    cells = [
        Cell(
            run.info.run_id,
            run.info.run_name,
            run.data.metrics["seconds_per_epoch"],
            run.data.metrics["images_per_second"],
            run.data.metrics["peak_memory_mb"],
            run.info.end_time - run.info.start_time,
            run.data.metrics["steady"],
        )
        for run in runs
        if run is not parent
    ]
    assert sorted(cell.name for cell in cells) == list(NAMES)
    return Sweep(experiment.experiment_id, parent.info.run_id, cells, links[0])


@pytest.fixture
def mlflow_server(output_root: Path) -> Iterator[str]:
    """`mlflow server` on the test's store, on loopback and a free port; its URL once it
    answers. Stopped (its whole process group) whatever the test does."""
    with running_mlflow_server(output_root / DEFAULT_STORE_FILE, output_root) as url:
        yield url


def test_the_ui_shows_the_cells_to_compare(
    chromium: str, sweep: Sweep, mlflow_server: str, screenshots: Path
) -> None:
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(
            executable_path=chromium, args=CHROMIUM_FLAGS, headless=True
        )
        try:
            page = browser.new_page(viewport=VIEWPORT)
            page.set_default_timeout(UI_WAIT_MS)
            page.goto(mlflow_server + sweep.link)
            _check_runs_table(page, sweep.cells)
            page.screenshot(path=str(screenshots / "mlflow-ui-runs.png"), full_page=True)
            _check_sweep_run(page, mlflow_server, sweep)
            page.screenshot(path=str(screenshots / "mlflow-ui-sweep.png"), full_page=True)
            _check_compare_view(page, mlflow_server, sweep)
            page.screenshot(path=str(screenshots / "mlflow-ui-compare.png"), full_page=True)
        finally:
            browser.close()


def _duration(milliseconds: int) -> str:
    """A duration as MLflow's runs table writes it (Utils.formatDuration in MLflow 3.17's UI)."""
    if milliseconds < 500:
        return f"{milliseconds}ms"
    for unit, size, below in (("s", 1e3, 6e4), ("min", 6e4, 36e5), ("h", 36e5, 864e5)):
        if milliseconds < below:
            return f"{_to_fixed_1(milliseconds / size)}{unit}"
    return f"{_to_fixed_1(milliseconds / 864e5)}d"


def _to_fixed_1(value: float) -> str:
    """JavaScript's value.toFixed(1): the float's exact value rounded, ties away from zero
    (Python's format rounds ties to even: 1.25 -> '1.2', where the UI shows 1.3)."""
    return str(Decimal(value).quantize(Decimal("0.1"), rounding=ROUND_HALF_UP))


def _check_runs_table(page, cells: list[Cell]) -> None:  # noqa: ANN001 - playwright Page
    """The link opens the runs table (not MLflow 3's GenAI overview) on the cells, fastest
    first, with the key columns switched on: nothing to expand, no column to add."""
    page.get_by_role("heading", name="Runs").wait_for()
    for name in NAMES:
        page.get_by_text(name, exact=True).wait_for()
    fastest_first = sorted(cells, key=lambda cell: cell.seconds_per_epoch)
    rows = page.locator("[role=row][row-id]")  # a row is in the pinned and the main columns
    shown = [rows.nth(i).get_attribute("row-id") for i in range(rows.count())]
    assert list(dict.fromkeys(shown)) == [cell.run_id for cell in fastest_first]
    for cell in cells:
        row = f'[role=row][row-id="{cell.run_id}"]'
        name = page.locator(f'{row} [col-id="attributes.`Run Name`"]').get_by_role("link")
        assert name.inner_text() == cell.name
        assert page.locator(f'{row} [col-id="duration"]').inner_text() == _duration(
            cell.duration_ms
        )
        for metric in ("seconds_per_epoch", "images_per_second", "peak_memory_mb"):
            shown = page.locator(f'{row} [col-id="metrics.`{metric}`"]')
            shown.scroll_into_view_if_needed()
            assert float(shown.inner_text()) == pytest.approx(getattr(cell, metric), rel=1e-9)
        assert (
            page.locator(f'{row} [col-id="params.`distribution.name`"]').inner_text()
            == "sequential"
        )
        assert page.locator(f'{row} [col-id="metrics.`world_size`"]').inner_text() == "1"
        steady = page.locator(f'{row} [col-id="metrics.`steady`"]')  # 0: unsteady, said here
        steady.scroll_into_view_if_needed()
        assert float(steady.inner_text()) == cell.steady


def _check_sweep_run(page, base: str, sweep: Sweep) -> None:  # noqa: ANN001
    """The sweep's parent run: its page says how the cells ended and which was fastest."""
    fastest = min(sweep.cells, key=lambda cell: cell.seconds_per_epoch)
    page.goto(
        f"{base}/#/experiments/{sweep.experiment_id}/runs/{sweep.parent_run_id}"
        "?workflowType=machine_learning"
    )
    page.get_by_text(
        f"Sweep: 2 cell(s) ok, 0 failed; fastest '{fastest.name}' at "
        f"{fastest.seconds_per_epoch:.3f} s/epoch."
    ).wait_for()


# The compare view lists metrics in a virtualised grid of names beside one of values (which
# scrolls both): a row's values are the cells of the values grid at its name's height, once
# the values grid has scrolled to it.
_METRIC_ROW_JS = """name => {
  const link = [...document.querySelectorAll('a[title="Plot chart"]')]
      .find(a => a.textContent === name);
  const grids = [...document.querySelectorAll('[role=grid]')];
  if (!link) { grids[1].scrollTop += 200; return null; }
  const top = link.parentElement.style.top;
  const values = grids[grids.indexOf(link.closest('[role=grid]')) + 1];
  const row = [...values.querySelectorAll('div')]
      .filter(d => d.style.position === 'absolute' && d.style.top === top)
      .map(d => d.textContent);
  if (row.length === 0) { values.scrollTop = parseInt(top); return null; }
  return row;
}"""


def _metric_row(page, name: str) -> list[float]:  # noqa: ANN001
    """The values of metric `name` in the compare view."""
    for _ in range(50):
        row = page.evaluate(_METRIC_ROW_JS, name)
        if row is not None:
            return [float(value) for value in row]
        page.wait_for_timeout(200)  # the grids render what was scrolled to
    raise AssertionError(f"{name} is not in the compare view")


def _check_compare_view(page, base: str, sweep: Sweep) -> None:  # noqa: ANN001
    """MLflow 3's compare view: #/compare-runs?runs=[ids as JSON]&experiments=[ids]; its
    columns are in the order of `runs`, its metrics rounded (4 significant digits, at most
    3 decimals)."""
    cells = sweep.cells
    page.goto(
        f"{base}/#/compare-runs?runs={json.dumps([c.run_id for c in cells])}"
        f"&experiments={json.dumps([sweep.experiment_id])}"
    )
    page.get_by_text("Comparing 2 Runs").wait_for()
    names = page.get_by_role("row").filter(has=page.get_by_text("Run Name:", exact=True))
    assert names.inner_text().split() == ["Run", "Name:", *" ".join(c.name for c in cells).split()]
    durations = page.get_by_role("row").filter(has=page.get_by_text("Duration:", exact=True))
    assert durations.inner_text().split()[1:] == [_duration(c.duration_ms) for c in cells]
    # In the grid's (alphabetical) order: the search only scrolls down, and a metric found
    # further down leaves the grids scrolled past those above it.
    for metric in ("images_per_second", "peak_memory_mb", "seconds_per_epoch"):
        assert _metric_row(page, metric) == pytest.approx(
            [getattr(cell, metric) for cell in cells], rel=1e-3, abs=5e-4
        )
