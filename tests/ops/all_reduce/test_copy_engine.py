"""all_reduce on the copy engine (`comm=copy_engine`): the GEMM stages its partial and counts
its tiles per chunk of rows; the copy engine ships each counted chunk to every peer; every
rank sums the W partials. Checked in the emulated world on sizes off the tiles, at W = 1-4,
back to back with random delays, with the sum inside the GEMM's kernel or after it and on
the library's GEMM; the copy engine's program order; compiled for every GPU target (gemm=ws
on cuda:90); a dropped signal reported; and the default resource stays SMs."""

from __future__ import annotations

import pytest

from tilelink.codegen import render_triton
from tilelink.codegen.compile import emit_stage, load_module
from tilelink.errors import ConfigError, HangError
from tilelink.frontend import load_text
from tilelink.runtime import check, emulate
from tilelink.schedule import get_target, make_schedule
from tilelink.tune.space import _canonical, candidates, extents

from ...conftest import EXAMPLES, run_broken

AR = load_text(EXAMPLES / "gemm_ar.tl")
CE = {"comm": "copy_engine"}
# 100 rows in 32-row chunks (the emulated tiles): 4 chunks, the last one short
RAGGED = {"M": 100, "N": 72, "K": 96}


@pytest.mark.slow
@pytest.mark.parametrize("world", [1, 2, 3, 4])
@pytest.mark.parametrize("reduce_after", ["0", "1"])
def test_matches_the_reference(world, reduce_after):
    s, res = emulate(AR, world, RAGGED, CE | {"reduce_after": reduce_after}, calls=2)
    assert "all_reduce/copy_engine (one-shot)" in s.kernel
    rep = check(s.bound, res)
    assert rep.ok, rep.lines


@pytest.mark.slow
def test_delayed_back_to_back_calls_and_the_library_gemm():
    s, res = emulate(AR, 4, RAGGED, CE, calls=5, delays=True, seed=11)
    assert check(s.bound, res).ok
    # gemm=library: the library's GEMM, then a pass kernel staging and counting its tiles
    s, res = emulate(AR, 3, RAGGED, CE | {"gemm": "library", "reduce_after": "1"}, calls=4,
                     delays=True, seed=12)
    assert "gemm/library" in s.render()
    rep = check(s.bound, res)
    assert rep.ok, rep.lines


def _program(world, reduce_after, rank, epoch=5):
    s = make_schedule(AR.bind({"M": 1000, "N": 256, "K": 96 * world}, world),
                      get_target("cuda:90"), CE | {"reduce_after": reduce_after,
                                                   "comm_block_m": "256", "comm_block_n": "64"})
    mod = load_module(render_triton(s))
    return mod, mod.copy_engine_ops(rank, epoch, {"out_send": "SEND"})


def test_the_copy_engine_ships_each_chunk_to_every_peer_in_row_order():
    mod, ops = _program(4, "1", rank=2)
    # first every peer's release (the next rank first), then per chunk of 256 rows: its
    # counter, then one copy and one signal per peer; no copy to itself (read in place)
    assert [o[:4] for o in ops[:3]] == [("wait", 2, "ctl", 4 + 4 + d) for d in (3, 0, 1)]
    rest = ops[3:]
    assert len(rest) == 4 * (1 + 2 * 3)  # 1000 rows: 4 chunks, the last one short
    for j in range(4):
        wait, *sends = rest[j * 7:(j + 1) * 7]
        assert wait == ("wait", 2, "out_count", j, 5 * mod.OUT_TILES_PER_CHUNK[j])
        copies, signals = sends[0::2], sends[1::2]
        rows = min(256, 1000 - j * 256)
        for d, c, sig in zip((3, 0, 1), copies, signals):
            # rows j*256.. of this call's send buffer into slab 2 of d's stage buffer
            assert c == ("copy", "SEND", (1 * 1000 + j * 256) * 256, rows * 256, d,
                         "out_stage", ((1 * 4 + 2) * 1000 + j * 256) * 256)
            assert sig == ("signal", d, "out_ready", 2 * mod.OUT_CHUNKS + j, 5)
    # every tile of this rank is counted in the chunks its rows meet, once per call
    assert sum(mod.OUT_TILES_PER_CHUNK) >= -(-1000 // mod.BM) * -(-256 // mod.BN)


def test_the_reduction_inside_the_gemm_kernel_gets_its_own_partial_copied_too():
    _, ops = _program(2, "0", rank=0)
    copies = [o for o in ops if o[0] == "copy"]
    assert sorted({o[4] for o in copies}) == [0, 1]  # the own slab is the copy engine's too


@pytest.mark.parametrize("target,stage,extra", [
    ("cuda:90", "ptx", {}), ("cuda:80", "ptx", {}), ("hip:gfx942", "amdgcn", {}),
    ("cuda:90", "ptx", {"gemm": "ws"}), ("cuda:90", "ptx", {"reduce_after": "0"})])
def test_it_compiles(target, stage, extra):
    s = make_schedule(AR.bind({"M": 360, "N": 1000, "K": 1200}, 3), get_target(target),
                      CE | extra)
    assert emit_stage(render_triton(s), get_target(target), stage)


@pytest.mark.slow
def test_a_dropped_signal_is_reported_not_hung():
    s = make_schedule(AR.bind({"M": 64, "N": 32, "K": 64}, 2), get_target("interp"), CE)
    src = render_triton(s, fault="drop_notify")
    assert src.count("fault injected (drop_notify)") == 1  # the copy engine's ready signal
    with pytest.raises(HangError) as err:
        run_broken(s, src)
    text = str(err.value)
    assert "waits for the copy engine of a rank to deliver its partial chunk of c" in text
    assert "all_reduce at" in text and "chunk 0 of the rows" in text


def test_the_default_stays_on_sms_and_the_tuner_tries_the_copy_engine():
    # (the overlapped default; the cost model's default there is the library's plan)
    bp = AR.bind({"M": 4096, "N": 8192, "K": 8192}, 2)
    assert make_schedule(bp, get_target("cuda:90"), allow_fallback=False).config.comm == "sm"
    cands = candidates(bp, get_target("cuda:90"))
    assert any(c.comm == "copy_engine" for c in cands)
    assert all(c.fuse_reduce == 0 for c in cands if c.comm == "copy_engine")


@pytest.mark.parametrize("extra,words", [
    ({"fuse_reduce": "1"}, "fuse_reduce=1 does nothing with these lowerings"),
    ({"allreduce": "two_shot"}, "its lowerings: all_reduce/sm (one-shot), all_reduce/sm "
                                "(two-shot), all_reduce/copy_engine (one-shot)"),
    ({"capturable": "1"}, "capturable=1 does nothing")])
def test_what_it_does_not_do_is_refused_by_name(extra, words):
    with pytest.raises(ConfigError, match=words.replace("(", r"\(").replace(")", r"\)")):
        make_schedule(AR.bind({"M": 512, "N": 256, "K": 256}, 2), get_target("cuda:90"),
                      CE | extra)


@pytest.mark.slow
def test_naming_the_copy_engine_starts_from_its_own_defaults():
    # the default never takes it, so the SM default's knobs (in-kernel chunks of 128 rows,
    # no flatten) would be a poor start: its own are the sum after the GEMM, flatten=1 and
    # chunks of up to 512 rows; knobs the user names still win
    bp = AR.bind({"M": 4096, "N": 8192, "K": 4096}, 2)
    cfg = make_schedule(bp, get_target("cuda:90"), CE).config
    assert (cfg.reduce_after, cfg.flatten, cfg.comm_block_m, cfg.comm_block_n) == (1, 1, 512, 32)
    cfg = make_schedule(bp, get_target("cuda:90"), CE | {"reduce_after": "0",
                                                          "comm_block_n": "16"}).config
    assert (cfg.reduce_after, cfg.comm_block_m, cfg.comm_block_n) == (0, 512, 16)


def test_the_tuner_space_holds_each_resources_own_default():
    # the grid's chunks (128 or 2048 rows x 128 columns) give a copy-engine reduction only
    # 128-row chunks (2048 x 128 spills the reduce tile); its own default (512 x 32, flatten,
    # the sum after the GEMM: 0.41 ms against 0.50 for the best 128-row one at M = 4096 on
    # 2x H200) is a candidate too, as is the SM default
    bp = AR.bind({"M": 4096, "N": 8192, "K": 4096}, 2)
    target = get_target("cuda:90")
    cands = candidates(bp, target)
    for overrides in ({}, CE):
        own = _canonical(make_schedule(bp, target, overrides).config, bp, extents(bp), target)
        assert own in cands, own
    assert any(c.comm == "copy_engine" and c.comm_block_m == 512 for c in cands)
