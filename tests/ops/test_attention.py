"""attention (tilelink/ops/attention.py): attention_partial's split-KV kernel (splits of each
(batch, key head)'s keys combined in the kernel by the last split, grouped-query attention on
the tensor cores), checked against the torch reference in the emulated world (ragged slices,
W = 1..3, G = 1, 4, 8, one split and several, D = 64 and 128) and compiled for every GPU
target; the timing tool's arguments (tools/decode_bw.py) without a GPU; per-sequence lengths
(kv_len); and the non-overlapped plan's attention (torch's fused SDPA kernels on GPUs, the
fp32 reference elsewhere). The attention op's FlashAttention-2 kernel is
tests/ops/test_attention_prefill.py."""

from __future__ import annotations

import math
import sys
from dataclasses import replace

import pytest
import torch

from tilelink.cli.main import main
from tilelink.codegen import render_triton
from tilelink.codegen.compile import compile_module
from tilelink.errors import ConfigError, PatternError
from tilelink.frontend import load_pattern, load_text
from tilelink.frontend.text import parse_text
from tilelink.ops.attention import (SPLIT_PROGRAM_GBS, _attend, _partial, _partial_sdpa, _sdpa,
                                     _split, _vendor)
from tilelink.runtime.bounds import output_bound
from tilelink.schedule import get_target, make_schedule
from tilelink.schedule.config import Config
from tilelink.schedule.schedule import default_config

from ..conftest import EXAMPLES, ROOT, run_argv

MHA, GQA = EXAMPLES / "flash_decode.tl", EXAMPLES / "flash_decode_gqa.tl"

# (pattern, W, sizes, config): S / W keys a rank, never a multiple of the 16-key blocks,
# and kv_splits that do not divide a rank's blocks either
RUNS = [
    # G = 1, the default split count (HKV = 1 leaves the interpreter's 4 programs idle
    # without splits: 3 of them), W = 3
    (MHA, 3, {"B": 1, "H": 1, "S": 3 * 37, "D": 64}, {}),
    # G = 4, 3 splits of 2 blocks over 5 (the last split one block), W = 2, D = 128
    (GQA, 2, {"B": 2, "H": 8, "HKV": 2, "S": 2 * 75, "D": 128}, {"kv_splits": "3"}),
    # G = 8, one split, W = 1
    (GQA, 1, {"B": 1, "H": 8, "HKV": 1, "S": 70, "D": 64}, {"kv_splits": "1"}),
    # G = 8, 4 splits, W = 3, D = 128, fp16
    (GQA, 3, {"B": 1, "H": 8, "HKV": 1, "S": 3 * 50, "D": 128, "dtype": "fp16"},
     {"kv_splits": "4"}),
    # G = 1, one split, W = 2, D = 128
    (MHA, 2, {"B": 2, "H": 2, "S": 2 * 41, "D": 128}, {"kv_splits": "1"}),
    # G = 4, more splits asked for than a rank has blocks (capped: one split a block)
    (GQA, 1, {"B": 1, "H": 4, "HKV": 1, "S": 40, "D": 64}, {"kv_splits": "9"}),
    # G = 4, 2 splits, W = 4 (four ranks' partials combined)
    (GQA, 4, {"B": 2, "H": 4, "HKV": 1, "S": 4 * 29, "D": 64}, {"kv_splits": "2"}),
]


def _args(path, world, sizes, config, calls=2):
    return run_argv(path, world, sizes, {"comm": "sm", "block_n": "16", **config}, calls)


@pytest.mark.parametrize("case", [pytest.param(i, marks=() if i == 1 else pytest.mark.slow)
                                  for i in range(len(RUNS))])
def test_split_kv_decode_checks_against_the_reference(case, capsys):
    # two calls: the counters the last split resets must be zero again for the second
    path, world, sizes, config = RUNS[case]
    assert main(_args(path, world, sizes, config)) == 0
    out = capsys.readouterr().out
    assert "check: OK" in out


def _bp(path, sizes, world):
    return load_text(path).bind({k: str(v) for k, v in sizes.items()}, world)


def test_the_emulated_runs_split_as_their_cases_say():
    # (the matrix above exercises what it claims: splits, ragged last blocks and groups)
    target = get_target("interp")
    seen = set()
    for path, world, sizes, config in RUNS:
        s = make_schedule(_bp(path, sizes, world), target,
                          {"comm": "sm", "block_n": "16", **config})
        op = s.bound.ops[0]
        sp = _split(s.bound, op, s.config)
        keys = s.bound.tensors[op.args[1]].local_shape[1]
        assert keys % sp.block, "a rank's keys should end in a ragged block"
        assert (sp.splits - 1) * sp.per_split < sp.blocks <= sp.splits * sp.per_split
        seen.add((sp.group, sp.splits > 1, sizes["D"]))
    assert {g for g, _, _ in seen} == {1, 4, 8}
    assert {many for _, many, _ in seen} == {True, False}
    assert {d for _, _, d in seen} == {64, 128}


def _emulate(path, world, sizes, config, mutate=None):
    """(bound pattern, the check's report) of one call of the kernel in the emulated world,
    its source changed by `mutate` first."""
    from tilelink.runtime import check
    from tilelink.runtime.emulated import run_emulated
    from tilelink.runtime.reference import make_inputs

    s = make_schedule(_bp(path, sizes, world), get_target("interp"),
                      {"comm": "sm", "block_n": "16", **config})
    source = render_triton(s)
    if mutate is not None:
        changed = mutate(source)
        assert changed != source
        source = changed
    res = run_emulated(source, world, [make_inputs(s.bound, 0)], timeout=120)
    return check(s.bound, res)


@pytest.mark.slow
@pytest.mark.parametrize("what,mutate", [
    # a group reads its neighbour's key head
    ("key head", lambda src: src.replace("* HKV + g) * D", "* HKV + (g + 1) % HKV) * D")),
    # the combine drops the last split (its keys' weight lost)
    ("last split", lambda src: src.replace("kmask = offs_k < SPLITS", "kmask = offs_k < SPLITS - 1")),
    # the ragged last block's keys past the slice count as keys
    ("ragged block", lambda src: src.replace("smask = offs_s < S ", "smask = offs_s < S + 8 ")),
])
def test_a_broken_kernel_fails_the_check(what, mutate):
    # the check's bound sees each of these (the unbroken kernel passes it)
    path, world, sizes, config = RUNS[1]
    assert _emulate(path, world, sizes, config).ok
    assert not _emulate(path, world, sizes, config, mutate).ok, what


def test_the_reference_reads_key_head_h_over_g():
    # against an explicit per-head softmax (not the einsum the reference uses)
    torch.manual_seed(0)
    b, h, hkv, s, d = 2, 8, 2, 13, 16
    q, k, v = torch.randn(b, h, d), torch.randn(b, s, hkv, d), torch.randn(b, s, hkv, d)
    got = _partial(q, k, v)
    for bi in range(b):
        for hi in range(h):
            kh, vh = k[bi, :, hi // (h // hkv)], v[bi, :, hi // (h // hkv)]
            scores = (kh @ q[bi, hi]) / math.sqrt(d)
            w = torch.exp(scores - scores.max())
            assert torch.allclose(got[bi, hi, :d], (w / w.sum()) @ vh, atol=1e-5)
            assert torch.allclose(got[bi, hi, d], scores.logsumexp(0), atol=1e-5)


def test_key_heads_that_do_not_divide_the_query_heads_are_refused():
    with pytest.raises(PatternError) as e:
        _bp(GQA, {"H": 8, "HKV": 3}, 2)
    assert "key heads (HKV = 3) to divide the query heads (H = 8)" in str(e.value)
    assert "flash_decode_gqa.tl:8" in str(e.value)


def test_kv_splits_is_refused_where_nothing_reads_it():
    bp = load_text(EXAMPLES / "ag_gemm.tl").bind({}, 2)
    with pytest.raises(ConfigError, match="kv_splits=4 does nothing with these lowerings"):
        make_schedule(bp, get_target("cuda:90"), {"kv_splits": "4"})
    with pytest.raises(ConfigError, match="kv_splits=-1 must be a count of splits"):
        make_schedule(_bp(MHA, {}, 2), get_target("cuda:90"),
                      {"comm": "sm", "kv_splits": "-1"})
    assert "kv_splits" not in str(Config())  # quiet at its default


@pytest.mark.parametrize("b,h,hkv,busy", [(1, 32, 32, 128), (1, 32, 8, 128), (8, 32, 8, 128),
                                          (2, 32, 32, 128), (16, 8, 2, 128)])
def test_the_default_split_keeps_the_gpu_busy(b, h, hkv, busy):
    # one H100 / H200 (132 programs), 65536 keys a rank (below the kernels' 2**30 elements a
    # tensor; B = 16 with 2 key heads: 256 items without splits): the one-program-per-head kernel kept
    # 32 of 132 busy at B = 1; the split keeps at least `busy` programs streaming, one
    # program's items never more than 4, and the cost model is told so
    bp = _bp(GQA, {"B": b, "H": h, "HKV": hkv, "S": 131072, "D": 128}, 2)
    s = make_schedule(bp, get_target("cuda:90"), {"comm": "sm"})
    op = bp.ops[0]
    sp = _split(bp, op, s.config)
    rounds = -(-sp.items // s.config.num_programs)
    assert sp.items // rounds >= busy and (sp.splits == 1 or rounds <= 4)
    # (a query group's tl.dot takes 128-key blocks: DECODE_GROUP_BLOCK)
    assert (sp.block, s.config.warps, s.config.stages) == (64 if h == hkv else 128, 4, 3)
    work = s.composition.lowerings[op.result].work(s.composition.sites[op.result])
    assert work.programs == sp.items // rounds
    assert work.program_gbs == SPLIT_PROGRAM_GBS  # (every item on the tensor cores)


@pytest.mark.parametrize("target", ["cuda:90", "cuda:80", "hip:gfx942"])
@pytest.mark.parametrize("path,sizes,config", [
    (MHA, {"B": 1, "H": 32, "S": 8192, "D": 128}, {}),
    (GQA, {"B": 2, "H": 32, "HKV": 4, "S": 2 * 1000, "D": 64}, {"kv_splits": "3"}),
    (GQA, {"B": 1, "H": 16, "HKV": 2, "S": 4096, "D": 128, "dtype": "fp16"}, {"kv_splits": "1"}),
    # per-sequence lengths: the KV loop's bound read on the device, still pipelined
    (EXAMPLES / "flash_decode_varlen.tl", {"B": 3, "H": 32, "HKV": 8, "S": 2 * 1000, "D": 128},
     {"kv_splits": "3"}),
])
def test_the_decode_kernel_compiles(target, path, sizes, config):
    s = make_schedule(_bp(path, sizes, 2), get_target(target), {"comm": "sm", **config})
    src = render_triton(s)
    name = f"{s.bound.name}_kernel"
    compiled = compile_module(src, get_target(target), name)
    if target.startswith("cuda"):
        ptx = compiled.asm["ptx"]
        assert "cp.async" in ptx  # the KV loop is software-pipelined
        if "HKV" in sizes:
            assert "mma" in ptx  # a key head's query group on the tensor cores
    else:
        assert compiled.asm["amdgcn"]
    sp = _split(s.bound, s.bound.ops[0], s.config)
    assert ("_kv_done_ptr + b * HKV + g, 1" in src) == (sp.splits > 1)  # the splits' count


def test_past_the_int32_bound_k_and_v_are_indexed_in_64_bits(monkeypatch, capsys):
    # one rank's K and V of 2**31 elements (MHA, 524,288 keys, W = 1) would wrap int32
    # offsets: the decode lowering computes theirs in 64 bits, so the size schedules and its
    # kernel compiles; below the bound the code is as before
    from tilelink.schedule import schedule as sched

    big = make_schedule(_bp(MHA, {"B": 1, "H": 32, "S": 524288, "D": 128}, 1),
                        get_target("cuda:90"), {"comm": "sm"})
    src = render_triton(big)
    assert "b64 = b.to(tl.int64)" in src and "kv = ((b64 * S + offs_s" in src
    assert compile_module(src, get_target("cuda:90"), f"{big.bound.name}_kernel").asm["ptx"]
    # checked on a GPU (the test below, 2026-11-28): the cost model decides there as below
    # the bound (here the plan: MHA at B = 1 measured slower as the kernel at 262,144 keys)
    for graph in (False, True):
        cfg, why = default_config(big.bound, replace(get_target("cuda:90"),
                                                     device="NVIDIA H200"), graph=graph)
        assert cfg.comm == "none" and "the cost model (NVIDIA H200" in why, why
    small = make_schedule(_bp(MHA, {"B": 1, "H": 32, "S": 8192, "D": 128}, 2),
                          get_target("cuda:90"), {"comm": "sm"})
    assert "b64" not in render_triton(small)
    # the 64-bit path's numbers, in the emulated world: the bound lowered below this K and V
    # (2 x 64 x 2 x 16 = 4096 elements a rank) and above every other tensor and buffer
    monkeypatch.setattr(sched, "MAX_ELEMENTS", 2048)
    sizes = {"B": 2, "H": 4, "HKV": 2, "S": 2 * 64, "D": 16}
    assert "b64 * S" in render_triton(make_schedule(_bp(GQA, sizes, 2), get_target("interp"),
                                                    {"comm": "sm", "block_n": "16"}))
    assert main(_args(GQA, 2, sizes, {"kv_splits": "2"})) == 0
    assert "check: OK" in capsys.readouterr().out
    # and with per-sequence lengths (the ragged loop's bounds beside the 64-bit offsets)
    varlen = EXAMPLES / "flash_decode_varlen.tl"
    assert "b64 * S" in render_triton(make_schedule(_bp(varlen, sizes, 2), get_target("interp"),
                                                    {"comm": "sm", "block_n": "16"}))
    assert main(_args(varlen, 2, sizes, {"kv_splits": "2"})) == 0
    assert "check: OK" in capsys.readouterr().out


@pytest.mark.gpu
@pytest.mark.parametrize("path,sizes", [
    (MHA, {"B": 1, "H": 32, "S": 524288, "D": 128}),
    # ragged lengths, a query group a key head: 8 sequences of up to 262,144 keys
    (EXAMPLES / "flash_decode_varlen.tl", {"B": 8, "H": 32, "HKV": 8, "S": 262144, "D": 128}),
])
def test_k_and_v_past_the_int32_bound_check_on_a_gpu(path, sizes, capsys):
    # 2**31 elements of K a rank (W = 1): 4 GiB each of K and V
    assert main(run_argv(path, 1, sizes, {"comm": "sm"}, 3)) == 0
    assert "check: OK" in capsys.readouterr().out


def test_the_split_shows_in_the_schedule(capsys):
    assert main(["compile", str(GQA), "-W", "2", "-D", "B=1", "-D", "H=32", "-D", "HKV=8",
                 "-D", "S=131072", "-D", "D=128", "--config", "comm=sm",
                 "--emit", "schedule"]) == 0
    out = capsys.readouterr().out
    assert "16 KV split(s) of 32 block(s) of 128 keys per (batch, key head): 128 items" in out
    assert "4 query heads a key head, on the tensor cores" in out


@pytest.mark.gpu
@pytest.mark.parametrize("path,sizes,config", [
    (MHA, {"B": 2, "H": 32, "S": 20001, "D": 128}, {}),
    (GQA, {"B": 3, "H": 32, "HKV": 8, "S": 20001, "D": 128}, {"kv_splits": "7"}),
    (GQA, {"B": 1, "H": 16, "HKV": 2, "S": 4099, "D": 64, "dtype": "fp16"}, {}),
    # ragged lengths over the whole 0 .. S (`draw_sequence_lengths`), the kernel not the plan
    (EXAMPLES / "flash_decode_varlen.tl", {"B": 7, "H": 32, "HKV": 8, "S": 20001, "D": 128},
     {}),
])
def test_split_kv_decode_checks_on_a_gpu(path, sizes, config, capsys):
    # the last split reads the partials the other programs stored (their release and its
    # acquire on the counter), over many calls and ragged 64-key blocks, W = 1
    assert main(run_argv(path, 1, sizes, {"comm": "sm", **config}, 20)) == 0
    assert "check: OK" in capsys.readouterr().out


@pytest.mark.gpu
@pytest.mark.parametrize("config", [{"comm": "sm"}, {"comm": "none"}])
def test_ragged_decode_replays_in_a_cuda_graph(config, capsys):
    # the kernel and the non-overlapped plan captured once and replayed on fresh lengths (the
    # plan's first cuBLAS call used to happen inside the capture and fail it)
    argv = run_argv(EXAMPLES / "flash_decode_varlen.tl", 1,
                    {"B": 6, "H": 32, "HKV": 8, "S": 9000, "D": 128}, config, 8) + ["--graph"]
    assert main(argv) == 0
    assert "check: OK" in capsys.readouterr().out


@pytest.mark.gpu
@pytest.mark.parametrize("group", [1, 4, 8])
def test_the_plans_fused_sdpa_reads_grouped_key_heads_on_a_gpu(group):
    # the non-overlapped plan's SDPA takes a key head's G query heads as G query rows
    from tilelink.ops.attention import _partial_sdpa

    g = torch.Generator(device="cuda").manual_seed(group)
    q = torch.randn(2, 8, 128, generator=g, device="cuda").to(torch.bfloat16)
    k, v = (torch.randn(2, 1000, 8 // group, 128, generator=g, device="cuda")
            .to(torch.bfloat16) for _ in range(2))
    got, want = _partial_sdpa(q, k, v), _partial(q, k, v)
    assert got is not None and got.shape == want.shape
    torch.testing.assert_close(got[..., -1], want[..., -1], atol=1e-3, rtol=1e-3)  # lse
    torch.testing.assert_close(got[..., :-1], want[..., :-1], atol=2e-2, rtol=2e-2)


# ---- tools/decode_bw.py: arguments without a GPU -------------------------------------------

def _tool():
    sys.path.insert(0, str(ROOT / "tools"))
    try:
        import decode_bw
    finally:
        sys.path.pop(0)
    return decode_bw


def test_decode_bw_parses_its_arguments_without_a_gpu():
    tool = _tool()
    args = tool.parser().parse_args(["--batch", "1", "8", "--heads", "32/8", "64/64",
                                     "--kv", "4096", "--configs", "", "kv_splits=8"])
    assert args.batch == [1, 8] and args.heads == [(32, 8), (64, 64)] and args.kv == [4096]
    assert args.configs == ["", "kv_splits=8"]
    defaults = tool.parser().parse_args([])
    assert defaults.batch == [1, 8, 32] and defaults.kv == [32768, 131072]
    assert defaults.heads == [(32, 32), (32, 8)] and defaults.dim == 128
    assert tool.kv_bytes(1, 131072, 32, 128) == 2**31  # 2 GiB: K and V of one sequence
    # the pattern it times is attention_partial alone at W = 1
    bp = parse_text(tool.PATTERN).bind({"B": 2, "H": 32, "HKV": 8, "S": 100, "D": 128}, 1)
    assert [op.kind for op in bp.ops] == ["attention_partial"]


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal without a GPU")
def test_decode_bw_refuses_cleanly_without_a_gpu(tilelink_cli):
    tool = ROOT / "tools" / "decode_bw.py"
    run = tilelink_cli.run_script(tool, ["--batch", "1"], ROOT, timeout=120)
    assert run.returncode == 2
    assert "needs a CUDA GPU" in run.stderr and "Traceback" not in run.stderr
    bad = tilelink_cli.run_script(tool, ["--heads", "32/5"], ROOT, timeout=120)
    assert bad.returncode == 2 and "KV must divide H" in bad.stderr


# ---- per-sequence lengths (kv_len) ---------------------------------------------------------

VARLEN = EXAMPLES / "flash_decode_varlen.tl"


def _lengths(world: int, keys: int, block: int, per_split: int, batch: int) -> list[list[int]]:
    """Two calls' lengths of `batch` sequences (S = world * keys in all): 0, 1, one ending
    mid-block, one ending mid-split (past its first block), one ending at the last rank's
    first key (a rank boundary: W > 1), the full S; then others, shuffled."""
    s = world * keys
    first = [0, 1, block + 5, per_split * block + 3, (world - 1) * keys or keys - 2, s]
    second = [s, keys + 1 if world > 1 else 3, 0, s - 1, 2 * block, block]
    return [(first * 2)[:batch], (second * 2)[:batch]]


def _oracle(q, ks, vs, lens) -> torch.Tensor:
    """softmax(q k^T / sqrt(D)) v per sequence over its first kv_len[b] keys of the ranks'
    slices in rank order (zeros where it has none), in fp64, head by head."""
    k, v = torch.cat(ks, dim=1).double(), torch.cat(vs, dim=1).double()
    bsz, heads, d = q.shape
    group = heads // k.shape[2]
    out = torch.zeros(bsz, heads, d, dtype=torch.float64)
    for b in range(bsz):
        n = max(0, min(int(lens[b]), k.shape[1]))
        for h in range(heads if n else 0):
            kh, vh = k[b, :n, h // group], v[b, :n, h // group]
            w = torch.softmax(kh @ q[b, h].double() / math.sqrt(d), dim=0)
            out[b, h] = w @ vh
    return out


def _varlen_run(world, sizes, config, calls, mutate=None, poison=False):
    """(check report, [(inputs, output of rank 0)] per call) of the ragged decode in the
    emulated world, one module for every call (each call its own lengths); `poison`: the
    keys and values past each length are NaN."""
    from tilelink.runtime import check
    from tilelink.runtime.emulated import run_emulated
    from tilelink.runtime.reference import make_inputs

    s = make_schedule(_bp(VARLEN, sizes, world), get_target("interp"),
                      {"comm": "sm", "block_n": "16", **config})
    source = render_triton(s)
    if mutate is not None:
        changed = mutate(source)
        assert changed != source
        source = changed
    per_call = []
    for c, lens in enumerate(calls):
        ins = make_inputs(s.bound, c)
        n = torch.tensor(lens, dtype=torch.int32)
        ins["kv_len"] = [n.clone() for _ in range(world)]
        if poison:
            keys = ins["k"][0].shape[1]
            for r in range(world):
                past = (torch.arange(keys) + r * keys).unsqueeze(0) >= n.unsqueeze(1)
                for name in ("k", "v"):
                    ins[name][r] = ins[name][r].masked_fill(past[:, :, None, None],
                                                            float("nan"))
        per_call.append(ins)
    res = run_emulated(source, world, per_call, timeout=240)
    report = check(s.bound, res) if not poison else None
    return report, [(ins, outs["o"][0]) for ins, outs in zip(res.inputs, res.outputs)], s


# (W, sizes, config): B = 5 or 7; a rank's keys never a multiple of the 16-key blocks
VARLEN_RUNS = [
    (1, {"B": 7, "H": 4, "HKV": 4, "S": 70, "D": 32}, {"kv_splits": "2"}),   # MHA, W = 1
    (2, {"B": 7, "H": 8, "HKV": 2, "S": 2 * 75, "D": 64}, {"kv_splits": "3"}),  # GQA
    (3, {"B": 5, "H": 2, "HKV": 2, "S": 3 * 37, "D": 32}, {"kv_splits": "1"}),  # MHA, 1 split
    (4, {"B": 7, "H": 8, "HKV": 1, "S": 4 * 41, "D": 32}, {}),                # GQA, default
]


@pytest.mark.parametrize("case", [pytest.param(i, marks=() if i == 1 else pytest.mark.slow)
                                  for i in range(len(VARLEN_RUNS))])
def test_ragged_lengths_attend_only_to_each_sequences_keys(case):
    # two calls of one compiled module with different lengths: 0 (zeros, never NaN), 1, a
    # length ending mid-block, mid-split, at a rank boundary and the full S; the check's
    # reference and an independent per-sequence oracle both agree with the kernel
    world, sizes, config = VARLEN_RUNS[case]
    bp = _bp(VARLEN, sizes, world)
    keys = bp.tensors["k"].local_shape[1]
    s = make_schedule(bp, get_target("interp"), {"comm": "sm", "block_n": "16", **config})
    sp = _split(bp, bp.ops[0], s.config)
    calls = _lengths(world, keys, sp.block, sp.per_split, sizes["B"])
    report, runs, _ = _varlen_run(world, sizes, config, calls)
    assert report.ok, report.lines
    for (ins, got), lens in zip(runs, calls):
        assert ins["kv_len"][0].tolist() == lens
        assert torch.isfinite(got).all()
        want = _oracle(ins["q"][0].float(), [x.float() for x in ins["k"]],
                       [x.float() for x in ins["v"]], lens)
        torch.testing.assert_close(got.double(), want, atol=2e-2, rtol=2e-2)
        for b, n in enumerate(lens):
            if n == 0:
                assert (got[b] == 0).all()


@pytest.mark.slow
def test_a_split_past_the_length_loads_no_key():
    # with the length mask inside a block taken away and every key past a block-aligned
    # length NaN, the output stays finite only where the kernel never loads a block past
    # the length; the same kernel streaming every block (its loop to NB) reads the NaNs
    world, sizes, config = 2, {"B": 3, "H": 4, "HKV": 2, "S": 2 * 64, "D": 32}, {"kv_splits": "2"}
    calls = [[16, 64 + 32, 0]]  # (a block, a rank and two blocks, none)
    no_mask = lambda src: src.replace("smask = offs_s < n_b ", "smask = offs_s < S ")
    _, runs, _ = _varlen_run(world, sizes, config, calls, no_mask, poison=True)
    (ins, got), = runs
    assert torch.isfinite(got).all()
    want = _oracle(ins["q"][0].float(), [x.float() for x in ins["k"]],
                   [x.float() for x in ins["v"]], calls[0])
    torch.testing.assert_close(got.double(), want, atol=2e-2, rtol=2e-2)
    every_block = lambda src: no_mask(src).replace("c * BPS + BPS, nb_b)", "c * BPS + BPS, NB)")
    _, runs, _ = _varlen_run(world, sizes, config, calls, every_block, poison=True)
    assert not torch.isfinite(runs[0][1]).all()


@pytest.mark.slow
@pytest.mark.parametrize("what,mutate", [
    # every rank takes the lengths as its own slice's (no rank offset)
    ("rank offset", lambda src: src.replace("n_b - me * S", "n_b")),
    # the keys past the length inside its last block count
    ("length mask", lambda src: src.replace("smask = offs_s < n_b ", "smask = offs_s < S ")),
    # a split with no key stores 0 / 0
    ("empty split", lambda src: src.replace("l_i = tl.where(l_i > 0.0, l_i, 1.0)", "l_i = l_i")),
])
def test_a_broken_ragged_kernel_fails_the_check(what, mutate):
    world, sizes, config = VARLEN_RUNS[1]
    calls = [[0, 1, 21, 51, 75, 150, 100]]
    assert _varlen_run(world, sizes, config, calls)[0].ok
    assert not _varlen_run(world, sizes, config, calls, mutate)[0].ok, what


def test_the_references_mask_each_sequence_and_combine_no_key_to_zeros():
    from tilelink.ops.attention import _combine

    torch.manual_seed(1)
    b, h, hkv, s, d = 4, 4, 2, 10, 16
    q, k, v = torch.randn(b, h, d), torch.randn(b, 2 * s, hkv, d), torch.randn(b, 2 * s, hkv, d)
    lens = torch.tensor([0, 3, s, 2 * s], dtype=torch.int32)
    parts = [_partial(q, k[:, r * s:(r + 1) * s], v[:, r * s:(r + 1) * s], lens, r * s)
             for r in range(2)]
    assert parts[0][0, :, d].isneginf().all() and (parts[0][0, :, :d] == 0).all()
    assert parts[1][1, :, d].isneginf().all() and (parts[1][1, :, :d] == 0).all()
    got = _combine(torch.cat(parts), 2, torch.float32)
    assert torch.isfinite(got).all() and (got[0] == 0).all()
    torch.testing.assert_close(got.double(), _oracle(q, [k], [v], lens.tolist()),
                               atol=1e-5, rtol=1e-5)
    # without lengths: every key, as before
    torch.testing.assert_close(_partial(q, k, v, torch.full((b,), 2 * s)), _partial(q, k, v))


@pytest.mark.parametrize("world", [2, 3])
def test_the_plan_masks_each_sequence_on_its_ranks_keys(world, capsys):
    # the non-overlapped plan (comm=none: each rank's distributed reference, then the
    # gather and the combine) against the reference, random lengths 0 .. S in each call
    sizes = {"B": 7, "H": 4, "HKV": 2, "S": world * 37, "D": 16}
    assert main(run_argv(VARLEN, world, sizes, {"comm": "none"}, 3)) == 0
    assert "check: OK" in capsys.readouterr().out


VARLEN_SRC = """pattern p(B = 3, H = 4, S = 64, D = 16)
    q : [B, H, D] bf16 replicated
    k : [B, S / W, H, D] bf16
    v : [B, S / W, H, D] bf16
    kv_len : {decl}
    part = attention_partial(q, k, v, kv_len{more})
    return part
"""


@pytest.mark.parametrize("decl,more,words", [
    ("[B] fp32 replicated", "", ["takes int32 tensors; its operand kv_len is fp32",
                                 "declare kv_len as int32"]),
    ("[B + 1] int32 replicated", "", ["one length per sequence: [3]; kv_len is [4]",
                                      "declare kv_len : [B] int32 replicated"]),
    ("[B, 1] int32 replicated", "", ["kv_len is [3, 1]", "declare kv_len : [B] int32"]),
    ("[B] int32", "", ["must be the same on every rank", "kv_len is local",
                       "declare kv_len : [B] int32 replicated"]),
    ("[B] int32 replicated", ", kv_len", ["attention_partial takes 3 to 4 tensor argument(s), "
                                          "got 5", "attention_partial(q, k, v[, kv_len])"]),
])
def test_bad_lengths_are_refused_at_their_line(decl, more, words):
    with pytest.raises(PatternError) as e:
        parse_text(VARLEN_SRC.format(decl=decl, more=more), "p.tl").bind({}, 2)
    text = str(e.value)
    assert "p.tl:6" in text
    for w in words:
        assert w in text


def test_bad_lengths_are_refused_in_the_python_dsl():
    import tilelink as tk

    @tk.pattern
    def p(B=3, H=4, S=64, D=16):
        q = tk.input((B, H, D), "bf16", placement="replicated")
        k = tk.input((B, S / tk.W, H, D), "bf16")
        v = tk.input((B, S / tk.W, H, D), "bf16")
        n = tk.input((B,), "int64", placement="replicated")
        return tk.attention_partial(q, k, v, n)

    with pytest.raises(PatternError, match="takes int32 tensors; its operand n is int64"):
        p.bind({}, 2)


def test_random_lengths_span_every_rank_and_split():
    # `tilelink run --check` and the bench draw kv_len over 0 .. W * S (the default random
    # integers, 0 .. 3, would end every sequence in rank 0's first block)
    from tilelink.runtime.reference import make_inputs

    bp = load_text(VARLEN).bind({"B": 64, "S": 4096}, 4)
    lens = make_inputs(bp, 0)["kv_len"][0]
    assert int(lens.min()) >= 0 and int(lens.max()) <= 4096
    assert {int(x) // 1024 for x in lens} >= {0, 1, 2, 3}  # lengths ending on every rank


def test_decode_counts_4_h_d_flops_per_key_of_the_ranks_slice():
    from tilelink.bench.report import flops_per_rank

    # W = 2, 16 keys a sequence: 8 a rank; 2 sequences x 4 query heads, D = 8; each query
    # row's q k^T and p v over the rank's 8 keys, 2 * D flops each: 4 * 2 * 4 * 8 * 8 (the
    # combine's weighted sums add none)
    sizes = {"B": 2, "H": 4, "S": 16, "D": 8}
    assert flops_per_rank(_bp(MHA, sizes, 2)) == 4 * 2 * 4 * 8 * 8 == 2048
    # 2 key heads serving the 4 query heads: every query head's scores still computed
    assert flops_per_rank(_bp(GQA, {**sizes, "HKV": 2}, 2)) == 2048
    # ragged: the lengths are known only when the call runs; their bound, every key, counts
    varlen = _bp(EXAMPLES / "flash_decode_varlen.tl", {**sizes, "HKV": 2}, 2)
    assert flops_per_rank(varlen) == 2048
    # W = 4: 4 keys a rank
    assert flops_per_rank(_bp(MHA, sizes, 4)) == 4 * 2 * 4 * 4 * 8


# ---- the non-overlapped plan's attention -------------------------------------------------------
# torch's fused SDPA kernels (what a user runs) on GPUs in half precision, the fp32 reference
# everywhere else; the same values either way.

@pytest.mark.parametrize("offset", [0, 16, 48])
def test_causal_sdpa_sees_the_keys_up_to_each_querys_global_position(offset):
    # a sequence-parallel q shard at rows offset.. against all 64 gathered keys
    g = torch.Generator().manual_seed(offset)
    q, k, v = (torch.randn(n, 2, 8, generator=g) for n in (16, 64, 64))
    torch.testing.assert_close(_sdpa(q, k, v, 1, offset),
                               _attend(q, k, v, 1, offset, torch.float32))
    torch.testing.assert_close(_sdpa(q, k, v, 0, 0), _attend(q, k, v, 0, 0, torch.float32))


def test_the_reference_and_cpu_tensors_never_take_the_vendor_path():
    half = torch.zeros(2, 2, 2, dtype=torch.bfloat16)
    assert not _vendor(half, exact=False)  # on the CPU
    assert not _vendor(half, exact=True)
    # neither flash nor memory-efficient attention runs on the CPU: the plan keeps _partial
    assert _partial_sdpa(*(torch.zeros(1, 2, 8), torch.zeros(1, 4, 2, 8),
                           torch.zeros(1, 4, 2, 8))) is None


def test_the_plans_bound_allows_weights_held_in_the_inputs_dtype():
    bp = load_pattern(str(EXAMPLES / "flash_decode.tl")).bind({}, 2)
    out = bp.pattern.outputs[0]
    assert output_bound(bp, out, plan=True).normwise > output_bound(bp, out).normwise


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_fused_partial_matches_the_reference_on_a_gpu(dtype):
    g = torch.Generator(device="cuda").manual_seed(0)
    q = torch.randn(2, 8, 128, generator=g, device="cuda").to(dtype)
    k, v = (torch.randn(2, 4096, 8, 128, generator=g, device="cuda").to(dtype)
            for _ in range(2))
    got, want = _partial_sdpa(q, k, v), _partial(q, k, v)
    assert got is not None and got.dtype == torch.float32 and got.shape == want.shape
    torch.testing.assert_close(got[..., -1], want[..., -1], atol=1e-3, rtol=1e-3)  # lse
    torch.testing.assert_close(got[..., :-1], want[..., :-1], atol=2e-2, rtol=2e-2)
