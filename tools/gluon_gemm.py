"""Experiment: a warp-specialised Hopper GEMM in Gluon (Triton 3.6's lower-level language).

    python tools/gluon_gemm.py --compile-only             # CPU: compile for cuda:90, print resources
    python tools/gluon_gemm.py                            # GPU: check and time against cuBLAS and
                                                          # TileLink's generated kernel (W = 1)

Why: ncu (tools/ncu_gemm.py, docs/perf.md session 11) shows TileLink's GEMM and cuBLAS's
spend the same tensor-pipe cycles per SM; TileLink's loses its time to tensor-pipe idle cycles
inside the kernel. cuBLAS's kernel (nvjet ..._coopA) is warp-specialised: a producer warp
issues the TMA loads and two consumer warpgroups only wait and issue wgmma, so the loads of
the next stages (and of the next tile) never sit behind the consumers' instructions. Stock
Triton's `tl` kernel does both in the same warps. This kernel has cuBLAS's structure, minus
its 2-CTA clusters (Gluon 3.6 has no TMA multicast):

* partition 0 (default, 4 warps) and partition 1 (4 warps): consumers, one per 64-row half
  of the 128 x BN output tile; each waits for a stage, issues its wgmma, keeps one in flight,
  releases the stage before it, and stores its half through shared memory and TMA;
* partition 2 (1 warp): the loader, running up to STAGES k-steps ahead, across tiles too.

A stage's `empty` barrier counts 2 arrivals (both consumers); `ready` completes on the TMA's
byte count. Persistent grid, grouped tile order, the same tiles as TileLink's kernel.
Not part of TileLink: if it beats the `tl` template here, the AG/RS templates can get a
Gluon flavour (the loader partition is where a tile's wait on its gathered rows would go).
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (fence_async_shared, mbarrier, tma,
                                                              warpgroup_mma, warpgroup_mma_wait)

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


@gluon.jit
def _tile(t, num_pid_m, num_pid_n, GROUP_M: gl.constexpr):
    """Grouped order: GROUP_M row-tiles swept across N before the next group (L2 reuse)."""
    in_group = GROUP_M * num_pid_n
    first_m = (t // in_group) * GROUP_M
    size_m = min(num_pid_m - first_m, GROUP_M)
    pid_m = first_m + (t % in_group) % size_m
    pid_n = (t % in_group) // size_m
    return pid_m, pid_n


@gluon.jit
def _loader(a_desc, b_desc, a_bufs, b_bufs, ready, empty, M, N, K, GROUP_M: gl.constexpr):
    BM: gl.constexpr = a_desc.block_type.shape[0]
    BK: gl.constexpr = a_desc.block_type.shape[1]
    BN: gl.constexpr = b_desc.block_type.shape[1]
    STAGES: gl.constexpr = a_bufs.shape[0]
    num_pid_m = gl.cdiv(M, BM)
    num_pid_n = gl.cdiv(N, BN)
    it = 0
    for t in range(gl.program_id(0), num_pid_m * num_pid_n, gl.num_programs(0)):
        pid_m, pid_n = _tile(t, num_pid_m, num_pid_n, GROUP_M)
        for k in range(0, K, BK):
            s = it % STAGES
            # a fresh barrier has completed "phase 1": the first round passes at once
            mbarrier.wait(empty.index(s), ((it // STAGES) & 1) ^ 1)
            bar = ready.index(s)
            mbarrier.expect(bar, a_desc.block_type.nbytes + b_desc.block_type.nbytes)
            tma.async_copy_global_to_shared(a_desc, [pid_m * BM, k], bar, a_bufs.index(s))
            tma.async_copy_global_to_shared(b_desc, [k, pid_n * BN], bar, b_bufs.index(s))
            it += 1


@gluon.jit
def _consumer(a_bufs, b_bufs, ready, empty, c_desc, c_smem, M, N, K, HALF: gl.constexpr,
              GROUP_M: gl.constexpr):
    BM: gl.constexpr = a_bufs.shape[1]
    BK: gl.constexpr = a_bufs.shape[2]
    BN: gl.constexpr = b_bufs.shape[2]
    HM: gl.constexpr = BM // 2
    STAGES: gl.constexpr = a_bufs.shape[0]
    acc_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                         instr_shape=[16, BN, 16])
    num_pid_m = gl.cdiv(M, BM)
    num_pid_n = gl.cdiv(N, BN)
    it = 0
    for t in range(gl.program_id(0), num_pid_m * num_pid_n, gl.num_programs(0)):
        pid_m, pid_n = _tile(t, num_pid_m, num_pid_n, GROUP_M)
        acc = gl.zeros((HM, BN), gl.float32, acc_layout)
        for k in range(0, K, BK):
            s = it % STAGES
            mbarrier.wait(ready.index(s), (it // STAGES) & 1)
            acc = warpgroup_mma(a_bufs.index(s).slice(HALF * HM, HM), b_bufs.index(s), acc,
                                is_async=True)
            # one wgmma in flight: the one before it is done, so its stage can be refilled
            acc = warpgroup_mma_wait(1, deps=(acc, ))
            mbarrier.arrive(empty.index((it + STAGES - 1) % STAGES), pred=k > 0)
            it += 1
        acc = warpgroup_mma_wait(0, deps=(acc, ))
        mbarrier.arrive(empty.index((it + STAGES - 1) % STAGES))
        tma.store_wait(pendings=0)  # the previous tile's store has left c_smem
        c_smem.store(acc.to(c_desc.dtype))
        fence_async_shared()
        tma.async_copy_shared_to_global(c_desc, [pid_m * BM + HALF * HM, pid_n * BN], c_smem)
    tma.store_wait(pendings=0)


@gluon.jit
def ws_gemm_kernel(a_desc, b_desc, c_desc, M, N, K, GROUP_M: gl.constexpr, STAGES: gl.constexpr,
                   LOADER_REGS: gl.constexpr, CONSUMER_REGS: gl.constexpr):
    dtype: gl.constexpr = a_desc.dtype
    a_bufs = gl.allocate_shared_memory(dtype, [STAGES] + a_desc.block_type.shape, a_desc.layout)
    b_bufs = gl.allocate_shared_memory(dtype, [STAGES] + b_desc.block_type.shape, b_desc.layout)
    ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    for i in gl.static_range(STAGES):
        mbarrier.init(ready.index(i), count=1)
        mbarrier.init(empty.index(i), count=2)
    c0 = gl.allocate_shared_memory(dtype, c_desc.block_type.shape, c_desc.layout)
    c1 = gl.allocate_shared_memory(dtype, c_desc.block_type.shape, c_desc.layout)
    gl.warp_specialize([
        (_consumer, (a_bufs, b_bufs, ready, empty, c_desc, c0, M, N, K, gl.constexpr(0), GROUP_M)),
        (_consumer, (a_bufs, b_bufs, ready, empty, c_desc, c1, M, N, K, gl.constexpr(1), GROUP_M)),
        (_loader, (a_desc, b_desc, a_bufs, b_bufs, ready, empty, M, N, K, GROUP_M)),
    ], [4, 1], [CONSUMER_REGS, LOADER_REGS])


def _layouts(bm, bn, bk):
    nv = gl.NVMMASharedLayout.get_default_for
    return (nv([bm, bk], gl.bfloat16), nv([bk, bn], gl.bfloat16), nv([bm // 2, bn], gl.bfloat16))


def ws_matmul(a, b, c, bm=128, bn=256, bk=64, stages=3, group_m=8, regs=(40, 232),
              programs=None):
    """c = a @ b (bf16, row-major, b is K x N) with ws_gemm_kernel on a persistent grid."""
    import torch
    import triton
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

    m, k = a.shape
    n = b.shape[1]
    la, lb, lc = _layouts(bm, bn, bk)
    ad = TensorDescriptor.from_tensor(a, [bm, bk], la)
    bd = TensorDescriptor.from_tensor(b, [bk, bn], lb)
    cd = TensorDescriptor.from_tensor(c, [bm // 2, bn], lc)
    sms = programs or torch.cuda.get_device_properties(a.device).multi_processor_count
    grid = (min(sms, triton.cdiv(m, bm) * triton.cdiv(n, bn)), )
    ws_gemm_kernel[grid](ad, bd, cd, m, n, k, group_m, stages, regs[0], regs[1], num_warps=4)
    return c


def compile_only(bm=128, bn=256, bk=64, stages=3, regs=(40, 232)):
    """Compile for cuda:90 on a machine without a GPU; return Triton's CompiledKernel."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.experimental.gluon._runtime import GluonASTSource

    la, lb, lc = _layouts(bm, bn, bk)

    def desc(block, layout):
        return f"tensordesc<bf16[{block[0]}, {block[1]}],{layout!r}>"

    sig = {"a_desc": desc([bm, bk], la), "b_desc": desc([bk, bn], lb),
           "c_desc": desc([bm // 2, bn], lc), "M": "i32", "N": "i32", "K": "i32",
           "GROUP_M": "constexpr", "STAGES": "constexpr", "LOADER_REGS": "constexpr",
           "CONSUMER_REGS": "constexpr"}
    src = GluonASTSource(ws_gemm_kernel, sig, {"GROUP_M": 8, "STAGES": stages,
                                               "LOADER_REGS": regs[0],
                                               "CONSUMER_REGS": regs[1]})
    return triton.compile(src, target=GPUTarget("cuda", 90, 32), options={"num_warps": 4})


def _time(fn, iters: int) -> float:
    """Median ms per call of `iters` back-to-back calls, CUDA events (steady state)."""
    from tilelink.runtime.timing import steady_state_ms

    return steady_state_ms(fn, iters=iters)


def _bench(rank, world, shapes, variants, rounds, iters):
    import torch

    from tilelink.frontend import load_pattern
    from tilelink.runtime.gpu import compile_op

    rows = []
    for shape in shapes:
        m, n, k = (int(x) for x in shape.split("x"))
        flop = 2.0 * m * n * k
        bp = load_pattern("examples/ag_gemm.tl").bind({"M": m, "N": n, "K": k}, 1)
        op = compile_op(bp, config={"comm": "copy_engine"})
        ins = op.make_inputs(0)
        a, b = ins["a"], ins["b"]
        ref = torch.matmul(a, b)
        fns = {"cublas": lambda: torch.matmul(a, b), "tilelink": lambda: op(**ins)}
        for text in variants:
            kw = {kk: int(v) for kk, v in (kv.split("=") for kv in text.split())}
            regs = (kw.pop("loader_regs", 40), kw.pop("consumer_regs", 232))
            c = torch.full((m, n), float("nan"), dtype=a.dtype, device=a.device)
            try:
                ws_matmul(a, b, c, regs=regs, **kw)
                torch.cuda.synchronize()
                err = (c.float() - ref.float()).abs().max().item()
                rel = ((c.float() - ref.float()).norm() / ref.float().norm()).item()
                print(f"gluon {shape} [{text or 'default'}] max err {err:.3g} rel {rel:.2e}",
                      flush=True)
                if rel != rel or rel > 1e-2:
                    rows.append((shape, f"gluon {text}", float("nan"), "WRONG"))
                    continue
                fns[f"gluon {text}"] = (lambda c=c, kw=kw, regs=regs:
                                        ws_matmul(a, b, c, regs=regs, **kw))
            except Exception as e:  # report and go on with the other variants
                rows.append((shape, f"gluon {text}", float("nan"), f"{type(e).__name__}: {e}"[:300]))
        times = {name: [] for name in fns}
        for _ in range(rounds):  # interleaved so clock drift hits all alike
            for name, fn in fns.items():
                times[name].append(_time(fn, iters))
        cb = statistics.median(times["cublas"])
        for name, ts in times.items():
            t = statistics.median(ts)
            rows.append((shape, name, t, f"{flop / t / 1e9:.0f} TFLOP/s, {cb / t:.3f}x cuBLAS"))
    return rows


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--shapes", nargs="+", default=["1024x4096x8192", "8192x4096x8192"])
    p.add_argument("--variants", nargs="+", default=["", "bm=256 bn=128", "group_m=1"],
                   help='kernel knobs, e.g. "stages=4 group_m=1 consumer_regs=240" ("" = default)')
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--iters", type=int, default=20)
    p.add_argument("--compile-only", action="store_true",
                   help="compile for cuda:90 here (no GPU needed) and print its resources")
    args = p.parse_args()
    if args.compile_only:
        k = compile_only()
        ptx = k.asm["ptx"]
        print(f"compiled: {k.metadata.num_warps} warps, shared {k.metadata.shared} B, "
              f"wgmma {ptx.count('wgmma.mma_async')}, setmaxnreg {ptx.count('setmaxnreg')}, "
              f"cp.async.bulk.tensor {ptx.count('cp.async.bulk.tensor')}")
        return 0
    from tilelink.runtime.launcher import launch_world

    for shape, name, t, note in launch_world(_bench, 1, args.shapes, args.variants, args.rounds,
                                             args.iters):
        print(f"{shape:>16} {name:>28} {t:8.4f} ms  {note}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
