"""Baselines per pattern signature, on this rank's local inputs (GPU, torch.distributed).

`build(bp, inputs, group)` returns `{system: Baseline}` for the pattern's signature:

    "all_gather>gemm"      a [M/W, K] shard(0), b [K, N/W]  ->  c = all_gather(a) @ b
    "gemm>reduce_scatter"  a [M, K/W], b [K/W, N]           ->  out = reduce_scatter(a @ b)

Every `Baseline.fn` is a zero-argument callable, asynchronous on the current stream (side
streams are joined back), writing into buffers allocated here, outside anything timed; it
returns its output. `Baseline.check()` runs it once and compares with `reference()` (fp32
on the GPU, from NCCL-gathered inputs), so a wrong baseline is never timed. `note` says
exactly what one call does.

What the two comm-alone systems move: the bytes one rank receives in the collective —
all_gather: the W-1 peer shards of `a`; reduce_scatter: the W-1 peer partials of this
rank's M/W output rows (the sums are not part of the transfer).
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from dataclasses import dataclass

import torch

from ..errors import NotSupportedError

SIGNATURES = ("all_gather>gemm", "gemm>reduce_scatter")


@dataclass
class Baseline:
    """A zero-arg callable to time, how to check it once, and what it does."""

    key: str
    fn: Callable[[], torch.Tensor]
    check: Callable[[torch.Tensor], tuple[float, float, bool]]  # ref -> (max abs, rel, ok)
    note: str
    # what one call must rewrite: NaN-filled before a CUDA-graph replay is checked, so a
    # replay that skipped a step (the gather before the GEMM, a peer's push) cannot pass on
    # what the eager calls left there
    poison: tuple[torch.Tensor, ...] = ()


# ---------------------------------------------------------------- which input is which


def roles(bp) -> dict[str, str]:
    """Input names by role for the two supported signatures (NotSupportedError otherwise)."""
    sig = bp.signature()
    ops = bp.ops
    if sig == "all_gather>gemm":
        ag, mm = ops
        if bp.op_attrs(ag)["dim"] != 0 or mm.args[0] != ag.result:
            raise NotSupportedError("bench: AG-GEMM baselines need all_gather(x, dim = 0) as "
                                    "the gemm's first operand", mm.loc)
        return {"a": ag.args[0], "b": mm.args[1]}
    if sig == "gemm>reduce_scatter":
        mm, rs = ops
        if bp.op_attrs(rs)["dim"] != 0:
            raise NotSupportedError("bench: GEMM-RS baselines need reduce_scatter(c, dim = 0)",
                                    rs.loc)
        return {"a": mm.args[0], "b": mm.args[1]}
    raise NotSupportedError(f"bench: no baselines for pattern '{bp.name}' ({sig}); supported: "
                            + ", ".join(SIGNATURES))


# ---------------------------------------------------------------- checks


def compare(got: torch.Tensor, ref: torch.Tensor, k: int, dtype: str, slack: float = 1.0
            ) -> tuple[float, float, bool]:
    """(max abs error, ||got-ref|| / ||ref||, ok) of an output against the fp32 reference.

    ok: all finite, relative error < 1e-2 (bf16 operands land between 1e-3 and 1e-2), and
    every element within the K-long reduction tolerance of `runtime.reference` (times
    `slack`: GEMM-RS rounds twice, partial then sum).
    """
    from ..runtime.reference import tolerance

    atol, rtol = tolerance(dtype, k)
    return _judge(got, ref, slack * (atol + rtol * ref.abs()))


def sum_compare(got: torch.Tensor, parts: torch.Tensor, dtype: str
                ) -> tuple[float, float, bool]:
    """(max abs error, relative error, ok) of `got` against the sum of `parts` ([W, ...]) done
    in `dtype` in any order: NCCL's reduce-scatter rounds each of its W - 1 partial sums, and
    a partial sum can be larger than the result (the partials cancel), so each element may
    be off by W roundings of the sum of |parts| (at W = 4 a fixed K-based tolerance flagged
    NCCL itself: max abs err 5.75 on values of a few thousand)."""
    from ..runtime.reference import tolerance

    atol, rtol = tolerance(dtype, 1)  # rtol: two units of roundoff in `dtype`
    return _judge(got, parts.sum(0), atol + parts.shape[0] * (rtol / 2) * parts.abs().sum(0))


def _judge(got: torch.Tensor, want: torch.Tensor, bound: torch.Tensor
           ) -> tuple[float, float, bool]:
    """(max abs error, ||got-want|| / ||want||, ok): ok when all finite, the relative error
    is below 1e-2 and every element's error is within `bound` (element-wise)."""
    g = got.float()
    diff = (g - want).abs()
    finite = bool(torch.isfinite(g).all())
    max_abs = float(diff.max()) if finite else float("inf")
    rel = float(diff.norm() / want.norm().clamp_min(1e-30)) if finite else float("inf")
    within = bool((diff <= bound).all()) if finite else False
    return max_abs, rel, finite and rel < 1e-2 and within


def _no_tf32(fn):
    """Run `fn` with TF32 off (the fp32 reference must be fp32)."""
    old = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = False
    try:
        return fn()
    finally:
        torch.backends.cuda.matmul.allow_tf32 = old


def _gather0(x: torch.Tensor, group) -> torch.Tensor:
    """all_gather along dim 0 into a new [W * rows, ...] tensor (NCCL)."""
    import torch.distributed as dist

    w = dist.get_world_size(group)
    out = torch.empty((w * x.shape[0], *x.shape[1:]), dtype=x.dtype, device=x.device)
    dist.all_gather_into_tensor(out, x.contiguous(), group=group)
    return out


def reference(bp, inputs: dict[str, torch.Tensor], group) -> torch.Tensor:
    """This rank's pattern output in fp32, from inputs gathered with NCCL (bf16 bits exact)."""
    import torch.distributed as dist

    r = roles(bp)
    a, b = inputs[r["a"]], inputs[r["b"]]
    w, rank = dist.get_world_size(group), dist.get_rank(group)
    if bp.signature() == "all_gather>gemm":
        a_full = _gather0(a, group)
        return _no_tf32(lambda: a_full.float() @ b.float())
    m, kl = a.shape
    # a [M, K/W] per rank -> a_full [M, K] (ranks' column blocks side by side); b by rows.
    a_full = _gather0(a, group).view(w, m, kl).permute(1, 0, 2).reshape(m, w * kl)
    b_full = _gather0(b, group)
    rows = slice(rank * (m // w), (rank + 1) * (m // w))
    return _no_tf32(lambda: a_full[rows].float() @ b_full.float())


# ---------------------------------------------------------------- symmetric memory


def group_name(group) -> str:
    import torch.distributed as dist

    return (group or dist.group.WORLD).group_name


def enable_symm_mem(group) -> None:
    """Register the group for symmetric memory where this torch still needs it.

    torch <= 2.10 needs `enable_symm_mem_for_group(name)` before the fused ops or
    `rendezvous`; later versions deprecate it (a no-op need). Calling it is harmless.
    """
    import torch.distributed._symmetric_memory as symm

    fn = getattr(symm, "enable_symm_mem_for_group", None)
    if fn is not None:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", FutureWarning)
            fn(group_name(group))


class PeerBuffers:
    """A symmetric [W, *block] buffer on every rank; `slot(peer, i)` is peer's slot i here.

    Slot i of a rank's buffer receives what rank i sends it.
    """

    def __init__(self, block: tuple[int, ...], dtype: torch.dtype, group):
        import torch.distributed as dist
        import torch.distributed._symmetric_memory as symm

        enable_symm_mem(group)
        self.world, self.rank = dist.get_world_size(group), dist.get_rank(group)
        self.block, self.dtype = tuple(block), dtype
        self.local = symm.empty((self.world, *self.block), dtype=dtype,
                                device=torch.device("cuda", torch.cuda.current_device()))
        self.local.fill_(float("nan") if dtype.is_floating_point else -1)
        self.handle = symm.rendezvous(self.local, group_name(group))
        self.peers = {p: self.handle.get_buffer(p, (self.world, *self.block), dtype)
                      for p in range(self.world) if p != self.rank}
        # the slots the peers write here (this rank's own slot is never written)
        self.received = tuple(self.local[p] for p in sorted(self.peers))
        _sync_barrier(group)  # every poison fill done before any peer pushes

    def push_fn(self, blocks: dict[int, torch.Tensor]) -> Callable[[], None]:
        """Zero-arg callable: copy `blocks[p]` into slot `rank` of peer p, for every peer.

        Each copy is a same-device contiguous `copy_` into peer memory mapped into this
        process, i.e. one cudaMemcpyAsync (device to device) that the copy engine carries
        over NVLink — the same mechanism torch async-TP uses. With W > 2 the peers' copies
        go on separate side streams (one per peer) joined back to the current stream.
        """
        pairs = [(self.peers[p][self.rank], blocks[p].contiguous()) for p in sorted(self.peers)]
        if len(pairs) == 1:
            (dst, src), = pairs

            def push():
                dst.copy_(src)
            return push
        streams = [torch.cuda.Stream() for _ in pairs]

        def push_many():
            cur = torch.cuda.current_stream()
            for s, (dst, src) in zip(streams, pairs):
                s.wait_stream(cur)
                with torch.cuda.stream(s):
                    dst.copy_(src)
            for s in streams:
                cur.wait_stream(s)
        return push_many


# ---------------------------------------------------------------- the builders


def _symm_op(name: str):
    """torch.ops.symm_mem.<name> (registered when torch's symmetric memory module loads)."""
    import torch.distributed._symmetric_memory

    return getattr(torch.ops.symm_mem, name)


def _or_raise_later(make):
    """`make()`, or — if this torch lacks what it needs — a callable raising that error, so
    only that baseline's check fails (and is reported), not the whole shape."""
    try:
        return make()
    except Exception as e:  # noqa: BLE001
        err = e  # `e` itself is unbound once the except block ends

        def unavailable():
            raise err
        return unavailable


def _exact_check(got_fn, want_fn, poison=(), after_poison=None):
    """A comm check: poison the receive buffer, move once, compare bit for bit.
    `after_poison`: run between the two (a barrier, where the peers write the buffer)."""
    def check(_ref):
        for t in poison:
            t.fill_(float("nan"))
        if after_poison is not None:
            after_poison()
        got, want = got_fn(), want_fn()
        same = bool(torch.equal(got, want))
        err = 0.0 if same else float((got.float() - want.float()).abs().nan_to_num(1e30).max())
        return err, 0.0 if same else 1.0, same
    return check


def _output_check(fn, poison, k, dtype, slack=1.0):
    """A compute check: poison the preallocated output, run once, compare with the ref."""
    def check(ref):
        for t in poison:
            t.fill_(float("nan"))
        out = fn()
        torch.cuda.synchronize()
        return compare(out, ref, k, dtype, slack)
    return check


def _sync_barrier(group):
    import torch.distributed as dist

    torch.cuda.synchronize()
    dist.barrier(group=group)
    torch.cuda.synchronize()


def build(bp, inputs: dict[str, torch.Tensor], group=None) -> dict[str, Baseline]:
    """Every baseline of `bp`'s signature on these (this rank's) inputs."""
    sig = bp.signature()
    if sig == "all_gather>gemm":
        return _build_ag_gemm(bp, inputs, group)
    if sig == "gemm>reduce_scatter":
        return _build_gemm_rs(bp, inputs, group)
    roles(bp)  # raises the NotSupportedError
    return {}


def _build_ag_gemm(bp, inputs, group) -> dict[str, Baseline]:
    import torch.distributed as dist

    r = roles(bp)
    a, b = inputs[r["a"]].contiguous(), inputs[r["b"]].contiguous()
    w, rank = dist.get_world_size(group), dist.get_rank(group)
    m_loc, k = a.shape
    dtype = bp.tensors[r["a"]].dtype
    gname = group_name(group)
    a_full = torch.empty((w * m_loc, k), dtype=a.dtype, device=a.device)
    c = torch.empty((w * m_loc, b.shape[1]), dtype=a.dtype, device=a.device)

    def nccl_cublas():
        dist.all_gather_into_tensor(a_full, a, group=group)
        return torch.mm(a_full, b, out=c)

    enable_symm_mem(group)

    def make_async_tp():
        op = _symm_op("fused_all_gather_matmul")
        kw = ({"return_A": False} if any(x.name == "return_A"
                                         for x in op.default._schema.arguments)
              else {})  # older torch always returns the gathered A too
        return lambda: op(a, [b], 0, gname, **kw)[1][0]

    async_tp = _or_raise_later(make_async_tp)

    # GEMM alone: the gathered operand already in place (gathered once, here).
    a_gemm = _gather0(a, group)
    c_gemm = torch.empty_like(c)

    def gemm():
        return torch.mm(a_gemm, b, out=c_gemm)

    a_comm = torch.empty_like(a_full)

    def nccl_comm():
        dist.all_gather_into_tensor(a_comm, a, group=group)
        return a_comm

    bufs = PeerBuffers((m_loc, k), a.dtype, group)
    push = bufs.push_fn({p: a for p in bufs.peers})

    def ce_comm():
        push()
        return bufs.local

    def ce_got():
        _sync_barrier(group)  # every rank's push has landed
        return torch.cat([bufs.local[p] for p in sorted(bufs.peers)])

    peer_rows = [a_gemm[p * m_loc:(p + 1) * m_loc] for p in range(w) if p != rank]
    return {
        "nccl_cublas": Baseline("nccl_cublas", nccl_cublas,
                                _output_check(nccl_cublas, [a_full, c], k, dtype),
                                "all_gather_into_tensor (NCCL) into a preallocated [M, K], then "
                                "torch.mm(out=) [M, K] x [K, N/W]", poison=(a_full, c)),
        "async_tp": Baseline("async_tp", async_tp, _output_check(async_tp, [], k, dtype),
                             "torch.ops.symm_mem.fused_all_gather_matmul(a, [b], 0, group, "
                             "return_A=False) (allocates its output each call)"),
        "gemm": Baseline("gemm", gemm, _output_check(gemm, [c_gemm], k, dtype),
                         "torch.mm(out=) [M, K] x [K, N/W] on the already-gathered operand",
                         poison=(c_gemm,)),
        "nccl_comm": Baseline("nccl_comm", nccl_comm,
                              _exact_check(lambda: (nccl_comm(), torch.cuda.synchronize(),
                                                    a_comm)[2], lambda: a_gemm, [a_comm]),
                              "all_gather_into_tensor (NCCL) of a [M/W, K] shard into [M, K]",
                              poison=(a_comm,)),
        "ce_comm": Baseline("ce_comm", ce_comm,
                            _exact_check(lambda: (ce_comm(), ce_got())[1],
                                         lambda: torch.cat(peer_rows), bufs.received,
                                         lambda: _sync_barrier(group)),
                            "copy_ of this rank's [M/W, K] shard into slot `rank` of every "
                            "peer's symmetric buffer (cudaMemcpyAsync over NVLink, copy "
                            "engine); all ranks push at once, no flag or barrier inside the "
                            "call (nobody reads the data), so it times the transfer only",
                            poison=bufs.received),
    }


def _build_gemm_rs(bp, inputs, group) -> dict[str, Baseline]:
    import torch.distributed as dist

    r = roles(bp)
    a, b = inputs[r["a"]].contiguous(), inputs[r["b"]].contiguous()
    w, rank = dist.get_world_size(group), dist.get_rank(group)
    m, k_loc = a.shape
    n = b.shape[1]
    k = k_loc * w
    dtype = bp.tensors[r["a"]].dtype
    gname = group_name(group)
    partial = torch.empty((m, n), dtype=a.dtype, device=a.device)
    out = torch.empty((m // w, n), dtype=a.dtype, device=a.device)

    def nccl_cublas():
        torch.mm(a, b, out=partial)
        dist.reduce_scatter_tensor(out, partial, group=group)
        return out

    enable_symm_mem(group)

    def make_async_tp():
        op = _symm_op("fused_matmul_reduce_scatter")
        return lambda: op(a, b, "sum", 0, gname)

    async_tp = _or_raise_later(make_async_tp)

    partial_gemm = torch.empty_like(partial)

    def gemm():
        return torch.mm(a, b, out=partial_gemm)

    # Comm alone moves real partials (this rank's GEMM result, computed once).
    src = torch.mm(a, b)
    out_comm = torch.empty_like(out)

    def nccl_comm():
        dist.reduce_scatter_tensor(out_comm, src, group=group)
        return out_comm

    rows = m // w
    bufs = PeerBuffers((rows, n), a.dtype, group)
    push = bufs.push_fn({p: src[p * rows:(p + 1) * rows] for p in bufs.peers})

    def ce_comm():
        push()
        return bufs.local

    def ce_got():
        _sync_barrier(group)
        return torch.cat([bufs.local[p] for p in sorted(bufs.peers)])

    def partials_of_my_rows():
        """[W, M/W, N]: every rank's partial of this rank's rows (all partials gathered)."""
        return _gather0(src, group).view(w, m, n)[:, rank * rows:(rank + 1) * rows]

    def ce_want():
        allp = partials_of_my_rows()
        return torch.cat([allp[p] for p in range(w) if p != rank])

    def nccl_comm_check(_ref):
        out_comm.fill_(float("nan"))
        got = (nccl_comm(), torch.cuda.synchronize(), out_comm)[2]
        return sum_compare(got, partials_of_my_rows().float(), dtype)

    return {
        "nccl_cublas": Baseline("nccl_cublas", nccl_cublas,
                                _output_check(nccl_cublas, [partial, out], k, dtype, slack=2.0),
                                "torch.mm(out=) [M, K/W] x [K/W, N], then reduce_scatter_tensor "
                                "(NCCL, sum) into a preallocated [M/W, N]",
                                poison=(partial, out)),
        "async_tp": Baseline("async_tp", async_tp, _output_check(async_tp, [], k, dtype, 2.0),
                             "torch.ops.symm_mem.fused_matmul_reduce_scatter(a, b, 'sum', 0, "
                             "group) (allocates its output each call)"),
        "gemm": Baseline("gemm", gemm, _rs_gemm_check(gemm, partial_gemm, a, b, group, k, dtype),
                         "torch.mm(out=) [M, K/W] x [K/W, N] (this rank's partial)",
                         poison=(partial_gemm,)),
        "nccl_comm": Baseline("nccl_comm", nccl_comm, nccl_comm_check,
                              "reduce_scatter_tensor (NCCL, sum) of a [M, N] partial into "
                              "[M/W, N] (includes NCCL's sums)", poison=(out_comm,)),
        "ce_comm": Baseline("ce_comm", ce_comm, _exact_check(lambda: (ce_comm(), ce_got())[1],
                                                             ce_want, bufs.received,
                                                             lambda: _sync_barrier(group)),
                            "copy_ of the [M/W, N] partial rows owned by each peer into slot "
                            "`rank` of that peer's symmetric buffer (cudaMemcpyAsync over "
                            "NVLink, copy engine); all ranks push at once; no flag, barrier "
                            "or reduction inside the call: it times the transfer only",
                            poison=bufs.received),
    }


def _rs_gemm_check(gemm, partial_gemm, a, b, group, k, dtype):
    """GEMM alone in GEMM-RS computes a partial: compare with this rank's own fp32 product."""
    def check(_ref):
        partial_gemm.fill_(float("nan"))
        got = gemm()
        torch.cuda.synchronize()
        ref = _no_tf32(lambda: a.float() @ b.float())
        return compare(got, ref, a.shape[1], dtype)
    return check
