#!/usr/bin/env bash
# The CUDA path on one GPU, as measured in docs/benchmarks/2026-11-25-cuda-h100-h200.md, "CUDA on
# one H100, then on one H200 (2026-11-25 to 2026-11-28)": the CUDA tests
# (tests/integration/test_cuda.py: a cell on cuda, DDP and FSDP2 over a real NCCL group of one
# rank), cells that train on the GPU (ResNet-18 on MNIST, Llama-tiny and GPT-2 small on tokens), the
# memory model against the CUDA allocator's peak (4 networks x 2 batch sizes), DDP and FSDP2 with
# one worker, and two workers on the one GPU (DDP over gloo; GPipe, which cannot run there). Then
# the report: every cell's seconds per epoch (median and spread over its epochs), peak MB, the
# memory model's prediction and its error (scripts/gpu_report.py).
#
#   scripts/gpu_check.sh [OUTDIR]      # default outputs/gpu_check; PYTHON=..., HARDWARE=...
#   STEPS="tests gpipe_2_gloo" scripts/gpu_check.sh   # only these steps (names as printed)
#
# Needs a CUDA device and distbench installed (scripts/setup.sh, or `pip install -e .`); MLflow
# is not used (tracking.enabled=false). Each step is bounded (STEP_TIMEOUT_S, default 300 s)
# and a failed step does not stop the others; its log is in OUTDIR/logs.
set -uo pipefail

repo_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$repo_root"
out="$(realpath -m "${1:-outputs/gpu_check}")"
py="${PYTHON:-$( [ -x .venv/bin/python ] && echo .venv/bin/python || echo python3 )}"
hardware="${HARDWARE:-h100_1gpu}"
limit="${STEP_TIMEOUT_S:-300}"
mkdir -p "$out/logs" "$out/cells"
export PYTHONUNBUFFERED=1

step() {  # step NAME COMMAND...: run it bounded, its output in logs/NAME.log
    local name=$1; shift
    [ -z "${STEPS:-}" ] || [[ " $STEPS " == *" $name "* ]] || return 0
    echo "== $name: $*"
    local started=$SECONDS
    timeout "$limit" "$@" >"$out/logs/$name.log" 2>&1
    local rc=$?
    echo "   exit $rc after $((SECONDS - started)) s; $(grep -h 's/epoch\|passed\|failed\|Error' \
        "$out/logs/$name.log" | tail -1)"
}

cell() {  # cell NAME OVERRIDES...: one cell (or a -m grid) of python -m harness on the GPU
    local name=$1; shift
    step "$name" "$py" -m harness "$@" "hardware=$hardware" tracking.enabled=false \
        run.progress=false "run.output_dir=$out/cells" "hydra.run.dir=$out/cells/$name" \
        "hydra.sweep.dir=$out/cells/$name"
}

nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
"$py" -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda,
"nccl", torch.cuda.nccl.version(), torch.cuda.get_device_name(0))'

step tests "$py" -m pytest tests/integration/test_cuda.py -q -p no:cacheprovider -rs

# Training: seconds per epoch over 3 repeats (each 3 epochs, 2 for GPT-2).
cell resnet18_mnist network=resnet18 dataset=mnist dataset.num_samples=16384 \
    distribution.batch_size=128 run.epochs=3 run.repeats=3
cell llama_tiny_tokens network=llama_tiny dataset=tokens dataset.num_samples=8192 \
    distribution.batch_size=64 run.epochs=3 run.repeats=3
cell gpt2_small_tokens network=gpt2_small dataset=tokens dataset.num_samples=2048 \
    distribution.batch_size=32 run.epochs=2 run.repeats=3

# The memory model: 4 networks x 2 batch sizes on CIFAR-10 (one epoch each).
cell memory_grid -m network=resnet18,resnet50,vgg16,mobilenetv2 \
    distribution.batch_size=32,128 dataset=cifar10 dataset.num_samples=1024 run.epochs=1 \
    run.warmup_batches=2

# Data parallel with one worker (no process group: the harness trains the plain network).
cell ddp_1 distribution=ddp network=resnet18 dataset=mnist dataset.num_samples=16384 \
    distribution.batch_size=128 run.epochs=3
cell fsdp_1 distribution=fsdp network=resnet18 dataset=mnist dataset.num_samples=16384 \
    distribution.batch_size=128 run.epochs=3

# Two workers on the one GPU. DDP over gloo (gloo allreduces CUDA tensors) trains. A pipeline
# cannot: gloo does not send CUDA tensors (refused at validation, exit 2), and NCCL refuses two
# ranks on one device ("Duplicate GPU detected": a failed cell, expected on one GPU).
cell ddp_2_gloo distribution=ddp hardware.workers_per_node=2 distribution.backend=gloo \
    network=resnet18 dataset=mnist dataset.num_samples=16384 distribution.batch_size=128 \
    run.epochs=3
cell gpipe_2_gloo distribution=gpipe hardware.workers_per_node=2 distribution.backend=gloo \
    network=resnet18 dataset=mnist
cell gpipe_2_nccl distribution=gpipe hardware.workers_per_node=2 distribution.backend=nccl \
    network=resnet18 dataset=mnist dataset.num_samples=4096 distribution.batch_size=512 \
    distribution.micro_batches=4 run.epochs=1 run.progress_timeout_s=60

"$py" scripts/gpu_report.py "$out/cells" --json "$out/report.json" | tee "$out/report.txt"
