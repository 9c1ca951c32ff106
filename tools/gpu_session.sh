#!/usr/bin/env bash
# Prologue for commands on the GPU host: carried wheels (lark), multicast off, unbuffered.
# Usage (from the repo root there): source tools/gpu_session.sh
# For bench JSONs, also export TILELINK_COMMIT=<commit under test>: the device copy's .git can
# be older than the tree it runs (2026-11-22: a run of 07ed53f recorded 65c2e02).
# The wheels and TileLink's caches go to .gpu-session/ inside this checkout (ignored by git,
# private to its owner), never to the shared temp directory: anything on PYTHONPATH there
# could be planted by another user of the host.
mkdir -p .gpu-session/site .gpu-session/cache && chmod 700 .gpu-session || return 1
python3 -m pip install -q --no-index --no-deps --no-compile --upgrade \
    --target .gpu-session/site .whl/*.whl || return 1
export PYTHONPATH=$PWD:$PWD/.gpu-session/site NCCL_NVLS_ENABLE=0 \
    TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1 \
    TILELINK_CACHE=$PWD/.gpu-session/cache
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__, 'cuda', torch.version.cuda, torch.cuda.get_device_name())"
