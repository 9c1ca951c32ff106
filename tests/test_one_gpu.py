"""The one-GPU world's host logic, on the CPU: heaps and pointer tables, the SM budget and its
schedule note, kernels shared across ranks, the world op's streams (through a fake of
torch.cuda's stream API), the non-overlapped plan's collectives, the watchdog's order, the
process launcher, and the CLI's world choice and refusals. The GPU runs are tests/test_dist.py
with TILELINK_ONE_GPU_WORLDS set, and the `gpu` tests at the end of this file.
"""

from __future__ import annotations

import contextlib
import subprocess
import sys

import pytest
import torch

from tilelink.errors import ConfigError, HangError, NotSupportedError, TileLinkError
from tilelink.frontend import load_text
from tilelink.runtime import one_gpu
from tilelink.runtime.gpu_run import RunSpec
from tilelink.runtime.one_gpu import (RESERVED_SMS, OneGpuFallbackOp, OneGpuWorld, WorldOp,
                                      annotate_schedule, budget_note, check_backend,
                                      one_gpu_target, share_kernels_across_ranks, sm_budget)
from tilelink.runtime.reference import evaluate, judge, make_inputs, output_bound
from tilelink.runtime.symmetric import ALIGN, DeviceHeaps, layout
from tilelink.schedule import get_target, make_schedule

from .conftest import AG_RETURNING_GATHERED, EXAMPLES

AG = load_text(EXAMPLES / "ag_gemm.tl")
RS = load_text(EXAMPLES / "gemm_rs.tl")

# ---- heaps and pointer tables -------------------------------------------------------------

LAYOUTS = [
    {"ctl": ((7,), "int32")},
    {"full": ((2, 48, 16), "bf16"), "sig": ((6,), "int32"), "ctl": ((12,), "int32")},
    {"stage": ((3, 5), "fp32"), "odd": ((3,), "bf16"), "count": ((9,), "int32"),
     "ctl": ((4 + 2 * 4,), "int32")},
]


@pytest.mark.parametrize("symmetric", LAYOUTS)
@pytest.mark.parametrize("world", [1, 2, 3, 4])
def test_device_heaps_lay_out_every_rank_like_a_symmetric_heap(symmetric, world):
    heaps = DeviceHeaps(symmetric, world, "cpu")
    offsets, nbytes = layout(symmetric)
    assert heaps.heap_bases.tolist() == heaps.bases and len(heaps.bases) == world
    for r, base in enumerate(heaps.bases):
        assert base % ALIGN == 0  # whatever the allocator gave, the heap starts aligned
        for name, (shape, _dtype) in symmetric.items():
            t = heaps.peers[r][name]
            assert t.data_ptr() == base + offsets[name] and tuple(t.shape) == shape
            assert t.data_ptr() % ALIGN == 0
            for peer in range(world):  # symm_at: ptr - bases[me] + bases[peer]
                moved = t.data_ptr() - heaps.bases[r] + heaps.bases[peer]
                assert moved == heaps.peers[peer][name].data_ptr()
    spans = sorted((b, b + nbytes) for b in heaps.bases)  # no two ranks' heaps overlap
    assert all(a_end <= b_start for (_, a_end), (b_start, _) in zip(spans, spans[1:]))
    # every rank's view of the heaps is the same table; its own buffers are `tensors`
    for r, heap in enumerate(heaps.heaps):
        assert (heap.rank, heap.world) == (r, world) and heap.peers is heaps.peers
        assert heap.tensors is heaps.peers[r] and heap.heap_bases is heaps.heap_bases
        heap.barrier()  # (a CPU heap: nothing to wait for)


def test_device_heaps_writes_stay_in_their_rank():
    symmetric = LAYOUTS[2]
    heaps = DeviceHeaps(symmetric, 3, "cpu")
    for r in range(3):
        for t in heaps.heaps[r].tensors.values():
            t.fill_(r + 1)
    for r in range(3):
        whole = heaps.raw[r]
        skip = heaps.bases[r] - whole.data_ptr()
        for name, (shape, dtype) in symmetric.items():  # read back through the raw bytes
            view = heaps.peers[r][name]
            start = skip + heaps.offsets[name]
            raw = whole[start:start + view.numel() * view.element_size()].view(view.dtype)
            assert bool((raw == r + 1).all()), (r, name)


def test_the_copy_engine_checks_ops_against_a_device_heap():
    from tilelink.runtime.copy_ops import buffer_layout, check_copy_ops

    heaps = DeviceHeaps(LAYOUTS[1], 3, "cpu")
    table = buffer_layout(heaps.peers)
    src = torch.zeros(16, dtype=torch.bfloat16)
    check_copy_ops([("copy", src, 0, 16, 2, "full", 2 * 48 * 16 - 16),
                    ("signal", 2, "sig", 5, 1), ("wait", 0, "ctl", 11, 1)], table)
    for bad in [("copy", src, 0, 16, 3, "full", 0), ("signal", 1, "sig", 6, 1),
                ("copy", src, 0, 16, 1, "full", 2 * 48 * 16 - 15)]:
        with pytest.raises(TileLinkError):
            check_copy_ops([bad], table)


# ---- the SM budget and the schedule's note ----------------------------------------------

@pytest.mark.parametrize("sms", [132, 114, 108, 78, 16])
def test_every_rank_kernel_fits_with_sms_to_spare(sms):
    for world in range(1, 9):
        if sms - RESERVED_SMS < world:
            with pytest.raises(ConfigError, match="cannot share"):
                sm_budget(sms, world)
            continue
        budget = sm_budget(sms, world)
        assert budget >= 1 and world * budget + RESERVED_SMS <= sms
        assert world * (budget + 1) + RESERVED_SMS > sms  # and no program more
    with pytest.raises(ConfigError):
        sm_budget(132, 0)


@pytest.mark.parametrize("world", [2, 3, 4])
def test_the_schedule_takes_the_budget_and_says_so(world):
    base = get_target("cuda:90")
    target = one_gpu_target(base, world)
    assert target.num_sms == (132 - RESERVED_SMS) // world
    assert (target.name, target.lang, target.tma) == (base.name, base.lang, base.tma)
    bp = AG.bind({"M": "3072", "N": "3072", "K": "1024"}, world)
    s = annotate_schedule(make_schedule(bp, target, {"comm": "sm"}), 132, world)
    assert s.config.num_programs == target.num_sms  # the persistent grid is the share
    text = s.render()
    assert f"(132 - {RESERVED_SMS}) // {world} = {target.num_sms} programs" in text
    assert "not performance numbers" in text
    assert f"num_programs: 1..{target.num_sms}" in text
    with pytest.raises(ConfigError, match=f"1..{target.num_sms}"):
        make_schedule(bp, target, {"comm": "sm", "num_programs": str(target.num_sms + 1)})


def test_compile_emit_schedule_in_the_one_gpu_world(capsys):
    from tilelink.cli.main import main

    assert main(["compile", str(EXAMPLES / "gemm_rs.tl"), "-W", "3", "--world", "one-gpu",
                 "--emit", "schedule", "-D", "M=768", "-D", "K=768", "--config",
                 "comm=copy_engine"]) == 0
    out = capsys.readouterr().out
    assert budget_note(132, 3) in out and "num_programs=42" in out
    assert main(["compile", str(EXAMPLES / "ag_gemm.tl"), "--world", "one-gpu", "--target",
                 "interp"]) == 2
    assert "CUDA GPU" in capsys.readouterr().err


@pytest.mark.parametrize("backend", ["nvshmem", "nvshmem-ptr"])
def test_nvshmem_is_refused_with_the_reason(backend):
    with pytest.raises(NotSupportedError, match="one PE per GPU") as err:
        check_backend(backend)
    assert "backend 'torch'" in str(err.value)
    check_backend("torch")


# ---- kernels shared across ranks --------------------------------------------------------

@pytest.mark.parametrize("config", [{"comm": "sm"}, {"comm": "copy_engine", "gemm": "library"},
                                    {"comm": "copy_engine", "gemm": "ws"}])
def test_kernels_compile_once_for_every_rank(config):
    from triton.backends.compiler import BaseBackend
    from triton.runtime.jit import native_specialize_impl

    from tilelink.codegen import render_triton
    from tilelink.codegen.compile import kernel_names, load_module

    bp = AG.bind({"M": "3072", "N": "3072", "K": "1024"}, 3)
    mod = load_module(render_triton(make_schedule(bp, get_target("cuda:90"), config)))

    def keys(kernel):  # Triton's specialisation of `me` for ranks 0..3 and 16
        p = next(p for p in kernel.params if p.name == "me")
        return {native_specialize_impl(BaseBackend, r, False, not p.do_not_specialize, True)
                for r in (0, 1, 2, 3, 16)}

    kernels = [getattr(mod, k) for k in kernel_names(mod)]
    assert kernels and all(len(keys(k)) > 1 for k in kernels)  # by default: several
    changed = share_kernels_across_ranks(mod)
    assert set(kernel_names(mod)) <= set(changed)  # (and helpers that take `me`)
    assert all(len(keys(k)) == 1 for k in kernels)  # now one compilation for every rank
    others = [p for k in kernels for p in k.params if p.name != "me"]
    assert not any(p.do_not_specialize for p in others)
    # a kernel already bound to a device is left alone
    fresh = load_module(render_triton(make_schedule(bp, get_target("cuda:90"), config)))
    first = getattr(fresh, kernel_names(fresh)[0])
    first.device_caches[0] = "bound"  # (what a first launch leaves there)
    assert kernel_names(fresh)[0] not in share_kernels_across_ranks(fresh)


# ---- the world op's streams, through a fake of torch.cuda's stream API -------------------

class FakeStream:
    def __init__(self, name):
        self.name, self.waited = name, []

    def wait_event(self, event):
        self.waited.append(event.stream)

    def wait_stream(self, other):
        self.waited.append(other)


class FakeEvent:
    def __init__(self, *args, **kwargs):
        self.stream = None

    def record(self, stream=None):
        self.stream = stream if stream is not None else FakeCuda.current


class FakeGraph:
    def __init__(self):
        self.stream, self.replays = None, []

    def replay(self):
        self.replays.append(FakeCuda.current)


class FakeCuda:
    """torch.cuda's stream, event, graph and synchronisation calls the world op makes."""

    current = None
    log: list = []

    def __init__(self, monkeypatch):
        FakeCuda.current, FakeCuda.log = FakeStream("caller"), []
        self.capturing = False
        cuda = torch.cuda
        monkeypatch.setattr(cuda, "stream", self.stream)
        monkeypatch.setattr(cuda, "Event", FakeEvent)
        monkeypatch.setattr(cuda, "current_stream", lambda device=None: FakeCuda.current)
        monkeypatch.setattr(cuda, "is_current_stream_capturing", lambda: self.capturing)
        monkeypatch.setattr(cuda, "synchronize", lambda device=None: FakeCuda.log.append("sync"))
        monkeypatch.setattr(cuda, "CUDAGraph", FakeGraph)
        monkeypatch.setattr(cuda, "graph", self.graph)
        monkeypatch.setattr(cuda, "current_device", lambda: 0)

    @contextlib.contextmanager
    def stream(self, s):
        before, FakeCuda.current = FakeCuda.current, s
        try:
            yield
        finally:
            FakeCuda.current = before

    @contextlib.contextmanager
    def graph(self, g, stream=None):
        g.stream = stream
        self.capturing = True
        try:
            with self.stream(stream):
                yield
        finally:
            self.capturing = False


def _world(size):
    world = object.__new__(OneGpuWorld)
    world.size, world.ranks = size, tuple(range(size))
    world.device = torch.device("cpu")
    world.streams = [FakeStream(f"rank {r}") for r in range(size)]
    world.capture_stream = FakeStream("capture")
    world.sms, world.reserved = 132, RESERVED_SMS
    return world


class FakeKernelOp:
    """A rank's kernel op: records the stream each call ran on."""

    def __init__(self, rank, bound):
        self.rank, self.bound, self.calls = rank, bound, []
        self.schedule = self.config = None
        self.input_names, self.output_names = ("a", "b"), ("c",)
        self.captured_op = None
        self.vendor_rounded = False

    def __call__(self, **inputs):
        self.calls.append(FakeCuda.current)
        FakeCuda.log.append(("call", self.rank, FakeCuda.current.name))
        return torch.full((1,), float(self.rank))


def test_a_world_call_forks_onto_every_rank_stream_in_rank_order(monkeypatch):
    FakeCuda(monkeypatch)
    world = _world(3)
    bp = AG.bind({}, 4)  # (only its name is read)
    ops = [FakeKernelOp(r, bp) for r in range(3)]
    op = WorldOp(world, ops)
    caller = FakeCuda.current
    outs = op([{"a": torch.zeros(1)} for _ in range(3)],
              before=lambda r: FakeCuda.log.append(("before", r, FakeCuda.current.name)))
    assert [float(o) for o in outs] == [0.0, 1.0, 2.0]
    assert FakeCuda.log == [entry for r in range(3) for entry in
                            (("before", r, f"rank {r}"), ("call", r, f"rank {r}"))]
    for s in world.streams:  # each rank's stream first waited for the caller's work
        assert s.waited == [caller]
    with pytest.raises(TileLinkError, match="inputs for 2 ranks"):
        op([{}, {}])


def _fallback_world(monkeypatch, pattern, values, world_size, library_comm="nccl"):
    FakeCuda(monkeypatch)
    bp = pattern.bind(values, world_size)
    s = make_schedule(bp, get_target("cuda:90"), {"comm": "none", "library_comm": library_comm})
    ops = []
    for r in range(world_size):
        op = OneGpuFallbackOp(bp, s, r)
        op.device = torch.device("cpu")  # (its inputs are CPU tensors here)
        ops.append(op)
    return bp, WorldOp(_world(world_size), ops)


def _check_every_rank(bp, op, seed: int) -> None:
    """Call the world's op on every rank's inputs and check each rank's every output against
    the exact reference, within the non-overlapped plan's bound (its own roundings: a
    reduction in bf16, rank after rank)."""
    w = op.world.size
    per_rank = make_inputs(bp, seed=seed)
    outs = op([{n: v[r] for n, v in per_rank.items()} for r in range(w)])
    want = evaluate(bp, per_rank)
    for r in range(w):
        got = outs[r] if isinstance(outs[r], tuple) else (outs[r],)
        for name, g in zip(op.output_names, got):
            v = judge(g, want[name][r], output_bound(bp, name, plan=True))
            assert v.ok, v.words(name)


@pytest.mark.parametrize("pattern,values", [
    (AG, {"M": "96", "N": "48", "K": "32"}),
    (RS, {"M": "96", "N": "40", "K": "96"}),
    (AG, {"M": "60", "N": "24", "K": "16"}),
])
@pytest.mark.parametrize("world_size", [2, 3, 4])
def test_the_non_overlapped_plan_runs_every_rank_on_its_stream(monkeypatch, pattern, values,
                                                                world_size):
    try:
        pattern.bind(values, world_size)
    except TileLinkError:
        pytest.skip("sizes this world size does not divide")
    bp, op = _fallback_world(monkeypatch, pattern, values, world_size)
    assert op.fallback
    _check_every_rank(bp, op, seed=3)
    # before its collective every rank's stream waited for every rank's stream
    for s in op.world.streams:
        assert set(op.world.streams) <= set(s.waited)


@pytest.mark.parametrize("pattern,values", [
    (load_text(EXAMPLES / "sp_attention.tl"), {"S": "48", "H": "2", "D": "16"}),
    (load_text(EXAMPLES / "flash_decode.tl"), {"B": "2", "H": "2", "S": "64", "D": "16"}),
    (AG, {"M": "64", "N": "24", "K": "16"}),
])
def test_the_plan_runs_each_op_as_its_reference_does(monkeypatch, pattern, values):
    # every op with a reference runs (attention too, which no op-by-op table listed), each
    # rank's result within the plan's bound of the exact reference
    bp, op = _fallback_world(monkeypatch, pattern, values, 2)
    _check_every_rank(bp, op, seed=6)


def test_the_non_overlapped_plan_returns_every_output(monkeypatch):
    from tilelink.frontend.text import parse_text

    both = parse_text(AG_RETURNING_GATHERED, "both.tl")
    bp, op = _fallback_world(monkeypatch, both, {"M": "64", "N": "32", "K": "16"}, 2)
    per_rank = make_inputs(bp, seed=0)
    outs = op([{n: v[r] for n, v in per_rank.items()} for r in range(2)])
    gathered, c = outs[1]
    assert torch.equal(gathered, torch.cat(per_rank["a"]))
    assert c.shape == (64, 16)


def test_a_rank_alone_cannot_call_the_non_overlapped_plan(monkeypatch):
    bp, op = _fallback_world(monkeypatch, AG, {"M": "64", "N": "32", "K": "16"}, 2)
    a, b = make_inputs(bp, 0)["a"][0], make_inputs(bp, 0)["b"][0]
    with pytest.raises(TileLinkError, match="every rank at once") as err:
        op.ops[0](a, b)
    assert "op([inputs of rank 0" in str(err.value)


class FakeWatchedOp:
    def __init__(self, rank, hang):
        self.rank, self.hang = rank, hang

    def settle(self, timeout):
        FakeCuda.log.append(("settle", self.rank))

    def report(self):
        FakeCuda.log.append(("report", self.rank))
        if self.hang:
            raise HangError(f"rank {self.rank}: 1 wait(s) gave up")


def test_the_watchdog_settles_every_rank_before_the_device_wait(monkeypatch):
    FakeCuda(monkeypatch)
    op = object.__new__(WorldOp)
    op.world = _world(3)
    op.ops = [FakeWatchedOp(r, hang=r == 1) for r in range(3)]
    found = op.check_diagnostics(5.0)
    # a device-wide wait before rank 2 settled could wait on its stuck copy engine forever
    assert FakeCuda.log == [("settle", 0), ("settle", 1), ("settle", 2), "sync",
                            ("report", 0), ("report", 1), ("report", 2)]
    assert found[0] is None and found[2] is None and "rank 1" in str(found[1])


def test_kernels_are_captured_per_rank_and_the_fallback_as_one_graph(monkeypatch):
    fake = FakeCuda(monkeypatch)
    world = _world(3)
    ops = [FakeKernelOp(r, AG.bind({}, 4)) for r in range(3)]
    op = WorldOp(world, ops)
    static = [{"a": torch.zeros(2)} for _ in range(3)]
    graph = op.capture(static)
    assert graph.per_rank and [g.stream for g in graph.graphs] == world.streams
    assert [o.calls for o in ops] == [[s] for s in world.streams]
    outs = graph.replay([{"a": torch.ones(2)} for _ in range(3)])
    assert [g.replays for g in graph.graphs] == [[s] for s in world.streams]
    assert all(bool((s["a"] == 1).all()) for s in static)  # refilled before the replays
    assert [float(o) for o in outs] == [0.0, 1.0, 2.0]
    assert not fake.capturing
    # the non-overlapped plan: one graph on the capture stream, every rank a branch of it
    bp, fallback = _fallback_world(monkeypatch, AG, {"M": "64", "N": "32", "K": "16"}, 2)
    per_rank = make_inputs(bp, seed=0)
    inputs = [{n: v[r] for n, v in per_rank.items()} for r in range(2)]
    graph = fallback.capture(inputs)
    assert not graph.per_rank and graph.graphs[0].stream is fallback.world.capture_stream
    # the capture stream rejoined every branch before the capture ended
    assert set(fallback.world.streams) <= set(fallback.world.capture_stream.waited)
    # a fallback whose captured calls take a kernel is captured per rank
    for rank_op, kernel in zip(fallback.ops, [FakeKernelOp(r, bp) for r in range(2)]):
        rank_op.captured_op = kernel
    assert fallback.capture(inputs).per_rank


def test_compile_ops_builds_every_rank_of_a_one_gpu_world(monkeypatch):
    # the world interface end to end, up to the GPU: which target, which note, no tuner
    # cache, one op per rank, the captured calls' kernel per rank, the op cache per world
    from tilelink.runtime import gpu

    built = []

    def fake_build(bp, s, target, world, backend, limit, fault, verbose):
        built.append((s, target))
        if s.config.comm == "none":
            return world.fallback_ops(bp, s)
        return [f"kernel op of rank {r}" for r in world.ranks]

    def no_tuner(*args, **kwargs):
        raise AssertionError("the tuner's cache is not for the one-GPU world")

    FakeCuda(monkeypatch)
    monkeypatch.setattr(gpu, "_build_ops", fake_build)
    monkeypatch.setattr(gpu, "_tuned_config", no_tuner)
    monkeypatch.setattr(one_gpu, "device_target", lambda backend: get_target("cuda:90"))
    world = _world(2)
    world._id = 10_000
    # eager calls: the non-overlapped plan (host-bound); captured calls: the copy engine on flags
    values = {"M": "1024", "N": "8192", "K": "4096"}
    op = world.compile(AG, values)
    assert op.fallback and [o.rt.rank for o in op.ops] == [0, 1]
    (plan, target), (kernel, _) = built  # the plan, then the kernel its captures take
    assert target.num_sms == sm_budget(132, 2) and plan.notes[-1] == budget_note(132, 2)
    assert kernel.config.capturable == 1 and kernel.config.num_programs == target.num_sms
    assert [o.captured_op for o in op.ops] == ["kernel op of rank 0", "kernel op of rank 1"]
    assert world.compile(AG, values).ops is op.ops and len(built) == 2  # cached
    other = _world(2)
    other._id = 10_001
    assert other.compile(AG, values).ops is not op.ops  # another world: its own ops
    with pytest.raises(NotSupportedError, match="one PE per GPU"):
        world.compile(AG, values, backend="nvshmem")


# ---- the run driver, on a fake world ------------------------------------------------------

class FakeRunOp:
    """A WorldOp stand-in: every rank's exact outputs (rank `wrong`'s first row off by more
    than the output's largest value, as a wrong tile would be), and the watchdog findings it
    is given."""

    def __init__(self, bp, wrong=None, hang_rank=None, refuse=False):
        self.bound, self.wrong, self.hang_rank, self.refuse = bp, wrong, hang_rank, refuse
        self.ops = [type("Rank", (), {"config": f"cfg {r}"})() for r in range(bp.world)]
        self.input_names = tuple(d.name for d in bp.pattern.inputs)
        self.output_names = tuple(bp.pattern.outputs)
        self.calls, self.replays, self.delayed = 0, 0, []
        self.fallback = False
        self.vendor_rounded = False  # a kernel's outputs: judged by the kernels' bound

    def make_inputs(self, seed):
        per_rank = make_inputs(self.bound, seed)
        return [{n: v[r] for n, v in per_rank.items()} for r in range(self.bound.world)]

    def __call__(self, inputs, before=None):
        if self.refuse:
            raise NotSupportedError("this schedule cannot be captured")
        self.calls += 1
        for r in range(self.bound.world):
            if before is not None:
                before(r)
                self.delayed.append(r)
        return self._outputs(inputs)

    def _outputs(self, inputs):
        want = evaluate(self.bound, {n: [x[n] for x in inputs] for n in self.input_names})
        outs = [want[self.output_names[0]][r].clone() for r in range(self.bound.world)]
        if self.wrong is not None:
            outs[self.wrong][0] += outs[self.wrong].abs().max() + 1
        return outs

    def capture(self, static):
        if self.refuse:
            raise NotSupportedError("this schedule cannot be captured")
        op = self

        class Graph:
            def replay(self, inputs):
                op.replays += 1
                return op._outputs(inputs)

        return Graph()

    def check_diagnostics(self, timeout):
        return [HangError(f"rank {r}: 3 wait(s) gave up") if r == self.hang_rank else None
                for r in range(self.bound.world)]

    def captured_config(self):
        return None


class FakeRunWorld:
    def __init__(self, op):
        self.op, self.size, self.ranks, self.streams = op, op.bound.world, range(op.bound.world), []

    def compile(self, bp, **kwargs):
        assert bp.world == self.size
        return self.op

    def note(self):
        return "NOTE"


def _drive(monkeypatch, spec, **fake):
    from tilelink.frontend import load_pattern
    from tilelink.runtime.one_gpu_run import run_world_spec

    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a: None)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *a: "fake GPU")
    monkeypatch.setattr(torch.cuda, "_sleep", lambda cycles: None)
    bp = load_pattern(spec.pattern).bind(spec.values, 3)
    op = FakeRunOp(bp, **fake)
    return run_world_spec(FakeRunWorld(op), spec), op


RS_SPEC = RunSpec(str(EXAMPLES / "gemm_rs.tl"), {"M": "96", "N": "40", "K": "96"}, calls=4)


def test_the_run_driver_checks_every_call_of_every_rank(monkeypatch):
    from dataclasses import replace

    res, op = _drive(monkeypatch, replace(RS_SPEC, delays=True))
    assert res["world"] == 3 and res["note"] == "NOTE" and op.calls == 4
    assert op.delayed == [0, 1, 2] * 4  # a delay before each rank's launch of each call
    for r, summary in enumerate(res["ranks"]):
        assert summary["rank"] == r and summary["config"] == f"cfg {r}"
        assert summary["hang"] is None and summary["bad_calls"] == 0
        assert summary["errors"]["out"] == (0.0, 0.0)
    res, _ = _drive(monkeypatch, RS_SPEC, wrong=1)
    assert [s["bad_calls"] for s in res["ranks"]] == [0, 4, 0]
    assert res["ranks"][1]["errors"]["out"][0] >= 1


def test_the_run_driver_reports_a_hang_on_every_rank(monkeypatch):
    res, _ = _drive(monkeypatch, RS_SPEC, hang_rank=2)
    assert "gave up" in res["ranks"][2]["hang"] and "HangError" in res["ranks"][2]["hang"]
    for s in res["ranks"][:2]:  # the others say why theirs were not checked
        assert "another rank's wait gave up" in s["hang"] and not s["errors"]
    res, _ = _drive(monkeypatch, RS_SPEC, refuse=True)  # a call raised before any launch
    assert all("cannot be captured" in s["hang"] for s in res["ranks"])


def test_the_run_driver_replays_graphs_and_mixes_eager_calls(monkeypatch):
    from dataclasses import replace

    res, op = _drive(monkeypatch, replace(RS_SPEC, graph=True, mixed=True, calls=6))
    assert (op.replays, op.calls) == (3, 3)  # every other call eager
    assert all(s["bad_calls"] == 0 and s["errors"] for s in res["ranks"])
    res, op = _drive(monkeypatch, replace(RS_SPEC, graph=True, calls=5))
    assert (op.replays, op.calls) == (5, 0)


# ---- the process launcher ---------------------------------------------------------------

@pytest.mark.slow
def test_the_launcher_runs_one_process_and_relays_its_progress(monkeypatch):
    from tilelink.runtime import launcher

    from ._one_gpu_fake import raises_tilelink_error, world_size_plus

    monkeypatch.setattr(launcher, "gpu_count", lambda: 1)
    seen = []
    assert launcher.launch_one_gpu_world(world_size_plus, 3, 4, on_progress=seen.append) == 7
    assert seen == ["started"]
    with pytest.raises(TileLinkError, match="no world of 2 here"):
        launcher.launch_one_gpu_world(raises_tilelink_error, 2)
    monkeypatch.setattr(launcher, "gpu_count", lambda: 0)
    with pytest.raises(TileLinkError, match="needs a CUDA GPU"):
        launcher.launch_one_gpu_world(world_size_plus, 3, 4)


@pytest.mark.slow
def test_a_lost_case_fails_alone_and_the_rest_run_in_a_fresh_process(monkeypatch):
    from tilelink.runtime import launcher
    from tilelink.runtime.one_gpu_run import run_one_gpu_cases

    from ._one_gpu_fake import fake_cases

    monkeypatch.setattr(launcher, "gpu_count", lambda: 1)
    specs = [RunSpec(what) for what in ("ok", "crash", "ok", "hang", "raise", "ok")]
    # (the idle clock starts once the process has imported torch; a fake case then takes
    # microseconds, so 3 s tells the hang from the others on any load)
    got = run_one_gpu_cases(2, specs, case_timeout=3, runner=fake_cases)
    assert [g.get("what") for g in got] == ["ok", None, "ok", None, None, "ok"]
    assert [g.get("case") for g in got if "case" in g] == [0, 2, 5]
    assert "exit code 3" in got[1]["ranks"][0]["error"]
    assert "reported nothing for 3 s" in got[3]["ranks"][1]["error"]
    assert "illegal memory access" in got[4]["ranks"][0]["error"]
    assert len({g["pid"] for g in got if "pid" in g}) == 3  # a fresh process after each loss


@pytest.mark.slow
def test_processes_that_never_finish_a_case_stop_the_run(monkeypatch):
    from tilelink.runtime import launcher
    from tilelink.runtime.one_gpu_run import run_one_gpu_cases

    from ._one_gpu_fake import fake_cases

    monkeypatch.setattr(launcher, "gpu_count", lambda: 1)
    got = run_one_gpu_cases(2, [RunSpec("crash")] * 5, case_timeout=3, runner=fake_cases)
    assert all(g["ranks"][0]["error"] for g in got)
    assert "remaining cases were not run" in got[4]["ranks"][0]["error"]


@pytest.mark.parametrize("jobs", [1, 5, 12])
def test_precompilation_deals_every_case_to_one_process(jobs):
    from tilelink.runtime.one_gpu_run import precompile_parts

    cases = {w: [RunSpec(f"case {i} at {w}") for i in range(7)] for w in (2, 3, 4)}
    parts = precompile_parts(cases, jobs)
    assert len(parts) <= max(3, jobs + 2)
    for w, specs in cases.items():  # each world's cases, each exactly once, in its world
        dealt = [s for pw, part in parts if pw == w for s in part]
        assert sorted(d.pattern for d in dealt) == sorted(s.pattern for s in specs)
    assert all(part for _, part in parts)


# ---- the CLI: which world, and what is refused --------------------------------------------

@pytest.mark.parametrize("requested,w,gpus,torchrun,want", [
    ("auto", 2, 0, False, "emulated"),  # the README quick start on a CPU-only machine
    ("auto", 2, 2, False, "gpus"),
    ("auto", 4, 8, False, "gpus"),
    ("auto", 4, 1, True, "gpus"),  # torchrun made the world
    ("auto", 1, 1, False, "gpus"),
    ("emulated", 4, 8, False, "emulated"),
    ("one-gpu", 4, 1, False, "one-gpu"),
    ("one-gpu", 2, 8, False, "one-gpu"),
    ("gpus", 2, 2, False, "gpus"),
])
def test_the_world_run_chooses(requested, w, gpus, torchrun, want):
    from tilelink.cli.main import choose_world

    assert choose_world(requested, w, gpus, torchrun) == want


@pytest.mark.parametrize("requested,w,gpus,torchrun,message", [
    ("auto", 2, 1, False, "W = 2 ranks, but 1 GPU(s) visible"),
    ("auto", 4, 3, False, "W = 4 ranks, but 3 GPU(s) visible"),
    ("gpus", 4, 1, False, "needs 4 GPUs"),
    ("gpus", 4, 0, False, "needs 4 GPUs"),
    ("one-gpu", 2, 0, False, "needs a CUDA GPU"),
    ("one-gpu", 2, 1, True, "without torchrun"),
])
def test_the_world_run_refuses_to_guess(requested, w, gpus, torchrun, message):
    from tilelink.cli.main import choose_world

    with pytest.raises(TileLinkError) as err:
        choose_world(requested, w, gpus, torchrun)
    assert message in err.value.message
    hint = err.value.hint or ""
    if gpus and not torchrun:  # the worlds that exist here are named
        assert "--world one-gpu" in hint and "--world emulated" in hint
        assert f"a host with {w} GPUs" in hint


def test_run_with_too_few_gpus_names_the_worlds_and_exits_2(monkeypatch, capsys):
    from tilelink.cli.main import main
    from tilelink.runtime import launcher

    monkeypatch.setattr(launcher, "gpu_count", lambda: 1)
    assert main(["run", str(EXAMPLES / "ag_gemm.tl"), "-W", "2", "--check"]) == 2
    err = capsys.readouterr().err
    assert "1 GPU(s) visible" in err and "--world one-gpu" in err and "--world emulated" in err
    assert "Traceback" not in err
    assert main(["run", str(EXAMPLES / "ag_gemm.tl"), "--emulate", "--world", "gpus"]) == 2
    assert "contradict" in capsys.readouterr().err


def test_run_in_the_one_gpu_world_says_its_timings_are_not_performance(monkeypatch, capsys):
    from tilelink.cli.main import main
    from tilelink.runtime import launcher

    ran = []

    def fake_launch(fn, world_size, spec, **kwargs):
        ran.append((fn.__name__, world_size, spec))
        rank = {"device": "GPU", "config": "comm=sm", "hang": None, "calls": 1,
                "ms_per_call": 0.5, "errors": {"c": (0.1, 0.01)}, "bad_calls": 0}
        return {"pattern": "ag_gemm", "sizes": "M=256", "world": world_size, "note": "NOTE",
                "ranks": [dict(rank, rank=r) for r in range(world_size)]}

    monkeypatch.setattr(launcher, "gpu_count", lambda: 1)
    monkeypatch.setattr(launcher, "launch_one_gpu_world", fake_launch)
    assert main(["run", str(EXAMPLES / "ag_gemm.tl"), "-W", "4", "--world", "one-gpu",
                 "--check", "--calls", "3"]) == 0
    out, err = capsys.readouterr()
    assert ran[0][:2] == ("run_one_gpu_spec", 4) and ran[0][2].calls == 3
    assert "NOT performance numbers" in err and "ONE GPU" in err
    assert "NOT a performance number" in out and "note: NOTE" in out
    assert "check: OK" in out
    # nvshmem is refused before anything starts
    assert main(["run", str(EXAMPLES / "ag_gemm.tl"), "-W", "2", "--world", "one-gpu",
                 "--backend", "nvshmem"]) == 2
    assert "one PE per GPU" in capsys.readouterr().err and len(ran) == 1


def test_bench_refuses_the_one_gpu_world(monkeypatch, capsys):
    from tilelink.cli import bench as cli_bench
    from tilelink.cli.main import main

    assert main(["bench", str(EXAMPLES / "ag_gemm.tl"), "--world", "one-gpu"]) == 2
    err = capsys.readouterr().err
    assert "refused in the one-GPU world" in err and "SMs" in err and "bandwidth" in err
    assert main(["bench", str(EXAMPLES / "ag_gemm.tl"), "--world", "emulated"]) == 2
    assert "refused in the emulated world" in capsys.readouterr().err
    monkeypatch.setattr(cli_bench, "gpu_count", lambda: 1)  # fewer GPUs than ranks
    assert main(["bench", str(EXAMPLES / "ag_gemm.tl"), "-W", "2"]) == 2
    err = capsys.readouterr().err
    assert "one-GPU world" in err and "--world one-gpu" in err


# ---- on a GPU (one is enough) -----------------------------------------------------------

def _tilelink(*argv, timeout=300):
    return subprocess.run([sys.executable, "-m", "tilelink.cli.main", *argv],
                          capture_output=True, text=True, timeout=timeout)


@pytest.mark.gpu
@pytest.mark.parametrize("argv", [
    # the default plan at the example's sizes: the non-overlapped one, torch on every stream
    ["run", str(EXAMPLES / "ag_gemm.tl"), "-W", "4", "--check", "--calls", "3"],
    # the copy engine's kernel, replayed from per-rank CUDA graphs
    ["run", str(EXAMPLES / "ag_gemm.tl"), "-W", "2", "--check", "--calls", "5", "--graph",
     "--config", "comm=copy_engine", "capturable=1"],
])
def test_cli_run_on_one_gpu(argv):
    out = _tilelink(*argv, "--world", "one-gpu")
    assert out.returncode == 0, out.stdout + out.stderr
    assert "check: OK" in out.stdout and "NOT a performance number" in out.stdout
    assert "one-GPU world:" in out.stdout  # the SM budget note


@pytest.mark.gpu
def test_device_heaps_on_a_gpu():
    heaps = DeviceHeaps(LAYOUTS[1], 3, "cuda")
    assert heaps.heap_bases.is_cuda and heaps.heap_bases.tolist() == heaps.bases
    for r in range(3):
        heaps.heaps[r].tensors["sig"].fill_(r + 1)
    heaps.heaps[0].barrier()
    assert [int(heaps.peers[r]["sig"][0]) for r in range(3)] == [1, 2, 3]


@pytest.mark.parametrize("pattern", [AG, RS])
def test_a_library_plan_runs_as_the_worlds_own_plan(monkeypatch, pattern):
    # async-TP's fused calls need a process group and torch symmetric memory, which one
    # process driving every rank has not: the world runs its own plan, with the same values
    bp, op = _fallback_world(monkeypatch, pattern, {"M": "96", "N": "48", "K": "32"}, 2,
                             library_comm="async_tp")
    assert op.fallback and bp.ops  # built: no symmetric workspace was asked for
    _check_every_rank(bp, op, seed=4)
