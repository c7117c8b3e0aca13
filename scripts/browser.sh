#!/usr/bin/env bash
# The headless browser of the MLflow UI test (tests/integration/test_mlflow_ui.py): Debian's chromium,
# driven by the Python playwright package (a test dependency) without a browser download.
#
#   bash scripts/browser.sh install   # apt-get chromium (root, Debian); quick when installed
#   bash scripts/browser.sh path      # prints the browser's path
set -euo pipefail

browser=/usr/bin/chromium

install() {
    if [ -x "$browser" ]; then
        echo "[browser] installed: $browser"; return
    fi
    [ "$(id -u)" = 0 ] || { echo "[browser] installing needs root" >&2; exit 1; }
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null
    echo "[browser] installed: $browser"
}

case "${1:-}" in
    install) install ;;
    path) echo "$browser" ;;
    *) echo "usage: $0 install|path" >&2; exit 2 ;;
esac
