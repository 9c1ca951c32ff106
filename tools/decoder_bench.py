"""One tensor-parallel decoder layer's time over W GPUs: TileLink's layers against the same
layer on NCCL + cuBLAS and on torch's async-TP, each checked against the unsharded layer.

    python tools/decoder_bench.py -W 4 --out decoder.json          # spawns W ranks
    torchrun --nproc-per-node 4 tools/decoder_bench.py -W 4 --out decoder.json
    python tools/decoder_bench.py --cpu -W 2 --hidden 64 --intermediate 128 --heads 4/2 \\
        --prefill 16 --decode 4 --out cpu.json                     # the same code, gloo, no GPU

The layer (default: Llama-3-8B's, hidden 4096, intermediate 14336, 32/8 heads, bf16) is
`transformers`' LlamaDecoderLayer where transformers imports, else tilelink.model.llama's
(the same computation in plain torch); every rank builds it from one seed and rank 0's
weights. All variants share one sequence-parallel layout (rank r holds tokens
[r T / W, (r + 1) T / W); q/k/v and gate/up column-parallel, o and down row-parallel):

- `tilelink`: tilelink.model's layers (`torch.ops.tilelink.ag_gemm` / `gemm_rs`);
- `nccl`: the same layers with all_gather -> torch.mm and torch.mm -> reduce_scatter through
  torch's functional collectives (NCCL + cuBLAS, nothing overlapped);
- `async_tp`: eager, torch's fused symmetric-memory ops (`symm_mem.fused_all_gather_matmul`,
  `fused_matmul_reduce_scatter`); compiled, the `nccl` layer through inductor with
  `_micro_pipeline_tp` on (the pass that rewrites all_gather -> mm and mm -> reduce_scatter
  to those ops, as torchtitan's async TP) and symmetric memory enabled for the group.

Prefill sizes (`--prefill`, total tokens T of one sequence) are timed eager and compiled
(`torch.compile(fullgraph=True)`, one static-shape compile per size, not timed); decode
sizes (`--decode`, T sequences of one token: no KV cache, so a decode step's GEMMs and
collectives with a one-token attention) as CUDA-graph replays of the eager and the compiled
layer. Every row's output is compared with the unsharded layer's (relative max error <=
--tol); a variant that disagrees, or raises, is recorded as such and left out of the ratios.

Timing, per size: every row's callable is built first (compiled, captured, its output
checked once), then timed in `--rounds` rounds (default 3) after one untimed warm-up round:
each round times every row once (`--iters` back-to-back calls after `--warmup` more, CUDA
events, max over ranks: `steady_state_ms`), the order rotated round by round (the same on
every rank), so that drift and the host's state hit every row alike and no row always runs
first; a row keeps the median over rounds and every round's value, printed as median
[min-max]. `--profile DIR` then runs each row once more under torch.profiler.

JSON (`--out`, rewritten after each size, so a run cut short keeps what it measured):
`meta` (GPU, W, layer, sizes, iters / warmup / rounds, torch/triton versions) and `rows`,
one per (variant, mode, phase, tokens): `ms` (median over rounds), `ms_rounds` (each
round's), `err`, `ok`, `error`, compiled rows' `compile_s`, `graph_ops` (fused ops found in
inductor's code: shows whether async-TP's pass fired) and `recompiles` (compiles after the
first, if any: a compile may then be in the times), `profile` (with --profile),
`speedup_vs_best_baseline` (the fastest agreeing `nccl` / `async_tp` row of that phase and
size, any mode, over this row's ms), and `speedup_rounds` / `speedup_paired` (the same
ratio round by round, and its median: a round's rows ran back to back, so a host whose
speed drifts between rounds spreads it less). `--time-limit` bounds the whole run: past it every
rank exits (status 3) with the JSON written so far. `--cpu` runs the same flow on a gloo
world (no timing worth reading, no async_tp, compiled with aot_eager): the tool's own check.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tilelink.cli import argtypes  # noqa: E402  (after the path)

VARIANTS = ("tilelink", "nccl", "async_tp")
BASELINES = ("nccl", "async_tp")
FUSED_NAMES = ("symm_mem.fused_all_gather_matmul", "symm_mem.fused_matmul_reduce_scatter",
               "tilelink.ag_gemm", "tilelink.gemm_rs", "all_gather_into_tensor",
               "reduce_scatter_tensor")


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("-W", "--world-size", type=int, default=None,
                   help="ranks (default: torchrun's WORLD_SIZE, else every visible GPU)")
    p.add_argument("--out", required=True, help="JSON file for the results")
    p.add_argument("--prefill", type=int, nargs="*", default=[2048, 4096, 8192],
                   help="prefill token counts (one sequence; all ranks' tokens)")
    p.add_argument("--decode", type=int, nargs="*", default=[8, 64],
                   help="decode token counts (that many one-token sequences), graph replays")
    p.add_argument("--hidden", type=int, default=4096)
    p.add_argument("--intermediate", type=int, default=14336)
    p.add_argument("--heads", type=argtypes.heads, default=(32, 8), help="H/KV (default 32/8)")
    p.add_argument("--layer", choices=("auto", "hf", "plain"), default="auto",
                   help="transformers' LlamaDecoderLayer (hf), tilelink.model.llama's (plain),"
                   " or hf where transformers imports (auto)")
    p.add_argument("--variants", nargs="+", choices=VARIANTS, default=list(VARIANTS))
    p.add_argument("--tilelink-configs", nargs="+", default=[], metavar='"KNOB=VALUE ..."',
                   help="more TileLink variants, one per quoted config, timed beside the "
                   "others: every TileLink op of the layer built with these schedule "
                   "overrides (tilelink.model.config_override), e.g. \"comm=sm\" "
                   "\"comm=none\", or \"balance=0\" for each op's own choice instead of "
                   "the layer's joint decision (tilelink.model.prepare), \"balance=tuned\" "
                   "for tilelink.model.tune's (measured on the compiled layer, before the "
                   "timing); rows named tilelink[<config>]")
    p.add_argument("--save-choices", metavar="FILE",
                   help="with --tilelink-configs balance=tuned: write tilelink.model.tune's "
                   "picks to FILE (one file per GPU, world size and layer; each size's picks "
                   "added), for tilelink.model.prepare(..., choices=FILE) in a model")
    p.add_argument("--choices", metavar="FILE",
                   help="the default tilelink variant prepares with these saved choices "
                   "(tilelink.model.prepare(..., choices=FILE): a file --save-choices or "
                   "tilelink.model.tune(save=) wrote on this GPU and world size) instead of "
                   "the cost model's joint decision")
    p.add_argument("--no-compile", action="store_true", help="eager (and eager graphs) only")
    p.add_argument("--iters", type=int, default=20,
                   help="back-to-back calls per timing (one timing per row and round)")
    p.add_argument("--warmup", type=int, default=5, help="untimed calls before each timing")
    p.add_argument("--rounds", type=int, default=3,
                   help="timed rounds per size, every row once a round, the order rotated "
                   "each round, after one untimed warm-up round; a row keeps the median")
    p.add_argument("--tol", type=float, default=5e-2,
                   help="largest relative error against the unsharded layer (bf16)")
    p.add_argument("--time-limit", type=float, default=480.0,
                   help="seconds for the whole run; past it every rank exits (status 3)")
    p.add_argument("--cpu", action="store_true",
                   help="run on a gloo CPU world in fp32 (a check of the tool, not a timing)")
    p.add_argument("--agree-timeout", type=float, default=120.0,
                   help="seconds the ranks wait for each other after each row; a rank that "
                   "failed alone (the others still in that row's collectives) stops the run "
                   "after it (status 3), instead of calling collectives out of step")
    p.add_argument("--profile", metavar="DIR", default=None,
                   help="after a size's rounds, run each row's --iters more calls under "
                   "torch.profiler: "
                   "a Chrome/Perfetto trace per rank in DIR and, in the row, the host time a "
                   "call takes to issue, the GPU's busy time and its largest kernels")
    p.add_argument("--fail-rank", type=int, default=None, metavar="R",
                   help="testing: rank R raises in its first row, alone")
    return p


# ---- the layer --------------------------------------------------------------------------

def hf_available() -> bool:
    try:
        import transformers  # noqa: F401
    except ImportError:
        return False
    return True


class Subject:
    """The unsharded layer and how each form of it is called."""

    def __init__(self, args, device, dtype):
        import torch

        h, kv = args.heads
        self.kind = args.layer if args.layer != "auto" else ("hf" if hf_available() else "plain")
        torch.manual_seed(0)
        with torch.device(device):
            if self.kind == "hf":
                from transformers import LlamaConfig
                from transformers.models.llama.modeling_llama import (
                    LlamaDecoderLayer,
                    LlamaRotaryEmbedding,
                )

                cfg = LlamaConfig(hidden_size=args.hidden, intermediate_size=args.intermediate,
                                  num_attention_heads=h, num_key_value_heads=kv,
                                  num_hidden_layers=1, attn_implementation="sdpa")
                self.layer = LlamaDecoderLayer(cfg, layer_idx=0)
                self.rotary = LlamaRotaryEmbedding(cfg)
            else:
                from tilelink.model.llama import LlamaConfig, LlamaDecoderLayer

                self.layer = LlamaDecoderLayer(LlamaConfig(
                    hidden=args.hidden, heads=h, kv_heads=kv, intermediate=args.intermediate))
        self.layer = self.layer.to(dtype).eval().requires_grad_(False)
        import torch.distributed as dist

        for p in self.layer.parameters():  # rank 0's weights everywhere, whatever the RNG
            dist.broadcast(p.data, 0)
        self.hidden = args.hidden

    def tensor_parallel(self):
        """A fresh TileLink TP form of the layer (its shards copied, no op built)."""
        if self.kind == "hf":
            from tilelink.model.hf import tensor_parallel
        else:
            from tilelink.model.llama import tensor_parallel
        return tensor_parallel(self.layer)

    def inputs(self, tokens: int, phase: str, dtype, device):
        """(x [B, S, hidden] (the same on every rank), the unsharded layer's kwargs, the TP
        layer's kwargs): prefill one sequence of `tokens`, decode `tokens` of one each."""
        import torch
        import torch.distributed as dist

        batch, seq = (1, tokens) if phase == "prefill" else (tokens, 1)
        x = torch.randn(batch, seq, self.hidden, device=device).to(dtype)
        dist.broadcast(x, 0)
        if self.kind == "hf":
            pos = torch.arange(seq, device=device).unsqueeze(0)
            kw = {"position_embeddings": self.rotary(x, pos), "position_ids": pos}
            return x, kw, kw
        return x, {}, {"batch": batch}


# ---- the baselines: the same TP layers, other collectives + GEMMs -----------------------

def _baseline_classes():
    """(column, row) subclasses of tilelink's TP linears for the `nccl` and `async_tp`
    (eager) variants: same shards, same layout, another implementation of forward."""
    import torch
    import torch.distributed._functional_collectives as funcol

    from tilelink.model import ColumnParallelLinear, RowParallelLinear

    def _bias(y, bias):
        return y if bias is None else y + bias

    class NcclColumn(ColumnParallelLinear):
        def forward(self, x):
            full = funcol.all_gather_tensor(x.reshape(-1, x.shape[-1]), 0, self.group_name)
            return _bias(torch.mm(full, self.weight_t), self.bias)

    class NcclRow(RowParallelLinear):
        def forward(self, x):
            y = torch.mm(x.reshape(-1, x.shape[-1]), self.weight_t)
            if self.reduce == "scatter":
                y = funcol.reduce_scatter_tensor(y, "sum", 0, self.group_name)
            else:
                y = funcol.all_reduce(y, "sum", self.group_name)
            return _bias(y, self.bias)

    class SymmColumn(ColumnParallelLinear):
        def forward(self, x):
            from tilelink.bench.providers import gathered_operand_skipped, symm_mem_op

            fused = symm_mem_op("fused_all_gather_matmul")
            _, (y,) = fused(x.reshape(-1, x.shape[-1]), [self.weight_t], 0, self.group_name,
                            **gathered_operand_skipped(fused))
            return _bias(y, self.bias)

    class SymmRow(RowParallelLinear):
        def forward(self, x):
            y = torch.ops.symm_mem.fused_matmul_reduce_scatter(
                x.reshape(-1, x.shape[-1]), self.weight_t, "sum", 0, self.group_name)
            return _bias(y, self.bias)

    return {"nccl": (NcclColumn, NcclRow), "async_tp": (SymmColumn, SymmRow)}


def build_variant(subject: Subject, variant: str, compiled: bool):
    """The TP layer of `variant` (eager form; async_tp compiled: the nccl layer, which
    inductor's micro-pipeline pass rewrites)."""
    from tilelink.model import ColumnParallelLinear, RowParallelLinear

    tp = subject.tensor_parallel()
    if variant.startswith("tilelink"):  # (tilelink[<config>] too: the same layers)
        return tp
    col, row = _baseline_classes()["nccl" if compiled else variant]
    for m in tp.modules():
        if isinstance(m, ColumnParallelLinear):
            m.__class__ = col
        elif isinstance(m, RowParallelLinear):
            m.__class__ = row
    return tp


# ---- one rank ---------------------------------------------------------------------------

class Clock:
    """ms per call of `iters` back-to-back calls after `warmup` more, max over ranks: CUDA
    events (GPU); the wall clock (CPU, a check of the tool, not a timing)."""

    def __init__(self, cpu: bool, warmup: int, iters: int):
        self.cpu, self.warmup, self.iters = cpu, warmup, iters

    def ms(self, fn) -> float:
        if not self.cpu:
            from tilelink.runtime.timing import steady_state_ms

            return steady_state_ms(fn, warmup=self.warmup, iters=self.iters)
        for _ in range(self.warmup):
            fn()
        t0 = time.perf_counter()
        for _ in range(self.iters):
            fn()
        return _max_over_ranks((time.perf_counter() - t0) * 1e3 / self.iters)


def _max_over_ranks(value: float) -> float:
    import torch
    import torch.distributed as dist

    t = torch.tensor([value], dtype=torch.float64,
                     device="cuda" if dist.get_backend() == "nccl" else "cpu")
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return float(t.item())


def _graph_ops(codes) -> dict:
    text = "\n".join(codes)
    return {name: text.count(name) for name in FUSED_NAMES if name in text}


class Backend:
    """One compiled form's own torch.compile backend, counting its compiles.

    All of a size's forms are compiled before any is timed, so dynamo keeps their graphs
    side by side: no `torch._dynamo.reset()` between them (it would drop the graphs compiled
    before, and their next call, in the rounds, would compile again). Dynamo reuses a
    graph only under the backend object it was compiled with, so a backend per form keeps
    the `async_tp` compiled form (the `nccl` layer's classes) from reusing the `nccl`
    form's graph, which lacks async-TP's pass. `config`: inductor's settings for every
    compile of this form (a recompile too); `compiles` past the first are reported in the
    row."""

    def __init__(self, name: str, config: dict | None = None):
        self.name = name
        self.config = dict(config or {})
        self.compiles = 0

    def __call__(self, gm, example_inputs):
        self.compiles += 1
        if self.name == "inductor":  # (what torch.compile's "inductor" calls, with config)
            from torch._inductor.compile_fx import compile_fx

            return compile_fx(gm, example_inputs, config_patches=self.config)
        from torch._dynamo.backends.registry import lookup_backend

        return lookup_backend(self.name)(gm, example_inputs)

    def __repr__(self) -> str:
        return f"decoder_bench.Backend({self.name!r}, compiles={self.compiles})"


def _build(fn, variant, mode, phase, tokens, x, want, tp_kw, args):
    """One row's callable, its output checked against `want` (this rank's tokens of the
    unsharded layer's): (row without times, the call to time). Compiled modes compile on
    the first call (timed apart, code inspected); graph modes capture `fn` and replay."""
    from tilelink.model.llama import shard_tokens

    row = {"variant": variant, "mode": mode, "phase": phase, "tokens": tokens}
    xs = shard_tokens(x)
    t0 = time.perf_counter()
    if mode.startswith("compiled"):
        got, codes = _call_and_get_code(fn, xs, **tp_kw)
        row["compile_s"] = round(_max_over_ranks(time.perf_counter() - t0), 2)
        row["graph_ops"] = _graph_ops(codes)
    if mode.endswith("graph"):
        from tilelink.runtime.timing import capture_call

        graph, got = capture_call(lambda: fn(xs, **tp_kw))
        graph.replay()
        call = graph.replay
    else:
        got = fn(xs, **tp_kw)
        def call():
            return fn(xs, **tp_kw)
    row["err"] = _max_over_ranks(_rel_err(got, want))
    row["ok"] = row["err"] <= args.tol
    return row, call


def _rel_err(got, want) -> float:
    """The largest difference from `want`, relative to its largest magnitude."""
    return ((got.float() - want.float()).abs().max() / want.float().abs().max()).item()


def _call_and_get_code(fn, *args, **kwargs):
    """(fn's output, the code inductor generated meanwhile): as
    torch._inductor.utils.run_and_get_code, without its torch._dynamo.reset(), which would
    drop the graphs of this size's forms compiled before (their next call would compile
    again, inside the timing)."""
    from unittest import mock

    from torch._inductor.graph import GraphLowering

    codes: list[str] = []
    with mock.patch.object(GraphLowering, "save_output_code", codes.append):
        out = fn(*args, **kwargs)
    return out, codes


def round_orders(n: int, rounds: int) -> list[list[int]]:
    """The order of `n` callables in each of `rounds` rounds: each round all of them once,
    rotated so that the rounds start at callables spread over the list (no callable always
    first, after an idle gap, or after the same neighbour), as `tilelink bench` does."""
    if n < 1:
        return [[] for _ in range(rounds)]
    step = max(1, n // max(1, rounds))
    base = list(range(n))
    return [base[(i * step) % n:] + base[:(i * step) % n] for i in range(rounds)]


def _profile(call, iters: int, stem: Path) -> dict:
    """`iters` calls under torch.profiler (after the timed ones, so nothing compiles): what
    a call costs the host to issue, how long the GPU is busy per call (the union of its
    kernels' and copies' intervals on every stream) and the kernels that take most of it.
    Writes `stem`-rank<r>.json (chrome://tracing or ui.perfetto.dev)."""
    import torch
    import torch.distributed as dist
    from torch.profiler import ProfilerActivity, profile

    torch.cuda.synchronize()
    dist.barrier()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        t0 = time.perf_counter()
        for _ in range(iters):
            call()
        issued = time.perf_counter() - t0
        torch.cuda.synchronize()
    stem.parent.mkdir(parents=True, exist_ok=True)
    prof.export_chrome_trace(f"{stem}-rank{dist.get_rank()}.json")
    spans, by_name = [], {}
    for e in prof.events():
        if e.device_type == torch.autograd.DeviceType.CUDA and e.time_range.elapsed_us() > 0:
            spans.append((e.time_range.start, e.time_range.end))
            by_name[e.name] = by_name.get(e.name, 0.0) + e.time_range.elapsed_us()
    busy, end = 0.0, None
    for s, t in sorted(spans):
        if end is None or s > end:
            busy, end = busy + (t - s), t
        elif t > end:
            busy, end = busy + (t - end), t
    top = sorted(by_name.items(), key=lambda kv: -kv[1])[:12]
    return {"host_issue_ms": round(issued * 1e3 / iters, 4),
            "gpu_busy_ms": round(busy / 1e3 / iters, 4),
            "top_ms": [[n[:90], round(us / 1e3 / iters, 4)] for n, us in top]}


def _agree(row: dict, index: int, rank: int, world: int, timeout: float,
           what: str = "row") -> dict:
    """Every rank's outcome of step `index` (a row's build, or one of its timings), agreed
    through the process group's store: a row that failed on one rank is an error row on
    every rank, so that they all go on to the same next step. A rank that failed alone may
    find the others still in that step's collectives: they never post their outcome, so it
    stops the run (os._exit(4)) rather than meet them out of step. `what` names the step
    in that message."""
    import datetime

    import torch.distributed as dist

    store = dist.distributed_c10d._get_default_store()
    store.set(f"decoder_bench/{index}/{rank}", json.dumps(row.get("error")))
    keys = [f"decoder_bench/{index}/{r}" for r in range(world)]
    try:
        store.wait(keys, datetime.timedelta(seconds=timeout))
    except Exception as e:  # noqa: BLE001  (the store's timeout error type varies by torch)
        print(f"decoder_bench: rank {rank}: the ranks did not all finish {what} "
              f"{row['variant']} {row['mode']} {row['phase']} {row['tokens']} within "
              f"{timeout:g} s (this rank's outcome: {row.get('error') or 'ok'}); stopping "
              f"({type(e).__name__})", file=sys.stderr, flush=True)
        os._exit(4)
    errors = [json.loads(store.get(k)) for k in keys]
    # rank 0 hosts the store: it waits until every rank has read this step's outcomes, so
    # that it never ends the run (and the store) under a rank still reading them (a gloo
    # run's rank 1 was reset by its peer there, 2026-11-28)
    store.set(f"decoder_bench/{index}/read/{rank}", "1")
    if rank == 0:
        try:
            store.wait([f"decoder_bench/{index}/read/{r}" for r in range(world)],
                       datetime.timedelta(seconds=timeout))
        except Exception as e:  # noqa: BLE001  (as above)
            print(f"decoder_bench: rank 0: the ranks did not all read the outcomes of "
                  f"{what} {row['variant']} {row['mode']} {row['phase']} {row['tokens']} "
                  f"within {timeout:g} s; stopping ({type(e).__name__})", file=sys.stderr,
                  flush=True)
            os._exit(4)
    if row.get("error") is None and any(errors):
        first = next(r for r, e in enumerate(errors) if e)
        row = {k: row[k] for k in ("variant", "mode", "phase", "tokens")} | {
            "ok": False, "error": f"rank {first} failed: {errors[first]}"}
    return row


def _modes(phase: str, args) -> list[str]:
    graph = phase == "decode" and not args.cpu
    modes = ["eager graph" if graph else "eager"]
    if not args.no_compile:
        modes.append("compiled graph" if graph else "compiled")
    return modes


def _rank(rank: int, world: int, args) -> dict:
    import warnings

    import torch
    import torch.distributed as dist

    from tilelink.model import config_override, prepare
    from tilelink.model.plans import BALANCE_KNOB

    # torch 2.13 renamed the functional collectives (*_single) and warns on every call of
    # the old names, which torch 2.11 (the GPU hosts') has alone
    warnings.filterwarnings("ignore", message=r".*is deprecated\. Please use", category=FutureWarning)
    deadline = threading.Timer(args.time_limit, _out_of_time, (rank, args.time_limit))
    deadline.daemon = True
    deadline.start()
    device = torch.device("cpu") if args.cpu else torch.device("cuda", torch.cuda.current_device())
    dtype = torch.float32 if args.cpu else torch.bfloat16
    for name in ("cache_size_limit", "recompile_limit"):  # a static-shape compile per size
        if hasattr(torch._dynamo.config, name):
            setattr(torch._dynamo.config, name, 64)
    if not args.cpu:
        from tilelink.runtime.symmetric import enable_symm_mem

        enable_symm_mem(None)
    subject = Subject(args, device, dtype)
    sizes = [("prefill", t) for t in args.prefill] + [("decode", t) for t in args.decode]
    cases = {}
    with torch.no_grad():
        for phase, t in sizes:
            x, full_kw, tp_kw = subject.inputs(t, phase, dtype, device)
            from tilelink.model.llama import shard_tokens

            cases[(phase, t)] = (x, shard_tokens(subject.layer(x, **full_kw)), tp_kw)
    meta = {"world": world, "layer": subject.kind, "hidden": args.hidden,
            "intermediate": args.intermediate, "heads": list(args.heads),
            "dtype": str(dtype).replace("torch.", ""), "iters": args.iters,
            "warmup": args.warmup, "rounds": args.rounds,
            "torch": torch.__version__, "device": "cpu (gloo)" if args.cpu
            else torch.cuda.get_device_name(), "commit": os.environ.get("TILELINK_COMMIT", ""),
            "complete": False}
    try:
        import triton

        meta["triton"] = triton.__version__
    except ImportError:
        pass
    rows: list[dict] = []
    clock = Clock(args.cpu, args.warmup, args.iters)
    variants = [v for v in args.variants if not (args.cpu and v == "async_tp")]
    overrides = {f"tilelink[{text}]": config for text, config in args.tilelink_configs}
    variants += list(overrides)
    with torch.no_grad():  # (eager form, compiled form) of each variant, built once
        forms = {v: (build_variant(subject, v, compiled=False),
                     build_variant(subject, v, compiled=True)) for v in variants}
    steps = iter(range(1 << 62))  # one store key per agreed step, the same on every rank
    first_row = True
    # size by size, so that a run cut short by --time-limit has whole comparisons
    for phase, t in sizes:
        x, want, tp_kw = cases[(phase, t)]
        torch._dynamo.reset()  # no graph of another size reused (nor kept: its rows are done)
        built: list[tuple[dict, object, Backend | None]] = []
        size_rows: list[dict] = []
        for variant in variants:
            tp, compiled_tp = forms[variant]
            for mode in _modes(phase, args):
                call, backend = None, None
                try:
                    if first_row and args.fail_rank == rank:
                        raise RuntimeError(f"--fail-rank {rank}: this rank fails alone")
                    first_row = False
                    config = overrides.get(variant)
                    if variant.startswith("tilelink"):  # its ops built before any capture
                        with torch.no_grad(), config_override(config):
                            # (compiled_tp: the same shapes)
                            prepare(tp, tokens=[t],
                                    choices=args.choices if config is None else None)
                    if mode.startswith("compiled"):
                        # no FX-graph cache: a cached graph would not show its code
                        # (graph_ops); async-TP's pass on for its form alone
                        backend = Backend("aot_eager" if args.cpu else "inductor", {
                            "fx_graph_cache": False,
                            "_micro_pipeline_tp": variant == "async_tp"})
                        fn = torch.compile(compiled_tp, fullgraph=True, dynamic=False,
                                           backend=backend)
                    else:
                        fn = tp
                    with torch.no_grad(), config_override(config):
                        row, call = _build(fn, variant, mode, phase, t, x, want, tp_kw, args)
                        if (config or {}).get(BALANCE_KNOB) == "tuned" and mode == "compiled":
                            row = _tuned(tp, call, row, t, want, args)
                    if variant in overrides:  # (its calls look up the override's ops)
                        call = _under(overrides[variant], call)
                except Exception as e:  # noqa: BLE001  (recorded; the ranks fail alike: same code)
                    row = _error_row(variant, mode, phase, t, e, args.cpu)
                row = _agree(row, next(steps), rank, world, args.agree_timeout)
                size_rows.append(row)
                if "error" not in row:
                    built.append((row, call, backend))
        with torch.no_grad():
            _time_rounds(built, clock, args, rank, world, steps)
        for row, call, backend in built:
            if "error" in row:
                continue
            if args.profile and not args.cpu:
                try:  # (the row's timing stands without it)
                    with torch.no_grad():
                        name = re.sub(r"[^A-Za-z0-9_.-]+", "_", row["variant"])
                        row["profile"] = _profile(call, args.iters, Path(args.profile) / (
                            f"{name}-{row['mode'].replace(' ', '_')}-{phase}{t}"))
                except Exception as e:  # noqa: BLE001  (a profiler this torch lacks: in the row)
                    row["profile"] = {"error": f"{type(e).__name__}: {str(e)[:200]}"}
            if backend is not None and backend.compiles > 1:
                row["recompiles"] = backend.compiles - 1
        del built  # (the graphs and compiled forms of this size)
        rows += size_rows
        if rank == 0:
            for row in size_rows:
                print(_line(row), flush=True)
            for row in with_ratios(size_rows):
                if (line := _ratio_line(row)) is not None:
                    print(line, flush=True)
            write(args.out, meta, rows)
    meta["complete"] = True
    if not args.cpu:  # what tilelink.model.prepare's joint decision picked, per op and size
        from tilelink.model.plans import choices

        meta["tilelink_choices"] = choices(every_scope=True)
    deadline.cancel()
    if rank == 0:
        write(args.out, meta, rows)
    return {"meta": meta, "rows": with_ratios(rows)}


def _tuned(tp, call, row: dict, tokens: int, want, args) -> dict:
    """tilelink.model.tune over `call` (the compiled layer's forward) for the ops of `tp`,
    then the row's output checked again (its ops may have changed). The eager row of the
    variant, timed later, runs the same choices."""
    from tilelink.model import tune

    import torch.distributed as dist

    def say(line: str) -> None:  # (rank 0's progress: tuning takes a while a size)
        if not dist.is_initialized() or dist.get_rank() == 0:
            print(f"tune: {line}", flush=True)

    res = tune(tp, lambda _t: call(), [tokens], iters=max(3, args.iters // 2),
               warmup=2, rounds=3, save=args.save_choices, progress=say)
    row = dict(row, tuned=res[0])
    row["err"] = max(row["err"], _max_over_ranks(_rel_err(call(), want)))
    row["ok"] = row["err"] <= args.tol
    return row


def _under(config: dict, call):
    """`call`, each call made under the TileLink config override `config`."""
    from tilelink.model import config_override

    def run():
        with config_override(config):
            return call()
    return run


def _error_row(variant, mode, phase, tokens, e: Exception, cpu: bool) -> dict:
    import torch

    if not cpu:  # (its queued work done before the ranks agree on it)
        torch.cuda.synchronize()
    return {"variant": variant, "mode": mode, "phase": phase, "tokens": tokens, "ok": False,
            "error": f"{type(e).__name__}: {str(e)[:600]}"}


def _time_rounds(built: list, clock: Clock, args, rank: int, world: int, steps) -> None:
    """Time every built row of one size in --rounds interleaved rounds, after one untimed
    warm-up round: each round calls `clock.ms` once per row, in `round_orders`' rotation
    (the same order on every rank, so the ranks meet in the same collectives). Each row
    gets `ms_rounds` (every round's time) and `ms` (their median). A timing that fails on
    any rank turns its row into an error row on every rank, left out of later rounds."""
    import statistics

    times: list[list[float]] = [[] for _ in built]
    orders = round_orders(len(built), args.rounds)
    for r, order in enumerate([list(range(len(built)))] + orders):
        for i in order:
            row, call, _ = built[i]
            if "error" in row:
                continue
            outcome = row
            try:
                ms = clock.ms(call)
            except Exception as e:  # noqa: BLE001  (agreed below, as a failed build is)
                outcome = _error_row(row["variant"], row["mode"], row["phase"],
                                     row["tokens"], e, args.cpu)
            label = "warm-up round" if r == 0 else f"timing round {r}"
            agreed = _agree(outcome, next(steps), rank, world, args.agree_timeout,
                            f"{label} of row")
            if "error" in agreed:
                row.clear()
                row.update(agreed, error=f"{label}: {agreed['error']}")
            elif r > 0:
                times[i].append(round(ms, 4))
    for (row, _, _), ts in zip(built, times):
        if "error" not in row:
            row["ms"] = round(statistics.median(ts), 4)
            row["ms_rounds"] = ts


def _out_of_time(rank: int, limit: float) -> None:
    if rank == 0:
        print(f"decoder_bench: past --time-limit {limit:g} s; stopping (the JSON holds the "
              "sizes measured so far; fewer --prefill / --decode sizes, or --no-compile, "
              "fit more in)", file=sys.stderr, flush=True)
    os._exit(3)


# ---- results ----------------------------------------------------------------------------

def with_ratios(rows: list[dict]) -> list[dict]:
    """Each row with `speedup_vs_best_baseline`: the fastest agreeing baseline row of its
    phase and size (any mode) over this row's ms (> 1: faster than every baseline); and,
    round by round, the fastest baseline of that round over this row's time in it
    (`speedup_rounds`) and their median (`speedup_paired`). A round times every row of a
    size once, back to back, so a round's ratio compares times taken under the same state of
    the host: on hosts whose speed drifts between rounds it spreads less than the ratio of
    medians."""
    import statistics

    best: dict = {}
    base: dict = {}
    for r in rows:
        if r["variant"] in BASELINES and r.get("ok") and "ms" in r:
            key = (r["phase"], r["tokens"])
            base.setdefault(key, []).append(r)
            if key not in best or r["ms"] < best[key]["ms"]:
                best[key] = r
    out = []
    for r in rows:
        r = dict(r)
        key = (r["phase"], r["tokens"])
        b = best.get(key)
        if b is not None and r.get("ok") and "ms" in r:
            r["best_baseline"] = f"{b['variant']} {b['mode']}"
            r["speedup_vs_best_baseline"] = round(b["ms"] / r["ms"], 3)
            ts = r.get("ms_rounds") or []
            peers = [x["ms_rounds"] for x in base[key] if len(x.get("ms_rounds") or []) == len(ts)]
            if ts and peers:
                r["speedup_rounds"] = [round(min(p[i] for p in peers) / t, 3)
                                       for i, t in enumerate(ts)]
                r["speedup_paired"] = round(statistics.median(r["speedup_rounds"]), 3)
        out.append(r)
    return out


def _ratio_line(r: dict) -> str | None:
    """A row's ratio to the fastest baseline, per round (None for a baseline or a row
    without one)."""
    if r["variant"] in BASELINES or "speedup_rounds" not in r:
        return None
    sr = r["speedup_rounds"]
    return (f"  {r['variant']} {r['mode']} {r['phase']} T={r['tokens']}: x best baseline "
            f"{r['speedup_vs_best_baseline']:.3f} (medians); round by round {r['speedup_paired']:.3f} "
            f"[{min(sr):.3f}-{max(sr):.3f}]")


def write(path: str, meta: dict, rows: list[dict]) -> None:
    """The JSON, written whole to a temporary name and renamed (never half a file)."""
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    tmp = p.with_name(p.name + ".tmp")
    tmp.write_text(json.dumps({"meta": meta, "rows": with_ratios(rows)}, indent=1) + "\n")
    tmp.replace(p)


def _line(r: dict) -> str:
    head = f"{r['variant']:9s} {r['mode']:15s} {r['phase']:7s} T={r['tokens']:<6d}"
    if "error" in r:
        return f"{head} ERROR {r['error'][:200]}"
    extra = f"  compile {r['compile_s']} s {r.get('graph_ops', {})}" if "compile_s" in r else ""
    if r.get("recompiles"):
        extra += (f"  RECOMPILED {r['recompiles']}x after its first call (a compile may be "
                  "in its times)")
    pr = r.get("profile") or {}
    if "error" in pr:
        extra += f"\n    profile failed: {pr['error']}"
    elif pr:  # rank 0's
        extra += (f"\n    profile (rank 0): issuing a call {pr['host_issue_ms']:.3f} ms of "
                  f"host, GPU busy {pr['gpu_busy_ms']:.3f} ms a call; largest: "
                  + "; ".join(f"{n} {ms:.3f}" for n, ms in pr["top_ms"][:8]))
    ts = r["ms_rounds"]
    return (f"{head} {r['ms']:9.3f} ms [{min(ts):.3f}-{max(ts):.3f}]  err {r['err']:.2e}"
            f"{'' if r['ok'] else ' DISAGREES'}{extra}")


def main(argv=None) -> int:
    args = parser().parse_args(argv)
    world = args.world_size
    if world is None:
        from tilelink.runtime.launcher import gpu_count, under_torchrun

        world = int(os.environ["WORLD_SIZE"]) if under_torchrun() else (2 if args.cpu
                                                                          else gpu_count())
    h, kv = args.heads
    bad = [f"{what} ({n}) is not divisible by W = {world}"
           for what, n in (("heads", h), ("KV heads", kv), ("intermediate", args.intermediate))
           if world < 1 or n % world]
    bad += [f"{t} tokens are not divisible by W = {world}"
            for t in args.prefill + args.decode if world < 1 or t % world]
    if args.rounds < 1:
        bad.append(f"--rounds {args.rounds}: write --rounds 1 or more (timed rounds per size)")
    if args.iters < 1:
        bad.append(f"--iters {args.iters}: write --iters 1 or more (calls per timing)")
    if args.hidden % h:
        bad.append(f"hidden ({args.hidden}) is not divisible by heads ({h})")
    if world < 1:
        bad = [f"W = {world}: no GPU visible (use --cpu for the gloo check)"]
    from tilelink.model.plans import BALANCE_KNOB

    configs = []
    for text in args.tilelink_configs:
        items = text.split()
        if not items or any(item.count("=") != 1 for item in items):
            bad.append(f"--tilelink-configs {text!r}: write KNOB=VALUE items in one quoted "
                       "string per config, e.g. \"comm=sm comm_programs=32\"")
            continue
        config = dict(item.split("=") for item in items)
        try:
            from tilelink.schedule.config import Config

            if config.get(BALANCE_KNOB, "0") not in ("0", "1", "tuned"):
                raise ValueError(f"{BALANCE_KNOB}={config[BALANCE_KNOB]}: write 0 (each op's "
                                 "own choice), 1 (the model's joint decision) or tuned "
                                 "(tilelink.model.tune's measured choice)")
            Config().with_values({k: v for k, v in config.items() if k != BALANCE_KNOB})
        except Exception as e:  # noqa: BLE001  (ConfigError: its message and hint)
            bad.append(f"--tilelink-configs {text!r}: {e}")
            continue
        configs.append((" ".join(items), config))
    if len({text for text, _ in configs}) < len(configs):
        bad.append("--tilelink-configs: a config is given twice")
    args.tilelink_configs = configs
    if args.save_choices and not any(c.get(BALANCE_KNOB) == "tuned" for _, c in configs):
        bad.append("--save-choices writes tilelink.model.tune's picks: add "
                   "--tilelink-configs balance=tuned")
    if args.choices and not Path(args.choices).is_file():
        bad.append(f"--choices {args.choices}: no such file (write one with --save-choices "
                   "and --tilelink-configs balance=tuned)")
    if bad:
        parser().error("; ".join(bad))
    if args.layer == "hf" and not hf_available():
        parser().error("--layer hf needs transformers (pip install -e '.[hf]'); "
                       "--layer plain uses tilelink.model.llama's layer")
    from tilelink.errors import TileLinkError

    try:
        if args.cpu:
            from tilelink.model import cpu_world

            res = cpu_world.run(_rank, world, (args,), timeout=args.time_limit + 60)[0]
        else:
            from tilelink.runtime.launcher import launch_world

            res = launch_world(_rank, world, args)
    except TileLinkError as e:  # a rank failed, or the ranks stopped at --time-limit
        print(f"decoder_bench: {e}", file=sys.stderr)
        out = Path(args.out)
        if out.exists():
            print(f"decoder_bench: {out} holds the rows measured before that",
                  file=sys.stderr)
        return 3
    bad_rows = [r for r in res["rows"] if not r.get("ok")]
    if int(os.environ.get("RANK", "0")) == 0:  # torchrun: every rank returns here
        print(f"wrote {args.out}: {len(res['rows'])} rows, {len(bad_rows)} failed or "
              "disagreeing")
    return 1 if bad_rows else 0


if __name__ == "__main__":
    raise SystemExit(main())
