"""Run the dist test cases (tests/test_dist.py) directly and print one line per case and rank.

    python tools/dist_cases.py [--only REGEX] [--nvshmem | --new | --composed]

Faster to read than pytest's output when iterating on a GPU host; the tests are the record.
The watchdog cases drop a notify on purpose: for them a reported hang is the expected
outcome ("caught"), and a run that finishes is the failure ("MISSED").
"""

from __future__ import annotations

import argparse
import re
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tests.test_dist import (CASES, COMPOSED, COMPOSED_WATCHDOG, NOT_YET_RUN,  # noqa: E402
                             NVSHMEM_CASES, NVSHMEM_WATCHDOG, WATCHDOG, WATCHDOG_REPORT)
from tilelink.runtime.gpu_run import run_many  # noqa: E402
from tilelink.runtime.launcher import launch_world  # noqa: E402


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--only", default=".*", help="regex over case names")
    p.add_argument("--nvshmem", action="store_true", help="the NVSHMEM cases")
    p.add_argument("--new", action="store_true",
                   help="the cases added since the last GPU run (tests/test_dist.py NOT_YET_RUN)")
    p.add_argument("--composed", action="store_true",
                   help="the composed patterns' cases (GEMM-AR, flash-decode, chains)")
    p.add_argument("-W", "--world-size", type=int, default=2)
    args = p.parse_args()
    pool = (NVSHMEM_CASES | NVSHMEM_WATCHDOG if args.nvshmem else NOT_YET_RUN if args.new
            else COMPOSED | COMPOSED_WATCHDOG if args.composed else CASES | WATCHDOG)
    watchdog = WATCHDOG | COMPOSED_WATCHDOG | NVSHMEM_WATCHDOG
    cases = {k: v for k, v in pool.items() if re.search(args.only, k)}
    t0 = time.time()
    results = launch_world(run_many, args.world_size, list(cases.values()))
    bad = 0
    for name, res in zip(cases, results):
        for r in res["ranks"]:
            if r.get("error"):
                bad += 1
                print(f"{name:<16} rank {r['rank']} ERROR {r['error']}")
                continue
            errs = " ".join(f"{k}: abs {a:.3g}" for k, (a, _) in r["errors"].items())
            if name in watchdog:
                caught = all(w in (r["hang"] or "") for w in WATCHDOG_REPORT)
                status = "caught" if caught else "MISSED"
            else:
                status = "HANG" if r["hang"] else ("BAD" if r["bad_calls"] else "ok")
            bad += status not in ("ok", "caught")
            print(f"{name:<16} rank {r['rank']} {status:<4} calls={r['calls']} "
                  f"bad={r['bad_calls']} {errs} cfg=[{r['config']}]")
            if r["hang"] and status != "caught":
                print("   " + r["hang"].replace("\n", "\n   "))
    print(f"{len(cases)} case(s) in {time.time() - t0:.1f} s; {bad} not ok")
    return 0


if __name__ == "__main__":
    sys.exit(main())
