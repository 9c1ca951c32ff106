"""all_to_all with fp8 = 1: rows travel as fp8 e4m3 bytes with one fp32 scale per row.

EP dispatch and straight back (`examples/ep_dispatch_combine_fp8.tl`) in the emulated
world at W = 1-4 against the layer by hand with the rounding modelled exactly (each row
rounded to fp8 at its scale on the way out, and again on the way back), on the skewed
routings of `test_dispatch_combine` (every copy to one rank, past the capacity) with delays;
the non-overlapped plan rounds the same way; the kernel's roles (a receive step writing each
landed chunk, the readers waiting on its local signal), its buffers, the bytes it is charged,
and the refusals (that it compiles for every GPU target: test_dispatch_combine)."""

from __future__ import annotations

import pytest
import torch

from tilelink.errors import TileLinkError
from tilelink.frontend import load_pattern
from tilelink.frontend.text import parse_text
from tilelink.ops.all_to_all import dequantize_rows, quantize_rows, sent_rows, wire_bytes
from tilelink.runtime import check, emulate

from ...conftest import EXAMPLES
from .test_dispatch_combine import kept, routings

EXAMPLE = EXAMPLES / "ep_dispatch_combine_fp8.tl"
SIZES = {"T": 40, "TOPK": 2, "H": 24, "CAP": 24}
SM = {"comm": "sm", "comm_block_m": "16"}


def fp8_trip(x: torch.Tensor) -> torch.Tensor:
    """A row's way there and back: rounded to fp8 at its scale (bf16 on arrival), then again."""
    once = dequantize_rows(*quantize_rows(x), x.dtype)
    return dequantize_rows(*quantize_rows(once), x.dtype)


def _calls(world: int, sizes: dict, seed: int) -> list[dict]:
    gen = torch.Generator().manual_seed(seed)
    out = []
    for dests in routings(world, sizes["T"], sizes["TOPK"], gen):
        out.append({
            "x": [(torch.randn(sizes["T"], sizes["H"], generator=gen)
                   * torch.rand(sizes["T"], 1, generator=gen) * 10).to(torch.bfloat16)
                  for _ in range(world)],
            "dest": [d.to(torch.int32) for d in dests],
            "wts": [torch.rand(sizes["T"], sizes["TOPK"], generator=gen).to(torch.bfloat16)
                    for _ in range(world)]})
    return out


def _run(world: int, config: dict, seed: int = 0, sizes: dict = SIZES):
    bp = load_pattern(str(EXAMPLE)).bind(sizes, world)
    calls = _calls(world, sizes, seed)
    s, res = emulate(bp, world_size=world, config=config, inputs=calls, delays=True,
                     timeout=600, progress=False)
    report = check(s.bound, res)
    assert report.ok, "\n".join(report.lines)
    for i, ins in enumerate(calls):
        for r in range(world):
            x, dest, wts = ins["x"][r], ins["dest"][r], ins["wts"][r]
            w = torch.where(kept(dest, world, sizes["CAP"]), wts.float(), torch.zeros(()))
            want = fp8_trip(x).float() * w.sum(1, keepdim=True)
            exact = x.float() * w.sum(1, keepdim=True)
            got = res.outputs[i]["out"][r].float()
            assert got.abs().sum() > 0
            # the rounding is fp8's, modelled exactly: only the weighted sum's own rounding
            # to bf16 is left (its fp32 sum of at most TOPK terms, in another order)
            assert (got - want).abs().max() <= 2.0**-7 * want.abs().max(), (i, r)
            if (w > 0).any():  # and it is really there: fp8 is far coarser than bf16
                assert (got - exact).abs().max() > 2.0**-7 * exact.abs().max(), (i, r)
    return s


@pytest.mark.parametrize("world", [1, 2, 3, 4])
def test_the_kernel_rounds_every_row_to_fp8_and_back_as_modelled(world):
    s = _run(world, SM, seed=world)
    assert s.config.comm == "sm" and "check program order: ok" in s.render()


def test_the_non_overlapped_plan_rounds_the_same():
    s = _run(2, {"comm": "none"}, seed=5)
    assert s.config.comm == "none"


def test_several_chunks_a_slot_and_rows_wider_than_a_step():
    # H = 16,500 columns: a row spans two steps of the push (a pass for its largest
    # magnitude over both, then its bytes) and of the receive step; CAP = 20 rows in
    # chunks of 16 (a short last one)
    s = _run(2, SM, 7, {"T": 12, "TOPK": 3, "H": 16500, "CAP": 20})
    from tilelink.codegen import render_triton

    assert "a pass for the largest magnitude" in render_triton(s)


def test_a_gemm_reading_the_fp8_rows_waits_per_chunk_on_the_receive_step():
    """EP MoE from plain routing with both all_to_alls in fp8: the expert GEMM's tiles read
    the rows the dispatch's receive step wrote (waiting on its local signal per chunk), and
    the result is within the check's bound (fp8's rounding, carried through the GEMM)."""
    from tilelink.schedule import get_target, make_schedule

    text = (EXAMPLES / "ep_moe_routed.tl").read_text()
    text = text.replace("capacity = CAP)       # dispatch", "capacity = CAP, fp8 = 1)")
    text = text.replace("slots = 1, back = 1)", "slots = 1, back = 1, fp8 = 1)")
    assert text.count("fp8 = 1") == 2
    pattern = parse_text(text, "ep_moe_fp8.tl")
    sizes = {"T": 40, "TOPK": 2, "H": 24, "CAP": 24}
    s = make_schedule(pattern.bind(sizes, 2), get_target("interp"), SM)
    tiles = next(st for k in s.composition.kernels for st in k if st.kind == "tiles"
                 and st.op.kind == "gemm")
    assert "receive recv" in tiles.waits_on
    for world in (2, 3):
        bp = pattern.bind(sizes, world)
        s, res = emulate(bp, world_size=world, config=SM, calls=4, delays=True, timeout=600,
                         progress=False)
        report = check(s.bound, res)
        assert report.ok, "\n".join(report.lines)


# the dispatch alone, its rows read by a GEMM, or returned: counts drawn every call, so a
# slot's rows past this call's count are ones the last call wrote, and must read as zeros
DISPATCH = """pattern dispatch_fp8(T = 40, H = 24, CAP = 24, dtype = bf16)
    tokens : [T, H] dtype
    splits : [W] int32
{decl}    recv = all_to_all(tokens, splits, capacity = CAP, fp8 = 1)
{tail}"""


def test_rows_past_a_shrunk_count_read_as_zeros_to_a_gemm():
    pattern = parse_text(DISPATCH.format(decl="    w : [H, H] dtype\n",
                                         tail="    h = gemm(recv, w)\n    return h\n"),
                         "dispatch_fp8.tl")
    s, res = emulate(pattern.bind({}, 3), world_size=3, config=SM, calls=6, delays=True,
                     timeout=600, progress=False)
    report = check(s.bound, res)
    assert report.ok, "\n".join(report.lines)


def test_a_returned_result_is_every_row_rounded_once_and_zeros_past_the_counts():
    pattern = parse_text(DISPATCH.format(decl="", tail="    return recv\n"), "dispatch_fp8.tl")
    world, cap = 3, 24
    gen = torch.Generator().manual_seed(11)
    calls = []
    for counts in ([24, 10, 6], [3, 0, 30], [0, 0, 0], [40, 0, 0]):  # (past CAP; none; all)
        calls.append({"tokens": [torch.randn(40, 24, generator=gen).to(torch.bfloat16)
                                 for _ in range(world)],
                      "splits": [torch.tensor(counts, dtype=torch.int32)] * world})
    s, res = emulate(pattern.bind({}, world), world_size=world, config=SM, inputs=calls,
                     delays=True, timeout=600, progress=False)
    for i, ins in enumerate(calls):
        for d in range(world):
            want = torch.zeros(world * cap, 24, dtype=torch.bfloat16)
            for src in range(world):
                start, n = sent_rows(40, ins["splits"][src].tolist(), d, cap)
                rows = ins["tokens"][src][start:start + n]
                want[src * cap:src * cap + n] = dequantize_rows(*quantize_rows(rows), rows.dtype)
            assert torch.equal(res.outputs[i]["recv"][d], want), (i, d)


def test_quantizing_no_rows_and_rows_of_zeros():
    q, scales = quantize_rows(torch.zeros(0, 32, dtype=torch.bfloat16))
    assert q.shape == (0, 32) and scales.shape == (0,)
    assert dequantize_rows(q, scales, torch.bfloat16).shape == (0, 32)
    q, scales = quantize_rows(torch.zeros(3, 5, 4))
    assert not q.any() and not dequantize_rows(q, scales, torch.float32).any()


def test_a_nan_spoils_only_its_own_value():
    """The kernel's max skips a NaN, and so does the model: only that value arrives NaN."""
    x = torch.tensor([[1.0, float("nan"), 2.0, 0.5], [3.0, 1.0, 0.0, -4.0]])
    back = dequantize_rows(*quantize_rows(x), torch.float32)
    assert torch.isnan(back).tolist() == [[False, True, False, False], [False] * 4]
    assert back[0, 2] == 2.0 and back[1, 3] == -4.0


def test_profiles_count_the_receive_step_of_a_collective_as_communication():
    from tilelink.codegen import render_triton
    from tilelink.profile.events import roles_of
    from tilelink.codegen.compile import load_module
    from tilelink.schedule import get_target, make_schedule

    s = make_schedule(load_pattern(str(EXAMPLE)).bind(SIZES, 2), get_target("cuda:90"),
                      {"comm": "sm", "profile": "1"})
    roles = {r.name: r.compute for r in roles_of(load_module(render_triton(s)))}
    assert roles["receive recv"] is False and roles["receive back"] is False
    assert roles["receive out"] is True and roles["push recv"] is False


def test_a_tma_read_of_the_written_rows_is_fenced():
    """The receive step's plain stores and a GEMM's TMA loads of them are different proxies:
    the GEMM fences after its waits, as for rows peers write."""
    from tilelink.codegen import render_triton
    from tilelink.schedule import get_target, make_schedule

    text = (EXAMPLES / "ep_moe.tl").read_text().replace(
        "capacity = CAP)        # dispatch", "capacity = CAP, fp8 = 1)        # dispatch")
    assert "fp8 = 1" in text
    s = make_schedule(parse_text(text, "ep_moe_fp8.tl").bind({}, 2), get_target("cuda:90"),
                      {"comm": "sm"})
    src = render_triton(s)
    at = src.index("tld.wait(sig_recv_ready_ptr")
    assert "tile_desc.load" in src[at:] or "_desc.load" in src[at:]
    assert "tld.fence_proxy_async" in src[at:src.index("_desc.load", at)]


def test_the_receive_step_writes_each_chunk_and_its_readers_wait_on_it():
    from tilelink.codegen import render_triton
    from tilelink.schedule import get_target, make_schedule

    s = make_schedule(load_pattern(str(EXAMPLE)).bind(SIZES, 2), get_target("cuda:90"),
                      {"comm": "sm"})
    kernel = next(k for k in s.composition.kernels if any(st.kind == "push" for st in k))
    assert [(st.kind, st.op.result) for st in kernel] == [
        ("push", "recv"), ("receive", "recv"), ("push", "back"), ("receive", "back"),
        ("receive", "out")]
    firsts = [st.first for st in kernel]
    assert firsts == sorted(firsts)  # (the program-order rule: readers after writers)
    push_back = kernel[2]
    assert "receive recv" in push_back.waits_on
    src = render_triton(s)
    # the peers write bytes and scales into staging slots; the results are this rank's
    assert "'recv_q': ([2, 48, 24], 'uint8')" in src and "'recv_scale': ([2, 48], 'fp32')" in src
    assert "'recv': ([48, 24], 'bf16')" in src
    # Hopper converts in hardware; a target without fp8 (cuda:80) in integer arithmetic
    assert ".to(tl.float8e4nv).to(tl.uint8, bitcast=True)" in src and "fp8_bits" not in src
    a100 = render_triton(make_schedule(load_pattern(str(EXAMPLE)).bind(SIZES, 2),
                                       get_target("cuda:80"), {"comm": "sm"}))
    assert "tld.fp8_bits(" in a100 and "tld.fp8_value(" in a100 and "float8" not in a100
    assert "tld.wait(sig_recv_ready_ptr" in src  # the return push reads what was written
    assert "tld.notify(sig_recv_ready_ptr" in src


def test_the_bytes_charged_are_fp8s():
    from tilelink.bench.report import routed_bytes, routing_values

    plain = load_pattern(str(EXAMPLES / "ep_dispatch_combine.tl")).bind(dict(SIZES, H=7168), 2)
    fp8 = load_pattern(str(EXAMPLE)).bind(dict(SIZES, H=7168), 2)
    recv = next(o for o in fp8.ops if o.result == "recv")
    assert wire_bytes(fp8, recv) == pytest.approx(1 + 4 / 7168)
    assert wire_bytes(plain, next(o for o in plain.ops if o.result == "recv")) == 2
    a, b = (routed_bytes(bp, routing_values(bp, 0)) for bp in (plain, fp8))
    assert a[0][1] > 0 and b[0][1] == pytest.approx(a[0][1] * (1 + 4 / 7168) / 2, rel=1e-3)


@pytest.mark.parametrize("line,says", [
    ("    recv = all_to_all(copies, splits, capacity = CAP, fp8 = 2)",
     "all_to_all fp8 must be 0 or 1"),
    ("    recv = all_to_all(dest, splits, capacity = CAP, fp8 = 1)",
     "rounds the rows to fp8: dest is int32, not a float dtype")])
def test_bad_fp8_is_refused_naming_the_line(line, says):
    text = "\n".join(line if ln.startswith("    recv = all_to_all(") else ln
                     for ln in EXAMPLE.read_text().splitlines()) + "\n"
    with pytest.raises(TileLinkError) as e:
        parse_text(text, "fp8.tl").bind(SIZES, 2)
    assert says in str(e.value) and "fp8.tl:" in str(e.value)
