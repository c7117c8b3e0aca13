"""The MLflow UI as a user sees it: a real 2-cell sweep, `mlflow server` on its store (bound to
127.0.0.1), and headless Chromium (Debian's, installed by scripts/browser.sh, driven by the
playwright package) showing the sweep's runs with `seconds_per_epoch` and comparing two runs.

Screenshots go to the test's tmp dir and are copied to outputs/test-artifacts/mlflow-ui-*.png
in the checkout (ignored by git; each run overwrites them).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

from harness.tracking import DEFAULT_STORE_FILE
from tests.helpers import REPO_ROOT, run_module
from tests.helpers import mlflow_server as running_mlflow_server

BROWSER_SCRIPT = REPO_ROOT / "scripts" / "browser.sh"
ARTIFACTS = REPO_ROOT / "outputs" / "test-artifacts"
# Headless on a machine without a display, a GPU or a user namespace sandbox (root in a
# container), and with nothing fetched from the network behind the test's back.
CHROMIUM_FLAGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking",
                  "--disable-component-update", "--disable-sync", "--no-first-run"]
UI_WAIT_MS = 60_000
METRIC_COLUMN = '[col-id="metrics.`seconds_per_epoch`"]'
TINY_SWEEP = ["+sweep=smoke", "dataset=mnist,cifar10", "network=mobilenetv2",
              "distribution.batch_size=8", "dataset.num_samples=16", "run.epochs=1",
              "run.warmup_batches=0", "run.progress=false"]


@pytest.fixture(scope="module")
def chromium() -> str:
    """The browser's path, installed with scripts/browser.sh where it is missing (as the
    SLURM tests install SLURM)."""
    pytest.importorskip("playwright.sync_api")
    path = subprocess.run(["bash", str(BROWSER_SCRIPT), "path"], capture_output=True,
                          text=True, check=True).stdout.strip()
    if not os.access(path, os.X_OK):
        if os.geteuid() != 0 or shutil.which("apt-get") is None:
            pytest.skip("chromium is not installed and this machine cannot install it (needs "
                        "root and apt-get)")
        installed = subprocess.run(["bash", str(BROWSER_SCRIPT), "install"],
                                   capture_output=True, text=True, timeout=900)
        assert installed.returncode == 0, installed.stdout + installed.stderr
    return path


@pytest.fixture
def mlflow_server(output_root: Path) -> Iterator[str]:
    """`mlflow server` on the test's store, on loopback and a free port; its URL once it
    answers. Stopped (its whole process group) whatever the test does."""
    with running_mlflow_server(output_root / DEFAULT_STORE_FILE, output_root) as url:
        yield url


def _save_screenshot(page, tmp_path: Path, name: str) -> None:  # noqa: ANN001 - playwright Page
    path = tmp_path / f"mlflow-ui-{name}.png"
    page.screenshot(path=str(path), full_page=True)
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    shutil.copy(path, ARTIFACTS / path.name)


@pytest.fixture
def sweep_runs(output_root: Path) -> tuple[str, dict[str, float]]:
    """Run the tiny sweep; its experiment id and each cell's run id -> seconds_per_epoch."""
    done = run_module("harness", [*TINY_SWEEP, f"run.output_dir={output_root}"],
                      cwd=output_root.parent)
    assert done.returncode == 0, done.stderr[-3000:]
    client = MlflowClient(f"sqlite:///{output_root / DEFAULT_STORE_FILE}")
    experiment = client.get_experiment_by_name("smoke")
    assert experiment is not None
    cells = {run.info.run_id: run.data.metrics["seconds_per_epoch"]
             for run in client.search_runs([experiment.experiment_id])
             if "seconds_per_epoch" in run.data.metrics}
    assert len(cells) == 2
    return experiment.experiment_id, cells


def test_the_ui_lists_the_sweep_and_compares_two_runs(
        chromium: str, sweep_runs: tuple[str, dict[str, float]], mlflow_server: str,
        tmp_path: Path) -> None:
    from playwright.sync_api import sync_playwright

    experiment_id, cells = sweep_runs
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=chromium, args=CHROMIUM_FLAGS,
                                             headless=True)
        try:
            page = browser.new_page(viewport={"width": 1600, "height": 1000})
            page.set_default_timeout(UI_WAIT_MS)
            _check_runs_table(page, f"{mlflow_server}/#/experiments/{experiment_id}/runs",
                              cells)
            _save_screenshot(page, tmp_path, "runs")
            _check_compare_view(page, mlflow_server, experiment_id, cells)
            _save_screenshot(page, tmp_path, "compare")
        finally:
            browser.close()


def _check_runs_table(page, url: str, cells: dict[str, float]) -> None:  # noqa: ANN001
    """The experiment's runs table (MLflow 3 opens experiments on a GenAI overview; the
    training runs are at #/experiments/<id>/runs): the sweep's parent run, expanded to its
    cells, with the seconds_per_epoch column switched on as a user does (Columns menu)."""
    page.goto(url)
    parent = page.get_by_role("row").filter(has_text="sweep-")
    parent.get_by_role("button").first.click()  # expand the nested cells
    page.get_by_text("mobilenetv2-mnist-sequential-local_cpu").wait_for()
    page.get_by_text("mobilenetv2-cifar10-sequential-local_cpu").wait_for()
    page.get_by_role("button", name="Columns").click()
    page.get_by_text("seconds_per_epoch", exact=True).first.click()
    page.keyboard.press("Escape")
    for run_id, seconds in cells.items():
        cell = page.locator(f'[role=row][row-id="{run_id}"] [role=gridcell]{METRIC_COLUMN}')
        cell.scroll_into_view_if_needed()
        assert float(cell.inner_text()) == pytest.approx(seconds, rel=1e-6)


def _check_compare_view(page, base: str, experiment_id: str,  # noqa: ANN001
                        cells: dict[str, float]) -> None:
    """MLflow 3's compare view: #/compare-runs?runs=[ids as JSON]&experiments=[ids]."""
    page.goto(f"{base}/#/compare-runs?runs={json.dumps(list(cells))}"
              f"&experiments={json.dumps([experiment_id])}")
    page.get_by_text("Comparing 2 Runs").wait_for()
    page.get_by_text("mobilenetv2-mnist-sequential-local_cpu").first.wait_for()
    page.get_by_text("mobilenetv2-cifar10-sequential-local_cpu").first.wait_for()
    page.get_by_text("seconds_per_epoch", exact=True).first.wait_for()
