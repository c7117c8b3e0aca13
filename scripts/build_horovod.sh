#!/usr/bin/env bash
# Build and install Horovod 0.28.1 (its last release) into .venv against the pinned torch.
#
# Horovod 0.28.1 does not build against torch 2.14 as released; three changes make it build
# (measured, see ../shared/notes/horovod.md in the project workspace):
#   1. torch 2.14's headers need C++20: Horovod's CMake files ask for C++14 (and C++11 for CUDA).
#   2. CMake 4 rejects gloo's old cmake_minimum_required: CMAKE_POLICY_VERSION_MINIMUM=3.5.
#   3. With a CUDA build of torch, Horovod's CMake requires the CUDA toolkit (cudart and its
#      headers) and finds it only where nvcc sits unless told: CUDA_HOME, CUDAToolkit_ROOT and
#      HOROVOD_CUDA_HOME point at the toolkit (default /usr/local/cuda). Collectives still run
#      over gloo on the CPU; on a GPU cluster set HOROVOD_GPU_OPERATIONS=NCCL (and
#      HOROVOD_BUILD_CUDA_CC_LIST) before running this script to build with NCCL.
# Idempotent: does nothing when `import horovod.torch` already works.
set -euo pipefail

repo_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
python="$repo_root/.venv/bin/python"
version=0.28.1

if "$python" -c "import horovod.torch" 2>/dev/null; then
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

"$python" -m pip install -qqq 'setuptools<81' wheel packaging pyyaml cloudpickle psutil
cuda_home="${CUDA_HOME:-/usr/local/cuda}"
env CMAKE_POLICY_VERSION_MINIMUM=3.5 \
    CUDA_HOME="$cuda_home" CUDAToolkit_ROOT="$cuda_home" HOROVOD_CUDA_HOME="$cuda_home" \
    HOROVOD_WITH_PYTORCH=1 HOROVOD_WITH_GLOO=1 HOROVOD_WITHOUT_MPI=1 \
    HOROVOD_WITHOUT_TENSORFLOW=1 HOROVOD_WITHOUT_MXNET=1 \
    MAKEFLAGS="-j$(nproc)" \
    "$python" -m pip install --no-build-isolation --no-cache-dir "$src" 2>&1 | grep -v "is ignored" | tail -40
"$python" -c "import horovod.torch as hvd; assert hvd.gloo_built(), 'Horovod built without gloo'"
echo "[horovod] $version installed"
