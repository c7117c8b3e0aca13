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

# torch (a CUDA build) and the rest take about 7 GB in .venv, and pip unpacks before it installs:
# a full disk otherwise ends in pip's error only, after a minute of downloads.
needed_gb=10
free_gb=$(( $(df -Pk "$repo_root" | awk 'NR == 2 {print $4}') / 1024 / 1024 ))
if [ "$free_gb" -lt "$needed_gb" ]; then
    echo "[setup] error: $free_gb GB free on the disk of $repo_root; installing needs about $needed_gb GB" >&2
    exit 1
fi

# pip's own output goes to a log, and its end is shown when it fails: quiet when all is well,
# the reason said (a full disk, an unreachable registry, a release withdrawn) when not.
pip_log="$venv/setup-pip.log"
pip_quietly() {
    if ! "$venv/bin/python" -m pip "$@" > "$pip_log" 2>&1; then
        echo "[setup] error: pip $* failed; its last lines (all of them in $pip_log):" >&2
        tail -n 15 "$pip_log" >&2
        exit 1
    fi
}

echo "[setup] installing distbench and its dependencies into .venv (first time: several minutes)"
pip_quietly install --upgrade pip
pip_quietly install -e ".[test]"
bash "$repo_root/scripts/build_horovod.sh"   # Horovod builds from source against the pinned torch
echo "$wanted" > "$stamp"
echo "[setup] done"
