"""The Python API: tk.emulate takes patterns, paths and the caller's own tensors, and
refuses anything else with a TileLinkError naming what it accepts; run_emulated checks the
tensors it is given against the module before any rank starts; compile_op says when there
is no GPU."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

import tilelink as tk
from tilelink.codegen import render_triton
from tilelink.errors import NotSupportedError, RuntimeCheckError, UsageError
from tilelink.runtime import run_emulated
from tilelink.runtime.api import schedule_for
from tilelink.runtime.reference import evaluate, make_inputs

ROOT = Path(__file__).resolve().parent.parent
AG_PATH = ROOT / "examples" / "ag_gemm.tl"
SMALL = {"M": 64, "N": 32, "K": 32}
OVERLAPPED = {"comm": "sm"}  # the kernel itself (tiny GEMMs default to the library plan)


@tk.pattern
def ag_gemm(M=64, N=32, K=32, dtype="bf16"):
    a = tk.input((M, K), dtype, shard=0)
    b = tk.input((K, N / tk.W), dtype)
    a_full = tk.all_gather(a, dim=0)
    c = tk.gemm(a_full, b)
    return c


def plain_function(M=64):
    return M


# ---- what tk.emulate takes as the pattern ---------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize("pattern", [str(AG_PATH), AG_PATH, ag_gemm,
                                     f"{ROOT / 'examples' / 'patterns.py'}:ag_gemm"])
def test_emulate_takes_paths_and_patterns(pattern):
    values = None if pattern is ag_gemm else SMALL
    schedule, result = tk.emulate(pattern, 2, values)
    assert schedule.bound.world == 2 and tk.check(schedule, result).ok


def test_emulate_takes_a_bound_pattern_and_its_world_size():
    bp = ag_gemm.bind({}, 2)
    schedule, result = tk.emulate(bp)
    assert schedule.bound is bp and tk.check(schedule, result).ok


@pytest.mark.parametrize("pattern, words, hint", [
    (plain_function, "got the function 'plain_function', which is not a pattern",
     "@tk.pattern above def plain_function"),
    (lambda: None, "got the function '<lambda>'", "@tk.pattern"),
    (print, "got the builtin_function_or_method 'print'", None),
    (3, "got 3 (int)", None),
    (None, "got None (NoneType)", None),
    (b"examples/ag_gemm.tl", "got b'examples/ag_gemm.tl' (bytes)", None),
    (["examples/ag_gemm.tl"], "(list)", None),
])
def test_emulate_refuses_what_is_not_a_pattern(pattern, words, hint):
    with pytest.raises(UsageError) as e:
        tk.emulate(pattern, 2)
    assert "tk.emulate needs a pattern: a @tk.pattern function, a Pattern, a BoundPattern, " \
           "or a path ('file.tl', 'file.py:function')" in e.value.message
    assert words in e.value.message
    assert hint is None or hint in e.value.hint
    assert isinstance(e.value, TypeError)  # code catching TypeError for bad arguments works


def test_emulate_of_a_missing_path_is_a_load_error():
    with pytest.raises(tk.LoadError, match="no such pattern file"):
        tk.emulate("no/such/file.tl", 2)


# ---- options --------------------------------------------------------------------------------


@pytest.mark.parametrize("kwargs, words", [
    ({"world_size": "2"}, "the world size must be an int, got '2' (str)"),
    ({"world_size": 2.0}, "the world size must be an int, got 2.0 (float)"),
    ({"world_size": True}, "the world size must be an int, got True (bool)"),
    ({"values": "M=4"}, "values= takes a dict of parameter values, got 'M=4' (str)"),
    ({"values": [("M", 4)]}, "values= takes a dict"),
    ({"config": "comm=sm"}, "config= takes a dict of schedule values"),
    ({"config": {1: 2}}, "config keys are strings, got 1 (int)"),
    ({"config": {"block_m": 64.5}}, "config block_m= takes an int or a string, got 64.5"),
    ({"config": {"block_m": True}}, "config block_m= takes an int or a string, got True"),
    ({"config": {"block_m": None}}, "config block_m= takes an int or a string, got None"),
    ({"seed": -1}, "seed= takes an int from 0 to"),
    ({"seed": 2**64}, "seed= takes an int from 0 to"),
    ({"seed": 1.5}, "seed= takes an int"),
    ({"calls": 0}, "calls= takes an int from 1 to 10000, got 0"),
    ({"calls": -1}, "calls= takes an int from 1 to 10000, got -1"),
    ({"calls": 10**9}, "calls= takes an int from 1 to 10000"),
    ({"calls": "2"}, "calls= takes an int"),
    ({"delays": "yes"}, "delays= is True or False, got 'yes' (str)"),
    ({"timeout": float("nan")}, "timeout= takes a number of seconds > 0, got nan"),
    ({"timeout": float("inf")}, "timeout= takes a number of seconds > 0, got inf"),
    ({"timeout": 0}, "timeout= takes a number of seconds > 0, got 0"),
    ({"timeout": -5}, "timeout= takes a number of seconds > 0, got -5"),
    ({"timeout": "10"}, "timeout= takes a number of seconds > 0, got '10'"),
    ({"fault": 1}, "fault= takes a string or None, got 1 (int)"),
    ({"first_epoch": 1.0}, "first_epoch= takes an int"),
])
def test_emulate_refuses_bad_options_before_running(kwargs, words):
    with pytest.raises(UsageError) as e:
        tk.emulate(ag_gemm, **kwargs)
    assert words in e.value.message


@pytest.mark.parametrize("kwargs, words", [
    ({"world_size": 4}, "the pattern was bound for W = 2, but world_size=4"),
    ({"values": {"M": 128}}, "was given a BoundPattern (its sizes are bound) and values="),
])
def test_a_bound_pattern_does_not_silently_ignore_sizes(kwargs, words):
    with pytest.raises(UsageError, match=words.replace("(", r"\(").replace(")", r"\)")):
        tk.emulate(ag_gemm.bind({}, 2), **kwargs)


def test_tk_check_refuses_what_emulate_did_not_return():
    schedule, result = tk.emulate(ag_gemm, 2)
    with pytest.raises(UsageError, match="needs the schedule or bound pattern of the run"):
        tk.check(ag_gemm, result)
    with pytest.raises(UsageError, match="needs the result of tk.emulate"):
        tk.check(schedule, {"c": []})
    assert tk.check(schedule.bound, result).ok


# ---- the caller's own tensors ----------------------------------------------------------------


def ones_inputs(bp):
    """Inputs whose product is known: a = 1, b = 2 -> every c = 2 * K."""
    return {"a": [torch.ones(bp.tensors["a"].local_shape, dtype=torch.bfloat16)
                  for _ in range(bp.world)],
            "b": [torch.full(bp.tensors["b"].local_shape, 2.0, dtype=torch.bfloat16)
                  for _ in range(bp.world)]}


@pytest.mark.parametrize("comm", ["none", "sm", "copy_engine"])
def test_emulate_runs_the_callers_tensors(comm):
    bp = ag_gemm.bind({}, 2)
    schedule, result = tk.emulate(bp, config={"comm": comm}, inputs=ones_inputs(bp))
    assert schedule.config.comm == comm
    for rank in range(2):
        assert torch.equal(result.outputs[0]["c"][rank],
                           torch.full((64, 16), 64.0, dtype=torch.bfloat16))
    assert tk.check(schedule, result).ok


@pytest.mark.slow
def test_inputs_per_call_and_calls_of_one_dict():
    bp = ag_gemm.bind({}, 2)
    first, second = make_inputs(bp, 1), make_inputs(bp, 2)
    schedule, result = tk.emulate(bp, config=OVERLAPPED, inputs=[first, second])
    assert len(result.outputs) == 2
    for got, given in zip(result.outputs, (first, second)):
        want = evaluate(bp, given)["c"]
        assert all(torch.allclose(g.float(), w.float(), atol=0.2) for g, w in zip(got["c"], want))
    _, again = tk.emulate(bp, inputs=first, calls=3)  # one dict, every call
    assert len(again.inputs) == 3 and torch.equal(again.inputs[2]["a"][1], first["a"][1])
    with pytest.raises(RuntimeCheckError, match="inputs= holds 2 calls' inputs but calls=3"):
        tk.emulate(bp, inputs=[first, second], calls=3)


def _bad(change):
    bp = ag_gemm.bind({}, 2)
    ins = make_inputs(bp, 0)
    change(ins)
    return bp, ins


@pytest.mark.parametrize("change, words", [
    (lambda i: i.pop("b"), "input 'b' is missing"),
    (lambda i: i.update(x=i["a"]), "there is no input named 'x'"),
    (lambda i: i.update(bb=i["b"]), "there is no input named 'bb'"),
    (lambda i: i.update(a=i["a"][:1]), "input 'a' must be a list of 2 tensors, one per rank; "
                                       "got 1 items"),
    (lambda i: i.update(a=i["a"][0]), "input 'a' must be a list of 2 tensors"),
    (lambda i: i.update(a=[i["a"][0], "x"]), "input 'a' of rank 1 is a str, not a "
                                             "torch.Tensor"),
    (lambda i: i.update(a=[i["a"][0][:16], i["a"][1]]),
     "input 'a' of rank 0 has shape [16, 32], expected [32, 32] (the per-rank, local shape)"),
    (lambda i: i.update(a=[i["a"][0], torch.zeros(64, 32, dtype=torch.bfloat16)]),
     "input 'a' of rank 1 has shape [64, 32], expected [32, 32]"),
    (lambda i: i.update(a=[i["a"][0].float(), i["a"][1]]),
     "input 'a' of rank 0 is torch.float32, expected torch.bfloat16 (bf16)"),
    (lambda i: i.update(b=[i["b"][0], i["b"][1].t().contiguous().t()]),
     "input 'b' of rank 1 is not contiguous"),
    (lambda i: i.update(b=[i["b"][0], torch.empty(32, 16, dtype=torch.bfloat16,
                                                  device="meta")]),
     "input 'b' of rank 1 is on meta; the emulated world reads CPU tensors"),
])
def test_bad_inputs_name_the_input_the_rank_and_what_was_expected(change, words):
    bp, ins = _bad(change)
    with pytest.raises(RuntimeCheckError) as e:
        tk.emulate(bp, config=OVERLAPPED, inputs=ins)
    assert words in e.value.message


@pytest.mark.parametrize("inputs", ["a", 3, [], [3]])
def test_inputs_of_the_wrong_kind(inputs):
    with pytest.raises(RuntimeCheckError, match=r"inputs(=| \(call 0\)| must)"):
        tk.emulate(ag_gemm.bind({}, 2), inputs=inputs)


def test_replicated_inputs_must_agree_across_ranks():
    @tk.pattern
    def rep(M=64, K=32, N=32, dtype="fp32"):
        a = tk.input((M, K), dtype, shard=0)
        b = tk.input((K, N), dtype, placement="replicated")
        return tk.gemm(tk.all_gather(a, dim=0), b)

    bp = rep.bind({}, 2)
    ins = make_inputs(bp, 0)
    schedule, result = tk.emulate(bp, inputs=ins)
    assert tk.check(schedule, result).ok
    ins["b"] = [ins["b"][0], ins["b"][0] + 1]
    with pytest.raises(RuntimeCheckError, match="input 'b' is replicated, but rank 1's tensor "
                                                 "differs from rank 0's"):
        tk.emulate(bp, inputs=ins)


# ---- run_emulated checks its tensors against the module --------------------------------------


@pytest.fixture(scope="module")
def module_source():
    return render_triton(schedule_for(ag_gemm.bind({}, 2), config=OVERLAPPED))


@pytest.mark.parametrize("rows", [16, 64])
def test_run_emulated_refuses_rows_the_kernel_would_read_out_of_bounds(module_source, rows):
    ins = make_inputs(ag_gemm.bind({}, 2), 0)
    ins["a"] = [torch.randn(rows, 32).bfloat16() for _ in range(2)]
    with pytest.raises(RuntimeCheckError) as e:
        run_emulated(module_source, 2, [ins], timeout=30)
    assert e.value.message == (f"input 'a' of rank 0 has shape [{rows}, 32], expected [32, 32] "
                               "(the per-rank, local shape)")


@pytest.mark.parametrize("world, calls, words", [
    (3, "ok", "the module was generated for W = 2 ranks, run_emulated was given world = 3"),
    ("2", "ok", "run_emulated was given world = '2'"),
    (2, [], "run_emulated takes a non-empty list of calls' inputs"),
    (2, "dict", "run_emulated takes a non-empty list of calls' inputs"),
    (2, ["x"], "must be a dict {name: [tensor of rank 0, ...]}, got a str"),
])
def test_run_emulated_refuses_a_mismatched_world_or_call_list(module_source, world, calls,
                                                               words):
    ins = make_inputs(ag_gemm.bind({}, 2), 0)
    per_call = {"ok": [ins], "dict": ins}.get(calls, calls) if isinstance(calls, str) else calls
    with pytest.raises(RuntimeCheckError) as e:
        run_emulated(module_source, world, per_call, timeout=30)
    assert words in e.value.message


def test_run_emulated_names_the_call_of_a_bad_tensor(module_source):
    bp = ag_gemm.bind({}, 2)
    good, bad = make_inputs(bp, 0), make_inputs(bp, 1)
    bad["b"] = [bad["b"][0], bad["b"][1].half()]
    with pytest.raises(RuntimeCheckError, match=r"input 'b' of rank 1 \(call 1\) is "
                                                 r"torch.float16"):
        run_emulated(module_source, 2, [good, bad], timeout=30)


# ---- compile_op without a GPU ----------------------------------------------------------------


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-GPU message")
def test_compile_op_without_cuda_says_so():
    from tilelink.runtime.gpu import compile_op

    with pytest.raises(NotSupportedError) as e:
        compile_op(ag_gemm)
    assert "compile_op runs on GPUs, and torch sees none" in e.value.message
    assert "tk.emulate" in e.value.hint and "nccl" not in str(e.value)


def test_errors_are_exported():
    assert issubclass(tk.UsageError, tk.TileLinkError) and issubclass(tk.UsageError, TypeError)
    assert {"emulate", "check", "TileLinkWarning", "UsageError"} <= set(tk.__all__)
