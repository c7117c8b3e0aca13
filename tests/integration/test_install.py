"""distbench installed like a Hydra app: the wheel ships the configs and the console commands,
and an installed `distbench` runs a cell, and completes in bash, outside the checkout."""

from __future__ import annotations

import configparser
import inspect
import json
import os
import shutil
import subprocess
import sys
import sysconfig
import tomllib
import zipfile
from dataclasses import dataclass
from importlib import import_module
from pathlib import Path

import pytest

from harness.commands.compose import CONF_DIR, CONFIG_MODULE
from tests.helpers import REPO_ROOT

COMMANDS = {  # console command -> the module it runs as `python -m module` does
    "distbench": "harness.__main__",
    "distbench-analysis": "harness.analysis.__main__",
    "distbench-describe": "harness.describe",
    "distbench-plan": "harness.plan",
    "distbench-probe": "harness.probe",
    "distbench-recommend": "harness.recommend",
    "distbench-sweeps": "harness.sweeps.__main__",
    "distbench-sync": "harness.sync",
}
TINY_CELL = [
    "dataset=mnist",
    "network=mobilenetv2",
    "distribution.batch_size=8",
    "dataset.num_samples=8",
    "run.epochs=1",
    "run.warmup_batches=0",
    "run.progress=false",
    "tracking.enabled=false",
]
# Where the new venv imports distbench from, its configs and launcher plugin included.
WHERE_FROM = """
import harness, harness.conf, hydra_plugins.distbench_launcher as plugin
print(harness.__file__, harness.conf.__file__, plugin.__file__, sep="\\n")
"""
TIMEOUT_S = 300  # one command on a busy 2-core machine: torch's import alone takes seconds


@dataclass(frozen=True)
class Installed:
    wheel: Path
    venv: Path
    elsewhere: Path  # a directory outside the checkout, the commands' working directory

    @property
    def bin(self) -> Path:
        return self.venv / "bin"

    def env(self) -> dict[str, str]:
        """The environment of a user whose PATH starts with the new venv; nothing points at
        the checkout."""
        env = {key: value for key, value in os.environ.items() if key != "PYTHONPATH"}
        return env | {
            "PATH": f"{self.bin}{os.pathsep}{env.get('PATH', '')}",
            "VIRTUAL_ENV": str(self.venv),
            "PYTHONUNBUFFERED": "1",
        }

    def run(self, args: list[str]) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            args,
            cwd=self.elsewhere,
            env=self.env(),
            capture_output=True,
            text=True,
            timeout=TIMEOUT_S,
        )


def _working_tree(destination: Path) -> Path:
    """A copy of the checkout's files as git sees them (tracked, and new ones not ignored):
    the wheel is built from it, so that setuptools' build/ of an earlier build, which keeps
    files since deleted, and .venv, outputs/, ... play no part."""
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        check=True,
    )
    for name in filter(None, listed.stdout.split("\0")):
        source = REPO_ROOT / name
        if source.is_file():  # a tracked file deleted in the working tree is left out
            (destination / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, destination / name)
    return destination


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Installed:
    """The wheel, built as the README's install builds it, installed with pip (no index, no
    dependencies) into a fresh virtualenv outside the checkout. The dependencies (torch is
    gigabytes) come from this test's own environment through a .pth line: a plain path in a
    .pth file does not run the .pth files inside it, so the checkout's editable install there
    stays invisible."""
    root = tmp_path_factory.mktemp("install")
    source = _working_tree(root / "source")
    wheels = root / "wheels"
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "--no-build-isolation",
            "-q",
            "-w",
            str(wheels),
            str(source),
        ],
        check=True,
        capture_output=True,
        timeout=TIMEOUT_S,
    )
    (wheel,) = wheels.glob("distbench-*.whl")
    venv = root / "venv"
    subprocess.run(
        [sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=TIMEOUT_S
    )
    new_python = venv / "bin" / "python"
    site_packages = subprocess.run(
        [new_python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    (Path(site_packages) / "distbench-test-dependencies.pth").write_text(
        sysconfig.get_paths()["purelib"] + "\n"
    )
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "--python",
            str(new_python),
            "install",
            "-q",
            "--no-deps",
            "--no-index",
            str(wheel),
        ],
        check=True,
        capture_output=True,
        timeout=TIMEOUT_S,
    )
    elsewhere = root / "elsewhere"
    elsewhere.mkdir()
    return Installed(wheel=wheel, venv=venv, elsewhere=elsewhere)


def _console_scripts() -> dict[str, str]:
    """pyproject.toml's [project.scripts]: command -> "module:function"."""
    pyproject = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())
    return pyproject["project"]["scripts"]


def test_every_console_command_runs_its_python_m_module() -> None:
    """Each command calls a function of the module `python -m` runs, with no argument (what
    the generated script does: `sys.exit(function())`)."""
    scripts = _console_scripts()
    assert set(scripts) == set(COMMANDS)
    for command, target in scripts.items():
        module, function = target.split(":")
        assert module == COMMANDS[command], command
        parameters = inspect.signature(getattr(import_module(module), function)).parameters
        assert all(p.default is not p.empty for p in parameters.values()), command


def test_the_configs_are_the_package_harness_conf_in_the_checkout() -> None:
    """In the checkout (its editable install) Hydra's config package is conf/ itself."""
    assert Path(import_module(CONFIG_MODULE).__file__ or "").parent == REPO_ROOT / "conf"
    assert CONF_DIR == REPO_ROOT / "conf"


@pytest.mark.slow
def test_the_wheel_ships_every_config_and_console_command(installed: Installed) -> None:
    with zipfile.ZipFile(installed.wheel) as wheel:
        names = set(wheel.namelist())
        (entry_points,) = [n for n in names if n.endswith(".dist-info/entry_points.txt")]
        scripts = configparser.ConfigParser()
        scripts.read_string(wheel.read(entry_points).decode())
    configs = {
        f"harness/conf/{path.relative_to(CONF_DIR).as_posix()}" for path in CONF_DIR.rglob("*.yaml")
    }
    assert "harness/conf/config.yaml" in configs
    assert configs <= names, sorted(configs - names)
    assert "workloads/networks/layer_counts.json" in names  # the counts kept with the code
    assert not any("__pycache__" in name for name in names)
    assert dict(scripts["console_scripts"]) == _console_scripts()
    assert all((installed.bin / command).exists() for command in COMMANDS)


@pytest.mark.slow
def test_installed_distbench_runs_a_cell_outside_the_checkout(installed: Installed) -> None:
    where = installed.run([str(installed.bin / "python"), "-c", WHERE_FROM])
    assert where.returncode == 0, where.stderr[-3000:]
    for path in where.stdout.split():  # the wheel's copy, not the checkout's
        assert Path(path).is_relative_to(installed.venv), where.stdout

    output_dir = installed.elsewhere / "outputs"
    done = installed.run(["distbench", *TINY_CELL, f"run.output_dir={output_dir}"])
    assert done.returncode == 0, done.stderr[-3000:]
    (path,) = (output_dir / "runs").glob("*/result.json")
    result = json.loads(path.read_text())
    assert result["status"] == "ok"
    assert result["config"]["network"]["name"] == "mobilenetv2"
    assert result["config"]["dataset"]["num_samples"] == 8


@pytest.mark.slow
def test_bash_completes_distbench_overrides(installed: Installed) -> None:
    """Hydra's completion script as bash runs it on <TAB>: the function `complete -F` names,
    with COMP_LINE / COMP_POINT / COMP_CWORD set; it runs `distbench -sc query=bash`."""
    script = """
        eval "$(distbench -sc install=bash)"
        complete -p distbench
        for line in "distbench dist" "distbench hardware=local_2cpu distribution="; do
            COMP_LINE="$line" COMP_POINT=${#line}
            words=($line); COMP_CWORD=$(( ${#words[@]} - 1 ))
            hydra_bash_completion
            echo "$line -> ${COMPREPLY[*]}"
        done
    """
    done = installed.run(["bash", "-c", script])
    assert done.returncode == 0, done.stderr[-3000:]
    registered, group, names = done.stdout.strip().splitlines()
    assert registered.endswith("-F hydra_bash_completion distbench")
    assert group == "distbench dist -> distribution. distribution="
    offered = names.split(" -> ")[1].split()
    assert {
        "distribution=ddp",
        "distribution=gpipe",
        "distribution=horovod",
        "distribution=pipedream",
        "distribution=sequential",
    } <= set(offered), names
