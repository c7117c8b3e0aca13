#!/usr/bin/env bash
# Create .venv and install distbench with its test dependencies and Horovod, idempotently.
#
# A second run is quick: it re-installs only when pyproject.toml or setup.py changed since the
# last successful install (their hash is kept in .venv/.distbench-install-stamp).
set -euo pipefail

repo_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$repo_root"

python_bin="${DISTBENCH_PYTHON:-python3.11}"
command -v "$python_bin" >/dev/null 2>&1 || python_bin=python3
venv="$repo_root/.venv"
stamp="$venv/.distbench-install-stamp"

if [ ! -x "$venv/bin/python" ]; then
    echo "[setup] creating $venv with $("$python_bin" --version)"
    "$python_bin" -m venv "$venv"
fi

wanted="$(cat pyproject.toml setup.py | sha256sum | cut -d' ' -f1)"
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$wanted" ] \
    && "$venv/bin/python" -c "import harness.conf, workloads, launchers" 2>/dev/null; then
    # Idempotent too: builds only when Horovod is missing or was built without a patch it needs.
    bash "$repo_root/scripts/build_horovod.sh"
    echo "[setup] .venv is up to date"
    exit 0
fi

echo "[setup] installing distbench and its dependencies into .venv (first time: several minutes)"
"$venv/bin/python" -m pip install -qqq --upgrade pip
"$venv/bin/python" -m pip install -qqq -e ".[test]"
bash "$repo_root/scripts/build_horovod.sh"   # Horovod builds from source against the pinned torch
echo "$wanted" > "$stamp"
echo "[setup] done"
