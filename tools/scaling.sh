#!/usr/bin/env bash
# Issue #7 in one command, on a host with 4 or 8 GPUs (run from the repo root):
#   bash tools/scaling.sh 4 OUTDIR      # or 8
#   bash tools/scaling.sh 4 OUTDIR dist # only the correctness part (or: bench), for hosts whose
#                                       # per-command limit is below the two parts together
# Correctness (the dist suite at that world size), then the design shapes against the same
# baselines; results as JSON + PNG + markdown in OUTDIR. Multicast stays off (shared hosts).
set -uo pipefail
W=${1:?world size (4 or 8)}
OUT=${2:-scaling-w$W}
PART=${3:-all}
mkdir -p "$OUT"
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
if [[ $PART == all || $PART == dist ]]; then
TILELINK_DIST_WORLD=$W timeout 400 python3 -m pytest -q tests/test_dist.py -m dist 2>&1 | tee "$OUT/dist.log" | tail -3
fi
[[ $PART == all || $PART == bench ]] || exit 0
timeout 600 python3 -m tilelink.cli.main bench --suite design --world-size "$W" --rounds 3 --reps 3 \
    --json "$OUT/bench.json" --plot "$OUT/bench.png" --markdown 2>&1 | tee "$OUT/bench.log" | tail -20
