"""The GPU Python API's input validation, checked on the CPU (no GPU, no process group).

`TileLinkOp._bind` is what every call goes through; here it runs on an op whose device is
the CPU, so the messages a user gets for wrong tensors are tested everywhere.
"""

from __future__ import annotations

import pytest
import torch

from tilelink.errors import TileLinkError
from tilelink.frontend import load_text
from tilelink.runtime.gpu import FallbackOp

from .conftest import AG_RETURNING_GATHERED, EXAMPLES

AG = load_text(EXAMPLES / "ag_gemm.tl")


def _op():
    # a FallbackOp shell (its __init__ needs a GPU and a process group): only what _bind reads
    op = object.__new__(FallbackOp)
    bp = AG.bind({"M": "64", "N": "32", "K": "16"}, 2)
    op.bound, op.device = bp, torch.device("cpu")
    op.input_names = ("a", "b")

    class Layout:
        INPUTS = {n: (bp.tensors[n].local_shape, bp.tensors[n].dtype) for n in op.input_names}

    op.module = Layout
    return op


def _good():
    return torch.zeros(32, 16, dtype=torch.bfloat16), torch.zeros(16, 16, dtype=torch.bfloat16)


def test_good_inputs_bind_by_position_and_name():
    a, b = _good()
    op = _op()
    assert op._bind((a, b), {})["b"] is b
    assert op._bind((a,), {"b": b})["a"] is a


@pytest.mark.parametrize("mutate,message,hint", [
    (lambda a, b: (a.float(), b), "has dtype torch.float32; the pattern says bf16", ".to("),
    (lambda a, b: (a[:16], b), "has shape (16, 16); this rank's shard is (32, 16)", "values="),
    (lambda a, b: (torch.zeros(32, 32, dtype=torch.bfloat16)[:, :16], b), "not contiguous",
     ".contiguous()"),
    (lambda a, b: (a.tolist(), b), "must be a torch.Tensor", ""),
])
def test_wrong_inputs_say_what_and_how_to_fix(mutate, message, hint):
    a, b = mutate(*_good())
    op = _op()
    with pytest.raises(TileLinkError) as err:
        op._bind((a, b), {})
    assert message in str(err.value) and "input 'a'" in str(err.value)
    assert hint in str(err.value)


def test_missing_unknown_and_duplicate_inputs():
    a, b = _good()
    op = _op()
    with pytest.raises(TileLinkError, match="missing input"):
        op._bind((a,), {})
    with pytest.raises(TileLinkError, match="has no input 'c'"):
        op._bind((a, b), {"c": b})
    with pytest.raises(TileLinkError, match="given twice"):
        op._bind((a, b), {"a": a})
    with pytest.raises(TileLinkError, match="takes 2 inputs"):
        op._bind((a, b, b), {})


def test_misaligned_views_are_refused():
    a, b = _good()
    flat = torch.zeros(32 * 16 + 1, dtype=torch.bfloat16)
    shifted = flat[1:].view(32, 16)  # 2 bytes past an aligned base
    with pytest.raises(TileLinkError, match="16-byte"):
        _op()._bind((shifted, b), {})


def test_sizes_past_int32_offsets_are_refused_with_a_way_out():
    from tilelink.errors import ConfigError
    from tilelink.schedule import get_target, make_schedule

    big = AG.bind({"M": "131072", "K": "8192"}, 2)  # the gathered a: 2**30 elements a rank
    with pytest.raises(ConfigError, match="int32 offsets") as err:
        make_schedule(big, get_target("cuda:90"), {"comm": "copy_engine"})
    assert "comm=none" in str(err.value)
    assert make_schedule(big, get_target("cuda:90"), {"comm": "none"}).kernel is None


def test_the_int32_bound_is_on_each_ranks_part_not_the_whole_tensor():
    # a kernel indexes its own rank's buffers only: Ulysses' sequence shards at 262,144
    # positions, 32 heads, D = 128 hold 2**30 elements in all, 2**29 a rank at W = 2
    # (schedulable; the whole-tensor rule refused it), all of them at W = 1
    from tilelink.errors import ConfigError
    from tilelink.frontend import load_pattern
    from tilelink.schedule import get_target, make_schedule

    uly = load_pattern(str(EXAMPLES / "sp_ulysses.tl"))
    sizes = {"S": "262144", "H": "32", "D": "128"}
    assert make_schedule(uly.bind(sizes, 2), get_target("cuda:90"), {"comm": "sm"}).kernel
    with pytest.raises(ConfigError, match=r"'q' has 1073741824 elements a rank") as err:
        make_schedule(uly.bind(sizes, 1), get_target("cuda:90"), {"comm": "sm"})
    assert err.value.hint == "use --config comm=none (NCCL + cuBLAS) or split the problem"
    # a shard names more ranks as a way out
    with pytest.raises(ConfigError, match=r"'q' has 1073741824 elements a rank \(262144 x 32 x "
                       r"128 of 524288 x 32 x 128 in all\)") as err:
        make_schedule(uly.bind({**sizes, "S": "524288"}, 2), get_target("cuda:90"),
                      {"comm": "sm"})
    assert "more ranks" in err.value.hint


def test_a_staging_buffer_of_w_partials_is_bounded_like_a_tensor():
    # GEMM-AR's SM all-reduce stages W partials of M x N in one buffer indexed with int32
    # offsets (s * (M * N) + ...): at W = 4, 8192 x 98304 each partial fits the bound and the
    # stage (3 * 2**30 elements) would wrap; the kernel is refused, the default is the plan
    from dataclasses import replace

    from tilelink.codegen import render_triton
    from tilelink.errors import ConfigError
    from tilelink.frontend import load_pattern
    from tilelink.schedule import get_target, make_schedule

    bp = load_pattern(str(EXAMPLES / "gemm_ar.tl")).bind(
        {"M": "8192", "N": "98304", "K": "4096"}, 4)
    target = get_target("cuda:90")
    with pytest.raises(ConfigError, match=r"symmetric buffer 'out_stage' holds 3221225472 "
                       r"elements a copy \(4 x 8192 x 98304\)") as err:
        render_triton(make_schedule(bp, target, {"comm": "sm"}))
    assert "comm=none" in err.value.hint
    h100 = replace(target, device="NVIDIA H100")
    assert make_schedule(bp, h100).config.comm == "none"


def test_nvshmem_hook_is_reinstalled_and_chains(monkeypatch):
    import triton

    from tilelink.runtime import nvshmem_device

    calls = []

    def other(*args, **kwargs):  # e.g. torch's requires_nvshmem hook, which does not chain
        calls.append(kwargs.get("key"))

    monkeypatch.setattr(triton.knobs.runtime, "jit_post_compile_hook", other)
    monkeypatch.setattr(nvshmem_device, "_installed", None)
    nvshmem_device.install_hook()
    ours = triton.knobs.runtime.jit_post_compile_hook
    assert ours is not other
    ours(key="k1", fn=None, compile={})  # not an NVSHMEM kernel: only the chained hook runs
    assert calls == ["k1"]
    nvshmem_device.install_hook()  # already ours: unchanged
    assert triton.knobs.runtime.jit_post_compile_hook is ours
    monkeypatch.setattr(triton.knobs.runtime, "jit_post_compile_hook", other)
    nvshmem_device.install_hook()  # replaced since: installed again
    assert triton.knobs.runtime.jit_post_compile_hook not in (other, None)


def test_nvshmem_hook_registers_only_the_kernels_built_for_nvshmem(monkeypatch):
    # the hook is global to the process: a kernel of another module compiled after an
    # NVSHMEM one (the torch backend's, a user's) must never reach nvshmemx_cumodule_init
    import types

    import triton

    from tilelink.lang.nvshmem import LIBRARY
    from tilelink.runtime import nvshmem_device

    class Kernel:  # what Triton's device cache holds
        pass

    class JitFunction:  # (weakly referenced, as Triton's are)
        def __init__(self):
            self.device_caches = {0: ({"k": Kernel()},)}

    def jit_fn():
        return JitFunction()

    ours, theirs = jit_fn(), jit_fn()
    module = types.SimpleNamespace(main_kernel=ours)
    inited = []
    monkeypatch.setattr(nvshmem_device, "init_compiled", inited.append)
    monkeypatch.setattr(nvshmem_device, "_kernels", __import__("weakref").WeakSet())
    monkeypatch.setattr(nvshmem_device, "_installed", None)
    monkeypatch.setattr(triton.knobs.runtime, "jit_post_compile_hook", None)
    monkeypatch.setattr("tilelink.codegen.compile.kernel_names",
                        lambda mod: ["main_kernel"])
    nvshmem_device.install_hook(module)
    hook = triton.knobs.runtime.jit_post_compile_hook
    libs = ((LIBRARY, "/x/libnvshmem_device.bc"),)
    for fn in (ours, theirs):
        hook(key="k", fn=types.SimpleNamespace(jit_function=fn),
             compile={"device": 0, "extern_libs": libs})
    assert inited == [ours.device_caches[0][0]["k"]]  # only the module's own kernel


def test_copy_engine_ops_are_checked_against_the_heap_before_any_launch():
    # the GPU runtime issues copy-engine ops as raw addresses: every op is checked first
    import torch

    from tilelink.errors import TileLinkError
    from tilelink.runtime.gpu import check_copy_ops

    bufs = [{"full": (64, torch.bfloat16), "sig": (4, torch.int32)}]  # (elements, dtype)
    src = torch.zeros(16, dtype=torch.bfloat16)
    check_copy_ops([("copy", src, 0, 16, 0, "full", 48), ("signal", 0, "sig", 3, 1),
                    ("wait", 0, "sig", 0, 5)], bufs)  # fits exactly
    bad = [
        ("copy", src, 0, 16, 0, "full", 49),  # one past the end of the destination
        ("copy", src, 4, 16, 0, "full", 0),  # past the end of the source
        ("copy", src, 0, -1, 0, "full", 0),  # a negative count would wrap to a huge size_t
        ("copy", src, 0, 4, 1, "full", 0),  # no rank 1
        ("copy", src, 0, 4, -1, "full", 0),  # a negative rank would index the last one
        ("copy", src.float(), 0, 4, 0, "full", 0),  # dtype differs from the buffer's
        ("signal", 0, "full", 0, 1),  # not an int32 word
        ("wait", 0, "sig", 4, 1),  # past the end
        ("poke", 0, "sig", 0, 1),
    ]
    for op in bad:
        with pytest.raises(TileLinkError):
            check_copy_ops([op], bufs)


class _FakeEngine:
    """Stands in for gpu.CopyEngine: the heap layout the checks read, and what was run."""

    def __init__(self):
        self.layout = [{"buf": (64, torch.bfloat16), "ctl": (8, torch.int32)}] * 2
        self.runs = []
        self.flags = True  # capturable=1's protocol (constant-valued ops)

    def run(self, ops, ready, capturing=False):
        self.runs.append((list(ops), ready) + ((True,) if capturing else ()))

    def run_local(self, ops, stream, rank):
        self.runs.append(("local", list(ops), stream, rank))


def _rank_runtime():
    from tilelink.runtime.gpu import GpuRankRuntime

    rt = GpuRankRuntime(0, 2, {}, None, None, None, 100, _FakeEngine())
    rt.ready = "ready-event"
    return rt


OPS = [("wait", 0, "ctl", 6, 1), ("copy", torch.zeros(8, dtype=torch.bfloat16), 0, 8, 1,
                                    "buf", 8), ("signal", 1, "ctl", 2, 1)]


def test_copy_engine_ops_wait_for_the_launch_unless_started_now():
    rt = _rank_runtime()
    rt.copy_engine(OPS)  # the default: the op enqueues them after the kernel launch
    assert rt.pending == OPS and rt.engine.runs == []
    rt.pending = []
    rt.copy_engine(OPS, start_now=True)  # gemm=library: enqueued at once, after `ready`
    assert rt.pending == [] and rt.engine.runs == [(OPS, "ready-event")]
    # while the call is being captured the engine is told (it then skips record_stream)
    rt.capturing = True
    rt.copy_engine(OPS, start_now=True)
    assert rt.engine.runs[-1] == (OPS, "ready-event", True)


def test_capture_refuses_per_call_ops_before_the_launch_but_not_an_empty_call():
    from tilelink.errors import NotSupportedError

    rt = _rank_runtime()
    rt.engine.flags = False  # epoch-valued ops (capturable=0)
    rt.capturing = True
    with pytest.raises(NotSupportedError, match="compile with comm=sm for graph capture"):
        rt.copy_engine(OPS)  # no values make its copy engine capturable: SMs
    rt.graph_config = "capturable=1"  # what its lowerings' flag protocol needs (TileLinkOp)
    with pytest.raises(NotSupportedError, match="compile with config capturable=1 .*or comm=sm"):
        rt.copy_engine(OPS)
    assert rt.pending == [] and rt.engine.runs == []  # nothing taken: the call left no trace
    rt.copy_engine([])  # W = 1: own rows read in place, no op carries a per-call value
    assert rt.pending == []
    rt.engine.flags = True
    rt.copy_engine(OPS)
    assert rt.pending == OPS


def test_the_warm_up_starts_no_copy_engine_op():
    # during the warm-up no kernel runs, so no gate opens: a copy-engine op started then
    # would wait on its stream forever (a stream wait has no bound); it must stay pending
    # (the warm-up drops it) even when the launch asks for start_now
    rt = _rank_runtime()
    rt.compile_only = True
    rt.copy_engine(OPS, start_now=True)
    assert rt.engine.runs == [] and rt.pending == OPS


def test_copy_engine_ops_are_checked_before_anything_runs():
    rt = _rank_runtime()
    bad = OPS[:1] + [("copy", torch.zeros(8, dtype=torch.bfloat16), 0, 8, 1, "buf", 60)]
    with pytest.raises(TileLinkError, match="out of bounds"):
        rt.copy_engine(bad, start_now=True)
    assert rt.engine.runs == [] and rt.pending == []


LOCAL = [("local_copy", torch.zeros(8, dtype=torch.bfloat16), 0, 8, "buf", 0),
         ("local_signal", "ctl", 3, 1)]


def test_local_ops_go_on_the_calls_stream_before_the_kernel():
    # copies into this rank's own buffers run at once on the call's stream (before the
    # launch that follows): a copy within one GPU may run on SMs, which the kernel waiting
    # for it may hold; the other ops still wait for the launch
    rt = _rank_runtime()
    rt.stream = "call-stream"
    rt.copy_engine(LOCAL + OPS)
    assert rt.engine.runs == [("local", LOCAL, "call-stream", 0)] and rt.pending == OPS
    rt.engine.runs, rt.pending = [], []
    rt.copy_engine(LOCAL)  # W = 1: nothing for the side stream
    assert rt.engine.runs == [("local", LOCAL, "call-stream", 0)] and rt.pending == []


def test_local_ops_are_checked_against_the_ranks_own_buffers_and_skipped_in_the_warm_up():
    rt = _rank_runtime()
    with pytest.raises(TileLinkError, match="out of bounds"):
        rt.copy_engine([("local_copy", torch.zeros(8, dtype=torch.bfloat16), 0, 8, "buf", 60)]
                       + OPS)
    with pytest.raises(TileLinkError, match="not an int32 word"):
        rt.copy_engine([("local_signal", "ctl", 8, 1)])
    assert rt.engine.runs == [] and rt.pending == []
    rt.compile_only = True  # no kernel runs in the warm-up: nothing is enqueued
    rt.copy_engine(LOCAL + OPS)
    assert rt.engine.runs == [] and rt.pending == OPS


def test_capture_refuses_per_call_local_ops():
    from tilelink.errors import NotSupportedError

    rt = _rank_runtime()
    rt.engine.flags, rt.capturing = False, True  # a local signal carries the call's epoch
    with pytest.raises(NotSupportedError):
        rt.copy_engine(LOCAL)
    assert rt.engine.runs == []


def test_captured_calls_take_the_graph_tuned_config_only_where_outputs_agree():
    # tune --graph's winner replaces the eager plan in captured calls, except under explicit
    # overrides or a fault; a pattern returning two outputs too, since the non-overlapped
    # plan and the kernel both return every output
    from tilelink.frontend.text import parse_text
    from tilelink.runtime.gpu import _captured_config
    from tilelink.schedule import Config, get_target

    target = get_target("cuda:90")
    lean = AG.bind({"M": "1024", "N": "8192", "K": "8192"}, 2)
    kernel, none = Config(comm="copy_engine", capturable=1), Config(comm="none")
    assert _captured_config(lean, target, none, None, kernel, False, None) == kernel
    assert _captured_config(lean, target, kernel, None, kernel, False, None) is None  # same
    assert _captured_config(lean, target, none, None, kernel, True, None) is None  # explicit
    assert _captured_config(lean, target, none, None, kernel, False, "drop_notify") is None
    both = parse_text(AG_RETURNING_GATHERED, "both.tl").bind({}, 2)
    assert _captured_config(both, target, none, None, kernel, False, None) == kernel
    # without a graph-tuned config the scheduler's own rule: the lean fallback takes the
    # overlapped kernel (capturable), an eager-tuned one (base given) does not
    got = _captured_config(lean, target, none, None, None, False, None)
    assert got is not None and got.capturable == 1
    assert _captured_config(lean, target, none, none, None, False, None) is None


def test_a_failing_nvshmem_module_init_is_a_clear_refusal(monkeypatch):
    # nvshmemx_cumodule_init failed with status 7 on 2x and 4x H100 hosts: the user gets the
    # reason and the backends that work, not a RuntimeError from inside a launch
    import torch

    from tilelink.errors import NotSupportedError
    from tilelink.runtime import nvshmem_device

    def failing(module):
        raise RuntimeError("nvshmemx_cumodule_init failed with error code 7")

    monkeypatch.setattr(torch._C._distributed_c10d, "_nvshmemx_cumodule_init", failing,
                        raising=False)
    with pytest.raises(NotSupportedError, match="error code 7") as e:
        nvshmem_device._cumodule_init(1234)
    assert "--backend torch" in e.value.hint and "nvshmem-ptr" in e.value.hint


def test_a_refusal_on_the_device_is_reported_as_a_runtime_check_error():
    # the host side of `tld.refuse` on GPUs: a REFUSED record (with the waits that gave up
    # because of it) raises a RuntimeCheckError naming the check, not a HangError; the
    # records and the abort word are cleared
    from types import SimpleNamespace

    from tilelink.errors import RuntimeCheckError
    from tilelink.lang import (DIAG_FIELDS, DIAG_HEADER, DIAG_WORDS, REASON_ABORTED,
                               REASON_REFUSED)
    from tilelink.runtime.gpu import TileLinkOp

    diag = torch.zeros(DIAG_WORDS, dtype=torch.int32)
    recs = [(1, 0, 0, 0, 8, 3, 0, REASON_REFUSED), (1, 5, 2, 7, 4, 3, 1, REASON_ABORTED)]
    diag[0] = len(recs)
    for i, rec in enumerate(recs):
        diag[DIAG_HEADER + i * DIAG_FIELDS:DIAG_HEADER + (i + 1) * DIAG_FIELDS] = \
            torch.tensor(rec)
    rt = SimpleNamespace(diag=diag, abort=torch.ones(1, dtype=torch.int32), rank=1,
                         spin_limit=100)
    op = SimpleNamespace(captured_op=None, _released_waits=None, rt=rt,
                         schedule=SimpleNamespace(roles=[]),
                         module={0: "routing of y: expert choices in ids outside 0 .. 7",
                                 2: "reduce chunk of out"})
    with pytest.raises(RuntimeCheckError, match=r"(?s)refused this call's input:\n  rank 1: "
                       r"routing of y: expert choices in ids outside 0 \.\. 7: 3 value"):
        TileLinkOp.report(op)
    assert int(rt.diag.abs().sum()) == 0 and int(rt.abort) == 0


def test_local_ops_reach_the_driver_as_this_ranks_own_addresses(monkeypatch):
    # CopyEngine.run_local turns local ops into raw addresses of rank `rank`'s buffers, on the
    # stream it is given (the call's), with the driver calls stubbed
    from tilelink.runtime import copy_engine

    calls = []
    monkeypatch.setattr(copy_engine.stream_ops, "copy_async",
                        lambda *a: calls.append(("copy",) + a))
    monkeypatch.setattr(copy_engine.stream_ops, "write_value32",
                        lambda *a: calls.append(("write",) + a))
    engine = object.__new__(copy_engine.CopyEngine)
    # (base address, element size) of each rank's buffers
    engine.bufs = [{"buf": (1000, 2), "sig": (5000, 4)}, {"buf": (9000, 2), "sig": (13000, 4)}]
    src = torch.zeros(16, dtype=torch.bfloat16)
    engine.run_local([("local_copy", src, 4, 8, "buf", 32), ("local_signal", "sig", 3, 7)],
                     "call-stream", 1)
    assert calls == [("copy", "call-stream", 9000 + 32 * 2, src.data_ptr() + 4 * 2, 8 * 2),
                     ("write", "call-stream", 13000 + 3 * 4, 7)]
