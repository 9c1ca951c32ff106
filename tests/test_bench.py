"""tilelink bench: what runs without a GPU (records, ratios, table, JSON, chart, CLI refusal,
FLOP counting, timing logic, the fp32 reference over gloo), and end-to-end GPU runs (dist)."""

from __future__ import annotations

import io
import json
import os
import socket

import pytest
import torch

from tilelink.bench import report, timing
from tilelink.bench.report import (
    BenchResult,
    Progress,
    comm_bytes_per_rank,
    dump_json,
    flops_per_rank,
    format_detail,
    format_markdown_section,
    format_table,
    load_json,
)
from tilelink.cli.main import main
from tilelink.frontend import load_pattern
from tilelink.runtime.dist_reference import make_local_inputs
from tilelink.runtime.reference import integer_values
from tilelink.schedule import cost

from .conftest import EXAMPLES, ROOT

AG = str(EXAMPLES / "ag_gemm.tl")
RS = str(EXAMPLES / "gemm_rs.tl")


def _result(**steady) -> BenchResult:
    ms = {"tilelink": 0.80, "nccl_cublas": 1.00, "async_tp": 0.90, "gemm": 0.70,
          "nccl_comm": 0.30, "ce_comm": 0.20}
    ms.update(steady)
    ms = {k: v for k, v in ms.items() if v is not None}
    return BenchResult(pattern="ag_gemm", ops="all_gather>gemm",
                       sizes={"M": 8192, "N": 8192, "K": 8192, "dtype": "bf16"}, world=2,
                       flops_per_rank=2 * 8192 * 4096 * 8192,
                       comm_bytes_per_rank=4096 * 8192 * 2, config="comm=copy_engine",
                       steady_ms=ms, single_ms={"tilelink": 0.95},
                       max_abs_err={"tilelink": 0.5}, rel_err={"tilelink": 1e-3})


# ---------------------------------------------------------------- FLOPs and bytes


@pytest.mark.parametrize("w", [1, 2, 4])
@pytest.mark.parametrize("m,n,k", [(8192, 8192, 8192), (2048, 28672, 8192), (1024, 8192, 8192)])
def test_flops_and_bytes_ag_gemm(w, m, n, k):
    bp = load_pattern(AG).bind({"M": m, "N": n, "K": k}, w)
    assert flops_per_rank(bp) == 2 * m * (n // w) * k
    assert comm_bytes_per_rank(bp) == (w - 1) * (m // w) * k * 2  # peer shards of a, bf16


@pytest.mark.parametrize("w", [1, 2, 4])
@pytest.mark.parametrize("m,n,k", [(8192, 8192, 28672), (2048, 8192, 28672)])
def test_flops_and_bytes_gemm_rs(w, m, n, k):
    bp = load_pattern(RS).bind({"M": m, "N": n, "K": k}, w)
    assert flops_per_rank(bp) == 2 * m * n * (k // w)
    assert comm_bytes_per_rank(bp) == (w - 1) * (m // w) * n * 2  # peer partials of my rows


# ---------------------------------------------------------------- ratios


def test_floor_is_max_of_gemm_and_fastest_comm():
    r = _result()
    assert r.comm_ms() == 0.20 and r.floor_ms() == 0.70
    assert _result(ce_comm=None, nccl_comm=0.9).floor_ms() == 0.9       # comm bound
    assert _result(nccl_comm=None).floor_ms() == 0.70
    assert _result(nccl_comm=None, ce_comm=None).floor_ms() == 0.70      # no comm measured
    assert _result(gemm=None).floor_ms() is None


def test_ratios_and_rates():
    r = _result()
    assert r.vs_floor() == pytest.approx(0.80 / 0.70)
    assert r.speedup("nccl_cublas") == pytest.approx(1.25)
    assert r.speedup("async_tp") == pytest.approx(0.90 / 0.80)
    assert r.tflops() == pytest.approx(2 * 8192 * 4096 * 8192 / 0.8e-3 / 1e12)
    assert r.comm_gbps("ce_comm") == pytest.approx(4096 * 8192 * 2 / 0.2e-3 / 1e9)
    assert r.ok and r.label == "AG-GEMM" and r.shape == "M=8192 N=8192 K=8192"
    missing = _result(tilelink=None, async_tp=None)
    assert missing.speedup("async_tp") is None and missing.tflops() is None
    assert not missing.ok


def test_failed_row_is_marked():
    r = _result()
    r.failed["tilelink"] = "MISMATCH vs fp32 reference: max abs err 3e+10"
    assert not r.ok
    table = format_table([r])
    assert "FAILED" in table
    assert "TileLink FAILED" in format_detail(r)
    r2 = _result()
    r2.failed["async_tp"] = "RuntimeError: boom"
    assert r2.ok and "torch async-TP failed" in format_table([r2])


# ---------------------------------------------------------------- table, JSON


def test_table_has_every_number():
    rows = [_result(), _result(tilelink=1.2)]
    rows[1].ops, rows[1].pattern = "gemm>reduce_scatter", "gemm_rs"
    text = format_table(rows)
    lines = text.splitlines()
    assert len(lines) == 3 and "TileLink ms" in lines[0] and "× async-TP" in lines[0]
    assert "AG-GEMM" in lines[1] and "GEMM-RS" in lines[2]
    assert "1.25×" in lines[1] and "1.14" in lines[1]  # speedup over NCCL+cuBLAS, TL/floor
    assert "0.83×" in lines[2]                          # slower than NCCL+cuBLAS: below 1
    md = format_table(rows, markdown=True).splitlines()
    assert all(line.count("|") == len(report.COLUMNS) + 1 for line in md)
    detail = format_detail(rows[0])
    for key, name in report.NAMES.items():
        assert (name in detail) == (key in rows[0].steady_ms or key == "floor"), key
    assert "GB/s" in detail and "TFLOP/s" in detail


def test_the_bar_is_the_fastest_baseline():
    """A GEMM-AR row: cuBLAS + torch's symmetric-memory two-shot all-reduce beats NCCL +
    cuBLAS, so it is the bar: `× best` and the JSON's speedup_over_best are over it, and a
    TileLink slower than it reads below 1 there while still above 1 over NCCL+cuBLAS."""
    r = _result(tilelink=0.30, nccl_cublas=0.33, async_tp=None, symm_one_shot=0.31,
                symm_two_shot=0.29)
    r.ops, r.pattern = "gemm>all_reduce", "gemm_ar"
    assert r.best_baseline() == "symm_two_shot" and r.symm_ms() == 0.29
    assert r.speedup("nccl_cublas") == pytest.approx(1.1)
    assert r.speedup_best() == pytest.approx(0.29 / 0.30)
    header, row = format_table([r]).splitlines()
    assert "× best" in header and "symm-mem ms" in header
    assert "0.97×" in row and "1.10×" in row and "0.290" in row
    assert "the bar: cuBLAS+symm-mem 2-shot" in format_detail(r)
    derived = json.loads(dump_json([r], {}))["results"][0]["derived"]
    assert derived["best_baseline"] == "symm_two_shot"
    assert derived["speedup_over_best"] == pytest.approx(0.29 / 0.30)
    assert _result(tilelink=None).speedup_best() is None
    assert _result(nccl_cublas=None, async_tp=None).best_baseline() is None


def test_json_round_trip(tmp_path):
    rs = [_result(), _result(async_tp=None)]
    rs[1].failed["async_tp"] = "RuntimeError: x"
    meta = {"date": "2026-11-22", "host": "h", "command": "tilelink bench --suite design"}
    path = tmp_path / "b.json"
    dump_json(rs, meta, str(path))
    raw = json.loads(path.read_text())
    assert raw["results"][0]["derived"]["speedup_over_nccl_cublas"] == pytest.approx(1.25)
    assert raw["results"][0]["derived"]["floor_ms"] == pytest.approx(0.70)
    meta2, back = load_json(str(path))
    assert meta2 == meta and back == rs


def test_markdown_section_names_how_to_reproduce():
    meta = {"date": "2026-11-22", "gpu": "2x NVIDIA H200", "host": "h", "torch": "2.11.0",
            "triton": "3.6.0", "command": "NCCL_NVLS_ENABLE=0 tilelink bench --suite design"}
    text = format_markdown_section([_result()], meta, "bench.png")
    assert "2026-11-22" in text and "2x NVIDIA H200" in text and "torch 2.11.0" in text
    assert "tilelink bench --suite design" in text and "![" in text and "| AG-GEMM |" in text


def test_collect_meta_runs_without_gpu():
    meta = report.collect_meta("tilelink bench x")
    assert meta["command"] == "tilelink bench x" and "torch" in meta and "date" in meta


# ---------------------------------------------------------------- the bytes floor

ROUTED = str(EXAMPLES / "ep_moe_routed.tl")
H100_NAME = "NVIDIA H100 80GB HBM3"
SAVED_EP = ROOT / "bench-results" / "2026-11-27-d1d9b5e-ep_moe_routed-t4096-w2-h100.json"


def _markdown_row(out: str) -> dict:
    """The first row of the markdown table in `out`, by column."""
    lines = [x for x in out.splitlines() if x.startswith("| ")]
    cells = [c.strip() for c in lines[1].strip("|").split("|")]
    return dict(zip(report.COLUMNS, cells))


def test_routed_bytes_of_a_small_routing_by_hand():
    # W = 3, two tokens of two copies each, slots of CAP = 2 rows, rows of 4 bf16 (8 bytes)
    bp = load_pattern(ROUTED).bind({"T": 2, "TOPK": 2, "H": 4, "CAP": 2}, 3)
    dest = [torch.tensor(d, dtype=torch.int32)
            for d in ([[1, 1], [1, 2]], [[1, 1], [1, 1]], [[0, 0], [1, 0]])]
    got = report.routed_bytes(bp, integer_values(bp, {"dest": dest}))
    # dispatch, copies per destination at most CAP: rank 0 [0, 3, 1] -> [0, 2, 1] (a copy
    # to rank 1 dropped), rank 1 [0, 4, 0] -> [0, 2, 0], rank 2 [3, 1, 0] -> [2, 1, 0];
    # the combine sends each rank back what it sent: rows s -> d in all
    # [[0, 2, 3], [2, 4, 1], [3, 1, 0]], 8 bytes each
    assert got == [[0, 16, 24], [16, 32, 8], [24, 8, 0]]
    # own rows (the diagonal) cross no link: rank 0 sends 5 rows and receives 5, rank 1
    # 3 and 3, rank 2 4 and 4
    assert report.link_bytes(got) == [40, 24, 32]
    r = _result(tilelink=0.001)
    r.world, r.device, r.routed_bytes = 3, H100_NAME, got
    rate = cost.link_gbs(cost.H100, 2)[0]
    assert r.bytes_floor_ms() == pytest.approx(40 / (rate * 1e9) * 1e3)
    assert r.vs_bytes_floor() == pytest.approx(0.001 / r.bytes_floor_ms())
    row = dict(zip(report.COLUMNS, report.table_rows([r])[0]))
    assert row["bytes floor ms"] == f"{r.bytes_floor_ms():.3f}"
    assert row["TL/bytes floor"] == f"{r.vs_bytes_floor():.2f}"
    text = format_table([r])
    assert "bytes floor =" in text and "W = 3: NVIDIA H100 SM stores" in text
    assert "peer_share, 2 peers at once" in text
    detail = format_detail(r)
    assert "bytes floor" in detail and f"TileLink {r.vs_bytes_floor():.2f}× it" in detail
    # an unmeasured GPU has no row in the cost model: no floor rather than a guessed one
    r.device = "Some Other GPU"
    assert r.bytes_floor_ms() is None and "bytes floor =" not in format_table([r])


def test_the_expert_gemm_counts_the_rows_that_landed_not_its_capacity():
    # the same W = 3 routing: the dispatch lands rows [0 + 0 + 2, 2 + 2 + 1, 1 + 0 + 0] =
    # [2, 5, 1] on ranks 0, 1, 2 of their W x CAP = 6 (mean 8 / 3), and each gets back the
    # rows it sent: [3, 2, 3] (mean 8 / 3); the gemm h = recv @ w (H x H) counts 2·rows·H·H
    bp = load_pattern(ROUTED).bind({"T": 2, "TOPK": 2, "H": 4, "CAP": 2}, 3)
    dest = [torch.tensor(d, dtype=torch.int32)
            for d in ([[1, 1], [1, 2]], [[1, 1], [1, 1]], [[0, 0], [1, 0]])]
    filled = report.filled_rows(bp, integer_values(bp, {"dest": dest}))
    assert filled == {"recv": pytest.approx(8 / 3), "back": pytest.approx(8 / 3)}
    assert report.flops_per_rank(bp, filled) == round(2 * 8 / 3 * 4 * 4)
    assert report.flops_per_rank(bp) == 2 * 3 * 2 * 4 * 4  # without the routing: W x CAP
    # a pattern routing nothing by counts fills nothing
    assert report.filled_rows(load_pattern(AG).bind({}, 2), {}) == {}


def test_link_bytes_takes_the_busier_direction():
    # rank 0 sends 10 and receives 1 + 4; rank 1 sends 1 + 2 and receives 10; rank 2 sends
    # 4 and receives 2
    assert report.link_bytes([[5, 10, 0], [1, 7, 2], [4, 0, 9]]) == [10, 10, 4]


def test_link_rate_is_the_cost_models_fastest_mover():
    one, what = cost.link_gbs(cost.H100, 1)
    assert one == max(g for _, g in cost.H100.ce_gbs) and "copy engine" in what
    three, what3 = cost.link_gbs(cost.H100, 3)
    sm = max(g for pts in cost.H100.sm_copy_gbs.values() for _, g in pts)
    assert three == pytest.approx(max(sm * cost.share(cost.H100, "sm", 3),
                                      one * cost.share(cost.H100, "ce", 3)))
    assert three < one and "peer_share, 3 peers at once" in what3
    assert report.link_rate("NVIDIA H200", 2)[0] == max(g for _, g in cost.H200.ce_gbs)
    assert report.link_rate("", 2) is None and report.link_rate("Some GPU", 2) is None


def test_rows_without_routing_are_unchanged(tmp_path):
    bp = load_pattern(AG).bind({}, 2)
    assert report.routed_bytes(bp, report.routing_values(bp, 0)) is None
    r = _result()
    r.device = H100_NAME
    assert r.bytes_floor_ms() is None and r.vs_bytes_floor() is None
    row = dict(zip(report.COLUMNS, report.table_rows([r])[0]))
    assert row["bytes floor ms"] == row["TL/bytes floor"] == "—"
    assert row["floor ms"] == "0.700" and row["TL/floor"] == f"{0.80 / 0.70:.2f}"
    meta = {"date": "2026-11-22", "command": "tilelink bench x"}
    assert "bytes floor" not in format_table([r]).splitlines()[-1]
    assert "bytes floor =" not in format_markdown_section([r], meta)
    assert "bytes floor" not in format_detail(r)
    path = tmp_path / "b.json"
    dump_json([r], meta, str(path))
    derived = json.loads(path.read_text())["results"][0]["derived"]
    assert derived["bytes_floor_ms"] is None and derived["vs_bytes_floor"] is None
    assert derived["floor_ms"] == pytest.approx(0.70)
    assert load_json(str(path))[1] == [r]


def test_routed_row_round_trips_through_json(tmp_path):
    r = _result(tilelink=0.5)
    r.world, r.device, r.routed_bytes = 2, H100_NAME, [[100, 3_000_000], [1_000_000, 0]]
    path = tmp_path / "b.json"
    dump_json([r], {"gpu": "2x " + H100_NAME, "command": "tilelink bench x.tl"}, str(path))
    derived = json.loads(path.read_text())["results"][0]["derived"]
    floor = 3_000_000 / (cost.link_gbs(cost.H100, 1)[0] * 1e9) * 1e3
    assert derived["bytes_floor_ms"] == pytest.approx(floor)
    assert derived["vs_bytes_floor"] == pytest.approx(0.5 / floor)
    assert derived["link_bytes"] == [3_000_000, 3_000_000]
    assert "copy engine" in derived["link_rate"]
    (back,) = load_json(str(path))[1]
    assert back == r and "bytes_floor" not in back.notes  # recorded: nothing recomputed
    bad = json.loads(path.read_text())
    bad["results"][0]["routed_bytes"] = [[1, 2]]
    path.write_text(json.dumps(bad))
    with pytest.raises(TypeError, match="routed_bytes"):
        load_json(str(path))


def test_from_a_saved_ep_run_recomputes_its_routing_and_prints_the_bytes_floor(capsys):
    # the run (d1d9b5e) predates the field: its routing is drawn again from its seed (0)
    assert main(["bench", "--from", str(SAVED_EP), "--markdown"]) == 0
    out = capsys.readouterr().out
    saved = json.loads(SAVED_EP.read_text())["results"][0]
    sizes = {k: v for k, v in saved["sizes"].items() if k != "dtype"}
    bp = load_pattern(ROUTED).bind(sizes, 2)
    # the bench's own inputs, counted here by rows: each rank sends its peer the copies
    # routed there (at most CAP), and the combine sends back what the peer sent it
    dest = [make_local_inputs(bp, r, 0, torch.device("cpu"))["dest"] for r in range(2)]
    to_peer = [min(int((dest[s] == 1 - s).sum()), sizes["CAP"]) for s in range(2)]
    busiest = sum(to_peer) * sizes["H"] * 2
    floor = busiest / (cost.link_gbs(cost.H100, 1)[0] * 1e9) * 1e3
    tl = saved["steady_ms"]["tilelink"]
    row = _markdown_row(out)
    assert row["bytes floor ms"] == f"{floor:.3f}"
    assert row["TL/bytes floor"] == f"{tl / floor:.2f}"
    assert "TL/bytes floor" in out.splitlines()[0]
    assert "W = 2: NVIDIA H100 copy engine, 385 GB/s to one peer" in out


def test_from_recomputes_nothing_it_cannot_trust(tmp_path, capsys):
    saved = json.loads(SAVED_EP.read_text())
    marker = tmp_path / "ran"
    evil = tmp_path / "p.py"
    evil.write_text(f"open({str(marker)!r}, 'w').close()\n")
    for command in (saved["meta"]["command"].replace("examples/ep_moe_routed.tl",
                                                     "examples/no_such.tl"),
                    f"tilelink bench {evil}:ep_moe_routed -W 2 --seed 0",
                    saved["meta"]["command"].replace("examples/ep_moe_routed.tl",
                                                     "examples/ep_moe_topk.tl")):
        saved["meta"]["command"] = command
        path = tmp_path / "old.json"
        path.write_text(json.dumps(saved))
        assert main(["bench", "--from", str(path), "--markdown"]) == 0
        row = _markdown_row(capsys.readouterr().out)
        # a missing file, a Python pattern (reading a JSON never runs its code), another
        # pattern than the one measured: the bytes are not known
        assert row["bytes floor ms"] == row["TL/bytes floor"] == "—", command
        assert row["TileLink ms"] == "6.874"
    assert not marker.exists()


# ---------------------------------------------------------------- TFLOP/s of every compute op

SAVED_AG_MOE = ROOT / "bench-results" / "2026-11-27-fb9beed-ag_moe-mixtral-sm-w2.json"


def test_an_attention_row_shows_its_tflops():
    # causal SP attention, W = 2, 8192 positions, 32 query heads of 128: the lower triangle
    # of 8192 x 8192 (with the diagonal) over the two ranks, q k^T and p v at 2 * 128 flops
    # a pair and head
    bp = load_pattern(str(EXAMPLES / "sp_attention_causal.tl")).bind(
        {"S": 8192, "H": 32, "HKV": 8, "D": 128}, 2)
    flops = 4 * 32 * 128 * (8192 * 8193 // 2) // 2
    assert flops_per_rank(bp) == flops
    r = BenchResult(pattern=bp.name, ops=report.op_chain(bp), sizes={"S": 8192}, world=2,
                    flops_per_rank=flops_per_rank(bp), comm_bytes_per_rank=0,
                    steady_ms={"tilelink": 2.0, "nccl_cublas": 2.5})
    row = dict(zip(report.COLUMNS, report.table_rows([r])[0]))
    assert row["pattern"] == "AG-AG-ATTENTION"
    assert row["TFLOP/s"] == f"{flops / 2e-3 / 1e12:.0f}" == "137"
    assert f"{flops / 2.5e-3 / 1e12:.0f} TFLOP/s" in format_detail(r)
    # a row no op of which counts its FLOPs shows none, not a rate of 0
    r.flops_per_rank = 0
    assert r.tflops() is None
    assert dict(zip(report.COLUMNS, report.table_rows([r])[0]))["TFLOP/s"] == "—"


def test_from_a_saved_moe_run_counts_its_flops_from_its_pattern(capsys):
    # the run (fb9beed) recorded 0 FLOPs: grouped_gemm registered no count then; its command
    # names examples/ag_moe.tl, bound again to the row's sizes
    saved = json.loads(SAVED_AG_MOE.read_text())
    raw = saved["results"][0]
    assert raw["flops_per_rank"] == 0
    sz = raw["sizes"]
    # each rank: all T tokens x TOPK choices, K products for each of its N / W columns
    flops = 2 * sz["T"] * sz["TOPK"] * sz["K"] * (sz["N"] // 2)
    _, (r,) = load_json(str(SAVED_AG_MOE))
    assert r.flops_per_rank == flops and "examples/ag_moe.tl" in r.notes["flops"]
    assert main(["bench", "--from", str(SAVED_AG_MOE), "--markdown"]) == 0
    row = _markdown_row(capsys.readouterr().out)
    tl = raw["steady_ms"]["tilelink"]
    assert row["TFLOP/s"] == f"{flops / (tl * 1e-3) / 1e12:.0f}" == "499"
    # a recorded count is kept as recorded (the EP run's gemm over its W x CAP rows)
    _, (ep,) = load_json(str(SAVED_EP))
    ep_raw = json.loads(SAVED_EP.read_text())["results"][0]
    assert ep.flops_per_rank == ep_raw["flops_per_rank"] > 0 and "flops" not in ep.notes


def test_from_counts_no_flops_without_the_pattern_it_measured(tmp_path, capsys):
    saved = json.loads(SAVED_AG_MOE.read_text())
    for command in (saved["meta"]["command"].replace("examples/ag_moe.tl", "examples/none.tl"),
                    saved["meta"]["command"].replace("examples/ag_moe.tl",
                                                     "examples/moe_rs.tl")):
        saved["meta"]["command"] = command
        path = tmp_path / "old.json"
        path.write_text(json.dumps(saved))
        _, (r,) = load_json(str(path))
        assert r.flops_per_rank == 0 and "flops" not in r.notes, command
        assert main(["bench", "--from", str(path), "--markdown"]) == 0
        assert _markdown_row(capsys.readouterr().out)["TFLOP/s"] == "—", command


# ---------------------------------------------------------------- progress


def test_progress_plain_lines_when_not_a_tty():
    err, out = io.StringIO(), io.StringIO()
    p = Progress(3, stream=err)
    p.update(1, "compiling")
    p.write("a result", out=out)
    p.update(1, "timing")
    p.close()
    assert err.getvalue() == "[1/3] compiling\n[2/3] timing\n"
    assert out.getvalue() == "a result\n"


def test_progress_redraws_on_a_tty():
    class Tty(io.StringIO):
        def isatty(self):
            return True

    err, out = Tty(), io.StringIO()
    p = Progress(4, "bench", stream=err, width=8)
    p.update(2, "half")
    p.write("row", out=out)
    p.close()
    text = err.getvalue()
    assert "\r\x1b[2K" in text and "bench [####....] 2/4 half" in text and text.endswith("\n")
    assert out.getvalue() == "row\n"


# ---------------------------------------------------------------- timing logic (fake events)


class _FakeClock:
    """Stands in for CUDA: events read a counter that every fn() call advances by 1 ms."""

    def __init__(self):
        self.now = 0.0
        clock = self

        class Event:
            def __init__(self, enable_timing=False):
                self.t = None

            def record(self, stream=None):
                self.t = clock.now

            def synchronize(self):
                pass

            def elapsed_time(self, other):
                return other.t - self.t

        self.Event = Event

    def fn(self):
        self.now += 1.0


def test_steady_state_and_single_call_logic(monkeypatch):
    clock = _FakeClock()
    monkeypatch.setattr(torch.cuda, "Event", clock.Event)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a, **k: None)
    calls = []

    def fn():
        calls.append(1)
        clock.fn()

    assert timing.steady_state_ms(fn, warmup=3, iters=10) == pytest.approx(1.0)
    assert len(calls) == 13  # warm-up calls are not timed
    calls.clear()
    assert timing.single_call_ms(fn, reps=4) == pytest.approx(1.0)
    assert len(calls) == 5
    with pytest.raises(ValueError):
        timing.steady_state_ms(fn, iters=0)
    assert timing.max_over_ranks([1.0, 2.0]) == [1.0, 2.0]  # no torch.distributed here


# ---------------------------------------------------------------- CLI


@pytest.fixture
def no_gpu(monkeypatch):
    import tilelink.cli.bench as cli_bench

    monkeypatch.setattr(cli_bench, "gpu_count", lambda: 0)


@pytest.mark.parametrize("argv", [["bench", AG, "-D", "M=8192"], ["bench", "--suite", "design"],
                                  ["bench", RS, "-W", "2"]])
def test_cli_refuses_without_gpus(argv, no_gpu, capsys):
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "needs 2 CUDA GPUs, found 0" in err and "emulated world" in err
    assert "Traceback" not in err


def test_cli_refuses_with_too_few_gpus(monkeypatch, capsys):
    import tilelink.cli.bench as cli_bench

    monkeypatch.setattr(cli_bench, "gpu_count", lambda: 1)
    assert main(["bench", AG]) == 2
    assert "needs 2 CUDA GPUs, found 1" in capsys.readouterr().err


@pytest.mark.parametrize("argv,msg", [
    (["bench"], "needs a pattern or --suite design"),
    (["bench", AG, "-D", "Q=3"], "has no parameter 'Q'"),
    (["bench", "--suite", "design", "-D", "M=4"], "give no pattern and no -D"),
    (["bench", AG, "-W", "3"], "does not divide"),
    (["bench", AG, "--systems", "tilelink,cublas"], "unknown system 'cublas'"),
])
def test_cli_bad_input_exit_2(argv, msg, no_gpu, capsys):
    assert main(argv) == 2
    assert msg in capsys.readouterr().err


def test_cli_help_lists_bench(capsys):
    with pytest.raises(SystemExit) as e:
        main(["bench", "--help"])
    assert e.value.code == 0
    out = capsys.readouterr().out
    for flag in ("--suite", "--json", "--plot", "--warmup", "--iters", "--world-size"):
        assert flag in out


def test_systems_option_keeps_the_harness_order():
    import argparse

    from tilelink.bench.report import SYSTEMS
    from tilelink.cli.bench import SYSTEM_NAMES, systems_from_args

    assert SYSTEM_NAMES == SYSTEMS  # the --help list (no torch import) is the harness's
    args = argparse.Namespace(systems=None)
    assert systems_from_args(args) == SYSTEMS
    args.systems = "gemm, tilelink"
    assert systems_from_args(args) == ("tilelink", "gemm")


def test_design_suite_has_the_nine_shapes():
    import argparse

    from tilelink.cli.bench import specs_from_args

    args = argparse.Namespace(suite="design", pattern=None, defines=None, config=["a=b"],
                              world_size=2)
    specs = specs_from_args(args)
    assert len(specs) == 9
    assert [s.values for s in specs][:2] == [{"M": 8192, "N": 8192, "K": 8192},
                                             {"M": 8192, "N": 28672, "K": 8192}]
    assert sum(s.pattern.endswith("gemm_rs.tl") for s in specs) == 4
    assert all(s.config == {"a": "b"} for s in specs)
    args.suite = "design-rs"
    assert [s.values["K"] for s in specs_from_args(args)] == [28672, 29568, 8192, 28672]
    args.suite = "design-ag"
    assert len(specs_from_args(args)) == 5
    args.suite = "matrix"
    matrix = specs_from_args(args)
    assert len(matrix) == 14 and [s.values for s in matrix[:9]] == [s.values for s in specs]
    assert [s.values["M"] for s in matrix if s.pattern.endswith("gemm_ar.tl")] == [
        128, 512, 2048, 4096]
    assert matrix[-1].pattern.endswith("tp_mlp.tl") and matrix[-1].values["I"] == 14336


def test_command_line_reproduces(monkeypatch):
    import argparse

    from tilelink.cli.bench import command_line

    monkeypatch.setenv("NCCL_NVLS_ENABLE", "0")
    args = argparse.Namespace(suite=None, pattern="examples/ag_gemm.tl", defines=["M=1024"],
                              world_size=2, config=["comm=sm"], warmup=5, iters=20, rounds=3,
                              reps=5, seed=0, json="b.json", plot=None, systems="tilelink,gemm")
    cmd = command_line(args)
    assert cmd.startswith("NCCL_NVLS_ENABLE=0 tilelink bench examples/ag_gemm.tl -D M=1024 ")
    assert "--config comm=sm" in cmd and "--json b.json" in cmd
    assert "--systems tilelink,gemm" in cmd


# ---------------------------------------------------------------- baselines (no GPU parts)


def test_output_check_catches_nan_and_wrong_tiles():
    from tilelink.bench.baselines import check_outputs

    bp = load_pattern(AG).bind({"M": 256, "N": 256, "K": 1024}, 2)
    g = torch.Generator().manual_seed(0)
    ref = torch.randn(256, 128, generator=g) * 30
    good = ref.to(torch.bfloat16)
    assert check_outputs(bp, ("c",), good, ref)[2]
    assert check_outputs(bp, ("c",), (good,), (ref,))[2]  # tuples as well
    bad = good.clone()
    bad[0, 0] = float("nan")
    assert not check_outputs(bp, ("c",), bad, ref)[2]
    bad = good.clone()
    bad[:16, :16] = 0  # one wrong tile: small in norm, caught elementwise
    m, _, ok = check_outputs(bp, ("c",), bad, ref)
    assert not ok and m > 10
    assert not check_outputs(bp, ("c",), (good, good), (ref,))[2]  # an output too many


def test_bitwise_check_takes_nan_padding_and_catches_one_bit():
    from tilelink.bench.baselines import bitwise_check

    a = torch.full((2, 8), float("nan"), dtype=torch.bfloat16)
    a[:, :5] = torch.arange(10, dtype=torch.bfloat16).view(2, 5)
    assert bitwise_check((a,), (a.clone(),)) == (0.0, 0.0, True)
    b = a.clone()
    b.view(torch.int16)[1, 2] ^= 1  # the lowest mantissa bit of one element
    err, rel, ok = bitwise_check((a,), (b,))
    assert not ok and rel == 1.0 and err > 0


def test_op_chain_labels_and_legacy_records():
    from tilelink.bench.report import chain_label, op_chain

    assert op_chain(load_pattern(AG).bind({}, 2)) == "all_gather>gemm"
    assert chain_label("all_gather>gemm") == "AG-GEMM"
    assert chain_label("gemm>reduce_scatter") == "GEMM-RS"
    assert chain_label("all_to_all>gemm>all_to_all") == "ATA-GEMM-ATA"
    old = _result().to_dict()
    old["signature"] = old.pop("ops")  # a record saved before the field was renamed
    assert BenchResult.from_dict(old).label == "AG-GEMM"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _gloo_reference_worker(rank, world, port, path, values):
    import torch.distributed as dist

    from tilelink.bench.baselines import reference
    from tilelink.runtime.reference import evaluate, judge, make_inputs, output_bound

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        bp = load_pattern(path).bind(values, world)
        allin = make_inputs(bp, 3)
        mine = {k: v[rank] for k, v in allin.items()}
        got = reference(bp, mine, None)
        want = evaluate(bp, allin)
        # both round to the pattern dtype at op boundaries; only the order of the sums over
        # ranks (gloo's) may differ
        assert len(got) == len(bp.pattern.outputs)
        for name, g in zip(bp.pattern.outputs, got):
            w = want[name][rank]
            assert g.dtype == w.dtype and g.shape == w.shape
            assert judge(g, w, output_bound(bp, name)).ok, name
    finally:
        dist.destroy_process_group()


@pytest.mark.slow
@pytest.mark.parametrize("path,world", [(AG, 2), (RS, 2), (RS, 3),
                                        (str(EXAMPLES / "gemm_ar.tl"), 3)])
def test_fp32_reference_over_gloo(path, world, fork_world):
    values = {"M": 96, "N": 48, "K": 96}
    fork_world.run(_gloo_reference_worker, args=(world, _free_port(), path, values),
                   nprocs=world)


# ---------------------------------------------------------------- GPU end to end


@pytest.mark.dist
@pytest.mark.parametrize("path,defines", [
    (AG, ["M=1024", "N=1024", "K=512"]),
    (RS, ["M=1024", "N=512", "K=1024"]),
])
def test_bench_end_to_end_on_two_gpus(path, defines, tmp_path, capsys):
    out = tmp_path / "b.json"
    argv = ["bench", path, "-W", "2", "--json", str(out), "--warmup", "2", "--iters", "5",
            "--rounds", "1", "--reps", "2"]
    for d in defines:
        argv += ["-D", d]
    assert main(argv) == 0, capsys.readouterr().err
    meta, (r,) = load_json(str(out))
    assert r.ok and not r.failed, r.failed
    # every system, less the baselines the pattern has no counterpart of (said in its notes)
    want = {k for k in report.SYSTEMS
            if not r.notes.get(k, "").startswith("none for this pattern")}
    assert report.SYSTEMS[0] in want and len(want) >= 4, r.notes
    assert set(r.steady_ms) == want and set(r.single_ms) == want, r.notes
    assert all(v > 0 for v in r.steady_ms.values())
    assert r.floor_ms() == max(r.steady_ms["gemm"],
                               min(r.steady_ms["nccl_comm"], r.steady_ms["ce_comm"]))
    assert all(r.rel_err[k] < 1e-2 for k in ("tilelink", "nccl_cublas", "async_tp", "gemm"))
    assert r.rel_err["ce_comm"] == 0.0 and r.tl_vs_nccl_cublas_max_abs is not None
    assert "gpu" in meta and "TileLink ms" in capsys.readouterr().out


@pytest.mark.dist
def test_bench_records_the_routed_bytes_on_two_gpus(tmp_path, capsys):
    # the routing drawn on the GPUs is the one recomputed on the CPU (else no bytes floor)
    out = tmp_path / "ep.json"
    sizes = {"T": 256, "TOPK": 4, "H": 512, "CAP": 640}
    argv = ["bench", ROUTED, "-W", "2", "--json", str(out), "--config", "comm=sm",
            "--warmup", "2", "--iters", "5", "--rounds", "1", "--reps", "2",
            "--systems", "tilelink,gemm,ce_comm"]
    for k, v in sizes.items():
        argv += ["-D", f"{k}={v}"]
    assert main(argv) == 0, capsys.readouterr().err
    _, (r,) = load_json(str(out))
    bp = load_pattern(ROUTED).bind(sizes, 2)
    dest = [make_local_inputs(bp, s, 0, torch.device("cpu"))["dest"] for s in range(2)]
    sent = [[min(int((dest[s] == d).sum()), sizes["CAP"]) for d in range(2)] for s in range(2)]
    assert r.routed_bytes == [[(sent[s][d] + sent[d][s]) * sizes["H"] * 2 for d in range(2)]
                              for s in range(2)]
    assert r.bytes_floor_ms() and "TL/bytes floor" in capsys.readouterr().out


@pytest.mark.dist
def test_bench_graph_mode_on_two_gpus(tmp_path, capsys):
    # AG at a small shape: the default is the non-overlapped plan, whose captured calls take
    # the overlapped capturable kernel (FallbackOp.captured_op): --graph times that kernel
    out = tmp_path / "g.json"
    argv = ["bench", AG, "-W", "2", "-D", "M=1024", "-D", "N=4096", "-D", "K=4096", "--graph",
            "--json", str(out), "--warmup", "2", "--iters", "5", "--rounds", "1", "--reps", "2"]
    assert main(argv) == 0, capsys.readouterr().err
    meta, (r,) = load_json(str(out))
    assert r.ok and r.graph and meta["timing"] == "CUDA graph replays"
    assert "capturable=1" in r.config and "comm=copy_engine" in r.config, r.config
    assert r.rel_err["tilelink"] < 1e-2 and r.steady_ms["tilelink"] > 0
    # the baselines are captured too (async-TP may refuse capture: then it says so)
    for k in ("nccl_cublas", "gemm", "nccl_comm", "ce_comm"):
        assert k in r.steady_ms and "timed as CUDA graph replays" in r.notes[k], (k, r.failed)
    assert "async_tp" in r.steady_ms or r.failed.get("async_tp", "").startswith(
        "not capturable"), r.failed


# ---------------------------------------------------------------- the per-rank body on gloo


class _Event:
    """CPU stand-in for torch.cuda.Event (host clock)."""

    def __init__(self, enable_timing=False):
        self.t = None

    def record(self, stream=None):
        import time

        self.t = time.perf_counter()

    def synchronize(self):
        pass

    def elapsed_time(self, other):
        return (other.t - self.t) * 1e3


def _fake_gpu_world():
    """Make bench_one's GPU-only parts run on CPU/gloo: CUDA calls, the TileLink op (the
    torch reference), symmetric peer buffers (emulated with all_gather). async-TP stays
    real, so it fails on CPU — which exercises the failure path."""
    import torch.distributed as dist

    import tilelink.bench.baselines as bl
    import tilelink.runtime.timing as tm
    from tilelink.runtime import gpu
    from tilelink.runtime.dist_reference import evaluate_local, make_local_inputs

    torch.cuda.synchronize = lambda *a, **k: None
    torch.cuda.Event = _Event
    torch.cuda.current_device = lambda: 0
    torch.cuda.empty_cache = lambda: None
    torch.cuda.get_device_name = lambda *a: H100_NAME  # a GPU with a cost-model row

    def max_over_ranks(values, group=None):
        t = torch.tensor(values, dtype=torch.float64)
        dist.all_reduce(t, op=dist.ReduceOp.MAX, group=group)
        return t.tolist()

    tm.max_over_ranks = max_over_ranks

    class PeerBuffers:
        def __init__(self, block, dtype, group):
            self.world, self.rank = dist.get_world_size(group), dist.get_rank(group)
            self.local = torch.full((self.world, *block), float("nan"), dtype=dtype)
            self.peers = {p: None for p in range(self.world) if p != self.rank}
            self.received = tuple(self.local[p] for p in sorted(self.peers))
            self.group = group

        def push_fn(self, blocks):
            def push():  # slot `rank` of peer p gets blocks[p] in its first elements
                for p in range(self.world):
                    src = torch.full_like(self.local[0], float("nan")).view(-1)
                    if p in blocks:
                        src[:blocks[p].numel()] = blocks[p].reshape(-1)
                    got = [torch.empty_like(src) for _ in range(self.world)]
                    dist.all_gather(got, src, group=self.group)
                    if p == self.rank:
                        for q in self.peers:
                            self.local[q].view(-1).copy_(got[q])
            return push

    bl.PeerBuffers = PeerBuffers
    bl.enable_symm_mem = lambda group: None

    class Op:
        def __init__(self, bp, group, wrong):
            self.bound, self.group, self.config, self.wrong = bp, group, "comm=fake", wrong
            self.vendor_rounded = False  # the fp32 evaluation: one rounding, as an overlapped plan

        def make_inputs(self, seed):
            return make_local_inputs(self.bound, dist.get_rank(), seed, torch.device("cpu"))

        def __call__(self, **ins):
            got = evaluate_local(self.bound, ins, self.group)
            outs = [got[n] for n in self.bound.pattern.outputs]
            if self.wrong and dist.get_rank() == 1:
                outs[0].view(-1)[-1] += 100  # one wrong element, on one rank only
            return outs[0] if len(outs) == 1 else tuple(outs)

        def check_diagnostics(self):
            pass

    gpu.compile_op = lambda bp, config=None, group=None, **kw: Op(bp, group, bool(config))


def _bench_body_worker(rank, world, port, path, wrong, q, values=None):
    import torch.distributed as dist

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        _fake_gpu_world()
        from tilelink.bench.run import Options, Spec, bench_rank

        spec = Spec(path, values or {"M": 64, "N": 32, "K": 64}, {"wrong": "1"} if wrong else {})
        res = bench_rank(rank, world, [spec], Options(warmup=1, iters=2, rounds=2, reps=2))
        if rank == 0:
            q.put(res[0].to_dict())
    finally:
        dist.destroy_process_group()


def _baselines_worker(rank, world, port, cases, q):
    import torch.distributed as dist

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        _fake_gpu_world()
        import tilelink.bench.baselines as bl
        from tilelink.runtime.dist_reference import make_local_inputs

        found = {}
        for path, values in cases:
            bp = load_pattern(path).bind(values, world)
            ins = make_local_inputs(bp, rank, 5, torch.device("cpu"))
            ref = bl.reference(bp, ins, None)
            systems = bl.build(bp, ins, None)
            checks = {}
            for key, b in systems.items():
                if key == "async_tp" or key.startswith("symm_"):
                    continue  # torch's fused and symmetric-memory ops have no CPU kernels
                checks[key] = b.check(ref)[2]
                out = b.fn()  # a second call gives what the check saw
                assert all(torch.is_tensor(t) for t in out), key
            found[bp.name] = (sorted(systems), checks, {k: b.note for k, b in systems.items()})
        if rank == 0:
            q.put(found)
    finally:
        dist.destroy_process_group()


@pytest.mark.slow
@pytest.mark.parametrize("world", [2, 3])
def test_baselines_follow_from_the_ops_of_any_pattern(world, fork_world):
    # the systems a pattern has, what each runs, and every check passing, for patterns
    # beyond AG-GEMM / GEMM-RS: an all_reduce, a four-op MLP (two fusable pairs), an
    # all_to_all, attention with a compute op after its collective, and sizes off the tiles
    cases = [(str(EXAMPLES / "gemm_ar.tl"), {"M": 48, "N": 32, "K": 24 * world}),
             (str(EXAMPLES / "tp_mlp.tl"), {"M": 24 * world, "H": 32, "I": 24 * world}),
             (str(EXAMPLES / "ep_moe.tl"), {"T": 16, "H": 32, "CAP": 8}),
             (str(EXAMPLES / "flash_decode.tl"), {"B": 2, "H": 2, "S": 24 * world, "D": 16}),
             (AG, {"M": 13 * world, "N": 5 * world, "K": 40})]
    q = fork_world.queue()
    fork_world.run(_baselines_worker, args=(world, _free_port(), cases, q), nprocs=world)
    found = q.get()
    every = ["ce_comm", "gemm", "nccl_comm", "nccl_cublas"]
    # no pair torch async-TP fuses; torch symmetric memory's all-reduce calls
    assert found["gemm_ar"][0] == sorted(every + ["symm_one_shot", "symm_two_shot"])
    assert found["tp_mlp"][0] == sorted(every + ["async_tp"])
    assert found["ep_moe"][0] == sorted(every + ["nccl_counts"])
    assert found["flash_decode"][0] == every
    assert found["ag_gemm"][0] == sorted(every + ["async_tp"])
    for name, (_, checks, _) in found.items():
        assert checks and all(checks.values()), (name, checks)
    notes = found["tp_mlp"][2]
    assert notes["async_tp"].count("torch.ops.symm_mem.fused") == 2, notes["async_tp"]
    assert "h = gemm(x_full, w1)" in notes["gemm"] and "all_gather" not in notes["gemm"]
    assert "reduce_scatter" in notes["nccl_comm"] and "gemm" not in notes["nccl_comm"]


@pytest.mark.slow
@pytest.mark.parametrize("path", [AG, RS])
@pytest.mark.parametrize("wrong", [False, True])
def test_bench_body_on_cpu_gloo(path, wrong, fork_world):
    q = fork_world.queue()
    fork_world.run(_bench_body_worker, args=(2, _free_port(), path, wrong, q), nprocs=2)
    r = BenchResult.from_dict(q.get())
    assert set(r.failed) == ({"async_tp", "tilelink"} if wrong else {"async_tp"})
    assert "NotImplementedError" in r.failed["async_tp"]  # no CPU async-TP: reported, untimed
    timed = {"nccl_cublas", "gemm", "nccl_comm", "ce_comm"} | (set() if wrong else {"tilelink"})
    assert set(r.steady_ms) == timed and set(r.single_ms) == timed
    assert all(len(r.spread_ms[k]) == 2 for k in timed)
    assert r.rel_err["ce_comm"] == 0.0 and r.rel_err["nccl_cublas"] < 1e-2
    if wrong:  # a mismatch on rank 1 alone marks rank 0's row FAILED
        assert not r.ok and "MISMATCH" in r.failed["tilelink"]
        assert r.max_abs_err["tilelink"] > 50
    else:
        assert r.ok and r.tl_vs_nccl_cublas_max_abs is not None


@pytest.mark.slow
def test_bench_body_records_what_the_routing_moved_on_cpu_gloo(fork_world):
    sizes = {"T": 24, "TOPK": 2, "H": 40, "CAP": 16}
    q = fork_world.queue()
    fork_world.run(_bench_body_worker, args=(2, _free_port(), ROUTED, False, q, sizes),
                   nprocs=2)
    r = BenchResult.from_dict(q.get())
    assert r.ok and r.device == H100_NAME
    # the timed inputs' routing, counted here by rows: rank s sends its peer the copies
    # routed there (at most CAP) and keeps the rest; the combine sends back what each got
    bp = load_pattern(ROUTED).bind(sizes, 2)
    dest = [make_local_inputs(bp, s, 0, torch.device("cpu"))["dest"] for s in range(2)]
    sent = [[min(int((dest[s] == d).sum()), sizes["CAP"]) for d in range(2)] for s in range(2)]
    row = sizes["H"] * 2
    assert r.routed_bytes == [[(sent[s][d] + sent[d][s]) * row for d in range(2)]
                              for s in range(2)]
    assert r.bytes_floor_ms() and r.vs_bytes_floor() == pytest.approx(
        r.steady_ms["tilelink"] / r.bytes_floor_ms())
    # the expert GEMM (H x H) counted over the rows that landed, mean over the two ranks
    landed = sum(sent[s][d] for s in range(2) for d in range(2)) / 2
    assert r.flops_per_rank == round(2 * landed * sizes["H"] ** 2)
    assert r.flops_per_rank <= 2 * 2 * sizes["CAP"] * sizes["H"] ** 2  # at most W x CAP rows


def _bench_graph_worker(rank, world, port, path, q):
    import torch.distributed as dist

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        _fake_gpu_world()
        import tilelink.bench.run as run

        captures = []

        class Graph:  # a "replay" is the call again, written into the captured output
            def __init__(self, fn, out):
                self.fn, self.out = fn, out

            def replay(self):
                got = self.fn()
                for g, o in zip(*((x,) if torch.is_tensor(x) else x for x in (got, self.out))):
                    if g is not o:
                        o.copy_(g)

        def capture_call(fn):
            captures.append(fn)
            # the fake runs the call: every rank must, or its gloo collectives hang (a real
            # capture records the collective and runs nothing)
            out = fn()
            if rank == 1 and len(captures) == 2:  # one rank alone cannot capture a system
                raise RuntimeError("operation not permitted when stream is capturing")
            return Graph(fn, out), out

        run.capture_call = capture_call
        opts = run.Options(warmup=1, iters=2, rounds=1, reps=2, graph=True)
        res = run.bench_rank(rank, world, [run.Spec(path, {"M": 64, "N": 32, "K": 64})], opts)
        if rank == 0:
            q.put(res[0].to_dict())
    finally:
        dist.destroy_process_group()


@pytest.mark.slow
def test_bench_graph_mode_on_cpu_gloo_survives_one_rank_failing_a_capture(fork_world):
    # --graph's phases end in agreements every rank reaches: the rank whose capture raised
    # and the rank whose capture worked both mark that system FAILED, and go on together
    q = fork_world.queue()
    fork_world.run(_bench_graph_worker, args=(2, _free_port(), AG, q), nprocs=2)
    r = BenchResult.from_dict(q.get())
    assert r.graph
    second = [k for k, v in r.failed.items() if k != "async_tp"]
    assert len(second) == 1, r.failed
    assert r.failed[second[0]].startswith("not capturable on another rank"), r.failed
    timed = {"tilelink", "nccl_cublas", "gemm", "nccl_comm", "ce_comm"} - set(second)
    assert set(r.steady_ms) == timed, (r.steady_ms, r.failed)
    assert all("timed as CUDA graph replays" in r.notes[k] for k in timed)
    assert r.rel_err["tilelink"] < 1e-2 and r.tl_vs_nccl_cublas_max_abs is not None


def test_table_and_detail_with_only_some_systems_timed():
    # --systems tilelink,gemm: the other columns are blank, nothing raises
    r = _result(nccl_cublas=None, async_tp=None, nccl_comm=None, ce_comm=None)
    table = format_table([r])
    assert "0.800" in table and "0.700" in table
    assert r.speedup("nccl_cublas") is None and r.vs_floor() == pytest.approx(0.8 / 0.7)
    format_detail(r)


@pytest.mark.parametrize("world", [2, 4, 8])
def test_reduce_scatter_check_takes_a_bf16_ring_sum_and_catches_a_wrong_element(world):
    # NCCL's reduce-scatter sums W partials in bf16, rounding every partial sum; partials of
    # a K-long GEMM cancel, so the partial sums can exceed the result. The check must take
    # any such order (a K-based tolerance once flagged NCCL itself at W = 4) and still catch
    # a wrong element.
    from tilelink.bench.baselines import check_outputs

    bp = load_pattern(RS).bind({"M": 256 * world, "N": 256, "K": 256 * world}, world)
    g = torch.Generator().manual_seed(world)
    parts = (torch.randn(world, 256, 256, generator=g) * 3000).bfloat16().float()
    want = parts.sum(0).bfloat16()  # the exact reference: fp32 sum, rounded once
    for start in range(world):  # every ring's starting rank
        acc = parts[start].bfloat16()
        for i in range(1, world):
            acc = (acc.float() + parts[(start + i) % world]).bfloat16()
        assert check_outputs(bp, ("out",), acc, want, plan=True)[2]
    bad = parts.sum(0)
    bad[17] -= parts[world - 1, 17]  # one row of one peer's partial never arrived
    assert not check_outputs(bp, ("out",), bad.bfloat16(), want, plan=True)[2]
