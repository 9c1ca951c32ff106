#!/usr/bin/env bash
# The tuner's check on a GPU host: model-pruned vs exhaustive tuning, one shape per line
# of the design shapes (or the shapes given as "ag|rs M N K" arguments). Prints the perf.md
# row of each; full logs and the tuned configs (the tune cache) go to OUTDIR.
#   bash tools/tune_compare.sh OUTDIR [ "ag 8192 8192 8192" ... ]
set -uo pipefail
OUT=${1:?output directory}; shift
mkdir -p "$OUT"
export TILELINK_CACHE=${TILELINK_CACHE:-$OUT/cache}
SHAPES=("$@")
if [ ${#SHAPES[@]} -eq 0 ]; then
    SHAPES=("ag 8192 8192 8192" "ag 8192 28672 8192" "ag 8192 49152 12288" "ag 2048 28672 8192"
            "ag 1024 8192 8192" "rs 8192 8192 28672" "rs 8192 8192 29568" "rs 8192 8192 8192"
            "rs 2048 8192 28672")
fi
for s in "${SHAPES[@]}"; do
    read -r kind m n k <<<"$s"
    ex=examples/ag_gemm.tl; [ "$kind" = rs ] && ex=examples/gemm_rs.tl
    log="$OUT/tune-$kind-$m-$n-$k.log"
    start=$(date +%s)
    timeout 150 python3 -m tilelink.cli.main tune "$ex" -D M="$m" -D N="$n" -D K="$k" -W 2 \
        --exhaustive --iters 10 --force >"$log" 2>&1
    echo "$kind $m $n $k: rc=$? $(( $(date +%s) - start )) s  $(grep '^perf.md row' "$log")"
done
