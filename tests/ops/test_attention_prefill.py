"""attention's kernel (FlashAttention-2's forward) on gathered keys and values: checked
against the torch reference in the emulated world (W = 1..4, causal and not, G = 1, 4, 8,
ragged slices, D = 64 and 128, bf16 and fp16, both comm resources), its waits per block of
keys (own rows first, a causal tile never waiting for keys it does not read), the plan's
per-block rule, its compilation for every GPU target, and the cost model's view of it."""

from __future__ import annotations

import re

import pytest
import torch

from tilelink.cli.main import main
from tilelink.codegen import render_triton
from tilelink.codegen.compile import compile_module
from tilelink.errors import ConfigError
from tilelink.frontend import load_text
from tilelink.ops.attention import _attend
from tilelink.runtime import check
from tilelink.runtime.emulated import run_emulated
from tilelink.runtime.reference import make_inputs
from tilelink.schedule import get_target, make_schedule

from ..conftest import EXAMPLES, run_argv

CAUSAL = EXAMPLES / "sp_attention_causal.tl"
SMALL = {"comm": "sm", "block_m": "16", "block_n": "16", "comm_block_m": "16"}


def _pattern(tmp_path, causal: int):
    """sp_attention_causal.tl with `causal` as given (HKV = H: one key head a query head)."""
    path = tmp_path / f"sp_attention_{causal}.tl"
    path.write_text(CAUSAL.read_text().replace("causal = 1", f"causal = {causal}"))
    return path


# (causal, W, sizes, config): S / W query rows a rank, most not a multiple of the blocks
RUNS = [
    # MHA, W = 1, 40 rows: 2 full blocks and a ragged one
    (0, 1, {"S": 40, "H": 2, "HKV": 2, "D": 64}, {}),
    # G = 4, causal, W = 2, 24 rows a rank: a key block straddles the ranks' rows
    (1, 2, {"S": 2 * 24, "H": 4, "HKV": 1, "D": 64}, {}),
    # G = 8, W = 3, D = 128, fp16; key blocks of two chunks each
    (0, 3, {"S": 3 * 20, "H": 8, "HKV": 1, "D": 128, "dtype": "fp16"},
     {"block_n": "32"}),
    # MHA, causal, W = 4, 12 rows a rank (fewer than a block)
    (1, 4, {"S": 4 * 12, "H": 2, "HKV": 2, "D": 64}, {}),
    # G = 4, W = 4, the copy engine's gather
    (0, 4, {"S": 4 * 16, "H": 4, "HKV": 1, "D": 64}, {"comm": "copy_engine"}),
    # G = 4, causal, W = 3, D = 128, 32-row query blocks
    (1, 3, {"S": 3 * 40, "H": 8, "HKV": 2, "D": 128}, {"block_m": "32"}),
]


@pytest.mark.parametrize("case", [pytest.param(i, marks=() if i in (0, 1) else pytest.mark.slow)
                                  for i in range(len(RUNS))])
def test_the_kernel_checks_against_the_reference(case, tmp_path, capsys):
    # two calls: the gathered buffers swap and the signals' epochs advance
    causal, world, sizes, config = RUNS[case]
    assert main(run_argv(_pattern(tmp_path, causal), world, sizes, SMALL | config, 2)) == 0
    out = capsys.readouterr().out
    assert "check: OK" in out and "comm=none" not in out


def test_the_runs_cover_what_they_claim(tmp_path):
    seen = set()
    for causal, world, sizes, config in RUNS:
        bp = load_text(_pattern(tmp_path, causal)).bind({k: str(v) for k, v in sizes.items()},
                                                        world)
        s = make_schedule(bp, get_target("interp"), SMALL | config)
        assert s.kernel is not None and s.config.comm != "none"
        seen.add((causal, world, sizes["H"] // sizes["HKV"], sizes["D"],
                  sizes["S"] // world % s.config.block_n != 0))
    assert {c for c, *_ in seen} == {0, 1}
    assert {w for _, w, *_ in seen} == {1, 2, 3, 4}
    assert {g for _, _, g, *_ in seen} == {1, 4, 8}
    assert {d for *_, d, _ in seen} == {64, 128}
    assert any(ragged for *_, ragged in seen)


def test_the_plan_shows_the_per_block_rule(capsys):
    assert main(["compile", str(CAUSAL), "--target", "interp", "-W", "2", "-D", "S=128",
                 "--emit", "plan"]) == 0
    out = capsys.readouterr().out
    assert "loop inside each tile: n: 4 steps (128 in tiles of 32)" in out
    assert "consumer reads k_full[rank, n, segment(h), :]" in out
    assert "loop:    per step of n (a loop inside the consumer's tile)" in out
    # a step of 32 keys waits on the one chunk of 32 rows holding it
    assert re.search(r"\*\s+\*\s+\*\s+3\s+slots 3 -> ranks 1", out), out


def _probed(source: str) -> str:
    """`source` with a record, on each rank, of every wait on key chunks (their slots), every
    block of keys a tile reads (its first key) and every tile's start (its first query):
    lines of "what value" in the file $SP_PROBE.<rank>."""
    out = []
    for line in source.splitlines():
        pad = line[:len(line) - len(line.lstrip())]
        if line.lstrip().startswith("tok = tld.wait_flat(sig_k_full_ptr + w_slot"):
            # one wait on the chunk slots first .. end - 1
            out.append(f"{pad}_probe(me, 'wait', w_chunk_first * 65536 + w_chunk_end)")
        if line.lstrip().startswith("nblk = "):
            out.append(f"{pad}_probe(me, 'tile', m0)")
        out.append(line)
        if line.lstrip().startswith("kt = tl.load("):
            out.append(f"{pad}_probe(me, 'block', n0)")
    assert sum("_probe(" in x for x in out) == 3, "the kernel's lines changed: fix the probe"
    return "\n".join(out) + '''


def _probe(me, what, value):
    import os

    def plain(x):
        return int(getattr(getattr(x, "handle", None), "data", x))

    with open(f"{os.environ['SP_PROBE']}.{plain(me)}", "a") as f:
        f.write(f"{what} {plain(value)}\\n")
'''


def _tiles(path) -> list[list[tuple[int, list[int]]]]:
    """Per tile of a rank's record: its blocks in order, each (first key, the chunk slots
    waited on since the previous block)."""
    tiles, waits = [], []
    for line in path.read_text().splitlines():
        what, value = line.split()
        if what == "tile":
            tiles.append([])
        elif what == "wait":
            waits += range(int(value) // 65536, int(value) % 65536)
        else:
            tiles[-1].append((int(value), waits))
            waits = []
    return tiles


def test_a_tile_waits_before_each_block_for_its_chunks_own_rows_first(tmp_path, monkeypatch):
    # causal, W = 3, 32 rows a rank in blocks of 16 keys, chunks of 16 rows: rank r's tiles
    # read r's own blocks first, then 0, 1, ... (the order its gather lands them), wait
    # before each block for that block's chunk only, and never for a later rank's keys
    world, rows, block = 3, 32, 16
    bp = load_text(CAUSAL).bind({"S": str(world * rows), "H": "1", "HKV": "1", "D": "64"},
                                world)
    s = make_schedule(bp, get_target("interp"), SMALL)
    monkeypatch.setenv("SP_PROBE", str(tmp_path / "probe"))
    res = run_emulated(_probed(render_triton(s)), world, [make_inputs(s.bound, 0)], timeout=300)
    assert check(s.bound, res).ok
    for r in range(world):
        tiles = _tiles(tmp_path / f"probe.{r}")
        assert len(tiles) == rows // block
        for i, blocks in enumerate(tiles):
            m = len(tiles) - 1 - i  # causal: the last query blocks (the longest) run first
            last = r * rows + (m + 1) * block  # keys up to the tile's last query
            nblk = -(-last // block)
            firsts = [n0 for n0, _ in blocks]
            own = r * rows // block
            want = [(own + i) % nblk * block for i in range(nblk)]
            assert firsts == want, (r, m, firsts)
            for n0, waited in blocks:
                assert waited == [n0 // 16], (r, m, n0, waited)  # that block's chunk, no other
            assert all(n0 < last for n0 in firsts)  # no block past the causal boundary


def test_a_tile_waits_once_for_a_chunk_of_several_blocks(tmp_path, monkeypatch):
    # chunks of 32 rows, blocks of 16 keys: a tile waits for a chunk before its first block
    # of it and not again for the chunk's second block (a wait is an acquire load and a CTA
    # barrier); a block of a chunk not waited for yet by this tile still waits first
    world, rows, block, chunk = 3, 32, 16, 32
    bp = load_text(CAUSAL).bind({"S": str(world * rows), "H": "1", "HKV": "1", "D": "64"},
                                world)
    s = make_schedule(bp, get_target("interp"), SMALL | {"comm_block_m": str(chunk)})
    monkeypatch.setenv("SP_PROBE", str(tmp_path / "probe"))
    res = run_emulated(_probed(render_triton(s)), world, [make_inputs(s.bound, 0)], timeout=300)
    assert check(s.bound, res).ok
    skipped = 0
    for r in range(world):
        for blocks in _tiles(tmp_path / f"probe.{r}"):
            before = None
            for n0, waited in blocks:
                c = n0 // chunk
                assert waited == ([] if c == before else [c]), (r, n0, waited)
                skipped += c == before
                before = c
    assert skipped > 0  # the case has blocks sharing a chunk


def test_a_causal_rank_never_waits_for_a_later_ranks_keys(monkeypatch):
    # rank 1 never launches: rank 0's causal tiles read only rank 0's keys, so it finishes
    # its call, right; a tile waiting for every gathered key at its start would hang
    world = 2
    bp = load_text(CAUSAL).bind({"S": "64", "H": "2", "HKV": "1", "D": "64"}, world)
    s = make_schedule(bp, get_target("interp"), SMALL)
    ins = make_inputs(s.bound, 0)
    res = run_emulated(render_triton(s), world, [ins], timeout=120, fault="skip_rank:1")
    q, k, v = (ins[n][0] for n in ("q", "k", "v"))
    want = _attend(q, k, v, 1, 0, torch.float32)
    got = res.outputs[0]["o"][0].float()
    assert (got - want).abs().max() < 0.02 * want.abs().max()


@pytest.mark.parametrize("target", ["cuda:90", "cuda:80", "hip:gfx942"])
@pytest.mark.parametrize("layout,sizes", [
    ("plain", {"S": 2 * 1000, "H": 8, "HKV": 8, "D": 64}),
    ("causal", {"S": 2 * 1024, "H": 32, "HKV": 4, "D": 128, "dtype": "fp16"}),
    ("zigzag", {"S": 2 * 1000, "H": 16, "HKV": 2, "D": 128}),
])
def test_the_kernel_compiles(target, layout, sizes, tmp_path):
    bp = load_text(_layout(tmp_path, layout)).bind({k: str(v) for k, v in sizes.items()}, 2)
    s = make_schedule(bp, get_target(target), {"comm": "sm"})
    assert s.kernel is not None
    compiled = compile_module(render_triton(s), get_target(target), f"{s.bound.name}_kernel")
    if target.startswith("cuda"):
        assert "mma" in compiled.asm["ptx"]  # q k and p v on the tensor cores
    else:
        assert compiled.asm["amdgcn"]


@pytest.mark.parametrize("stages", [2, 4])
def test_the_stages_knob_sets_the_kv_blocks_in_flight(stages):
    # the KV loop is software-pipelined `stages` deep: that many K (and V) buffers
    bp = load_text(CAUSAL).bind({"S": "2048", "H": "8", "HKV": "2", "D": "64"}, 2)
    s = make_schedule(bp, get_target("cuda:90"), {"comm": "sm", "block_n": "64",
                                                   "stages": str(stages)})
    compiled = compile_module(render_triton(s), get_target("cuda:90"), f"{s.bound.name}_kernel")
    buffers = set(re.findall(r"memdesc<(\d+)x64x64xbf16", compiled.asm["ttgir"]))
    assert buffers == {str(stages)}


@pytest.mark.parametrize("target,dtype,overrides,want", [
    # H100 / H200: 64-key blocks in 3 stages (measured fastest of the body's tiles)
    ("cuda:90", "bf16", {}, ("128", "64", "3")),
    # 128-key blocks set by the user: 3 stages fit in bf16
    ("cuda:90", "bf16", {"block_n": "128"}, ("128", "128", "3")),
    # fp32 takes twice the bytes: stages down to 2 to fit 232,448 B
    ("cuda:90", "fp32", {}, ("128", "64", "2")),
    # knobs the user set stay as set: 64-key blocks in 4 stages fit
    ("cuda:90", "bf16", {"block_n": "64", "stages": "4"}, ("128", "64", "4")),
    # A100 and MI300X: FlashAttention-2's usual forward tiles
    ("cuda:80", "bf16", {}, ("128", "64", "2")),
    ("hip:gfx942", "bf16", {}, ("128", "64", "2")),
])
def test_the_gpu_tiles_fit_the_targets_shared_memory(target, dtype, overrides, want):
    bp = load_text(CAUSAL).bind({"S": "16384", "H": "32", "HKV": "8", "D": "128",
                                 "dtype": dtype}, 2)
    s = make_schedule(bp, get_target(target), {"comm": "sm"} | overrides)
    cfg = s.config
    assert (str(cfg.block_m), str(cfg.block_n), str(cfg.stages)) == want
    limit = get_target(target).smem_bytes
    if limit is not None and not overrides:
        elem = 4 if dtype == "fp32" else 2
        assert (cfg.block_m + cfg.stages * 2 * cfg.block_n) * 128 * elem <= limit


def test_user_tiles_that_cannot_fit_are_refused_with_the_way_out():
    # fp32, 128-key blocks kept as the user set them: even 2 stages need 327,680 B
    bp = load_text(CAUSAL).bind({"S": "16384", "H": "32", "HKV": "8", "D": "128",
                                 "dtype": "fp32"}, 2)
    with pytest.raises(ConfigError, match="327680 B of shared memory.*fewer stages"):
        make_schedule(bp, get_target("cuda:90"), {"comm": "sm", "block_n": "128"})


def test_the_cost_model_sees_the_kernels_work():
    # the kernel's declared work is what the default weighs against the plan's SDPA
    bp = load_text(CAUSAL).bind({"S": "8192", "H": "32", "HKV": "8", "D": "128"}, 2)
    s = make_schedule(bp, get_target("cuda:90"), {"comm": "sm"})
    op = bp.ops[-1]
    work = s.composition.lowerings[op.result].work(s.composition.sites[op.result])
    sq, skv = 4096, 8192
    # the busiest rank's queries (the last rank's) see keys up to their positions
    seen = sum(min(sq + i + 1, skv) for i in range(sq)) / sq
    assert work.flops == pytest.approx(4.0 * sq * seen * 32 * 128)
    assert work.programs == min(132, (sq // 128) * 32)


def test_attention_counts_4_h_d_flops_per_query_key_pair(tmp_path):
    from tilelink.bench.report import flops_per_rank
    from tilelink.ops.attention import attended_pairs

    h, d = 2, 4  # query heads (HKV = 1: grouped-query heads still count each query head)
    sizes = {"S": 8, "H": h, "HKV": 1, "D": d}
    # causal, W = 2, 4 queries a rank over the 8 gathered keys: rank 0's queries at
    # positions 0..3 see 1 + 2 + 3 + 4 keys, rank 1's at 4..7 see 5 + 6 + 7 + 8 (the lower
    # triangle with its diagonal, 36 in all); the count per rank is their mean, 18
    bp = load_text(CAUSAL).bind(sizes, 2)
    op = bp.ops[-1]
    assert [attended_pairs(bp, op, r) for r in range(2)] == [10, 26]
    assert flops_per_rank(bp) == 4 * h * d * 18 == 576
    # W = 4, 2 queries a rank: rank r's at 2r, 2r + 1 see 4r + 3 keys (3, 7, 11, 15: 36)
    bp = load_text(CAUSAL).bind(sizes, 4)
    assert [attended_pairs(bp, bp.ops[-1], r) for r in range(4)] == [3, 7, 11, 15]
    assert flops_per_rank(bp) == 4 * h * d * 9
    # zig-zag, W = 2: rank 0 holds positions 0, 1, 6, 7 (1 + 2 + 7 + 8 keys), rank 1
    # 2, 3, 4, 5 (3 + 4 + 5 + 6): 18 each
    bp = load_text(_zigzag(tmp_path)).bind(sizes, 2)
    assert [attended_pairs(bp, bp.ops[-1], r) for r in range(2)] == [18, 18]
    assert flops_per_rank(bp) == 576
    # not causal: each rank's 4 queries against all 8 keys
    bp = load_text(_pattern(tmp_path, 0)).bind(sizes, 2)
    assert flops_per_rank(bp) == 4 * h * d * 4 * 8 == 1024
    # one rank's whole sequence, 16 queries and keys, 8 query heads on 2 key heads, D = 8
    one = load_text(EXAMPLES / "attention.tl").bind({"S": 16, "H": 8, "HKV": 2, "D": 8}, 1)
    assert flops_per_rank(one) == 4 * 8 * 8 * 16 * 16
    # Ulysses, W = 2: after the all-to-all a rank holds all 84 positions of 12 / 2 heads
    uly = load_text(EXAMPLES / "sp_ulysses.tl").bind({"S": 84, "H": 12, "D": 16}, 2)
    assert flops_per_rank(uly) == 4 * 6 * 16 * 84 * 84


def _layout(tmp_path, layout: str):
    """The pattern file of `layout`: "plain" (not causal), "causal" or "zigzag" (causal,
    zig-zag placed)."""
    if layout == "zigzag":
        return _zigzag(tmp_path)
    return _pattern(tmp_path, int(layout == "causal"))


@pytest.mark.dist
@pytest.mark.parametrize("world", [2, 4])
@pytest.mark.parametrize("layout", ["plain", "causal", "zigzag"])
@pytest.mark.parametrize("comm", ["sm", "copy_engine"])
def test_sp_attention_on_gpus(world, layout, comm, tmp_path, capsys):
    # 1000 rows a rank (ragged against the 128-row query and 64-key blocks), GQA where causal
    if torch.cuda.device_count() < world:
        pytest.skip(f"needs {world} CUDA GPUs")
    sizes = {"S": world * 1000, "H": 16, "HKV": 16 if layout == "plain" else 4, "D": 128}
    assert main(run_argv(_layout(tmp_path, layout), world, sizes, {"comm": comm}, 3)) == 0
    assert "check: OK" in capsys.readouterr().out


def test_key_heads_that_do_not_divide_the_query_heads_are_refused():
    from tilelink.errors import PatternError

    with pytest.raises(PatternError) as e:
        load_text(CAUSAL).bind({"H": "8", "HKV": "3"}, 2)
    assert "key heads (HKV = 3) to divide the query heads (H = 8)" in str(e.value)
    assert "sp_attention_causal.tl:10" in str(e.value)


def test_the_reference_reads_key_head_h_over_g():
    # against an explicit per-head softmax (not the einsum the reference uses), causal
    torch.manual_seed(0)
    s, t, h, hkv, d, offset = 5, 13, 4, 2, 16, 6
    q, k, v = torch.randn(s, h, d), torch.randn(t, hkv, d), torch.randn(t, hkv, d)
    got = _attend(q, k, v, 1, offset, torch.float32)
    for i in range(s):
        for hi in range(h):
            kh, vh = k[:offset + i + 1, hi // (h // hkv)], v[:offset + i + 1, hi // (h // hkv)]
            w = torch.softmax(kh @ q[i, hi] / d ** 0.5, dim=0)
            assert torch.allclose(got[i, hi], w @ vh, atol=1e-5)


# ---- zig-zag placement -------------------------------------------------------------------


def _zigzag(tmp_path):
    """sp_attention_causal.tl with zigzag = 1: rank r holds blocks r and 2W - 1 - r."""
    path = tmp_path / "sp_attention_zigzag.tl"
    path.write_text(CAUSAL.read_text().replace("causal = 1", "causal = 1, zigzag = 1"))
    return path


def test_the_reference_takes_heads_a_few_at_a_time_with_the_same_result(monkeypatch):
    # a score matrix of 3 heads at a time (8 query heads, 2 key heads): each query head
    # against a softmax written out here, causal from position 13
    import tilelink.ops.attention as attn
    torch.manual_seed(0)
    q, k, v = torch.randn(37, 8, 16), torch.randn(50, 2, 16), torch.randn(50, 2, 16)
    monkeypatch.setattr(attn, "_SCORE_BYTES", 4 * 37 * 50 * 3)
    got = attn._attend(q, k, v, 1, 13, torch.float32)
    for h in range(8):
        s = q[:, h] @ k[:, h // 4].T / 4.0
        s[torch.arange(50)[None, :] > torch.arange(37)[:, None] + 13] = float("-inf")
        want = torch.softmax(s, dim=-1) @ v[:, h // 4]
        assert torch.allclose(got[:, h], want, atol=1e-5), h


def test_zigzag_positions_are_blocks_r_and_2w_minus_1_minus_r():
    from tilelink.ops.attention import positions

    # W = 2, 8 rows a rank: blocks of 4; rank 0 holds blocks 0 and 3, rank 1 blocks 1 and 2
    assert positions(0, 8, 2, 1).tolist() == [0, 1, 2, 3, 12, 13, 14, 15]
    assert positions(1, 8, 2, 1).tolist() == [4, 5, 6, 7, 8, 9, 10, 11]
    assert positions(1, 8, 2, 0).tolist() == list(range(8, 16))


@pytest.mark.parametrize("world,sizes,config", [
    pytest.param(2, {"S": 2 * 32, "H": 2, "HKV": 1, "D": 64}, {}),
    # 24 rows a rank: halves of 12 rows, blocks of 16 keys straddle them
    pytest.param(4, {"S": 4 * 24, "H": 4, "HKV": 2, "D": 64}, {"comm": "copy_engine"},
                 marks=pytest.mark.slow),
])
def test_zigzag_checks_against_the_reference(world, sizes, config, tmp_path, capsys):
    assert main(run_argv(_zigzag(tmp_path), world, sizes, SMALL | config, 2)) == 0
    assert "check: OK" in capsys.readouterr().out


def test_the_zigzag_reference_is_not_the_plain_one(tmp_path):
    # the kernel with the plain placement's positions fails the zig-zag check
    bp = load_text(_zigzag(tmp_path)).bind({"S": "64", "H": "1", "HKV": "1", "D": "64"}, 2)
    s = make_schedule(bp, get_target("interp"), SMALL)
    src = render_triton(s)
    plain = re.sub(r"qpos = tl\.where\(.*\)", "qpos = me * SQ + offs_m", src)
    plain = re.sub(r"kpos = tl\.where\(.*\)", "kpos = offs_n", plain)
    assert plain != src
    ins = [make_inputs(s.bound, 0)]
    assert check(s.bound, run_emulated(src, 2, ins, timeout=120)).ok
    assert not check(s.bound, run_emulated(plain, 2, ins, timeout=120)).ok


def test_zigzag_balances_the_causal_work(tmp_path):
    from tilelink.ops.attention import seen_keys

    sizes = {"S": "4096", "H": "8", "HKV": "8", "D": "64"}
    zz = load_text(_zigzag(tmp_path)).bind(sizes, 4)
    plain = load_text(CAUSAL).bind(sizes, 4)
    # the busiest rank: about half the keys zig-zag, 7/8 of them for the last plain rank
    assert seen_keys(zz, zz.ops[-1]) == pytest.approx(4096 / 2, rel=1e-3)
    assert seen_keys(plain, plain.ops[-1]) == pytest.approx(4096 * 7 / 8, rel=1e-3)


def test_zigzag_needs_two_halves_a_rank(tmp_path):
    from tilelink.errors import PatternError

    with pytest.raises(PatternError, match="zigzag = 1 places two blocks of S / 2 rows"):
        load_text(_zigzag(tmp_path)).bind({"S": "6", "H": "2", "HKV": "2", "D": "16"}, 2)


def test_a_zigzag_tile_skips_the_blocks_it_does_not_see(tmp_path, monkeypatch):
    # W = 2, 32 rows a rank (blocks of 16 rows: rank 0 holds 0 and 3, rank 1 holds 1 and 2),
    # key blocks of 16, chunks of 16: a tile reads, own rows first, exactly the key blocks
    # holding a position at or before its last query's, each after waiting for its chunk
    from tilelink.ops.attention import positions

    world, rows, block = 2, 32, 16
    bp = load_text(_zigzag(tmp_path)).bind({"S": str(world * rows), "H": "1", "HKV": "1",
                                            "D": "64"}, world)
    s = make_schedule(bp, get_target("interp"), SMALL)
    monkeypatch.setenv("SP_PROBE", str(tmp_path / "probe"))
    res = run_emulated(_probed(render_triton(s)), world, [make_inputs(s.bound, 0)], timeout=300)
    assert check(s.bound, res).ok
    kpos = torch.cat([positions(r, rows, world, 1) for r in range(world)])
    skipped = 0
    for r in range(world):
        qpos = positions(r, rows, world, 1)
        tiles = _tiles(tmp_path / f"probe.{r}")
        for i, blocks in enumerate(tiles):
            m = len(tiles) - 1 - i  # causal: the last query blocks run first
            last = int(qpos[m * block:(m + 1) * block].max())
            nblk = world * rows // block
            order = [(r * rows // block + i) % nblk * block for i in range(nblk)]
            want = [n0 for n0 in order if int(kpos[n0:n0 + block].min()) <= last]
            assert [n0 for n0, _ in blocks] == want, (r, m, blocks)
            assert all(waited == [n0 // 16] for n0, waited in blocks)
            skipped += nblk - len(want)
    assert skipped  # (the case has blocks to skip)


@pytest.mark.parametrize("w,measured", [(2, {"copy_engine": 1.266, "sm": 1.898, "none": 1.571}),
                                        (4, {"copy_engine": 0.798, "none": 1.035})])
def test_the_default_takes_the_plan_measured_faster(w, measured):
    # 4x H100 (2026-11-27), causal sequence-parallel attention S = 8192, 32 / 8 heads, D = 128,
    # ms per call: the kernel (gathering on the copy engine, or on SMs) against the
    # non-overlapped plan (NCCL all-gather + SDPA); the default must not take the slower one
    from dataclasses import replace

    from tilelink.frontend import load_pattern
    from tilelink.schedule import get_target
    from tilelink.schedule.schedule import default_config

    bp = load_pattern(str(EXAMPLES / "sp_attention_causal.tl")).bind(
        {"S": 8192, "H": 32, "HKV": 8, "D": 128}, w)
    chosen, why = default_config(bp, replace(get_target("cuda:90"), device="NVIDIA H100"))
    assert chosen.comm in measured and measured[chosen.comm] == min(measured.values()), why
