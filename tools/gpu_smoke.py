"""GPU smoke run of a generated kernel over torch symmetric memory (2 GPUs, no runtime yet).

Interim harness until the GPU runtime exists: one symmetric allocation per rank holds the
module's SYMMETRIC buffers at identical offsets, `buffer_ptrs` give the heap bases, and the
generated `launch` runs `--calls` back-to-back calls with fresh inputs and no host barrier.

    python tools/gpu_smoke.py examples/ag_gemm.tl -D M=4096 N=4096 K=4096 --calls 20
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def _worker(rank, world, args):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT="29533")
    torch.cuda.set_device(rank)
    dist.init_process_group("nccl", rank=rank, world_size=world)
    import torch.distributed._symmetric_memory as symm

    from tilelink.codegen import render_triton
    from tilelink.codegen.compile import load_module
    from tilelink.frontend import load_pattern
    from tilelink.runtime.reference import TORCH_DTYPES, compare, evaluate, make_inputs
    from tilelink.schedule import get_target, make_schedule

    values = dict(kv.split("=") for kv in args.D)
    bp = load_pattern(args.pattern).bind(values, world)
    cfg = dict(kv.split("=") for kv in args.config)
    s = make_schedule(bp, get_target("cuda:90"), cfg)
    mod = load_module(render_triton(s), name=f"tilelink_generated_gpu{rank}")
    sizes = {k: torch.empty(sh, dtype=TORCH_DTYPES[d]).nbytes for k, (sh, d) in mod.SYMMETRIC.items()}
    offs, total = {}, 0
    for k, n in sizes.items():
        offs[k] = total
        total += -(-n // 256) * 256
    heap = symm.empty(total, dtype=torch.uint8, device=f"cuda:{rank}")
    hdl = symm.rendezvous(heap, dist.group.WORLD.group_name)
    heap.zero_()
    symmetric = {}
    for k, (sh, d) in mod.SYMMETRIC.items():
        symmetric[k] = heap[offs[k]:offs[k] + sizes[k]].view(TORCH_DTYPES[d]).view(sh)

    class Rt:
        pass

    rt = Rt()
    rt.rank, rt.world, rt.symmetric = rank, world, symmetric
    rt.heap_bases = torch.tensor(list(hdl.buffer_ptrs), dtype=torch.int64, device="cuda")
    rt.abort = torch.zeros(1, dtype=torch.int32, device="cuda")
    rt.diag = torch.zeros(8 + 64 * 8, dtype=torch.int32, device="cuda")
    rt.spin_limit = 2**31 - 1 if args.spin_limit <= 0 else args.spin_limit
    side = torch.cuda.Stream()

    def copy_engine(ops):
        # Interim copy engine: peer copies on a side stream; waits/signals via torch's stream ops.
        if not ops:
            return
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for op in ops:
                if op[0] == "copy":
                    _, src, peer, buf, off = op
                    dst = hdl.get_buffer(peer, (sizes[buf] // src.element_size(),), src.dtype,
                                         offs[buf] // src.element_size())
                    dst[off:off + src.numel()].copy_(src.reshape(-1), non_blocking=True)
                elif op[0] == "signal":
                    _, peer, buf, idx, value = op
                    flag = hdl.get_buffer(peer, (sizes[buf] // 4,), torch.uint32, offs[buf] // 4)
                    torch.ops.symm_mem.stream_write_value32_(flag, idx, value)
                # "wait" (release of the buffer two calls ago) is skipped here: the harness
                # synchronises every 2 calls when comm=copy_engine (see below).

    rt.copy_engine = copy_engine
    calls = [make_inputs(bp, args.seed + i) for i in range(args.calls)]
    dev = [{k: v[rank].cuda() for k, v in c.items()} for c in calls]
    outs = [{k: torch.empty(sh, dtype=TORCH_DTYPES[d], device="cuda")
             for k, (sh, d) in mod.OUTPUTS.items()} for _ in calls]
    dist.barrier()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for i in range(args.calls):
        mod.launch(rt, dev[i], outs[i], epoch=i + 1)
        if cfg.get("comm") == "copy_engine" and i % 2 == 1:
            torch.cuda.synchronize()
            dist.barrier()
    torch.cuda.synchronize()
    dt = (time.perf_counter() - t0) / args.calls
    worst, bad = 0.0, 0
    for i, c in enumerate(calls):
        want = evaluate(bp, c)
        for k, o in outs[i].items():
            ae, _ = compare(o.cpu(), want[k][rank])
            worst = max(worst, ae)
            bad += int(not torch.allclose(o.float().cpu(), want[k][rank].float(), atol=0.5,
                                          rtol=2 ** -6))
    ndiag = int(rt.diag[0])
    print(f"rank {rank}: {bp.name} {bp.sizes_str()} cfg={cfg} calls={args.calls} "
          f"max_abs_err={worst:.3g} mismatched_calls={bad} diag_records={ndiag} "
          f"ms_per_call={dt * 1e3:.3f}", flush=True)
    dist.barrier()
    dist.destroy_process_group()


def main():
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("pattern")
    p.add_argument("-D", nargs="*", default=[])
    p.add_argument("--config", nargs="*", default=[])
    p.add_argument("--calls", type=int, default=10)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--spin-limit", type=int, default=0)
    args = p.parse_args()
    mp.spawn(_worker, args=(2, args), nprocs=2, join=True)


if __name__ == "__main__":
    sys.exit(main())
