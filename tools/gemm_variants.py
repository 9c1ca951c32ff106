"""Persistent bf16 TMA GEMM variants against cuBLAS on one GPU (issue #5: >= 0.97x cuBLAS).

    python tools/gemm_variants.py                                   # all variants, 3 shapes
    python tools/gemm_variants.py --shapes 8192x4096x8192 --variants base flat_sub2_s4
    python tools/gemm_variants.py --extra "bk128:BK=128,STAGES=2,EPI_SPLIT=2,FLATTEN=1"
    python tools/gemm_variants.py --compile-only cuda:90           # no GPU needed

TileLink's compute role (templates/ag_gemm.py.j2, TMA, comm=copy_engine, W=1) is a persistent
GEMM: a host grid of num_SMs programs, `tl.range` over tiles in grouped order, device-side
tensor descriptors, a per-tile K loop `tl.range(num_stages=STAGES)` and one descriptor store of
the whole 128x256 tile, plus -- per tile -- a signal wait, a proxy fence and a token that makes
the A loads depend on the wait. This script rebuilds that loop as ONE kernel whose constexpr
knobs switch the things that may matter on Hopper (loop flattening, epilogue subtiling, stage
count, warp specialization, host vs device descriptors, TileLink's per-tile synchronisation),
and times each variant against torch.matmul (cuBLAS) on the same operands, steady state:
warm-up calls, CUDA events around `--iters` back-to-back calls, median of `--rounds`
interleaved rounds (variant, cuBLAS, variant, cuBLAS, ...).

`--compile-only cuda:90` compiles every variant with `triton.compile` for that target (works
on a CPU-only machine; shape = the first of --shapes) and prints, per variant, whether it
compiled, its shared memory, how many `scf.for` loops remain in the TTGIR (1 = flatten fused
the tile and K loops), the depth of the smem operand rings (0 = not software pipelined),
whether the TTGIR is warp specialized and the warps it launches. The timed table also gives
registers / spills per thread and the compile time of each variant.

Imports `tilelink.lang.nvidia` (TileLink's wait primitives) from this checkout; the timed run
needs torch with CUDA and uses GPU 0 only.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import re
import statistics
import sys
import tempfile
import time
from pathlib import Path

import triton
import triton.language as tl

# The TILE_SYNC knob reuses TileLink's own wait / fence / token primitives, so that variant
# costs exactly what the generated kernel pays per tile (the repo root holds `tilelink`).
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from tilelink.lang import nvidia as tld
from tilelink.runtime.timing import steady_state_ms

DEFAULT_SHAPES = ["8192x4096x8192", "8192x14336x8192", "8192x24576x12288"]
SMEM_LIMIT = 232448  # max dynamic shared memory per block on H100 / H200 (227 KiB)
CHUNK_ROWS = tl.constexpr(2048)  # rows per signal slot in TileLink's M=8192 AG plan (comm_block_m)

# TileLink's defaults today; every variant below is this plus a few knobs.
BASE = {"BM": 128, "BN": 256, "BK": 64, "STAGES": 3, "GROUP_M": 8, "num_warps": 8,
        "FLATTEN": False, "WARP_SPEC": False, "EPI_SPLIT": 1, "HOST_DESC": False, "TILE_SYNC": 0}

# name -> (knobs over BASE, what it tests). Kept short: one question per variant.
VARIANTS = {
    "tilelink": ({"TILE_SYNC": 1},
                 "TileLink's loop as generated: per-tile chunk loop of waits + fence + token"),
    "base": ({},
             "same loop without the per-tile sync: what the sync costs"),
    "flat": ({"FLATTEN": True},
             "flatten=True: the next tile's loads overlap this tile's epilogue"),
    "sub2": ({"EPI_SPLIT": 2},
             "epilogue stored as two 128x128 halves (32 KB less smem)"),
    "flat_sub2_s4": ({"FLATTEN": True, "EPI_SPLIT": 2, "STAGES": 4},
                     "flatten + halves; the freed 32 KB buys a 4th stage"),
    "flat_sub2_s4_asmwait": ({"FLATTEN": True, "EPI_SPLIT": 2, "STAGES": 4, "TILE_SYNC": 3},
                             "the above, with the loop-free per-tile wait (tld.wait_flat)"),
    "ws": ({"WARP_SPEC": True, "num_warps": 4},
           "warp_specialize=True (Hopper autoWS: TMA producer + 2 MMA consumer warp groups)"),
    "ws_asmwait": ({"WARP_SPEC": True, "num_warps": 4, "TILE_SYNC": 4},
                   ("the above with a loop-free per-tile wait (the unbounded _asm_wait: "
                    "wait_flat is not WS-safe) + fence + token")),
}
# Knobs that --extra may set: BASE's. TILE_SYNC: 0 none; 1 TileLink's (a `for` over the signal
# chunks of the tile's rows, each a tld.wait, then fence + token); 2 one tld.wait, no chunk
# loop; 3 one tld.wait_flat over the tile's chunks (its bounded spin is one inline-PTX op, no
# scf loop at all); 4 the unbounded per-thread _asm_wait experiment (no barrier: what a
# warp-specialized loop can take). HOST_DESC: descriptors built on the host (TensorDescriptor
# kernel args) instead of tl.make_tensor_descriptor in the kernel.
# What compiling for cuda:90 with Triton 3.6 showed (see --compile-only):
# * flatten is silently NOT applied when the tile loop holds another loop (TILE_SYNC=1: the
#   chunk `for`), and with TILE_SYNC=2 the tiles fuse but the fused loop is not software
#   pipelined at all (no multi-buffered smem; tld.wait's scf.while sits in it). TILE_SYNC=3
#   (tld.wait_flat) keeps both the fusion and the 3-4 stage pipeline; so does its give-up
#   branch (an scf.if), but a tl.debug_barrier() in the tile loop would stop the pipeliner.
# * tld.wait_flat is not WS-safe (autoWS copies its thread-0 spin and CTA-wide barrier.red
#   into every partition), hence TILE_SYNC=4 for ws_asmwait.
# * warp_specialize on Hopper (nvidia.passes.hopper autoWS) only acts with num_warps=4 (it then
#   launches 12 warps: producer + 2 consumers, each consumer 64 x BN), and silently does
#   nothing with num_warps=8, with flatten=True, or with tld.wait in the loop (TILE_SYNC=1/2:
#   an scf.if/while it declines); with EPI_SPLIT=2 the pass crashes (PassManager::run failed).


@triton.jit
def _tile_coords(t, num_m, num_n, GROUP_M: tl.constexpr):
    """(pid_m, pid_n) of linear tile `t` in grouped order: GROUP_M row blocks sweep the
    columns together so the B panels they share stay in L2 (same order as TileLink's)."""
    group = t // (GROUP_M * num_n)
    first_m = group * GROUP_M
    group_rows = tl.minimum(num_m - first_m, GROUP_M)
    pid_m = first_m + (t % (GROUP_M * num_n)) % group_rows
    pid_n = (t % (GROUP_M * num_n)) // group_rows
    return pid_m, pid_n


@triton.jit
def _asm_wait(sig_ptr, expected):
    """Spin until the int32 at `sig_ptr` is >= `expected` (acquire, system scope); return it.

    Every thread spins on its own `ld.acquire.sys` inside ONE inline-asm op and there is no
    barrier, so it also works inside warp-specialized partitions (tld.wait_flat does not: its
    CTA barrier and thread-0 spin assume every thread of the CTA runs it). Unbounded (no abort
    / give-up like tld.wait_flat): an experiment only, kept for the ws_asmwait variant.
    """
    return tl.inline_asm_elementwise(
        """{
        .reg .pred p;
        spin_${:uid}:
        ld.acquire.sys.global.b32 $0, [$1];
        setp.lt.s32 p, $0, $2;
        @p bra spin_${:uid};
        }""",
        "=r,l,r", [sig_ptr, expected], dtype=tl.int32, is_pure=False, pack=1)


@triton.jit
def _halves(x, BM: tl.constexpr, W: tl.constexpr):
    """Split a (BM, W) tile into its left and right (BM, W // 2) column halves.

    reshape -> (BM, 2, W/2), permute the 2 last, split: the tutorial's way; on the wgmma
    accumulator layout the halves are whole registers, so this is free of data movement.
    """
    x = tl.reshape(x, (BM, 2, W // 2))
    x = tl.permute(x, (0, 2, 1))
    return tl.split(x)


@triton.jit
def _store_tile(c_desc, acc, row, col, BM: tl.constexpr, BN: tl.constexpr,
                EPI_SPLIT: tl.constexpr):
    """Store the fp32 accumulator as bf16 through `c_desc` in EPI_SPLIT (1, 2 or 4) column
    pieces. Smaller pieces need a smaller smem staging buffer (128x256 bf16 = 64 KB whole,
    32 KB per half) and let the first TMA store start while the next piece is converted."""
    if EPI_SPLIT == 1:
        c_desc.store([row, col], acc.to(tl.bfloat16))
    elif EPI_SPLIT == 2:
        h0, h1 = _halves(acc, BM, BN)
        c_desc.store([row, col], h0.to(tl.bfloat16))
        c_desc.store([row, col + BN // 2], h1.to(tl.bfloat16))
    else:
        h0, h1 = _halves(acc, BM, BN)
        q0, q1 = _halves(h0, BM, BN // 2)
        q2, q3 = _halves(h1, BM, BN // 2)
        c_desc.store([row, col], q0.to(tl.bfloat16))
        c_desc.store([row, col + BN // 4], q1.to(tl.bfloat16))
        c_desc.store([row, col + 2 * (BN // 4)], q2.to(tl.bfloat16))
        c_desc.store([row, col + 3 * (BN // 4)], q3.to(tl.bfloat16))


@triton.jit
def gemm_kernel(a, b, c, flag_ptr, abort_ptr, diag_ptr, spin_limit,
                M: tl.constexpr, N: tl.constexpr, K: tl.constexpr,
                BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr,
                STAGES: tl.constexpr, GROUP_M: tl.constexpr, NUM_SMS: tl.constexpr,
                FLATTEN: tl.constexpr, WARP_SPEC: tl.constexpr, EPI_SPLIT: tl.constexpr,
                HOST_DESC: tl.constexpr, TILE_SYNC: tl.constexpr):
    """c[M, N] = a[M, K] @ b[K, N] (bf16 in, fp32 accumulate, bf16 out), persistent.

    a, b, c are row-major pointers (device descriptors are built here, as TileLink does) or,
    with HOST_DESC, TensorDescriptors built on the host (passed as __grid_constant__ kernel
    arguments: no global-memory descriptor writes and no tensormap fence in the kernel).
    M, N, K are constexpr like in TileLink's generated kernel (trip counts known).
    flag_ptr / abort_ptr / diag_ptr / spin_limit are only read with TILE_SYNC.
    """
    pid = tl.program_id(0)
    num_m = tl.cdiv(M, BM)
    num_n = tl.cdiv(N, BN)
    if HOST_DESC:
        a_desc = a
        b_desc = b
        c_desc = c
    else:
        # device-side descriptors (needs triton.set_allocator): what TileLink emits today
        a_desc = tl.make_tensor_descriptor(a, shape=[M, K], strides=[K, 1], block_shape=[BM, BK])
        b_desc = tl.make_tensor_descriptor(b, shape=[K, N], strides=[N, 1], block_shape=[BK, BN])
        c_desc = tl.make_tensor_descriptor(c, shape=[M, N], strides=[N, 1],
                                           block_shape=[BM, BN // EPI_SPLIT])
    # The tile loop. flatten fuses it with the K loop below into one software-pipelined loop
    # (the next tile's first loads are issued before this tile's epilogue instead of after);
    # warp_specialize hands the loop to the autoWS pass (a TMA producer warp group feeding
    # MMA consumer warp groups through smem barriers) instead of software pipelining.
    for t in tl.range(pid, num_m * num_n, NUM_SMS, flatten=FLATTEN, warp_specialize=WARP_SPEC):
        pid_m, pid_n = _tile_coords(t, num_m, num_n, GROUP_M)
        row = pid_m * BM
        col = pid_n * BN
        if TILE_SYNC:
            # TileLink's per-tile prologue at W=1 (the signals are already set, so each wait
            # is one acquire load at system scope plus a CTA barrier): wait for every chunk of
            # rows the tile reads, fence generic -> async proxy, make the A row depend on it.
            if TILE_SYNC == 1:
                tok = row * 0
                for w in range(row // CHUNK_ROWS, (row + BM - 1) // CHUNK_ROWS + 1):
                    tok = tld.wait(flag_ptr + w, 1, spin_limit, abort_ptr, diag_ptr, 0, w, 0)
            elif TILE_SYNC == 3:
                # loop-free wait (tld.wait_flat: the bounded spin over the tile's chunks is
                # one inline-PTX op), so the tile loop holds no scf loop but the K loop
                w = row // CHUNK_ROWS
                tok = tld.wait_flat(flag_ptr + w, (row + BM - 1) // CHUNK_ROWS + 1 - w, 1,
                                    spin_limit, abort_ptr, diag_ptr, 0, w, 0)
            elif TILE_SYNC == 4:
                # unbounded per-thread spin, no barrier (the warp-specialized experiment)
                tok = _asm_wait(flag_ptr + row // CHUNK_ROWS, 1)
            else:
                # one wait, no chunk loop (right when BM divides CHUNK_ROWS: a tile's rows
                # never straddle two chunks), so the tile loop holds no loop but the K loop
                w = row // CHUNK_ROWS
                tok = tld.wait(flag_ptr + w, 1, spin_limit, abort_ptr, diag_ptr, 0, w, 0)
            tld.fence_proxy_async(True)
            a_row = tld.consume_token(row, tok)
        else:
            a_row = row
        acc = tl.zeros((BM, BN), dtype=tl.float32)
        for k0 in tl.range(0, K, BK, num_stages=STAGES):
            acc = tl.dot(a_desc.load([a_row, k0]), b_desc.load([k0, col]), acc)
        # (the tutorial recomputes the tile coordinates here from a second counter to dodge
        # a Blackwell pipeliner bug; on Hopper reusing row/col is fine)
        _store_tile(c_desc, acc, row, col, BM, BN, EPI_SPLIT)


@contextlib.contextmanager
def captured_stderr(log: list):
    """Send fd 2 to a temp file for the block (MLIR pass failures dump a ~100-line reproducer
    there, which would bury the table), then append its lines that say what failed to `log`."""
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile() as f:
        os.dup2(f.fileno(), 2)
        try:
            yield
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
            f.seek(0)
            text = f.read().decode(errors="replace")
            log.extend(x.strip() for x in text.splitlines()
                       if re.search(r"UNREACHABLE|Assertion|error:|unsupported", x))


def knobs_of(name: str, extra: dict) -> dict:
    """Full knob set of a named variant (BASE + its overrides, or an --extra one)."""
    over = extra[name] if name in extra else VARIANTS[name][0]
    return {**BASE, **over}


def parse_extra(texts: list[str]) -> dict:
    """--extra "name:KEY=V,KEY=V" -> {name: {KEY: V}} (ints; 0/1 for the bool knobs)."""
    out = {}
    for text in texts:
        name, _, body = text.partition(":")
        over = {}
        for kv in filter(None, body.split(",")):
            key, val = kv.split("=")
            if key.strip() not in BASE:
                raise SystemExit(f"--extra {text!r}: unknown knob {key!r}; knobs: {list(BASE)}")
            over[key.strip()] = int(val)
        for key in ("FLATTEN", "WARP_SPEC", "HOST_DESC"):
            if key in over:
                over[key] = bool(over[key])
        out[name] = over
    return out


def constexprs(kn: dict, m: int, n: int, k: int, num_sms: int) -> dict:
    """The kernel's constexpr arguments for knobs `kn` and shape m x n x k."""
    keys = ("BM", "BN", "BK", "STAGES", "GROUP_M", "FLATTEN", "WARP_SPEC", "EPI_SPLIT",
            "HOST_DESC", "TILE_SYNC")
    return {"M": m, "N": n, "K": k, "NUM_SMS": num_sms, **{x: kn[x] for x in keys}}


def compile_only(target: str, names: list[str], extra: dict, shape: str, num_sms: int) -> int:
    """Compile every variant for `target` (e.g. cuda:90) with triton.compile; no GPU needed.

    Prints compiled / failed, compile seconds, shared memory (over SMEM_LIMIT would be an
    OutOfResources at launch), the scf.for count left in the TTGIR (flatten worked if the
    tile and K loops became one) and whether the TTGIR holds a ttg.warp_specialize region.
    """
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    backend, arch = target.split(":")
    gpu = GPUTarget(backend, int(arch), 32)
    m, n, k = (int(x) for x in shape.split("x"))
    print(f"compile-only for {target}, shape {shape}, NUM_SMS={num_sms}")
    print(f"{'variant':>24} {'result':>8} {'s':>6} {'smem B':>8} {'for':>4} {'bufs':>4} {'WS':>3} "
          f"{'warps':>5}  note")
    failures = 0
    for name in names:
        kn = knobs_of(name, extra)
        if kn["HOST_DESC"]:
            # host descriptors: the block shape is part of the argument type
            sig_abc = {"a": f"tensordesc<bf16[{kn['BM']}, {kn['BK']}]>",
                       "b": f"tensordesc<bf16[{kn['BK']}, {kn['BN']}]>",
                       "c": f"tensordesc<bf16[{kn['BM']}, {kn['BN'] // kn['EPI_SPLIT']}]>"}
        else:
            sig_abc = {"a": "*bf16", "b": "*bf16", "c": "*bf16"}
        sig = {**sig_abc, "flag_ptr": "*i32", "abort_ptr": "*i32", "diag_ptr": "*i32",
               "spin_limit": "i32"}
        consts = constexprs(kn, m, n, k, num_sms)
        sig.update({x: "constexpr" for x in consts})
        # the 16-byte alignment the JIT would see for torch allocations (pointer args)
        attrs = {(i,): [["tt.divisibility", 16]]
                 for i, x in enumerate(gemm_kernel.arg_names) if sig.get(x, "").startswith("*")}
        t0 = time.time()
        log = []
        try:
            with captured_stderr(log):
                ck = triton.compile(ASTSource(gemm_kernel, sig, consts, attrs), target=gpu,
                                    options={"num_warps": kn["num_warps"],
                                             "num_stages": kn["STAGES"]})
            ttgir = ck.asm["ttgir"]
            smem = ck.metadata.shared
            loops = ttgir.count("scf.for ")
            ws = "ttg.warp_specialize" in ttgir
            # pipeline depth: the most buffers of any multi-buffered bf16 smem operand ring
            # (0: the loads are not software pipelined)
            bufs = max((int(x) for x in re.findall(r"memdesc<(\d+)x\d+x\d+xbf16", ttgir)),
                       default=0)
            note = "OVER SMEM LIMIT" if smem > SMEM_LIMIT else ""
            if kn["WARP_SPEC"] and not ws:
                note += " warp_specialize had no effect"
            if kn["FLATTEN"] and loops > 1:
                note += " flatten had no effect"
            print(f"{name:>24} {'ok':>8} {time.time() - t0:6.1f} {smem:8d} {loops:4d} {bufs:4d} "
                  f"{'yes' if ws else 'no':>3} {ck.metadata.num_warps:5d}  {note}")
        # WS on Hopper may legitimately fail: report it and go on
        except Exception as e:  # noqa: BLE001
            failures += 1
            msg = " ".join((log[:1] or [str(e)])[0].split())[:240]
            print(f"{name:>24} {'FAILED':>8} {time.time() - t0:6.1f} {'':>8} {'':>4} {'':>4} "
                  f"{'':>3} {'':>5}  "
                  f"{type(e).__name__}: {msg}")
    return 1 if failures else 0


def make_runner(kn: dict, a, b, c, sync, num_sms: int):
    """A no-argument callable that launches the variant once (descriptors built up front)."""
    from triton.tools.tensor_descriptor import TensorDescriptor

    m, k = a.shape
    n = b.shape[1]
    if kn["HOST_DESC"]:
        args = (TensorDescriptor.from_tensor(a, [kn["BM"], kn["BK"]]),
                TensorDescriptor.from_tensor(b, [kn["BK"], kn["BN"]]),
                TensorDescriptor.from_tensor(c, [kn["BM"], kn["BN"] // kn["EPI_SPLIT"]]))
    else:
        args = (a, b, c)
    flag, abort, diag = sync
    consts = constexprs(kn, m, n, k, num_sms)
    tiles = triton.cdiv(m, kn["BM"]) * triton.cdiv(n, kn["BN"])
    grid = (min(num_sms, tiles),)

    def run():
        return gemm_kernel[grid](*args, flag, abort, diag, 1 << 30, **consts,
                                 num_warps=kn["num_warps"], num_stages=kn["STAGES"])
    return run


def measure(shapes, names, extra, rounds, iters, warmup):
    """Check and time every variant on every shape against torch.matmul; print the table."""
    import torch

    torch.cuda.set_device(0)
    # device-side tensor descriptors live in global scratch that Triton asks this for
    triton.set_allocator(lambda size, align, stream: torch.empty(size, dtype=torch.int8,
                                                                 device="cuda"))
    num_sms = torch.cuda.get_device_properties(0).multi_processor_count
    # TILE_SYNC's signals, one per CHUNK_ROWS rows, already at epoch 1 so no wait ever spins
    # (as at W=1, where the own shard is there from the start); then abort flag, diag records
    sync_buf = torch.zeros(8192, dtype=torch.int32, device="cuda")
    sync_buf[:1024] = 1
    sync = (sync_buf[0:], sync_buf[1024:], sync_buf[1056:])
    print(f"device: {torch.cuda.get_device_name(0)}, {num_sms} SMs; torch {torch.__version__}, "
          f"triton {triton.__version__}; rounds={rounds} iters={iters}")
    print(f"{'shape':>17} {'variant':>22} {'ms':>7} {'TFLOP/s':>8} {'cuBLAS':>7} {'ratio':>6} "
          f"{'cuBLAS ms':>9} {'max err':>8} {'regs':>4} {'spill':>5} {'compile s':>9}  note")
    torch.manual_seed(0)
    for shape in shapes:
        m, n, k = (int(x) for x in shape.split("x"))
        flop = 2.0 * m * n * k
        a = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
        b = torch.randn(k, n, device="cuda", dtype=torch.bfloat16)
        ref = torch.matmul(a, b)
        scale = ref.float().abs().max().item()

        def cublas(a=a, b=b):
            return torch.matmul(a, b)

        for name in names:
            kn = knobs_of(name, extra)
            c = torch.empty(m, n, device="cuda", dtype=torch.bfloat16)
            log = []
            try:
                run = make_runner(kn, a, b, c, sync, num_sms)
                t0 = time.time()
                with captured_stderr(log):
                    ck = run()  # compiles (kept out of the timed region) and runs once
                    torch.cuda.synchronize()
                comp_s = time.time() - t0
                err = (c.float() - ref.float()).abs().max().item()
                ms_v, ms_c = [], []
                for _ in range(rounds):  # interleaved, so clock / thermal drift hits both
                    ms_v.append(steady_state_ms(run, warmup=warmup, iters=iters))
                    ms_c.append(steady_state_ms(cublas, warmup=warmup, iters=iters))
                tv, tc = statistics.median(ms_v), statistics.median(ms_c)
                fv, fc = flop / tv / 1e9, flop / tc / 1e9
                # bf16 output: ~1 ulp of the largest |value| is the expected error
                note = "" if err <= 2 ** -7 * scale * 2 else f"WRONG? (|ref| max {scale:.0f})"
                regs, spills = getattr(ck, "n_regs", -1), getattr(ck, "n_spills", -1)
                print(f"{shape:>17} {name:>22} {tv:7.3f} {fv:8.0f} {fc:7.0f} {fv / fc:6.3f} "
                      f"{tc:9.3f} {err:8.3g} {regs:4d} {spills:5d} {comp_s:9.1f}  {note}",
                      flush=True)
            # e.g. OutOfResources: a row of the table, not the end of the run
            except Exception as e:  # noqa: BLE001
                msg = " ".join(" ".join([str(e)] + log[:1]).split())[:200]
                print(f"{shape:>17} {name:>22} {'-':>7} {'-':>8} {'-':>7} {'-':>6} {'-':>9} "
                      f"{'-':>8} {'-':>4} {'-':>5} {'-':>9}  {type(e).__name__}: {msg}",
                      flush=True)
            del c
        del a, b, ref
        torch.cuda.empty_cache()
    return 0


def main() -> int:
    """Parse arguments; compile-only on any machine, else measure on GPU 0."""
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--shapes", nargs="+", default=DEFAULT_SHAPES, help="MxNxK, one GEMM each")
    p.add_argument("--variants", nargs="+", default=None,
                   help="subset of: " + " ".join(VARIANTS) + " (default: all, then --extra)")
    p.add_argument("--extra", nargs="+", default=[],
                   help='extra variants "name:KEY=V,..." over BASE, e.g. "w4:BN=128,num_warps=4"')
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--iters", type=int, default=20)
    p.add_argument("--warmup", type=int, default=3, help="untimed calls before each timing")
    p.add_argument("--compile-only", metavar="TARGET", default=None,
                   help="compile every variant for TARGET (e.g. cuda:90) on the CPU and exit")
    p.add_argument("--num-sms", type=int, default=132, help="NUM_SMS for --compile-only")
    args = p.parse_args()
    extra = parse_extra(args.extra)
    names = (args.variants or list(VARIANTS)) + [x for x in extra if x not in (args.variants or [])]
    for name in names:
        if name not in VARIANTS and name not in extra:
            p.error(f"unknown variant {name}")
    print("variants:")
    for name in names:
        why = VARIANTS[name][1] if name in VARIANTS and name not in extra else "--extra"
        kn = knobs_of(name, extra)
        diff = {x: v for x, v in kn.items() if BASE[x] != v} if name != "base" else {}
        print(f"  {name:>22}: {diff or 'BASE ' + str(BASE)}  -- {why}")
    if args.compile_only:
        return compile_only(args.compile_only, names, extra, args.shapes[0], args.num_sms)
    return measure(args.shapes, names, extra, args.rounds, args.iters, args.warmup)


if __name__ == "__main__":
    sys.exit(main())
