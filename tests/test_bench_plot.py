"""The benchmark chart (tilelink.bench.plot): `tilelink bench --plot`, and `--from` re-plots of
saved runs, with and without matplotlib. Needs no GPU."""

from __future__ import annotations

import json
import sys

import pytest

from tilelink.bench import plot as bench_plot
from tilelink.bench.report import BenchResult, dump_json
from tilelink.cli.main import main

from .conftest import EXAMPLES

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def _result(label: str = "all_gather>gemm", world: int = 2, m: int = 8192,
            tilelink: float = 0.8, failed: bool = False) -> BenchResult:
    ms = {"tilelink": tilelink, "nccl_cublas": 1.0, "async_tp": 0.9, "gemm": 0.7,
          "nccl_comm": 0.3, "ce_comm": 0.2}
    return BenchResult(pattern="p", ops=label, sizes={"M": m, "N": 8192, "K": 8192},
                       world=world, flops_per_rank=2 * m * 4096 * 8192,
                       comm_bytes_per_rank=m * 8192, steady_ms=ms,
                       failed={"tilelink": "boom"} if failed else {})


def _runs(tmp_path):
    """Two saved runs: AG-GEMM at W = 2 (one row off the chart's scale) and GEMM-RS at W = 4."""
    a, b = tmp_path / "a.json", tmp_path / "b.json"
    dump_json([_result(), _result(m=1024, tilelink=3.0)],
              {"date": "2026-11-22", "gpu": "2x H200", "timing": "eager calls"}, str(a))
    dump_json([_result("gemm>reduce_scatter", world=4), _result(world=4, failed=True)],
              {"date": "2026-11-23"}, str(b))
    return a, b


@pytest.fixture
def no_matplotlib(monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib", None)


@pytest.fixture
def matplotlib_present():
    pytest.importorskip("matplotlib")


# ---------------------------------------------------------------- the chart itself


@pytest.mark.parametrize("rows", [
    [_result()],
    [_result(), _result(m=1024, tilelink=5.0)],                          # a bar past CLIP
    [_result(), _result("gemm>reduce_scatter")],                         # two panels
    [_result(world=2), _result(world=4, failed=True)],                   # mixed W, a failure
    [BenchResult(pattern="p", ops="all_gather>grouped_gemm", sizes={"T": 8192}, world=4,
                 flops_per_rank=1, comm_bytes_per_rank=1,
                 steady_ms={"tilelink": 0.33, "nccl_cublas": 0.59})],           # no floor
])
def test_plot_writes_a_png(rows, tmp_path, matplotlib_present):
    out = tmp_path / "c.png"
    bench_plot.plot(rows, str(out), title="t")
    assert out.read_bytes()[:8] == PNG_MAGIC


def test_a_panel_without_a_floor_is_drawn_against_its_fastest_baseline():
    # (a run of --systems tilelink,nccl_cublas measures no GEMM alone, so no floor: the
    # chart divides by the fastest baseline measured instead, else by TileLink's own time)
    full = _result()
    bare = BenchResult(pattern="p", ops="all_gather>grouped_gemm", sizes={"T": 8192},
                       world=4, flops_per_rank=1, comm_bytes_per_rank=1,
                       steady_ms={"tilelink": 0.33, "nccl_cublas": 0.59, "async_tp": 0.66})
    alone = BenchResult(pattern="p", ops="all_gather>grouped_gemm", sizes={"T": 8192},
                        world=4, flops_per_rank=1, comm_bytes_per_rank=1,
                        steady_ms={"tilelink": 0.5})
    name, ref = bench_plot.reference([full])
    assert name == "floor" and ref(full) == full.floor_ms() == 0.7
    name, ref = bench_plot.reference([full, bare])
    assert name == "fastest baseline" and ref(bare) == 0.59 and ref(full) == 0.9
    name, ref = bench_plot.reference([bare, alone])
    assert name == "TileLink" and ref(alone) == 0.5


def test_plot_without_matplotlib_names_the_install_command(tmp_path, no_matplotlib):
    with pytest.raises(bench_plot.TileLinkError) as e:
        bench_plot.plot([_result()], str(tmp_path / "c.png"))
    assert "matplotlib" in e.value.message and e.value.hint.startswith("pip install matplotlib")
    assert not (tmp_path / "c.png").exists()


@pytest.mark.parametrize("name,why", [("c.txt", "PNG file"), ("c", "PNG file"),
                                      ("missing/c.png", "does not exist")])
def test_unwritable_chart_paths_are_refused(name, why, tmp_path):
    with pytest.raises(bench_plot.TileLinkError) as e:
        bench_plot.check_can_plot(str(tmp_path / name))
    assert why in e.value.message and e.value.hint


def test_title_says_how_it_was_timed():
    assert "(CUDA graph replays)" in bench_plot.title_for({"timing": "CUDA graph replays"})
    assert "graph" not in bench_plot.title_for({"timing": "eager calls", "gpu": "1x H200"})
    assert "1x H200" in bench_plot.title_for({"gpu": "1x H200"})


# ---------------------------------------------------------------- tilelink bench --from


def test_from_prints_the_merged_table(tmp_path, capsys):
    a, b = _runs(tmp_path)
    assert main(["bench", "--from", str(a), "--from", str(b)]) == 0
    out = capsys.readouterr().out
    rows = [line for line in out.splitlines() if line.split()[:1] in (["AG-GEMM"], ["GEMM-RS"])]
    assert len(rows) == 4 and "FAILED" in rows[3]


def test_from_draws_the_chart_and_the_markdown(tmp_path, capsys, matplotlib_present):
    a, b = _runs(tmp_path)
    png = tmp_path / "both.png"
    assert main(["bench", "--from", str(a), "--from", str(b), "--plot", str(png),
                 "--markdown"]) == 0
    out = capsys.readouterr()
    assert png.read_bytes()[:8] == PNG_MAGIC and f"chart: {png}" in out.err
    assert out.out.count("| AG-GEMM |") == 3 and "### 2026-11-22" in out.out  # a's metadata


def test_from_with_plot_but_no_matplotlib_is_a_clear_error(tmp_path, capsys, no_matplotlib):
    a, _ = _runs(tmp_path)
    assert main(["bench", "--from", str(a), "--plot", str(tmp_path / "c.png")]) == 2
    out = capsys.readouterr()
    assert "pip install matplotlib" in out.err and "Traceback" not in out.err
    assert out.out == ""  # refused before printing anything


@pytest.mark.parametrize("content,why", [
    (None, "no such file"),
    ("{not json", "not a tilelink bench result"),
    ("[1, 2]", "not a tilelink bench result"),
    ('{"meta": {}}', "not a tilelink bench result"),
    ('{"results": [3]}', "not a tilelink bench result"),
    ('{"results": []}', "no results in it"),
    (b"\xff\xfe\x00", "cannot read it"),
])
def test_from_bad_files_exit_2_with_the_reason(content, why, tmp_path, capsys):
    path = tmp_path / "r.json"
    if isinstance(content, bytes):
        path.write_bytes(content)
    elif content is not None:
        path.write_text(content)
    assert main(["bench", "--from", str(path)]) == 2
    err = capsys.readouterr().err
    assert why in err and "hint:" in err and "Traceback" not in err


@pytest.mark.parametrize("extra", [[str(EXAMPLES / "ag_gemm.tl")], ["--suite", "design"],
                                   ["-D", "M=8"], ["--config", "comm=sm"]])
def test_from_refuses_what_would_measure(extra, tmp_path, capsys):
    a, _ = _runs(tmp_path)
    assert main(["bench", "--from", str(a), *extra]) == 2
    assert "measures nothing" in capsys.readouterr().err


# ---------------------------------------------------------------- tilelink bench --plot


def test_bench_plot_without_matplotlib_is_refused_before_measuring(no_matplotlib, capsys):
    assert main(["bench", str(EXAMPLES / "ag_gemm.tl"), "--plot", "c.png"]) == 2
    err = capsys.readouterr().err
    assert "pip install matplotlib" in err and "CUDA GPUs" not in err


def test_bench_plot_without_matplotlib_but_with_json_goes_on(no_matplotlib, monkeypatch,
                                                             capsys):
    import tilelink.cli.bench as cli_bench

    monkeypatch.setattr(cli_bench, "gpu_count", lambda: 0)  # stops right after the plot check
    assert main(["bench", str(EXAMPLES / "ag_gemm.tl"), "--json", "r.json",
                 "--plot", "c.png"]) == 2
    err = capsys.readouterr().err
    assert "tilelink bench --from r.json --plot c.png" in err and "needs 2 CUDA GPUs" in err


def test_report_json_round_trips_through_the_replot_loader(tmp_path):
    a, b = _runs(tmp_path)
    meta, rows = bench_plot.load_runs([str(a), str(b)])
    assert meta["date"] == "2026-11-22" and [r.world for r in rows] == [2, 2, 4, 4]
    assert json.loads(a.read_text())["results"][1]["steady_ms"]["tilelink"] == \
        rows[1].steady_ms["tilelink"] == 3.0
