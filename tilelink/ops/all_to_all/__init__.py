"""all_to_all: send rows to ranks by per-rank counts; each rank receives into fixed slots."""

from __future__ import annotations

import torch

from ...ir.ops import Inferred, OpDoc, fail, local_shape, register, spec
from ...ir.tensor import DTYPE_BYTES, FLOAT_DTYPES, INT_DTYPES, LOCAL
from ...plan.regions import access, chunk_axis, region_rule
from ...plan.tiling import FULL, DimRule, TileGrid, cdiv
from ...bench.providers import peer_elements, transfer
from ...runtime.bounds import Sums, rounding
from ...runtime.dist_reference import Prepared, dist_reference, library_variant
from ...runtime.reference import int_draw, reference
from ..all_gather import copies


@register("all_to_all", "comm", ["x", "splits"],
          {"capacity": None, "slots": 0, "back": 0, "fp8": 0},
          "Send rows of `x` to ranks by per-rank counts `splits` ([W] ints, rows grouped by "
          "destination); each rank receives up to `capacity` rows from every rank.",
          dtypes={1: INT_DTYPES},  # x: any (rows are copied); splits: row counts
          details=OpDoc(
              args={"x": "this rank's rows `[T, ...]`, grouped by destination: the first "
                         "splits[0] rows go to rank 0, the next splits[1] to rank 1, ...; "
                         "with slots = 1, `[W * capacity, ...]` in slots as this op's result "
                         "holds them: rank d's rows are the first splits[d] of slot d",
                    "splits": "`[W]` per rank: how many rows of x go to each "
                              "rank (read when the call runs; a negative count sends none)",
                    "capacity": "the most rows a rank receives from each rank (> 0). "
                                "Capacity rule: rank d gets the first min(splits[d], "
                                "capacity) of its rows; the rest, and rows past x's end, are "
                                "dropped, max(0, splits[d] - capacity) of them, which the "
                                "sender computes from its own splits",
                    "slots": "0: x's rows grouped by destination, one after another; 1: x in "
                             "`capacity`-row slots, one per destination (the result of an "
                             "all_to_all, or of ops on it row by row: an expert-parallel "
                             "layer's combine sends each rank's slot back)",
                    "back": "1 (with slots = 1): x's slot s holds the rows an all_to_all over "
                            "these same splits (the dispatch, earlier in the pattern, same "
                            "capacity) landed here from rank s, or ops on them row by row; "
                            "each slot goes back to its sender, as many rows as it sent here "
                            "(what the dispatch landed), so no count of received rows is "
                            "passed in",
                    "fp8": "1: the rows travel as fp8 e4m3 with one fp32 scale per row (their "
                           "largest magnitude / 448), about half the bytes of bf16; every row, "
                           "this rank's own included, arrives rounded to fp8 (relative error "
                           "at most 2**-4, a value far below its row's largest rounded to a "
                           "multiple of 2**-9 of the scale), so the result does not depend on "
                           "where a row's expert lives; x of a float dtype. On an H200 it "
                           "is not yet faster than bf16 (EP dispatch + combine at 4,096 "
                           "tokens, top-8, hidden 7168: 2.82 against 1.58 ms at W = 2; "
                           "docs/perf.md): the quantizing push and a receive pass over "
                           "the rows take more SM time than the halved bytes save"},
              result="`[W * capacity, ...]` (x's other dims), x's dtype, per rank (`local`): "
                     "block s of `capacity` rows holds the rows rank s sent here, in order, "
                     "zero past those",
              example="recv = all_to_all(tokens, splits, capacity = CAP)",
              given=("tokens : [T, H] bf16", "splits : [W] int32"),
              sizes="T = 64, H = 32, CAP = 64",
              notes="The non-overlapped plan runs it as one all_to_all_single of NCCL on "
                    "GPUs. The kernel (`comm=sm`, the default: on 4x H100 it ran EP MoE "
                    "1.25-7.8x faster than NCCL + cuBLAS at 128-4096 tokens) reads splits on the device, pushes each "
                    "rank's rows into its slot for this rank in chunks of comm_block_m rows "
                    "with the slot's count, and a GEMM reading the result waits per chunk and "
                    "skips tiles past a source's count; the zeros past the counts cost "
                    "NVLink bytes only where a count shrank since the call two before. "
                    "With back = 1 the kernel reads the counts the dispatch's kernel wrote "
                    "into this rank (after a wait on each source's first chunk) and the "
                    "non-overlapped plan exchanges them (an all_to_all_single of W ints on "
                    "the device): no host sync either way. An all_to_all of another "
                    "all_to_all's result (`examples/ep_dispatch_combine.tl`: the rows sent "
                    "straight back) pushes in the same kernel, each chunk once the rows it "
                    "sends on have landed."))
def shape(op, xs, attrs, world):
    x, splits = xs
    if tuple(splits.local_shape) != (world,):
        fail(op, f"all_to_all splits must have shape [W]; {splits.name} is "
             f"{list(splits.local_shape)}", f"declare {splits.name} : [W] int32", 1)
    cap = attrs["capacity"]
    if cap is None or cap <= 0:
        fail(op, "all_to_all needs a positive capacity (rows received from each rank)",
             "write all_to_all(x, splits, capacity = T)")
    if attrs["slots"] not in (0, 1):
        fail(op, f"all_to_all slots must be 0 or 1; got {attrs['slots']}",
             "write slots = 1 where x holds a capacity-row slot per rank, else leave it out")
    if attrs["back"] not in (0, 1):
        fail(op, f"all_to_all back must be 0 or 1; got {attrs['back']}",
             "write back = 1 where x's slots hold rows a dispatch landed, else leave it out")
    if attrs["fp8"] not in (0, 1):
        fail(op, f"all_to_all fp8 must be 0 or 1; got {attrs['fp8']}",
             "write fp8 = 1 to send the rows as fp8 with a scale per row, else leave it out")
    if attrs["fp8"] and x.dtype not in FLOAT_DTYPES:
        fail(op, f"all_to_all fp8 = 1 rounds the rows to fp8: {x.name} is {x.dtype}, not a "
             "float dtype", "leave fp8 out for integer rows", 0)
    if attrs["back"] and not attrs["slots"]:
        fail(op, "all_to_all back = 1 sends each slot of x back to its sender: x must be in "
             "slots", "write all_to_all(h, splits, capacity = CAP, slots = 1, back = 1)")
    if attrs["slots"] and local_shape(x)[0] != world * cap:
        fail(op, f"all_to_all with slots = 1 reads x in W slots of capacity = {cap} rows "
             f"({world * cap} rows at W = {world}); {x.name} has {local_shape(x)[0]} per rank",
             f"pass x of W * {cap} rows (an all_to_all's result), or leave slots out", 0)
    shape = (world * cap,) + tuple(local_shape(x)[1:])
    return Inferred(shape, x.dtype, LOCAL)


#: the run-time axis of the rows of x one push item sends (the region rule's and the
#: kernel's name)
SENT_AXIS = "sent_rows"


def delivered_by_collective(bp, name: str) -> bool:
    """Whether tensor `name` is the result of a collective (rows peers deliver during the
    call, not ready when the push's kernel starts)."""
    src = next((o for o in bp.ops if o.result == name), None)
    return src is not None and spec(src.kind).category == "comm"


@region_rule("all_to_all")
def region(bp, op, ins, out, tiles) -> TileGrid:
    """Chunks of the received rows, one segment per source rank; which rows of the source a
    chunk holds is known only at run time (the splits). Where a collective delivers x, the
    read names those rows as a run-time interval (`SENT_AXIS`: one push item's rows, which
    its kernel computes from the counts), so the plan keeps the producer's closed form and
    the push waits on exactly the chunks it sends on; any other x is complete when the
    push's kernel starts, and the read stays the whole of x."""
    x, _splits = ins
    chunk = chunk_axis(out.shape[0], bp.world, tiles.comm_block_m)
    sent = f"rows of {x.name} sent to each rank follow {op.args[1]} at run time"
    rows = {}
    if delivered_by_collective(bp, x.name):
        rows = {0: DimRule(SENT_AXIS, "runtime")}
        sent += (": a push item's rows lie in [lo, hi), computed by the push from the counts "
                 "before its waits")
    read = access(x, DimRule("chunk", "segment"), rows, dynamic=sent)
    write = access(out, FULL, {0: DimRule("chunk")})
    return TileGrid(op.result, (chunk,), (read,), (write,), rank_of=("chunk", "segment"))


def sent_rows(rows: int, splits: list[int], dst: int, cap: int,
              slots: int = 0) -> tuple[int, int]:
    """(first row, count) of the rows of a `rows`-row x that go to rank `dst` under `splits`:
    its `splits[dst]` rows after those for lower ranks (with `slots`, from row dst * cap),
    at most `cap` of them and none past x's end; a negative count sends nothing (and takes
    no rows)."""
    counts = [max(0, int(v)) for v in splits]
    start = dst * cap if slots else sum(counts[:dst])
    return start, max(0, min(counts[dst], cap, rows - start))


def _received(x: torch.Tensor, src_splits: list[int], dst: int, cap: int, slots: int = 0):
    """The rows source rank's `x` sends to `dst` (`sent_rows`)."""
    start, n = sent_rows(x.shape[0], src_splits, dst, cap, slots)
    return x[start:start + n]


@int_draw("all_to_all")
def routed_counts(bp, op, i, gen):
    """Random counts (operand 1) as a router makes them: each of x's rows goes to a rank
    drawn uniformly, so the counts sum to x's rows, about T / W each (with slots, about
    capacity each: some past it)."""
    if i != 1:
        return None
    rows = bp.tensors[op.args[0]].local_shape[0]
    dest = torch.randint(0, bp.world, (rows,), generator=gen)
    return torch.bincount(dest, minlength=bp.world)


def dispatch_of(bp, op):
    """The all_to_all whose landed rows `op` (back = 1) sends back: the last one before it
    over the same splits and capacity, rows grouped by destination (slots = 0); None if the
    pattern has none."""
    found = None
    for o in bp.ops:
        if o is op or o.result == op.result:
            break
        attrs = bp.op_attrs(o)
        if (o.kind == "all_to_all" and o.args[1] == op.args[1] and not attrs["slots"]
                and attrs["capacity"] == bp.op_attrs(op)["capacity"]):
            found = o
    return found


def dispatched_rows(bp, op) -> int:
    """The rows of the x that `op`'s dispatch (`dispatch_of`) sends from (rows past its end
    are not sent, so not sent back); with no dispatch, no limit."""
    d = dispatch_of(bp, op)
    return bp.tensors[d.args[0]].local_shape[0] if d is not None else 1 << 62


def send_plans(bp, op, splits: list) -> list[list[int]]:
    """Each rank's counts per destination as `sent_rows` reads them, from every rank's
    `splits` (one [W] tensor per rank). With back = 1, rank s sends d back the rows d sent
    s: d's count for s, as the dispatch applied it."""
    plans = [[int(v) for v in s.tolist()] for s in splits]
    attrs = bp.op_attrs(op)
    if not attrs["back"]:
        return plans
    rows, cap = dispatched_rows(bp, op), attrs["capacity"]
    return [[sent_rows(rows, plans[d], s, cap)[1] for d in range(bp.world)]
            for s in range(bp.world)]


def routed_elements(bp, op, ints) -> list[list[int]] | None:
    """[[elements rank s sends rank d]] given every rank's counts (`providers.Transfer`'s
    `routed`): the rows `sent_rows` takes under the capacity rule, each x's row of elements;
    None where the counts are not in `ints` (computed from a float tensor)."""
    splits = ints.get(op.args[1])
    if splits is None:
        return None
    x = bp.tensors[op.args[0]]
    inner = 1
    for d in x.local_shape[1:]:
        inner *= d
    attrs = bp.op_attrs(op)
    plans = send_plans(bp, op, splits)
    return [[sent_rows(x.local_shape[0], plans[s], d, attrs["capacity"], attrs["slots"])[1]
             * inner for d in range(bp.world)] for s in range(bp.world)]


@reference("all_to_all")
def ref(op, ctx, args):
    xs, splits = args
    cap = ctx.attrs["capacity"]
    plans = send_plans(ctx.bp, op, splits)
    outs = []
    for d in range(ctx.world):
        out = xs[0].new_zeros((ctx.world * cap,) + tuple(xs[0].shape[1:]))
        for s in range(ctx.world):
            rows = _received(xs[s], plans[s], d, cap, ctx.attrs["slots"])
            out[s * cap:s * cap + rows.shape[0]] = rows
        outs.append(out)
    return outs



def _sent(rows: int, splits: torch.Tensor, cap: int, slots: int,
          device) -> tuple[torch.Tensor, torch.Tensor]:
    """(first row, count) per destination as `sent_rows` gives them for a `rows`-row x, on
    `device`, int64 [W] each, computed there (no host sync)."""
    want = splits.to(device=device, dtype=torch.int64).clamp(min=0)
    starts = (torch.arange(want.shape[0], device=device) * cap if slots
              else torch.cumsum(want, 0) - want)
    n = torch.minimum(want.clamp(max=cap), (rows - starts).clamp(min=0))
    return starts, n


def _plan(op, ctx, x: torch.Tensor, splits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """This rank's (first row, count) per destination under torch.distributed. With back = 1
    the counts are those the dispatch sent here, exchanged on the device (an
    all_to_all_single of W ints: no host sync)."""
    cap = ctx.attrs["capacity"]
    if not ctx.attrs["back"]:
        return _sent(x.shape[0], splits, cap, ctx.attrs["slots"], x.device)
    import torch.distributed as dist

    _, sent = _sent(dispatched_rows(ctx.bp, op), splits, cap, 0, x.device)
    got = torch.empty_like(sent)
    dist.all_to_all_single(got, sent, group=ctx.group)
    return torch.arange(ctx.world, device=x.device) * cap, got


def _send_buffer(x, splits, ctx, op=None):
    """[W * capacity, ...]: slot d holds the rows this rank sends rank d (zero padded), built
    on the device without a host sync (the plan's call can be captured in a CUDA graph).
    `op`: the all_to_all (back = 1 finds its dispatch from it)."""
    cap, w = ctx.attrs["capacity"], ctx.world
    starts, n = _plan(op, ctx, x, splits)
    i = torch.arange(cap, device=x.device)
    idx = (starts[:, None] + i[None, :]).reshape(-1)
    valid = (i[None, :] < n[:, None]).reshape(-1)
    rows = x.index_select(0, torch.where(valid, idx, 0).clamp(max=max(0, x.shape[0] - 1)))
    keep = valid.view((w * cap,) + (1,) * (x.dim() - 1))
    return torch.where(keep, rows, torch.zeros((), dtype=x.dtype, device=x.device))


# the result holds W slots of `capacity` rows, one per source rank: W - 1 come from peers;
# what the counts really route: `routed_elements`
@transfer("all_to_all", received=lambda bp, op: peer_elements(bp, op.result) // bp.world,
          routed=routed_elements, element_bytes=lambda bp, op: wire_bytes(bp, op))
def sends(op, ctx, args):
    """Peer d receives its `capacity`-row slot of this rank's send buffer."""
    import torch.distributed as dist

    me, cap = dist.get_rank(ctx.group), ctx.attrs["capacity"]
    send = _send_buffer(*args, ctx, op)
    return {d: send[d * cap:(d + 1) * cap] for d in range(ctx.world) if d != me}


#: the most an fp8 e4m3 rounding changes a value by, relative (half its 2**-3 spacing)
FP8_ROUNDOFF = 2.0**-4


@rounding("all_to_all")
def moved(bp, op, plan) -> Sums:
    """Rows move between ranks unchanged (`copies`); with fp8 = 1 each value is rounded to
    fp8 on the way (within FP8_ROUNDOFF of itself, relative: both the kernel and the
    non-overlapped plan round so, and the reference copies exactly) and rounded back to the
    result's dtype once."""
    if not bp.op_attrs(op)["fp8"]:
        return copies(bp, op, plan)
    return Sums(term_error=FP8_ROUNDOFF)


def quantize_rows(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(bytes, scales): x's rows (dim 0) as fp8 e4m3 bytes (uint8, x's shape) and one fp32
    scale per row, its largest magnitude (at least 1e-30) / 448, as the kernel quantizes
    them (the value times 448 / largest, rounded to nearest even); x may have no rows."""
    f = x.float().flatten(1) if x.dim() > 1 else x.float()[:, None]
    # (a NaN does not count towards the largest, as the kernel's max skips it: only that
    # value is NaN on arrival)
    mag = torch.where(f.isnan(), torch.zeros((), device=f.device), f.abs())
    amax = mag.amax(dim=1) if f.shape[1] else f.new_zeros(f.shape[0])
    amax = amax.clamp_min(1e-30)  # (a row of zeros: any scale, its bytes are 0)
    # (tensor by tensor: torch divides a number by a tensor through the reciprocal, rounding
    # twice, where the kernel's division rounds once)
    full = torch.full_like(amax, 448.0)
    q = (f * (full / amax)[:, None]).to(torch.float8_e4m3fn).view(torch.uint8)
    return q.reshape(x.shape), amax / full


def dequantize_rows(q: torch.Tensor, scales: torch.Tensor, dtype) -> torch.Tensor:
    """`quantize_rows` undone: each row's fp8 values times its scale, rounded to `dtype`."""
    flat = q.flatten(1) if q.dim() > 1 else q[:, None]
    f = flat.view(torch.float8_e4m3fn).float() * scales[:, None]
    return f.to(dtype).reshape(q.shape)


def wire_bytes(bp, op) -> float:
    """Bytes one element of x costs on the wire: its dtype's, or with fp8 = 1 one byte plus
    its row's share of the fp32 scale."""
    x = bp.tensors[op.args[0]]
    if not bp.op_attrs(op)["fp8"]:
        return float(DTYPE_BYTES[x.dtype])
    inner = 1
    for d in x.local_shape[1:]:
        inner *= d
    return 1.0 + 4.0 / inner


@dist_reference("all_to_all")
def dist_ref(op, ctx, args):
    """One all_to_all_single of the `capacity`-row slots (padding included), no host sync;
    no count exchange but back = 1's (W ints, on the device)."""
    import torch.distributed as dist

    send = _send_buffer(*args, ctx, op)
    if ctx.attrs["fp8"]:  # the bytes and the scales, each in one all_to_all_single
        q, scales = quantize_rows(send)
        got_q, got_s = torch.empty_like(q), torch.empty_like(scales)
        dist.all_to_all_single(got_q, q, group=ctx.group)
        dist.all_to_all_single(got_s, scales, group=ctx.group)
        return dequantize_rows(got_q, got_s, send.dtype)
    out = torch.empty_like(send)
    dist.all_to_all_single(out, send, group=ctx.group)
    return out


@library_variant("all_to_all", "nccl_counts")
def with_counts(op, ctx) -> Prepared:
    """all_to_all_single with its count exchange, as expert-parallel layers call NCCL: the
    counts first (an all_to_all_single of W ints), read on the host (a sync: NCCL takes the
    split sizes as host ints), then the rows themselves, no padding, placed into the
    receiver's slots."""

    def run(op, ctx, args):
        import torch.distributed as dist

        x, splits = args
        cap, w = ctx.attrs["capacity"], ctx.world
        starts, n = _plan(op, ctx, x, splits)
        got = torch.empty_like(n)
        dist.all_to_all_single(got, n, group=ctx.group)
        first, sizes, recv_sizes = torch.stack([starts, n, got]).tolist()
        send = torch.cat([x[a:a + k] for a, k in zip(first, sizes)])
        recv = x.new_empty((sum(recv_sizes),) + tuple(x.shape[1:]))
        if ctx.attrs["fp8"]:  # the bytes and the scales, each in one all_to_all_single
            q, scales = quantize_rows(send)
            got_q = q.new_empty(recv.shape)
            got_s = scales.new_empty((recv.shape[0],))
            dist.all_to_all_single(got_q, q, recv_sizes, sizes, group=ctx.group)
            dist.all_to_all_single(got_s, scales, recv_sizes, sizes, group=ctx.group)
            recv = dequantize_rows(got_q, got_s, x.dtype)
        else:
            dist.all_to_all_single(recv, send, recv_sizes, sizes, group=ctx.group)
        out = x.new_zeros((w * cap,) + tuple(x.shape[1:]))
        at = torch.cat([torch.arange(k, device=x.device) + s * cap
                        for s, k in enumerate(recv_sizes)])
        out.index_copy_(0, at, recv)
        return out

    return Prepared(run)


# ---- cost of the non-overlapped plan's NCCL call; the kernel (`sm`) ----------------------

from ...schedule.lowering import local_bytes, register_library_comm  # noqa: E402


def _wire_share(bp, op) -> float:
    """Bytes on the wire per byte of the result (below 1 with fp8 = 1)."""
    return wire_bytes(bp, op) / DTYPE_BYTES[bp.tensors[op.args[0]].dtype]


def exchange_bytes(bp, op) -> float:
    """An all-to-all sends each peer its 1/W of this rank's send buffer (the result's size)."""
    return (bp.world - 1) / bp.world * local_bytes(bp, op.result) * _wire_share(bp, op)


def expected_bytes(bp, op) -> float:
    """What the kernel sends its W - 1 peers per call under a router spreading rows evenly:
    1/W of the rows it sends from (its dispatch's, with back = 1) to each peer, at most
    `capacity` (it sends only the rows the counts give; the schedule cannot know the counts,
    and a skewed routing sends up to `capacity` rows to a peer)."""
    res = bp.tensors[op.result]
    cap = bp.op_attrs(op)["capacity"]
    rows = res.local_shape[0] // bp.world  # (a slot: `capacity` rows)
    if cap is not None:
        source = dispatched_rows(bp, op) if bp.op_attrs(op)["back"] else \
            bp.tensors[op.args[0]].local_shape[0]
        rows = min(rows, cdiv(source, bp.world))
    return ((bp.world - 1) * rows * local_bytes(bp, op.result) / res.local_shape[0]
            * _wire_share(bp, op))


def counted_bytes(bp, op) -> float:
    """With the count exchange: the rows themselves, at most every slot full (what the
    schedule knows), and the counts."""
    return exchange_bytes(bp, op) + 4.0 * (bp.world - 1)


def send_buffer_bytes(bp, op) -> float:
    """The plan's padded send buffer (`_send_buffer`): W * capacity rows gathered from the
    routed rows (read and written), then the padding zeroed (read and written again)."""
    return 4.0 * local_bytes(bp, op.result)


def counted_staging_bytes(bp, op) -> float:
    """With the count exchange: the rows cut out by their splits (read and written) and
    placed into the receiver's slots (the zeroed result written, the rows read and written)."""
    return 5.0 * local_bytes(bp, op.result)


# (4x H100, 2026-11-27, W = 2, 4096 tokens top-8, hidden 7168: the plan's two all_to_alls
# alone took 4.31 ms, NCCL's bytes at its rate 2.0: the rest is building the padded buffers)
register_library_comm("all_to_all", "nccl", exchange_bytes, staged=send_buffer_bytes)
# (NCCL takes the split sizes as host ints: read each call, so no CUDA graph captures it)
register_library_comm("all_to_all", "nccl_counts", counted_bytes, host_sync=True,
                      staged=counted_staging_bytes)

from . import sm  # noqa: E402,F401  (the SM lowering registers itself)
from . import combine  # noqa: E402,F401  (EP top-k combine: a receive step of the all_to_all)
from . import dispatch  # noqa: E402,F401  (EP dispatch from plain routing)
