#!/usr/bin/env bash
# Build and install Horovod 0.28.1 (its last release) into .venv against the pinned torch.
#
# Horovod 0.28.1 does not build against torch 2.14 as released; three changes make it build
# (each found by building it; docs/install.md, "Horovod's build", has what was measured):
#   1. torch 2.14's headers need C++20: Horovod's CMake files ask for C++14 (and C++11 for CUDA).
#   2. CMake 4 rejects gloo's old cmake_minimum_required: CMAKE_POLICY_VERSION_MINIMUM=3.5.
#   3. With a CUDA build of torch, Horovod's CMake requires the CUDA toolkit (cudart and its
#      headers) and finds it only where nvcc sits unless told: CUDA_HOME, CUDAToolkit_ROOT and
#      HOROVOD_CUDA_HOME point at the toolkit (default /usr/local/cuda). Collectives still run
#      over gloo on the CPU; on a GPU cluster set HOROVOD_GPU_OPERATIONS=NCCL (and
#      HOROVOD_BUILD_CUDA_CC_LIST) before running this script to build with NCCL.
# And one fix of a Horovod bug that only shows across nodes:
#   4. A process set's gloo context (the global one every collective uses is one) makes its
#      device with its own, never set, interface name instead of HOROVOD_GLOO_IFACE, so gloo
#      binds to the address this host's name resolves to (127.0.0.1 where /etc/hosts says so)
#      and the other nodes cannot connect ("connect [127.0.0.1]:port: Connection refused").
#      The patch hands the global context's interface on (gloo_context.cc).
# Idempotent: does nothing when `import horovod.torch` already works and was built with these
# patches (a marker file in the installed package says which).
set -euo pipefail

repo_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
python="$repo_root/.venv/bin/python"
version=0.28.1
# Raise when the patches below change: an installed build without them is built again.
patches=4

installed_patches() {
    "$python" - <<'PY' 2>/dev/null
import pathlib, horovod.torch
print((pathlib.Path(horovod.__file__).parent / "DISTBENCH_PATCHES").read_text().strip())
PY
}

if [ "$(installed_patches)" = "$patches" ]; then
    echo "[horovod] $version is installed"
    exit 0
fi

work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
echo "[horovod] building $version against torch $("$python" -c 'import torch; print(torch.__version__)') (a few minutes)"
"$python" -m pip download -qqq --no-deps --no-binary :all: "horovod==$version" -d "$work"
tar -xzf "$work/horovod-$version.tar.gz" -C "$work"
src="$work/horovod-$version"
sed -i 's/set(CMAKE_CXX_STANDARD 14)/set(CMAKE_CXX_STANDARD 20)/' \
    "$src/CMakeLists.txt" "$src/horovod/torch/CMakeLists.txt"
sed -i "s/CMAKE_CUDA_FLAGS} -std=c++11/CMAKE_CUDA_FLAGS} -std=c++20/" "$src/CMakeLists.txt"
grep -q "CMAKE_CXX_STANDARD 20" "$src/CMakeLists.txt" "$src/horovod/torch/CMakeLists.txt"
gloo_context="$src/horovod/common/gloo/gloo_context.cc"
sed -i '/^void GlooContext::InitializeForProcessSet/,/^}/ s/^  device_attr.iface = gloo_iface_;/  gloo_iface_ = global_context.gloo_iface_;\n  device_attr.iface = gloo_iface_;/' \
    "$gloo_context"
grep -q "gloo_iface_ = global_context.gloo_iface_;" "$gloo_context"

"$python" -m pip install -qqq 'setuptools<81' wheel packaging pyyaml cloudpickle psutil
cuda_home="${CUDA_HOME:-/usr/local/cuda}"
env CMAKE_POLICY_VERSION_MINIMUM=3.5 \
    CUDA_HOME="$cuda_home" CUDAToolkit_ROOT="$cuda_home" HOROVOD_CUDA_HOME="$cuda_home" \
    HOROVOD_WITH_PYTORCH=1 HOROVOD_WITH_GLOO=1 HOROVOD_WITHOUT_MPI=1 \
    HOROVOD_WITHOUT_TENSORFLOW=1 HOROVOD_WITHOUT_MXNET=1 \
    MAKEFLAGS="-j$(nproc)" \
    "$python" -m pip install --no-build-isolation --no-cache-dir "$src" 2>&1 | grep -v "is ignored" | tail -40
"$python" -c "import horovod.torch as hvd; assert hvd.gloo_built(), 'Horovod built without gloo'"
"$python" -c "import horovod, pathlib; (pathlib.Path(horovod.__file__).parent / 'DISTBENCH_PATCHES').write_text('$patches')"
echo "[horovod] $version installed"
