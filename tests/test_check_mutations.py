"""The check fails a broken result at every world size, passes a correct one, and refuses a
result that is not the pattern's.

Worlds of 8 to 64 ranks are checked on synthetic results: what a kernel rounding as
TileLink's do produces from the pattern's inputs (fp32 products summed tile by tile, the
partials staged in bf16 but the rank's own, summed in fp32 in the rank's own order, one
rounding to nearest), then broken one way. W = 2 also runs the real kernel in the emulated
world, broken in its outputs and in its code: a wait removed, the double buffer's parity
forced to 0.
"""

from __future__ import annotations

import re

import pytest
import torch
import triton
import triton.language as tl

import tilelink.frontend as tk
from tilelink.codegen import render_triton
from tilelink.frontend import load_text
from tilelink.runtime import check, emulate
from tilelink.runtime.emulated import EmulationResult, run_emulated
from tilelink.runtime.reference import evaluate, make_inputs
from tilelink.schedule import get_target, make_schedule

from .conftest import EXAMPLES

RS = load_text(EXAMPLES / "gemm_rs.tl")
AR = load_text(EXAMPLES / "gemm_ar.tl")
AG = load_text(EXAMPLES / "ag_gemm.tl")
BF16 = torch.bfloat16

# per pattern: its sizes at world size W (every rank's output >= 1024 elements)
SIZES = {"gemm_rs": lambda w: {"M": 16 * w, "N": 64, "K": 8 * w},
         "gemm_ar": lambda w: {"M": 16, "N": 64, "K": 8 * w},
         "ag_gemm": lambda w: {"M": 4 * w, "N": 16 * w, "K": 64}}
PATTERNS = {"gemm_rs": RS, "gemm_ar": AR, "ag_gemm": AG}


@pytest.fixture(autouse=True, scope="module")
def _one_thread():
    """Hundreds of small matmuls: torch's thread pool only adds contention (10x slower on
    a busy two-core machine)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


# ---- what a kernel rounding as TileLink's produces ---------------------------------------


def _tiles(a: torch.Tensor, b: torch.Tensor, bk: int = 4) -> torch.Tensor:
    """a @ b in fp32, K in blocks of bk added one after another (a tile's K loop)."""
    acc = torch.zeros(a.shape[0], b.shape[1])
    for k in range(0, a.shape[1], bk):
        acc += a[:, k:k + bk].float() @ b[k:k + bk].float()
    return acc


def _reduced(bp, ins, every_row: bool, staged: bool = True, drop: int | None = None):
    """gemm_rs / gemm_ar: each rank's partial from its tiles; rank `me` sums the partials of
    its rows starting at rank me + 1 (the SM push order), its own in fp32 (the fused
    reduction) and every other staged in bf16 (`staged`; else all in fp32); rank `drop`'s
    partial never arrives."""
    w = bp.world
    parts = [_tiles(a, b) for a, b in zip(ins["a"], ins["b"])]
    seg = parts[0].shape[0] if every_row else parts[0].shape[0] // w
    outs = []
    for me in range(w):
        rows = slice(0 if every_row else me * seg, (1 if every_row else me + 1) * seg)
        total = torch.zeros(seg, parts[0].shape[1])
        for s in ((me + 1 + i) % w for i in range(w)):
            if s != drop:
                p = parts[s][rows]
                total += p if s == me or not staged else p.to(BF16).float()
        outs.append(total.to(BF16))
    return {"out": outs}


def _gathered(bp, ins, staged: bool = True, drop: int | None = None):
    """ag_gemm: every rank's rows gathered (rank `drop`'s never arrive: zeros), times this
    rank's columns, from its tiles."""
    a = torch.cat([x if r != drop else torch.zeros_like(x) for r, x in enumerate(ins["a"])])
    return {"c": [_tiles(a, b).to(BF16) for b in ins["b"]]}


def kernel_like(bp, ins, staged: bool = True, drop: int | None = None) -> dict:
    """One call's outputs as a correct kernel of the pattern rounds them (`drop`: without
    that rank's contribution)."""
    if bp.name == "ag_gemm":
        return _gathered(bp, ins, staged, drop)
    return _reduced(bp, ins, bp.name == "gemm_ar", staged, drop)


def _result(ins, outs, plan: bool = False) -> EmulationResult:
    return EmulationResult([ins], [outs], 0.0, plan=plan)


# ---- the mutations -----------------------------------------------------------------------


def _zero_tile(bp, ins, outs):
    return {n: [t.clone() if r else _zeroed(t) for r, t in enumerate(ts)] for n, ts in outs.items()}


def _zeroed(t):
    t = t.clone()
    t[:4, :8] = 0  # a 4 x 8 tile of rank 0
    return t


def _scaled(bp, ins, outs):
    return {n: [(t.float() * 1.01).to(t.dtype) for t in ts] for n, ts in outs.items()}


def _swapped(bp, ins, outs):
    return {n: [ts[-1]] + ts[1:-1] + [ts[0]] for n, ts in outs.items()}


def _rank_zeroed(bp, ins, outs):
    return {n: ts[:-1] + [torch.zeros_like(ts[-1])] for n, ts in outs.items()}


def _rank_dropped(bp, ins, outs):
    return kernel_like(bp, ins, drop=bp.world - 1)


MUTATIONS = {"a zeroed tile": _zero_tile, "outputs scaled by 1.01": _scaled,
             "two ranks' outputs swapped": _swapped, "a rank's output zeroed": _rank_zeroed,
             "a rank's contribution dropped": _rank_dropped}


@pytest.mark.parametrize("world", [2, 8, 32, 64])
@pytest.mark.parametrize("name", ["gemm_rs", "gemm_ar", "ag_gemm"])
def test_the_check_passes_a_correct_result_and_fails_every_mutation(name, world):
    bp = PATTERNS[name].bind(SIZES[name](world), world)
    ins = make_inputs(bp, seed=world)
    for staged in (True, False):  # partials staged in bf16, or kept in fp32: both correct
        rep = check(bp, _result(ins, kernel_like(bp, ins, staged)))
        assert rep.ok, rep.lines
    good = kernel_like(bp, ins)
    for what, mutate in MUTATIONS.items():
        if what == "two ranks' outputs swapped" and name == "gemm_ar":
            continue  # every rank holds the same sum: a swap changes nothing
        rep = check(bp, _result(ins, mutate(bp, ins, good)))
        assert not rep.ok, (what, rep.lines)
        assert "allowed" in rep.lines[0] and "worst: call 0, rank" in rep.lines[0]


def test_a_scaled_result_fails_normwise_where_every_element_is_within_its_own_bound():
    # 1 % is below the elementwise bound (one bf16 rounding each way, 2^-7, and the
    # partials' roundings): only the whole tensor's relative error shows it
    bp = RS.bind(SIZES["gemm_rs"](64), 64)
    ins = make_inputs(bp, seed=5)
    rep = check(bp, _result(ins, _scaled(bp, ins, kernel_like(bp, ins))))
    assert not rep.ok
    worst, allowed, norm, norm_allowed = map(float, re.findall(
        r"worst error (\S+) of .* \(allowed (\S+)\); normwise (\S+) \(allowed (\S+)\)",
        rep.lines[0])[0])
    assert worst <= allowed and norm > norm_allowed


def test_the_non_overlapped_plan_is_held_to_its_own_rounding():
    # NCCL's ring (and the emulated plan) rounds every running sum to bf16: at W = 64 its
    # error is above a kernel's bound but within the plan's
    bp = RS.bind(SIZES["gemm_rs"](64), 64)
    ins = make_inputs(bp, seed=2)
    ring = evaluate(bp, ins, exact=False)
    assert check(bp, _result(ins, ring, plan=True)).ok
    assert not check(bp, _result(ins, ring)).ok


# ---- a result that is not the pattern's --------------------------------------------------


def _small(world: int = 2, m: int = 64):
    bp = RS.bind({"M": m, "N": 32, "K": 64}, world)
    ins = make_inputs(bp, seed=1)
    return bp, ins, evaluate(bp, ins)


def _refused(bp, result, *words):
    rep = check(bp, result)
    assert not rep.ok and rep.lines and rep.errors == {}
    text = "\n".join(rep.lines)
    assert text.startswith("result does not belong to gemm_rs"), text
    for w in words:
        assert w in text, (w, text)


def test_a_result_of_another_world_size_is_refused():
    _, ins, outs = _small(world=2)
    bp4, *_ = _small(world=4)
    _refused(bp4, _result(ins, outs), "input 'a' has 2 rank(s)' tensors; the pattern is "
             "bound for W = 4", "output 'out' has 2 rank(s)' tensors")


def test_a_result_of_other_sizes_is_refused():
    _, ins, outs = _small(m=64)
    bp, *_ = _small(m=128)
    _refused(bp, _result(ins, outs), "input 'a' of rank 0 is [64, 32] bf16; the pattern's "
             "is [128, 32] bf16 per rank", "output 'out' of rank 0 is [32, 32] bf16")


def test_a_result_missing_a_call_a_rank_or_an_output_is_refused():
    bp, ins, outs = _small()
    _refused(bp, EmulationResult([ins, ins], [outs], 0.0), "2 call(s) of inputs but 1 of "
             "outputs")
    _refused(bp, EmulationResult([], [], 0.0), "no call's outputs")
    _refused(bp, _result(ins, {"out": outs["out"][:1]}), "output 'out' has 1 rank(s)'")
    _refused(bp, _result(ins, {}), "no output 'out'")
    _refused(bp, _result(ins, {"out": outs["out"], "c": outs["out"]}),
             "output 'c' is not one of the pattern's (out)")
    _refused(bp, _result(ins, {"out": [t.half() for t in outs["out"]]}),
             "output 'out' of rank 0 is [32, 32] fp16; the pattern's is [32, 32] bf16")


def test_the_pattern_own_result_is_not_refused():
    bp, ins, outs = _small()
    rep = check(bp, _result(ins, outs))
    assert rep.ok and rep.lines[0].startswith("out: max abs error 0;"), rep.lines


# ---- the real kernel in the emulated world (W = 2) ---------------------------------------

#: GEMM-RS on SMs, its reduction a second kernel: a pause between the two kernels is a
#: host-side line of `launch`
RS_CONFIG = {"comm": "sm", "reduce_after": "1"}
RS_SIZES = {"M": 64, "N": 32, "K": 64}
PAUSE = 3.0  # seconds: several times a rank's call at these sizes (~0.5 s)
#: test-only delays in the first call: (before rank 1's launch, between rank 0's kernels)
LATE_PEER = (PAUSE, 0.0)  # rank 0 reduces before rank 1 has sent anything
PAUSED_REDUCER = (0.0, PAUSE)  # rank 1 runs its second call before rank 0 reduces the first


def _with_delays(source: str, delays: tuple[float, float]) -> str:
    """The module with `delays` (see LATE_PEER) in its host code, `launch`."""
    head, launch = source.split("\ndef launch(", 1)
    first = launch.index("    rt.launch_kernel(")
    second = launch.index("    rt.launch_kernel(", first + 1)
    late, pause = delays
    launch = (launch[:first] + f"    _delay(rt.rank == 1 and epoch == 1, {late})\n"
              + launch[first:second] + f"    _delay(rt.rank == 0 and epoch == 1, {pause})\n"
              + launch[second:])
    return (head + "\nimport time as _time\n\n\ndef _delay(now, seconds):\n    if now:\n"
            "        _time.sleep(seconds)\n\n\ndef launch(" + launch)


def _run_rs(delays: tuple[float, float], calls: int, mutate=None):
    s = make_schedule(RS.bind(RS_SIZES, 2), get_target("interp"), RS_CONFIG)
    source = render_triton(s)
    if mutate is not None:
        source = mutate(source)
    ins = [make_inputs(s.bound, seed) for seed in range(calls)]
    return s.bound, run_emulated(_with_delays(source, delays), 2, ins, timeout=60)


def _no_partial_wait(source: str) -> str:
    """The reduction no longer waits for the peers' partial tiles."""
    line = re.search(r"tok = tld\.wait\(sig_c_ptr \+ w_slot, epoch,[^\n]*", source)
    assert line is not None
    return source.replace(line.group(0), "tok = epoch * 0  # (wait removed)")


def _one_buffer(source: str) -> str:
    """Every call uses buffer 0 of the double buffer."""
    assert source.count("buf = epoch & 1") == 2  # the GEMM's pushes and the reduction's reads
    return source.replace("buf = epoch & 1", "buf = epoch * 0")


# (the delays the fault needs to show, the calls it needs)
BROKEN = {"no wait": (_no_partial_wait, LATE_PEER, 1),
          "one buffer": (_one_buffer, PAUSED_REDUCER, 2)}


@pytest.mark.slow
@pytest.mark.parametrize("fault", list(BROKEN))
def test_a_broken_kernel_fails_the_check_where_the_kernel_passes(fault):
    # no wait: rank 0 reduces before the late rank 1 sent its partials; one buffer: rank 1's
    # second call overwrites its first partials in rank 0's stage buffer while rank 0
    # pauses before reducing them. The kernel itself passes under the same delays.
    mutate, delays, calls = BROKEN[fault]
    bp, res = _run_rs(delays, calls)
    rep = check(bp, res)
    assert rep.ok, rep.lines
    if fault == "one buffer":
        _broken_outputs_fail(bp, res)
    bp, res = _run_rs(delays, calls, mutate)
    rep = check(bp, res)
    assert not rep.ok, rep.lines
    assert "(worst: call 0, rank 0)" in rep.lines[0], rep.lines


def _broken_outputs_fail(bp, res):
    """The real kernel's second-call outputs, broken four ways, each fail the check."""
    ins, outs = res.inputs[1], res.outputs[1]
    c1 = (ins["a"][1].float() @ ins["b"][1].float()).to(BF16).float()  # rank 1's partial
    seg = RS_SIZES["M"] // 2
    broken = {
        "zeroed tile": _zero_tile(bp, ins, outs),
        "scaled": _scaled(bp, ins, outs),
        "swapped": _swapped(bp, ins, outs),
        "rank 1's partial dropped": {"out": [(t.float() - c1[r * seg:(r + 1) * seg]).to(BF16)
                                             for r, t in enumerate(outs["out"])]},
    }
    for what, mutated in broken.items():
        rep = check(bp, EmulationResult([res.inputs[0], ins], [res.outputs[0], mutated], 0.0))
        assert not rep.ok, what
        assert "(worst: call 1, rank" in rep.lines[0], (what, rep.lines)


# ---- the emulated world rounds as GPUs do; --check runs several calls with delays ---------


def test_bf16_casts_of_the_emulated_world_round_to_nearest_even():
    from tilelink.runtime.interp_rounding import to_bf16_bits

    x = torch.cat([torch.randn(4096) * 100, torch.tensor(
        [0.0, -0.0, 1.00390625, 1.01171875, -1.00390625, 3.4e38, -3.4e38, float("inf"),
         1e-40, -1e-40])])
    assert (to_bf16_bits(x.numpy()) == x.to(BF16).view(torch.int16).numpy().view("uint16")).all()
    # Triton's interpreter itself truncates: about half of a GEMM's outputs came out one ulp
    # smaller in magnitude than a GPU's (and the reference's); now they are the same
    s, res = emulate(AG, 2, {"M": 32, "N": 32, "K": 32}, {"comm": "sm"})
    want = evaluate(s.bound, res.inputs[0])
    for got, ref in zip(res.outputs[0]["c"], want["c"]):
        assert float((got == ref).float().mean()) > 0.99


@tk.tile_function(reads={"x": "rows", "g": "whole"})
@triton.jit
def bf16_rows(x, g, out, row0, rows, N: tl.constexpr, BM: tl.constexpr):
    """Arithmetic on bf16 values with no cast to fp32: products, sums, a max, a row sum."""
    offs_m = row0 + tl.arange(0, BM)
    offs_n = tl.arange(0, N)
    mask = offs_m[:, None] < rows
    v = tl.load(x + offs_m[:, None] * N + offs_n[None, :], mask=mask, other=0.0)
    w = tl.load(g + offs_n)[None, :]
    y = v * w + v - tl.maximum(v, w) + tl.sum(v, axis=1)[:, None]
    tl.store(out + offs_m[:, None] * N + offs_n[None, :], y, mask=mask)


@tk.pattern
def ag_bf16_rows(M=64, N=32, dtype="bf16"):
    x = tk.input((M, N), dtype, shard=0)
    g = tk.input((N,), dtype, placement="replicated")
    x_full = tk.all_gather(x, dim=0)
    y = tk.map(bf16_rows, x_full, g)
    return y


def test_bf16_arithmetic_of_a_tile_function_computes_on_values():
    # the interpreter keeps bf16 as uint16 bit patterns and ran numpy on those: v * w + v
    # came out as garbage and NaN, and --check passed it (the map's reference is the same
    # function in the same interpreter). Now each op is the fp32 one rounded to bf16.
    s, res = emulate(ag_bf16_rows, 2, {})
    assert check(s.bound, res).ok
    v, w = torch.cat(res.inputs[0]["x"]), res.inputs[0]["g"][0][None, :]
    want = v * w + v - torch.maximum(v, w) + v.float().sum(1, keepdim=True).to(BF16)
    for y in res.outputs[0]["y"]:
        assert not y.isnan().any()
        torch.testing.assert_close(y, want, rtol=2**-7, atol=2**-6)


@pytest.mark.slow
def test_check_runs_several_calls_with_delays_unless_told(monkeypatch, capsys):
    from tilelink import runtime
    from tilelink.cli.main import main

    seen = []
    real = runtime.emulate

    def spy(*args, **kw):
        seen.append((kw["calls"], kw["delays"]))
        return real(*args, **kw)

    monkeypatch.setattr(runtime, "emulate", spy)
    run = ["run", str(EXAMPLES / "ag_gemm.tl"), "-W", "2", "-D", "M=32", "-D", "N=32", "-D",
           "K=32"]
    assert main(run + ["--check"]) == 0
    assert main(run + ["--check", "--calls", "1", "--no-delays"]) == 0
    assert main(run) == 0
    assert seen == [(3, True), (1, False), (1, False)]
    out = capsys.readouterr().out
    assert "ran 3 call(s)" in out and out.count("check: OK") == 2


def test_a_row_of_few_large_terms_is_judged_at_its_own_scale():
    # causal attention in bf16 (P rounded before P V, as the fused kernels do), 2,048 keys:
    # the first queries see a few keys, rows of size ~0.7 against the output's rms of
    # ~0.09, and their rounding errors are of their size (0.005 of it here); against the
    # global rms alone the same rounding is 0.018
    from tilelink.ops.attention import _attend
    from tilelink.runtime.bounds import Bound, judge

    torch.manual_seed(0)
    s, d = 2048, 64
    q, k, v = (torch.randn(s, 1, d).bfloat16() for _ in range(3))
    want = _attend(q, k, v, 1, 0, torch.float32)
    sc = (q.float()[:, 0] @ k.float()[:, 0].T) / d ** 0.5
    sc = sc.masked_fill(torch.arange(s)[None, :] > torch.arange(s)[:, None], float("-inf"))
    p = torch.exp(sc - sc.amax(-1, keepdim=True))
    got = ((p.bfloat16().float() @ v.float()[:, 0]) / p.sum(-1, keepdim=True)).bfloat16()
    got = got.unsqueeze(1)
    bound = Bound(elementwise=0.01, normwise=0.01)
    assert judge(got, want, bound).ok
    rms = float(want.pow(2).mean().sqrt())
    worst_global = float(((got.float() - want).abs() / (want.abs() + rms)).max())
    assert worst_global > 0.01  # (the global rms alone would call this rounding a mismatch)
    # and a wrong value in that large row still fails by far
    bad = got.clone()
    bad[1, 0, 3] += 0.5
    assert not judge(bad, want, bound).ok
