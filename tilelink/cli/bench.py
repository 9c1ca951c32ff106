"""`tilelink bench`: TileLink against its baselines on real GPUs, one table.

    tilelink bench examples/ag_gemm.tl -D M=8192 -D N=8192 -D K=8192 --world-size 2
    tilelink bench --suite design --json bench.json --plot bench.png
    tilelink bench --from bench.json --plot bench.png        # re-draw a saved run (no GPU)

Measures in one run, on the same inputs: TileLink, NCCL+cuBLAS (no overlap), torch async-TP,
cuBLAS GEMM alone, the communication alone (NCCL and the copy engine) and the floor
max(GEMM, fastest comm). Headline: steady-state ms of back-to-back calls (CUDA events, after
warm-up, max over ranks); beside it one call's latency from idle. Needs W CUDA GPUs.
"""

from __future__ import annotations

import os
import shlex
import sys
from pathlib import Path

from . import argtypes

# the design shapes (docs/design.md; bf16, N and K global): pattern file -> [(M, N, K), ...]
DESIGN_SUITE = {
    "ag_gemm.tl": [(8192, 8192, 8192), (8192, 28672, 8192), (8192, 49152, 12288),
                   (2048, 28672, 8192), (1024, 8192, 8192)],
    "gemm_rs.tl": [(8192, 8192, 28672), (8192, 8192, 29568), (8192, 8192, 8192),
                   (2048, 8192, 28672)],
}
SUITES = {"design": ("ag_gemm.tl", "gemm_rs.tl"), "design-ag": ("ag_gemm.tl",),
          "design-rs": ("gemm_rs.tl",)}
# The never-slower matrix: the design shapes, GEMM-AR from decode to prefill sizes and a
# LLaMA-style TP MLP, each as (pattern file, its parameter values).
MATRIX_SUITE = (
    [(f, {"M": m, "N": n, "K": k}) for f in SUITES["design"] for m, n, k in DESIGN_SUITE[f]]
    + [("gemm_ar.tl", {"M": m, "N": 8192, "K": 8192}) for m in (128, 512, 2048, 4096)]
    + [("tp_mlp.tl", {"M": 4096, "H": 4096, "I": 14336})])


def suite_shapes(name: str) -> list[tuple[str, dict]]:
    """The (pattern file, values) pairs a `--suite` runs."""
    if name == "matrix":
        return list(MATRIX_SUITE)
    return [(f, {"M": m, "N": n, "K": k}) for f in SUITES[name] for m, n, k in DESIGN_SUITE[f]]


SUITE_NAMES = (*SUITES, "matrix")
ENV = ("NCCL_NVLS_ENABLE", "TORCH_SYMM_MEM_DISABLE_MULTICAST", "NVSHMEM_DISABLE_NVLS")
# the harness's systems, for --help without importing torch (tilelink.bench.report.SYSTEMS;
# a test keeps the two equal)
SYSTEM_NAMES = ("tilelink", "nccl_cublas", "async_tp", "symm_one_shot", "symm_two_shot",
                "nccl_counts", "gemm", "nccl_comm", "ce_comm")

# The options that only a measuring run uses, with their defaults: left unset (None) by the
# parser, so `--from` (which measures nothing) can tell which were given and refuse them.
MEASURING = {"world_size": 2, "warmup": 5, "iters": 20, "rounds": 3, "reps": 5, "seed": 0,
             "world": "gpus"}
# every option `--from` refuses, as written: (attribute, option); it takes the rest
NOT_FROM = (("pattern", "a pattern"), ("suite", "--suite"), ("defines", "-D"),
            ("config", "--config"), ("world_size", "--world-size"), ("world", "--world"),
            ("json", "--json"), ("tuned", "--tuned"), ("graph", "--graph"),
            ("systems", "--systems"), ("warmup", "--warmup"), ("iters", "--iters"),
            ("rounds", "--rounds"), ("reps", "--reps"), ("seed", "--seed"))


def add_parser(sub) -> None:
    from .main import CONFIG_MERGE

    b = sub.add_parser(
        "bench", help="time a pattern against NCCL+cuBLAS, torch async-TP, GEMM and comm alone",
        description="Measure, in one run and on the same inputs: TileLink, NCCL+cuBLAS (no "
        "overlap), torch async-TP, cuBLAS GEMM alone, the communication alone (NCCL and the "
        "copy engine), and the floor max(GEMM, fastest comm); where collectives route rows "
        "by run-time counts (EP dispatch and combine), also the bytes floor: the bytes the "
        "routing moves over NVLink at the cost model's rate. Headline: steady-state ms of "
        "back-to-back calls (CUDA events, after warm-up, max over ranks); beside it one "
        "call's latency from idle. Needs --world-size CUDA GPUs.", epilog="On the reference host export "
        + " ".join(f"{v}={'0' if v.startswith('NCCL') else '1'}" for v in ENV)
        + " (multicast off).")
    b.add_argument("pattern", nargs="?", help="a .tl file, or path/to/file.py:function")
    b.add_argument("--suite", choices=sorted(SUITE_NAMES), help="run fixed shapes instead of "
                   "one pattern: design = the 9 design shapes (examples/ag_gemm.tl and "
                   "examples/gemm_rs.tl), design-ag / design-rs = the 5 AG-GEMM / 4 GEMM-RS, "
                   "matrix = the design shapes, GEMM-AR at M = 128 / 512 / 2048 / 4096 "
                   "(N = K = 8192) and TP-MLP at M = 4096 (H = 4096, I = 14336)")
    b.add_argument("-D", dest="defines", action="append", metavar="NAME=VALUE",
                   help="give a pattern parameter a value (repeatable)")
    b.add_argument("--world-size", "-W", type=argtypes.world_size, default=None,
                   help="number of ranks/GPUs (default 2)")
    b.add_argument("--config", nargs="*", action="extend", default=[], metavar="KEY=VALUE",
                   help="TileLink schedule config values (default: the op's own choice). "
                   + CONFIG_MERGE)
    b.add_argument("--json", metavar="PATH", help="write the results (and run metadata) here")
    b.add_argument("--plot", metavar="PNG", help="draw the chart here (needs matplotlib: pip "
                   "install matplotlib)")
    b.add_argument("--from", dest="from_json", action="append", metavar="JSON",
                   help="measure nothing: read the results a run saved with --json (repeat to "
                   "merge runs) and print the table, draw --plot, print --markdown; no GPU "
                   "needed")
    b.add_argument("--markdown", action="store_true", help="print the docs/perf.md section "
                   "(markdown table, date, host, versions, command) after the table")
    b.add_argument("--warmup", type=argtypes.warmup, help="calls before each timed batch "
                   f"(default {MEASURING['warmup']})")
    b.add_argument("--iters", type=argtypes.count, help="back-to-back calls per timed batch "
                   f"(default {MEASURING['iters']})")
    b.add_argument("--rounds", type=argtypes.count, help="timed batches per system, "
                   f"interleaved; the median is reported (default {MEASURING['rounds']})")
    b.add_argument("--reps", type=argtypes.count, help="single calls from idle; median "
                   f"(default {MEASURING['reps']})")
    b.add_argument("--seed", type=argtypes.seed,
                   help=f"random input seed, 0 to {argtypes.MAX_SEED} (default 0)")
    b.add_argument("--systems", metavar="A,B,...",
                   help="time only these systems (default: all): " + ", ".join(SYSTEM_NAMES) +
                   ". E.g. --systems tilelink,gemm times TileLink and cuBLAS without the "
                   "other baselines between their rounds; the floor needs gemm and a comm")
    b.add_argument("--graph", action="store_true",
                   help="capture each system's call in a CUDA graph and time its replays (the "
                   "host leaves the critical path, as in a model that replays graphs); each "
                   "replay's output is checked first. TileLink ops that cannot be captured "
                   "are marked FAILED (AG-GEMM copy-engine configs need their flag protocol)")
    b.add_argument("--world", choices=("gpus", "one-gpu", "emulated"), default=None,
                   help="gpus (the only world bench times: one GPU per rank); one-gpu and "
                   "emulated are refused with the reason (use tilelink run --check there)")
    b.add_argument("--tuned", action="store_true",
                   help="use the config `tilelink tune` cached for each shape, if any (default: "
                   "the schedule's default config, or --config)")


def fill_measuring_defaults(args) -> None:
    """Give the measuring options left unset their defaults (`MEASURING`)."""
    for name, default in MEASURING.items():
        if getattr(args, name, None) is None:
            setattr(args, name, default)


def systems_from_args(args) -> tuple[str, ...]:
    """`--systems` as a tuple in the harness's order (all of them when not given)."""
    from ..bench.report import SYSTEMS
    from ..errors import TileLinkError, closest

    if not getattr(args, "systems", None):
        return SYSTEMS
    asked = [x.strip() for x in args.systems.split(",") if x.strip()]
    for x in asked:
        if x not in SYSTEMS:
            hint = closest(x, SYSTEMS)
            raise TileLinkError(f"--systems: unknown system '{x}'",
                                hint=f"did you mean '{hint}'?" if hint else
                                "systems: " + ", ".join(SYSTEMS))
    return tuple(k for k in SYSTEMS if k in asked)


def specs_from_args(args) -> list:
    """The shapes to run, each bound once here (on the CPU) so bad input fails early."""
    from ..bench.run import Spec
    from ..errors import TileLinkError
    from ..frontend import load_pattern
    from .main import _defines

    config = _defines(args.config, "--config")
    if args.suite:
        if args.pattern or args.defines:
            raise TileLinkError(f"--suite {args.suite} runs fixed shapes; give no pattern "
                                "and no -D", hint="tilelink bench --suite design -W 2")
        root = Path(__file__).resolve().parent.parent.parent / "examples"
        specs = [Spec(str(root / f), dict(values), config)
                 for f, values in suite_shapes(args.suite)]
    elif args.pattern:
        specs = [Spec(args.pattern, _defines(args.defines, "-D"), config)]
    else:
        raise TileLinkError("bench needs a pattern or --suite design",
                            hint="tilelink bench examples/ag_gemm.tl -D M=8192 -W 2")
    if args.world_size < 1:
        raise TileLinkError(f"--world-size must be >= 1, got {args.world_size}")
    for s in specs:
        load_pattern(s.pattern).bind(s.values, args.world_size).pattern.require_ops()
    return specs


def refuse_world(world: str) -> str | None:
    """Why bench does not run in `world` (None: it does, on one GPU per rank)."""
    if world == "one-gpu":
        return ("tilelink bench: refused in the one-GPU world. Its W ranks share one GPU's SMs "
                "(each rank's kernel gets a 1/W share) and memory bandwidth, and no byte "
                "crosses NVLink, so its timings say nothing about the pattern on W GPUs and "
                "cannot be compared with the baselines. To check a pattern there use: "
                "tilelink run PATTERN --check --world one-gpu")
    if world == "emulated":
        return ("tilelink bench: refused in the emulated world (CPU processes, Triton "
                "interpreter): nothing there is timed like a GPU. To check a pattern use: "
                "tilelink run PATTERN --check --world emulated")
    return None


def gpu_count() -> int:
    try:
        import torch

        return torch.cuda.device_count() if torch.cuda.is_available() else 0
    except Exception:
        return 0


def command_line(args) -> str:
    """The command that reproduces this run (with the multicast-off environment if set)."""
    env = [f"{v}={os.environ[v]}" for v in ENV if v in os.environ]
    parts = ["tilelink", "bench"]
    parts += ["--suite", args.suite] if args.suite else [args.pattern]
    for d in args.defines or []:
        parts += ["-D", d]
    parts += ["--world-size", str(args.world_size)]
    if args.config:
        parts += ["--config", *args.config]
    for flag in ("warmup", "iters", "rounds", "reps", "seed"):
        parts += [f"--{flag}", str(getattr(args, flag))]
    if getattr(args, "systems", None):
        parts += ["--systems", args.systems]
    if getattr(args, "graph", False):
        parts += ["--graph"]
    if args.json:
        parts += ["--json", args.json]
    if args.plot:
        parts += ["--plot", args.plot]
    return " ".join(env + [shlex.join(parts)])


def run(args) -> int:
    """Exit 0: every TileLink row checked and timed; 1: some row FAILED; 2: cannot run."""
    if args.from_json:
        return replot(args)
    fill_measuring_defaults(args)
    from ..bench.plot import check_can_plot, have_matplotlib, plot, title_for
    from ..bench.report import collect_meta, dump_json, format_markdown_section, format_table
    from ..bench.run import Options

    specs = specs_from_args(args)
    systems = systems_from_args(args)
    refused = refuse_world(getattr(args, "world", "gpus"))
    if refused:
        print(refused, file=sys.stderr)
        return 2
    if args.plot:
        if args.json and not have_matplotlib():
            # the numbers are kept: the chart can be drawn later, on any machine
            print("tilelink bench: matplotlib is not installed (pip install matplotlib): no "
                  f"chart now; draw it later with: tilelink bench --from {args.json} --plot "
                  f"{args.plot}", file=sys.stderr)
            args.plot = None
        else:
            check_can_plot(args.plot)  # refuse before measuring, not after
    if args.json:
        from ..bench.files import check_writable

        check_writable(args.json, "--json", "give a file name in a directory you can write")
    n = gpu_count()
    if n < args.world_size:
        print(f"tilelink bench: needs {args.world_size} CUDA GPUs, found {n}. Benchmarks are "
              "not meaningful on the emulated world (CPU processes, Triton interpreter), nor "
              "on the one-GPU world (the ranks share one GPU's SMs and memory bandwidth); to "
              "check a pattern without W GPUs use: tilelink run PATTERN --check "
              f"{'--world one-gpu' if n else '--world emulated'}", file=sys.stderr)
        return 2
    from ..bench.run import bench_rank
    from ..runtime.launcher import launch_world

    opts = Options(warmup=args.warmup, iters=args.iters, rounds=args.rounds, reps=args.reps,
                   tuned=args.tuned, seed=args.seed, systems=systems, graph=args.graph)
    results = launch_world(bench_rank, args.world_size, specs, opts)
    if int(os.environ.get("RANK", "0")) != 0 or results is None:
        return 0  # under torchrun: rank 0 reports
    meta = collect_meta(command_line(args))
    meta["timing"] = "CUDA graph replays" if args.graph else "eager calls"
    if args.graph:
        print("(every system timed as CUDA graph replays)")
    print(format_table(results))
    if args.json:
        dump_json(results, meta, args.json)
        print(f"results: {args.json}", file=sys.stderr)
    if args.plot:
        plot(results, args.plot, title=title_for(meta))
        print(f"chart: {args.plot}", file=sys.stderr)
    if args.markdown:
        print()
        print(format_markdown_section(results, meta, args.plot))
    failed = [r for r in results if not r.ok]
    if failed:
        print(f"tilelink bench: {len(failed)} of {len(results)} row(s) FAILED (see above)",
              file=sys.stderr)
    return 1 if failed else 0


def replot(args) -> int:
    """`tilelink bench --from JSON ...`: the table, chart and markdown of saved runs."""
    from ..bench.plot import check_can_plot, load_runs, plot, title_for
    from ..bench.report import format_markdown_section, format_table
    from ..errors import TileLinkError

    given = [flag for attr, flag in NOT_FROM
             if getattr(args, attr, None) is not None and getattr(args, attr) is not False
             and getattr(args, attr) != []]  # (0 is a value given: --warmup 0)
    if given:
        what = ", ".join(given)
        raise TileLinkError(f"--from reads saved results and measures nothing; {what} "
                            f"do{'es' if len(given) == 1 else ''} not apply",
                            hint="drop " + " and ".join(given) + " (--from takes --plot, "
                            "--markdown and more --from), e.g. tilelink bench --from "
                            "bench.json --plot bench.png")
    if args.plot:
        check_can_plot(args.plot)
    meta, results = load_runs(args.from_json)
    if not results:
        raise TileLinkError(f"--from {' '.join(args.from_json)}: no results in it",
                            hint="give a JSON written by tilelink bench --json")
    print(format_table(results))
    if args.plot:
        plot(results, args.plot, title=title_for(meta))
        print(f"chart: {args.plot}", file=sys.stderr)
    if args.markdown:
        print()
        print(format_markdown_section(results, meta, args.plot))
    return 0
