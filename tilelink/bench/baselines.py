"""Baselines of any pattern, on this rank's local inputs (GPU, torch.distributed).

`build(bp, inputs, group)` returns `{system: Baseline}`, each derived from the pattern's ops
(their distributed references and what their modules register in `providers`):

    nccl_cublas  the non-overlapped plan: every op as its distributed reference in the
                 pattern's dtype (NCCL collectives, cuBLAS / torch compute), one by one
    async_tp     the same, with every op pair that torch async-TP fuses (`providers.FUSED`)
                 done by that fused call; absent when no pair of the pattern has one
    symm_one_shot, symm_two_shot
                 the non-overlapped plan with every collective that registers that library
                 variant (`dist_reference.library_variant`: torch symmetric memory's
                 all-reduce kernels) done by it, the op before it writing its result into the
                 variant's symmetric workspace; absent when no collective has one
    nccl_counts  the same for the collectives that send rows by run-time counts
                 (all_to_all): the counts exchanged and read on the host, then the rows
    gemm         compute alone: the compute ops on the collectives' results (computed once,
                 here, outside anything timed)
    nccl_comm    the collectives alone (NCCL), on their operands computed once here
    ce_comm      the collectives' transfers alone (`providers.TRANSFERS`): direct copies into
                 the peers' symmetric buffers, the copy engine's cudaMemcpyAsync over NVLink

Every `Baseline.fn` is a zero-argument callable, asynchronous on the current stream (side
streams are joined back), returning a tuple of tensors. `Baseline.check(ref)` runs it once
and compares it with what it must produce, so a wrong baseline is never timed: the output
systems with `reference()` (fp32 arithmetic rounded at op boundaries, NCCL-gathered bits),
compute alone with the exact compute ops on the same collective results, NCCL comm with the
exact collectives, copy-engine comm bit for bit with what each peer sent. `note` says
exactly what one call does.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch


@dataclass
class Baseline:
    """A zero-arg callable to time, how to check it once, and what it does."""

    key: str
    fn: Callable[[], tuple]
    check: Callable[[tuple], tuple[float, float, bool]]  # ref -> (max abs, rel, ok)
    note: str
    # what one call must rewrite: NaN-filled before a CUDA-graph replay is checked, so a
    # replay that skipped a step (a peer's push) cannot pass on what the eager calls left
    poison: tuple[torch.Tensor, ...] = ()


# ---------------------------------------------------------------- checks


def as_tuple(out) -> tuple:
    """A system's output as a tuple of tensors (a single-output op returns the tensor)."""
    return tuple(out) if isinstance(out, (tuple, list)) else (out,)


def check_outputs(bp, names, got, want, plan: bool = False) -> tuple[float, float, bool]:
    """(max abs error, worst normwise error, ok) of outputs `got` (a tensor or a tuple, in
    the order of `names`) against `want`: each within `runtime.bounds.output_bound` of
    its own scale (`judge`, the rule `tilelink run --check` applies; `plan`: computed as
    the non-overlapped plan computes, by NCCL and cuBLAS in the pattern's dtype)."""
    from ..runtime.bounds import judge, output_bound

    got, want = as_tuple(got), as_tuple(want)
    if len(got) != len(want):
        return float("inf"), float("inf"), False
    max_abs, rel, ok = 0.0, 0.0, True
    for name, g, w in zip(names, got, want):
        v = judge(g, w, output_bound(bp, name, plan))
        max_abs, rel, ok = max(max_abs, v.max_abs), max(rel, v.normwise), ok and v.ok
    return max_abs, rel, ok


def bitwise_check(got, want) -> tuple[float, float, bool]:
    """(max abs difference, 0 or 1, ok): every tensor identical bit for bit."""
    got, want = as_tuple(got), as_tuple(want)
    same = len(got) == len(want) and all(
        g.shape == w.shape and bool(torch.equal(g.view(torch.uint8), w.view(torch.uint8)))
        for g, w in zip(got, want))
    if same:
        return 0.0, 0.0, True
    err = max((float((g.float() - w.float()).abs().nan_to_num(1e30).max())
               for g, w in zip(got, want) if g.shape == w.shape and g.numel()),
              default=float("inf"))
    return err, 1.0, False


def _no_tf32(fn):
    """Run `fn` with TF32 off (the fp32 reference must be fp32)."""
    old = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = False
    try:
        return fn()
    finally:
        torch.backends.cuda.matmul.allow_tf32 = old


def reference(bp, inputs: dict[str, torch.Tensor], group) -> tuple[torch.Tensor, ...]:
    """This rank's pattern outputs (in `bp.pattern.outputs` order), every op as its exact
    distributed reference: fp32 arithmetic rounded at op boundaries, NCCL collectives (a
    collective call: every rank calls it)."""
    from ..runtime.dist_reference import local_program

    return _no_tf32(lambda: local_program(bp, group, exact=True)(inputs))


# ---------------------------------------------------------------- symmetric memory


from ..runtime.symmetric import enable_symm_mem, group_name  # noqa: E402  (re-exported)


class PeerBuffers:
    """A symmetric [W, *block] buffer on every rank (NaN-filled); slot i of a rank's buffer
    receives what rank i sends it. A block smaller than a slot fills the slot's first
    elements (flat slots take blocks of any shape: ranks of a ragged shard send less)."""

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
        pairs = []
        for p in sorted(self.peers):
            src = blocks[p].contiguous().view(-1)
            pairs.append((self.peers[p][self.rank].view(-1)[:src.numel()], src))
        if not pairs:  # W = 1: nobody to send to
            return lambda: None
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


def _sync_barrier(group):
    import torch.distributed as dist

    torch.cuda.synchronize()
    dist.barrier(group=group)
    torch.cuda.synchronize()


def _program(steps: list, vals: dict, results: tuple[str, ...]) -> Callable[[], tuple]:
    """Zero-arg callable: run prepared op steps on (a copy of) `vals`, return `results`."""
    from ..runtime.dist_reference import run_steps

    def call():
        out = run_steps(steps, dict(vals))
        return tuple(out[r] for r in results)
    return call


def _output_check(bp, fn) -> Callable:
    """Check of a system computing the pattern's outputs: against the reference, within
    the non-overlapped plan's bound (a baseline's collectives sum as NCCL does)."""
    names = tuple(bp.pattern.outputs)

    def check(ref):
        out = fn()
        torch.cuda.synchronize()
        return check_outputs(bp, names, out, ref, plan=True)
    return check


def build(bp, inputs: dict[str, torch.Tensor], group=None) -> dict[str, Baseline]:
    """Every baseline of `bp` on these (this rank's) inputs (a collective call)."""
    from ..ir.ops import OPS
    from ..runtime.dist_reference import local_program, op_steps, run_steps

    comm = [op for op in bp.ops if OPS[op.kind].category == "comm"]
    compute = [op for op in bp.ops if OPS[op.kind].category != "comm"]
    # every intermediate value once, as the non-overlapped plan computes it: the operands of
    # compute alone and comm alone (so neither times the other's work)
    vals = run_steps(op_steps(bp, bp.ops, group), dict(inputs))
    plan = local_program(bp, group, exact=False)
    systems = {"nccl_cublas": Baseline(
        "nccl_cublas", lambda: plan(inputs), _output_check(bp, lambda: plan(inputs)),
        "the non-overlapped plan: " + "; then ".join(_op_words(bp, op) for op in bp.ops))}
    fused = _build_async_tp(bp, inputs, group)
    if fused is not None:
        systems["async_tp"] = fused
    from ..schedule.lowering import library_comms

    for variant in library_comms(bp)[1:]:  # (the first is NCCL: nccl_cublas above)
        if variant in systems:
            continue  # async_tp: built above
        try:
            systems[variant] = _build_library_comm(bp, inputs, group, variant)
        except Exception as e:  # noqa: BLE001 — this torch or device lacks it: reported
            systems[variant] = _unavailable(variant, e)
    if compute:
        systems["gemm"] = _build_compute(bp, compute, vals, group)
    if comm:
        systems["nccl_comm"] = _build_nccl_comm(bp, comm, vals, group)
        systems["ce_comm"] = _build_ce_comm(bp, comm, vals, group)
    return systems


def _op_words(bp, op) -> str:
    """`out = kind(args)`: one op of the pattern, as its line reads."""
    return f"{op.result} = {op.kind}({', '.join(op.args)})"


def _build_async_tp(bp, inputs, group) -> Baseline | None:
    """The non-overlapped plan with library_comm=async_tp: every op pair torch async-TP
    fuses (`dist_reference.library_pair`) done by its fused call; None when no pair of this
    pattern has one. Where this torch lacks the fused ops, a baseline whose check raises
    that error, so only async-TP is reported as failed, not the whole shape."""
    from ..runtime.dist_reference import fusable_pairs, local_program

    if not fusable_pairs(bp, "async_tp"):
        return None
    try:
        plan = local_program(bp, group, exact=False, library_comm="async_tp")
    except Exception as e:  # noqa: BLE001
        return _unavailable("async_tp", e)
    steps = plan.steps
    if not any(ctx is None for _, _, ctx, _ in steps):
        return None  # no pair's operands fit its fused call
    words = [fn.fused.note if ctx is None else _op_words(bp, op) for fn, op, ctx, _ in steps]
    return Baseline("async_tp", lambda: plan(inputs), _output_check(bp, lambda: plan(inputs)),
                    "; then ".join(words))


def _unavailable(key: str, err: Exception) -> Baseline:
    """A baseline that could not be prepared here: its check raises `err`, so only it is
    reported as failed (and never timed), not the whole shape."""

    def fail(*_):
        raise err
    return Baseline(key, fail, fail, f"unavailable: {type(err).__name__}: {err}"[:200])


def _build_library_comm(bp, inputs, group, variant: str) -> Baseline:
    """The non-overlapped plan with the collectives that have library variant `variant`
    done by it (a collective call: the variants' workspaces are exchanged here)."""
    from ..runtime.dist_reference import LIBRARY_VARIANTS, local_program

    plan = local_program(bp, group, exact=False, library_comm=variant)
    words = [f"{_op_words(bp, op)} [{variant}]" if (op.kind, variant) in LIBRARY_VARIANTS
             else _op_words(bp, op) for op in bp.ops]
    return Baseline(variant, lambda: plan(inputs), _output_check(bp, lambda: plan(inputs)),
                    f"the non-overlapped plan with the library variant {variant} of its "
                    "collectives: " + "; then ".join(words))


def _build_compute(bp, compute, vals, group) -> Baseline:
    """The compute ops alone, on the collectives' results computed once."""
    return _alone(bp, compute, vals, group, "gemm",
                  "compute alone, on the collectives' results: ")


def _build_nccl_comm(bp, comm, vals, group) -> Baseline:
    """Each collective alone (NCCL), on its operands computed once."""
    return _alone(bp, comm, vals, group, "nccl_comm",
                  "the collectives alone (NCCL) on their operands: ")


def _alone(bp, ops, vals, group, key: str, what: str) -> Baseline:
    """`ops` alone as the non-overlapped plan runs them, on operands taken from `vals`;
    checked against the same ops in exact arithmetic on the same operands (a reduction
    across ranks may sum in any order: the bound takes that)."""
    from ..runtime.dist_reference import op_steps

    results = tuple(op.result for op in ops)
    fn = _program(op_steps(bp, ops, group), vals, results)
    exact = _program(op_steps(bp, ops, group, exact=True), vals, results)

    def check(_ref):
        out = fn()
        torch.cuda.synchronize()
        return check_outputs(bp, results, out, _no_tf32(exact), plan=True)
    return Baseline(key, fn, check, what + "; then ".join(_op_words(bp, op) for op in ops))


def _build_ce_comm(bp, comm, vals, group) -> Baseline:
    """Each collective's transfers alone: what `providers.TRANSFERS` says this rank sends
    each peer, copied into slot `rank` of that peer's symmetric buffer. Checked bit for bit
    against what every peer sent (gathered with NCCL)."""
    import torch.distributed as dist

    from ..runtime.reference import TORCH_DTYPES, RefContext
    from ..runtime.timing import max_over_ranks
    from .providers import TRANSFERS

    w, rank = dist.get_world_size(group), dist.get_rank(group)
    pushes, bufs, sent = [], [], []
    for op in comm:
        ctx = RefContext(bp, bp.op_attrs(op), TORCH_DTYPES[bp.tensors[op.result].dtype],
                         bp.world, False, group)
        blocks = {p: b.contiguous() for p, b in
                  TRANSFERS[op.kind].sends(op, ctx, [vals[a] for a in op.args]).items()}
        n = int(max_over_ranks([max((b.numel() for b in blocks.values()), default=0)],
                               group)[0])
        buf = PeerBuffers((n,), vals[op.args[0]].dtype, group)  # what the collective moves
        pushes.append(buf.push_fn(blocks))
        bufs.append(buf)
        sent.append((blocks, n))

    def ce_comm():
        for push in pushes:
            push()
        return tuple(b.local for b in bufs)

    def check(_ref):
        for b in bufs:
            for t in b.received:
                t.fill_(float("nan"))
        _sync_barrier(group)  # every poison fill before any peer pushes
        ce_comm()
        _sync_barrier(group)  # every rank's push has landed
        got, want = [], []
        for b, (blocks, n) in zip(bufs, sent):
            # row q of `mine`: what this rank sent rank q (NaN-padded like the slots)
            mine = torch.full((w, n), float("nan"), dtype=b.local.dtype, device=b.local.device)
            for q, blk in blocks.items():
                mine[q, :blk.numel()] = blk.reshape(-1)
            rows = [torch.empty_like(mine) for _ in range(w)]
            dist.all_gather(rows, mine, group=group)
            for p in range(w):
                if p != rank:
                    got.append(b.local[p])
                    want.append(rows[p][rank])
        return bitwise_check(tuple(got), tuple(want))

    return Baseline("ce_comm", ce_comm, check,
                    "the collectives' transfers alone: " + "; then ".join(
                        f"{op.kind}: copy_ of what this rank sends each peer into slot `rank` "
                        "of that peer's symmetric buffer" for op in comm)
                    + " (cudaMemcpyAsync over NVLink, copy engine; peers on side streams); all "
                    "ranks push at once, no flag, barrier or reduction inside the call: it "
                    "times the transfer only",
                    poison=tuple(t for b in bufs for t in b.received))
