#!/usr/bin/env bash
# Prologue for commands on the GPU host: carried wheels (lark), multicast off, unbuffered.
# Usage (from the repo root there): source tools/gpu_session.sh
# For bench JSONs, also export TILELINK_COMMIT=<commit under test>: the device copy's .git can
# be older than the tree it runs (session 7: a run recorded the session's first commit).
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl || return 1
export PYTHONPATH=/tmp/site:$PWD NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 \
    NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1 TILELINK_CACHE=/tmp/tilelink-cache
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__, 'cuda', torch.version.cuda, torch.cuda.get_device_name())"
