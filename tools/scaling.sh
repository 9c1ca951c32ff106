#!/usr/bin/env bash
# The scaling checks in one command, on a host with 4 or 8 GPUs (run from the repo root):
#   bash tools/scaling.sh 4 OUTDIR      # or 8
#   bash tools/scaling.sh 4 OUTDIR dist # only the correctness part (or: bench), for hosts whose
#                                       # per-command limit is below the two parts together
# Correctness (the dist suite at that world size), then the never-slower matrix (the design
# shapes, GEMM-AR at four M, TP-MLP) against the same baselines, eager calls and graph replays;
# results as JSON + PNG + markdown in OUTDIR. Multicast stays off (shared hosts).
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
for MODE in eager graph; do
  G=$([[ $MODE == graph ]] && echo --graph)
  timeout 600 python3 -m tilelink bench --suite matrix --world-size "$W" --rounds 3 --reps 2 $G \
      --json "$OUT/matrix-$MODE.json" --plot "$OUT/matrix-$MODE.png" --markdown 2>&1 |
      tee "$OUT/matrix-$MODE.log" | tail -24
done
