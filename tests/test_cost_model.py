"""The cost model and the default it decides: never slower than what a user would run instead.

The measured cases are GPU runs recorded in docs/perf.md: the GEMM-AR config sweep on 2x H100
(2026-11-26, 400035b) and the design shapes on 2x / 4x H200 (2026-11-22). The model must rank
every pair of them whose times differ by more than the run-to-run spread in the measured
order, and the default must pick the plan that measured fastest wherever the gap is larger
than the model's margin. These tests pin the decisions, so a later change cannot bring back a
slower default silently."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from tilelink.frontend import load_pattern
from tilelink.schedule import Config, get_target, make_schedule
from tilelink.schedule.cost import (OVERLAP_MARGIN, device_spec, estimate, modelled,
                                    moved_bytes, share)
from tilelink.schedule.schedule import default_config

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"
MiB = 1 << 20


def _bp(name, w, **sizes):
    return load_pattern(str(EXAMPLES / f"{name}.tl")).bind(sizes, w)


def _target(device):
    return replace(get_target("cuda:90"), device=device)


def _config(bp, target, text):
    over = dict(kv.split("=") for kv in text.split())
    if over.get("comm") == "none":
        over.setdefault("library_comm", "nccl")
    return make_schedule(bp, target, over).config


def _plan(cfg) -> str:
    if cfg.comm == "sm" and cfg.reduce_after and cfg.flatten and cfg.allreduce == "one_shot":
        return "sm_after"  # (a GEMM-RS: the GEMM on every SM, then the sum's own kernel)
    return cfg.library_comm if cfg.comm == "none" else cfg.comm


def _default_within(bp, measured: dict, share: float, graph: bool = False,
                    device: str = "NVIDIA H100") -> None:
    """Check that the plan the default takes for `bp` on `device` is one `measured` has,
    within `share` of the fastest measured."""
    chosen, why = default_config(bp, _target(device), graph=graph)
    plan = _plan(chosen)
    assert plan in measured, (plan, why)
    assert measured[plan] <= share * min(measured.values()), (plan, measured, why)


# GEMM-AR, N = K = 8192, W = 2, 2x H100 (tools/sweep.py, ms per call)
SM, CE, TWO = "comm=sm", "comm=copy_engine", "comm=sm allreduce=two_shot"
NCCL = "comm=none"
S1, S2 = "comm=none library_comm=symm_one_shot", "comm=none library_comm=symm_two_shot"
H100_AR = {
    (128, False): {SM: .061, CE: .101, TWO: .107, NCCL: .160, S1: .059, S2: .058},
    (512, False): {SM: .102, CE: .222, TWO: .116, NCCL: .181, S1: .111, S2: .096},
    (2048, False): {SM: .329, CE: .303, TWO: .345, NCCL: .345, S1: .377, S2: .312},
    (4096, False): {SM: .612, CE: .587, TWO: .675, NCCL: .643, S1: .729, S2: .603},
    (128, True): {SM: .055, TWO: .062, NCCL: .068, S1: .050, S2: .051},
    (2048, True): {SM: .323, TWO: .334, NCCL: .342, S1: .371, S2: .307},
}
# pairs measured further apart than this are ordered (the model's own error is ~10%)
CLEAR = 1.15
# measurements the model misses by more than 25%, and why (it ranks them too fast)
KNOWN_MISSES = {
    (128, False, TWO): "eager calls host-bound at 0.107 ms (0.062 replayed): the two-shot "
                       "kernel's extra host work is not modelled",
    (512, False, CE): "one 512-row chunk: the copy engine's copy waits for the whole GEMM "
                      "and nothing hides it (0.222 ms; 0.101 at M = 128)",
}


@pytest.mark.parametrize("m,graph", list(H100_AR))
def test_the_model_orders_the_measured_gemm_ar_configs(m, graph):
    bp, t = _bp("gemm_ar", 2, M=m, N=8192, K=8192), _target("NVIDIA H100")
    dev = device_spec(t.device)
    measured = H100_AR[(m, graph)]
    model = {c: estimate(bp, _config(bp, t, c), dev, graph).total for c in measured}
    known = {c for c in measured if (m, graph, c) in KNOWN_MISSES}
    for a in measured:
        for b in measured:
            if measured[a] * CLEAR < measured[b] and b not in known:
                assert model[a] < model[b], (a, measured[a], model[a], b, measured[b], model[b])
    for c, ms in measured.items():  # and within 25% of each measurement
        assert c in known or 0.75 < model[c] / ms < 1.25, (c, ms, model[c])


# (pattern, M, N, K, W, TileLink's overlapped default ms, NCCL + cuBLAS ms), 2x / 4x H200
H200_DESIGN = [
    ("ag_gemm", 8192, 8192, 8192, 2, 0.756, 1.043),
    ("ag_gemm", 8192, 28672, 8192, 2, 2.790, 3.153),
    ("ag_gemm", 8192, 49152, 12288, 2, 7.256, 7.619),
    ("ag_gemm", 2048, 28672, 8192, 2, 0.702, 0.772),
    # (host-bound: 0.118-0.194 ms over seven runs against 0.145-0.154, a tie either way)
    ("ag_gemm", 1024, 8192, 8192, 2, 0.141, 0.150),
    ("ag_gemm", 512, 8192, 8192, 2, 0.131, 0.088),
    ("gemm_rs", 8192, 8192, 28672, 2, 2.808, 3.173),
    ("gemm_rs", 8192, 8192, 29568, 2, 2.853, 3.252),
    ("gemm_rs", 8192, 8192, 8192, 2, 0.818, 1.096),
    ("gemm_rs", 2048, 8192, 28672, 2, 0.728, 0.764),
    ("ag_gemm", 8192, 8192, 8192, 4, 0.410, 0.693),
    ("ag_gemm", 8192, 28672, 8192, 4, 1.315, 1.723),
    ("ag_gemm", 8192, 49152, 12288, 4, 3.475, 4.100),
    ("ag_gemm", 1024, 8192, 8192, 4, 0.174, 0.114),
    ("gemm_rs", 8192, 8192, 28672, 4, 1.433, 1.748),
    ("gemm_rs", 8192, 8192, 29568, 4, 1.444, 1.819),
    ("gemm_rs", 8192, 8192, 8192, 4, 0.550, 0.726),
]


@pytest.mark.parametrize("case", H200_DESIGN, ids=lambda c: "-".join(map(str, c[:5])))
def test_the_default_overlaps_where_overlap_measured_faster(case):
    name, m, n, k, w, overlapped_ms, nccl_ms = case
    bp, t = _bp(name, w, M=m, N=n, K=k), _target("NVIDIA H200")
    chosen, why = default_config(bp, t)
    tie = (name, m, w) == ("ag_gemm", 1024, 2)
    if overlapped_ms * (1 + OVERLAP_MARGIN) < nccl_ms and not tie:
        # an overlapped plan: TileLink's kernel, or torch async-TP's fused pipeline (not
        # measured in these runs; H200_MATRIX checks it where the default takes it)
        assert chosen.comm != "none" or chosen.library_comm == "async_tp", why
    elif nccl_ms < overlapped_ms:  # measured slower than NCCL + cuBLAS: never the default
        assert chosen.comm == "none" and chosen.library_comm == "nccl"
        assert "non-overlapped plan chosen" in why and "predicts" in why
    dev = device_spec(t.device)
    over, _ = default_config(bp, t, allow_fallback=False)
    model_over = estimate(bp, over, dev).total
    model_nccl = estimate(bp, replace(over, comm="none"), dev).total
    assert 0.85 < model_nccl / nccl_ms < 1.15, (model_nccl, nccl_ms)
    if name == "gemm_rs" or w == 2:  # (AG at W = 4: the copy engine's sharing is coarse)
        assert 0.8 < model_over / overlapped_ms < 1.2, (model_over, overlapped_ms)


@pytest.mark.parametrize("device", ["NVIDIA H100", "NVIDIA H200"])
@pytest.mark.parametrize("w", [2, 4, 8])
@pytest.mark.parametrize("m", [128, 512, 2048, 4096])
@pytest.mark.parametrize("graph", [False, True])
def test_gemm_ar_runs_torch_symmetric_memory_where_its_kernel_measured_slower(device, w, m,
                                                                            graph):
    # 2x H100: cuBLAS + the symmetric-memory all-reduce beat TileLink's GEMM-AR kernels at
    # every M (eager and replayed); at W = 4 (4x H100) its one-shot kernel read 0.53-0.70x
    # NCCL + cuBLAS
    bp = _bp("gemm_ar", w, M=m, N=8192, K=8192)
    chosen, why = default_config(bp, _target(device), graph=graph)
    assert chosen.comm == "none" and chosen.library_comm.startswith("symm_"), why


def test_captured_calls_of_ag_m1024_take_the_kernel_where_eager_ones_do_not():
    # 2x H200 (2026-11-22): eager calls host-bound, the kernel no faster than NCCL + cuBLAS
    bp = _bp("ag_gemm", 2, M=1024, N=8192, K=8192)
    eager, why = default_config(bp, _target("NVIDIA H200"))
    assert eager.comm == "none" and eager.library_comm == "nccl", why
    # 2x H100 (2026-11-27, 6142a53, replays): the capturable copy-engine kernel 0.115 ms,
    # torch async-TP 0.124, NCCL + cuBLAS 0.147
    replayed, why = default_config(bp, _target("NVIDIA H100"), graph=True)
    assert replayed.comm == "copy_engine" and replayed.capturable, why


def test_the_emulated_world_is_not_decided_by_the_model():
    bp = _bp("gemm_ar", 2, M=128, N=8192, K=8192)
    assert default_config(bp, get_target("interp"))[0].comm == "sm"


def test_one_rank_is_decided_by_the_model():
    # at W = 1 nothing is communicated: a kernel is the default only where the model
    # predicts it faster than the library's call. GEMM-AR's gemm=library kernel is the
    # library's GEMM alone (no collective call to pay for) ...
    one = _bp("gemm_ar", 1, M=128, N=8192, K=8192)
    cfg, why = default_config(one, _target("NVIDIA H100"))
    assert cfg.comm != "none" and cfg.value("gemm") == "library", why
    # ... while attention's tile body measured 0.77x / 0.65x torch's SDPA (causal) on one
    # H100 (2026-11-27: S = 8192, 32 / 8 heads, D = 128, 2.429 vs 1.877 ms; causal 1.669 vs
    # 1.087): SDPA is the default, eager and replayed
    sizes = dict(S=8192, H=32, HKV=8, D=128)
    for name in ("attention", "sp_attention_causal"):
        for graph in (False, True):
            cfg, why = default_config(_bp(name, 1, **sizes), _target("NVIDIA H100"),
                                      graph=graph)
            assert cfg.comm == "none", (name, graph, cfg)
            assert "predicts" in why and "non-overlapped plan chosen" in why


# attention, S = 8192, 32 query heads (GQA 32 / 8, or MHA: sp_attention), D = 128, bf16, on
# 4x H100 (2026-11-27, ms per call): TileLink's kernel (gathering on the copy engine where
# W > 1) and the plan (NCCL all-gathers + torch's SDPA)
GQA, MHA = dict(S=8192, H=32, HKV=8, D=128), dict(S=8192, H=32, D=128)
ATTENTION_H100 = {
    ("attention", 1): (GQA, {"kernel": 2.429, "plan": 1.877}),
    ("sp_attention_causal", 1): (GQA, {"kernel": 1.669, "plan": 1.087}),
    ("sp_attention_causal", 2): (GQA, {"kernel": 1.266, "plan": 1.571}),
    ("sp_attention_causal", 4): (GQA, {"kernel": 0.798, "plan": 1.035}),
    ("sp_attention", 2): (MHA, {"kernel": 1.720, "plan": 1.177}),
    ("sp_attention", 4): (MHA, {"kernel": 1.124, "plan": 0.813}),
}
# the model's misses past 12%, and why
ATTENTION_MISSES = {
    ("sp_attention", 2, "kernel"): "predicted 1.30: the tiles run at 0.46 of the model's rate "
                                   "here, 0.57 on one rank (MHA): not explained yet",
}


@pytest.mark.parametrize("case", sorted(ATTENTION_H100), ids=lambda c: f"{c[0]}-w{c[1]}")
def test_the_model_times_attention_as_measured(case):
    # the kernel's and SDPA's measured shares of the GEMM rate (attention_prefill.
    # TILE_EFFICIENCY, attention.SDPA_EFFICIENCY: torch's mask for a later rank's causal
    # queries runs on a slower kernel), and a tile's wait for every chunk its queries see
    # (Work.ready_share), put each prediction within 12% of its measurement
    name, w = case
    sizes, times = ATTENTION_H100[case]
    bp = _bp(name, w, **sizes)
    dev = device_spec("NVIDIA H100")
    for plan, text in (("kernel", "comm=copy_engine"), ("plan", "comm=none")):
        predicted = estimate(bp, _config(bp, _target("NVIDIA H100"), text), dev).total
        rel = 0.3 if (name, w, plan) in ATTENTION_MISSES else 0.12
        assert predicted == pytest.approx(times[plan], rel=rel), (plan, predicted, times[plan])


@pytest.mark.parametrize("case", sorted(ATTENTION_H100), ids=lambda c: f"{c[0]}-w{c[1]}")
def test_attentions_default_is_the_plan_measured_faster(case):
    # (eager calls: where the kernel measured slower, the plan; non-causal SP attention's
    # kernel cannot hide its gather: each tile reads every rank's keys)
    name, w = case
    sizes, times = ATTENTION_H100[case]
    cfg, why = default_config(_bp(name, w, **sizes), _target("NVIDIA H100"))
    took = "plan" if cfg.comm == "none" else "kernel"
    assert times[took] == min(times.values()), (took, why)


def test_patterns_the_model_does_not_time_keep_the_overlapped_default():
    # a tile function's work is not declared: the model cannot time it
    bp = load_pattern(str(EXAMPLES / "patterns.py") + ":ag_rmsnorm").bind(
        {"M": 8192, "K": 8192}, 2)
    assert modelled(bp) is not None and "one GEMM and one collective" in modelled(bp)
    s = make_schedule(bp, _target("NVIDIA H100"))
    assert s.config.comm != "none"
    assert any("cost model: no estimate" in n for n in s.costs)


# TP-MLP M = 4096, H = 4096, I = 14336 (the same runs as H100_MATRIX): a chain of two GEMM
# pairs, each timed as the model times AG-GEMM and GEMM-RS, one after the other. W = 4
# replays: 4731cef and 8152601 (the SM kernel 0.547 / 0.536 ms, async-TP 0.426 / 0.423,
# NCCL + cuBLAS 0.551 / 0.550).
TP_MLP_H100 = [
    (2, False, {"copy_engine": .706, "async_tp": .829, "nccl": .871}),
    (2, True, {"sm": .908, "async_tp": .782, "nccl": .838}),
    (4, False, {"copy_engine": .400, "async_tp": .833, "nccl": .544}),
    (4, True, {"sm": .541, "async_tp": .424, "nccl": .550}),
]


@pytest.mark.parametrize("w,graph,measured", TP_MLP_H100)
def test_tp_mlp_takes_a_plan_within_5_percent_of_the_fastest_measured(w, graph, measured):
    bp = _bp("tp_mlp", w, M=4096, H=4096, I=14336)
    assert modelled(bp) is None
    _default_within(bp, measured, 1.05, graph)


def test_the_schedule_shows_both_estimates():
    bp, t = _bp("gemm_ar", 2, M=2048, N=8192, K=8192), _target("NVIDIA H100")
    s = make_schedule(bp, t)
    text = s.render()
    assert "library_comm=symm_two_shot" in s.config_text
    assert "non-overlapped plan chosen (library_comm=symm_two_shot)" in text
    assert "cost model (NVIDIA H100): eager" in text and "graph replays" in text
    kernel = make_schedule(bp, t, {"comm": "sm"})
    assert any(n.startswith("cost model (NVIDIA H100): eager") and
               "the best non-overlapped plan" in n for n in kernel.costs)
    # and the other resource's default, which the default weighed against it
    assert any("comm=copy_engine's default: eager" in n and "host" in n for n in kernel.costs)
    assert not any("cost model" in n for n in kernel.notes)  # (not in the module's text)


def test_naming_a_kernel_starts_from_its_own_defaults():
    # the default is the non-overlapped plan: comm=sm gets the SM lowering's sum after the
    # GEMM, and a kernel knob alone (allreduce=two_shot) the overlapped default with it
    bp, t = _bp("gemm_ar", 2, M=2048, N=8192, K=8192), _target("NVIDIA H100")
    sm = make_schedule(bp, t, {"comm": "sm"}).config
    assert sm.comm == "sm" and sm.reduce_after == 1 and sm.library_comm == "nccl"
    two = make_schedule(bp, t, {"allreduce": "two_shot"}).config
    assert two.comm == "sm" and two.allreduce == "two_shot"
    nccl = make_schedule(bp, t, {"comm": "none", "library_comm": "nccl"}).config
    assert nccl.comm == "none" and nccl.library_comm == "nccl"


def test_bytes_per_collective_variant():
    w, m, n = 4, 4096, 8192
    bp = _bp("gemm_ar", w, M=m, N=n, K=8192)
    partial = m * n * 2
    t = _target("NVIDIA H100")
    one = _config(bp, t, SM)
    two = _config(bp, t, TWO)
    assert moved_bytes(bp, one) == (w - 1) * partial  # every peer gets the whole partial
    assert moved_bytes(bp, two) == pytest.approx(2 * (w - 1) / w * partial)
    assert moved_bytes(bp, Config(comm="none", library_comm="nccl")) == \
        pytest.approx(2 * (w - 1) / w * partial)  # NCCL's ring
    assert moved_bytes(bp, Config(comm="none", library_comm="symm_one_shot")) == \
        (w - 1) * partial
    ag = _bp("ag_gemm", w, M=m, N=n, K=8192)
    assert moved_bytes(ag, Config(comm="none")) == (w - 1) * (m // w) * 8192 * 2
    rs = _bp("gemm_rs", w, M=m, N=n, K=8192)
    assert moved_bytes(rs, Config(comm="none")) == (w - 1) * (m // w) * n * 2


def test_a_gpus_links_are_shared_by_the_peers_it_sends_to():
    dev = device_spec("NVIDIA H100")
    assert share(dev, "ce", 1) == 1.0 and share(dev, "sm", 1) == 1.0
    assert share(dev, "ce", 3) == pytest.approx(0.61) and share(dev, "ce", 7) == \
        pytest.approx(0.61)
    assert share(dev, "ce", 3) < share(dev, "sm", 3) < 1.0
    # the same GEMM-AR at W = 4 moves 3x its partial one-shot: the model charges more than
    # 3x the W = 2 transfer for it (shared links), where two-shot moves 1.5x
    t = _target("NVIDIA H100")
    b2, b4 = (_bp("gemm_ar", w, M=4096, N=8192, K=8192) for w in (2, 4))
    e2 = estimate(b2, _config(b2, t, SM), dev)
    e4 = estimate(b4, _config(b4, t, SM), dev)
    assert e4.comm > 3 * e2.comm


def test_eager_calls_pay_the_host_and_replays_do_not():
    bp, t = _bp("gemm_ar", 2, M=128, N=8192, K=8192), _target("NVIDIA H100")
    dev = device_spec(t.device)
    nccl = _config(bp, t, NCCL)
    eager, replayed = estimate(bp, nccl, dev), estimate(bp, nccl, dev, graph=True)
    assert eager.host > eager.gpu and eager.total == eager.host
    assert replayed.total == replayed.gpu < eager.total


# The never-slower matrix on H100s, AG-GEMM and GEMM-RS (`tilelink bench --suite matrix`,
# 2026-11-27, a 4x H100 NV18 host, GPUs 0-1 for W = 2; 4731cef and 6142a53, means of the runs
# that measured a plan): ms per call of each plan measured, by the key `_plan` gives a config
# (a resource, or the non-overlapped plan's library). The default must pick a measured plan
# within 5% of the fastest one measured.
AG, RS = "ag_gemm", "gemm_rs"
H100_MATRIX = [
    # W = 4, graph replays
    (AG, 8192, 8192, 8192, 4, True, {"nccl": .704, "async_tp": .426}),
    (AG, 8192, 28672, 8192, 4, True, {"sm": 1.445, "async_tp": 1.552, "nccl": 1.695}),
    (AG, 8192, 49152, 12288, 4, True, {"sm": 3.792, "async_tp": 3.624, "nccl": 3.967}),
    (AG, 2048, 28672, 8192, 4, True, {"sm": .459, "async_tp": .377, "nccl": .467}),
    (AG, 1024, 8192, 8192, 4, True, {"nccl": .121, "async_tp": .130}),
    (RS, 8192, 8192, 28672, 4, True, {"sm": 1.778, "async_tp": 1.438, "nccl": 1.717}),
    (RS, 8192, 8192, 29568, 4, True, {"sm": 1.815, "async_tp": 1.499, "nccl": 1.773}),
    (RS, 8192, 8192, 8192, 4, True, {"sm": .949, "async_tp": .535, "nccl": .733}),
    (RS, 2048, 8192, 28672, 4, True, {"sm": .523, "async_tp": .369, "nccl": .427}),
    # W = 4, eager calls
    (AG, 8192, 8192, 8192, 4, False, {"copy_engine": .429, "async_tp": .549, "nccl": .702}),
    (AG, 8192, 28672, 8192, 4, False, {"copy_engine": 1.314, "async_tp": 1.575,
                                       "nccl": 1.709}),
    (AG, 8192, 49152, 12288, 4, False, {"copy_engine": 3.462, "async_tp": 3.691,
                                        "nccl": 4.012}),
    (AG, 2048, 28672, 8192, 4, False, {"copy_engine": .430, "async_tp": .681, "nccl": .466}),
    (RS, 8192, 8192, 28672, 4, False, {"copy_engine": 1.389, "async_tp": 1.444, "nccl": 1.736}),
    (RS, 8192, 8192, 29568, 4, False, {"copy_engine": 1.439, "async_tp": 1.509, "nccl": 1.800}),
    (RS, 2048, 8192, 28672, 4, False, {"copy_engine": .399, "async_tp": .563, "nccl": .422}),
    # W = 2, graph replays (copy-engine AG-GEMM on its flag protocol, capturable=1)
    (AG, 8192, 8192, 8192, 2, True, {"copy_engine": .769, "async_tp": .803, "nccl": 1.055}),
    (AG, 8192, 28672, 8192, 2, True, {"copy_engine": 2.729, "async_tp": 2.792, "nccl": 3.056}),
    (AG, 2048, 28672, 8192, 2, True, {"copy_engine": .715, "async_tp": .781, "nccl": .783}),
    (AG, 1024, 8192, 8192, 2, True, {"copy_engine": .115, "async_tp": .124, "nccl": .147}),
    (RS, 8192, 8192, 28672, 2, True, {"async_tp": 2.902, "nccl": 3.000}),
    (RS, 8192, 8192, 8192, 2, True, {"async_tp": .906, "nccl": 1.086}),
    (RS, 2048, 8192, 28672, 2, True, {"async_tp": .748, "nccl": .764}),
    # W = 2, eager calls
    (AG, 8192, 8192, 8192, 2, False, {"copy_engine": .754, "async_tp": .810, "nccl": 1.047}),
    (AG, 2048, 28672, 8192, 2, False, {"copy_engine": .708, "async_tp": .779, "nccl": .773}),
    (AG, 1024, 8192, 8192, 2, False, {"copy_engine": .120, "async_tp": .231, "nccl": .149}),
    (RS, 8192, 8192, 28672, 2, False, {"copy_engine": 2.818, "async_tp": 2.892, "nccl": 3.180}),
    (RS, 8192, 8192, 29568, 2, False, {"copy_engine": 3.001, "async_tp": 2.901, "nccl": 3.172}),
    (RS, 8192, 8192, 8192, 2, False, {"copy_engine": .831, "async_tp": .927, "nccl": 1.099}),
]

# The same matrix at W = 4 on 7d18f86 (2026-11-27, a 4x H100 host, one lease, every row in one
# tree): the default's plan as TileLink ran it and the baselines of the same run (AG-GEMM,
# GEMM-RS and GEMM-AR rows; bench-results/2026-11-27-7d18f86-matrix-w4-*).
AR = "gemm_ar"
H100_MATRIX += [
    (AG, 8192, 8192, 8192, 4, True, {"nccl": .704, "async_tp": .425}),
    (AG, 8192, 28672, 8192, 4, True, {"nccl": 1.661, "async_tp": 1.565, "sm": 1.428}),
    (AG, 8192, 49152, 12288, 4, True, {"nccl": 3.939, "async_tp": 3.659, "sm": 3.654}),
    (AG, 2048, 28672, 8192, 4, True, {"nccl": .462, "async_tp": .378}),
    (AG, 1024, 8192, 8192, 4, True, {"nccl": .120, "async_tp": .129}),
    (RS, 8192, 8192, 28672, 4, True, {"nccl": 1.764, "async_tp": 1.461}),
    (RS, 8192, 8192, 29568, 4, True, {"nccl": 1.813, "async_tp": 1.501}),
    (RS, 8192, 8192, 8192, 4, True, {"nccl": .733, "async_tp": .531}),
    (RS, 2048, 8192, 28672, 4, True, {"nccl": .432, "async_tp": .366}),
    (AR, 128, 8192, 8192, 4, True, {"nccl": .051, "symm_one_shot": .045, "symm_two_shot": .040}),
    (AR, 512, 8192, 8192, 4, True, {"nccl": .102, "symm_one_shot": .123, "symm_two_shot": .086}),
    (AR, 2048, 8192, 8192, 4, True, {"nccl": .296, "symm_one_shot": .435,
                                     "symm_two_shot": .269}),
    (AR, 4096, 8192, 8192, 4, True, {"nccl": .560, "symm_one_shot": .846,
                                     "symm_two_shot": .509}),
    (AG, 8192, 8192, 8192, 4, False, {"nccl": .701, "async_tp": .755, "copy_engine": .431}),
    (AG, 8192, 28672, 8192, 4, False, {"nccl": 1.706, "async_tp": 1.570, "copy_engine": 1.305}),
    (AG, 8192, 49152, 12288, 4, False, {"nccl": 4.020, "async_tp": 3.638,
                                        "copy_engine": 3.467}),
    (AG, 2048, 28672, 8192, 4, False, {"nccl": .473, "async_tp": .752, "copy_engine": .424}),
    (AG, 1024, 8192, 8192, 4, False, {"nccl": .187, "async_tp": .782}),
    (RS, 8192, 8192, 28672, 4, False, {"nccl": 1.735, "async_tp": 1.472, "copy_engine": 1.361}),
    (RS, 8192, 8192, 29568, 4, False, {"nccl": 1.804, "async_tp": 1.503, "copy_engine": 1.450}),
    (RS, 8192, 8192, 8192, 4, False, {"nccl": .732, "async_tp": .614, "copy_engine": .637}),
    (RS, 2048, 8192, 28672, 4, False, {"nccl": .419, "async_tp": .713, "copy_engine": .400}),
    (AR, 128, 8192, 8192, 4, False, {"nccl": .135, "symm_one_shot": .049,
                                     "symm_two_shot": .047}),
    (AR, 512, 8192, 8192, 4, False, {"nccl": .131, "symm_one_shot": .125,
                                     "symm_two_shot": .090}),
    (AR, 2048, 8192, 8192, 4, False, {"nccl": .295, "symm_one_shot": .437,
                                      "symm_two_shot": .270}),
    (AR, 4096, 8192, 8192, 4, False, {"nccl": .560, "symm_one_shot": .850,
                                      "symm_two_shot": .514}),
]

# A Llama-3-8B decoder layer's four GEMM + collective pairs, eager calls (tools/host_profile.py,
# 2026-11-27, 4x H100 hosts, W = 2 on GPUs 0-1; one lease per group of rows, the plans of a row
# in one run): at M = 2048 tokens the SM kernel (AG; the one measured for GEMM-RS is the GEMM,
# then its reduction in a kernel of its own, flatten=1 reduce_after=1), the copy engine, and
# TileLink's non-overlapped plan ("nccl"); "sm_after" names that GEMM-RS kernel, which the
# default (flatten=0) is not. These shapes are host-bound or nearly: the copy
# engine's driver calls cost it up to 2x here, which the resource choice must see.
H100_MATRIX += [
    # 5cbca45 (the default was then the copy engine everywhere)
    (AG, 2048, 28672, 4096, 2, False, {"sm": .416, "copy_engine": .353, "nccl": .405}),
    (RS, 2048, 4096, 14336, 2, False, {"sm_after": .209, "copy_engine": .187, "nccl": .218}),
    # 65df0a4 (the default's SM kernel, flatten=0 for GEMM-RS)
    (AG, 2048, 6144, 4096, 2, False, {"sm": .104, "copy_engine": .145, "nccl": .146}),
    (RS, 2048, 4096, 4096, 2, False, {"sm": .145, "copy_engine": .153, "nccl": .171}),
    (AG, 2048, 6144, 4096, 4, False, {"sm": .134, "copy_engine": .198, "nccl": .191}),
    (RS, 2048, 4096, 4096, 4, False, {"sm": .123, "copy_engine": .265, "nccl": .211}),
    (AG, 2048, 28672, 4096, 4, False, {"sm": .248, "copy_engine": .247, "nccl": .258}),
    # 89dd524, decode sizes called eagerly (8 tokens)
    (AG, 8, 6144, 4096, 4, False, {"sm": .083, "copy_engine": .207, "nccl": .165}),
    (RS, 8, 4096, 14336, 4, False, {"sm": .080, "copy_engine": .243, "nccl": .184}),
]
# W = 4 down at 2048 tokens (960452b, two leases on two 4x H100 hosts): the GEMM, then the
# sum in a kernel of its own 0.149 / 0.1515 ms, the SM default (flatten=0) 0.203 / 0.1515, the
# copy engine 0.246, the plan 0.191 / 0.1735 (NCCL + cuBLAS in tilelink bench's form 0.180 /
# 0.163). The default was the plan (1.15x off the fastest): the model charged the sum-after
# kernel's pushes their whole stall, where this GEMM outlasts them (`stall_spreads`), and
# the default never weighed that kernel (`Lowering.default_axes`).
H100_MATRIX += [
    (RS, 2048, 4096, 14336, 4, False, {"sm_after": .149, "sm": .203, "copy_engine": .246,
                                       "nccl": .191}),
]


def test_the_default_weighs_a_lowerings_alternatives_on_eager_calls_only():
    # W = 4 down at 2048 tokens: the SM reduce-scatter's sum-after kernel (its `default_axes`)
    # is the eager default; replays keep the resources' defaults (see `_alternatives`)
    from tilelink.schedule.lowering import op_sites

    bp, t = _bp(RS, 4, M=2048, N=4096, K=14336), _target("NVIDIA H100")
    eager, _ = default_config(bp, t)
    assert (eager.comm, eager.flatten, eager.reduce_after) == ("sm", 1, 1)
    from tilelink.schedule.schedule import _alternatives, default_alternatives, default_space

    sm, _ = default_config(bp, t, allow_fallback=False, resource="sm")
    assert [(c.flatten, c.reduce_after) for c in default_alternatives(bp, t, sm)] == [(1, 1)]
    assert _alternatives(bp, t, default_space(t), sm, graph=True) == []
    # on the emulated world and at W = 1 the lowering proposes no alternative
    for target, w in ((get_target("interp"), 4), (t, 1)):
        b = _bp(RS, w, M=64, N=64, K=64 * w)
        cfg = Config(comm="sm")
        sites = op_sites(b, cfg, target)
        rs = next(op for op in b.ops if op.kind == "reduce_scatter")
        assert sites[rs.result].lowering.default_axes(sites[rs.result]) == []


# The copy engine's reduce-scatter in 512- and 1,024-row chunks (`comm_block_m`; the default
# and the alternative its lowering offers), eager calls at W = 2, 2x H100 hosts (2026-11-27,
# 955ef31 and 9e06a47 with the per-op host model, tools/host_profile.py, steady us per call):
# half the chunks, half the copies, waits and signals (a driver call each, ~5-7 us of host)
CE_CHUNKS_H100 = [
    ((4096, 4096, 4096), {512: 201.1, 1024: 157.1}),  # host-paced at 512
    ((4096, 4096, 14336), {512: 368.0, 1024: 374.4}),
    ((2048, 4096, 14336), {512: 200.7, 1024: 186.0}),
    ((2048, 8192, 8192), {512: 238.1, 1024: 229.9}),
    ((8192, 4096, 14336), {512: 751.7, 1024: 741.5}),
    ((8192, 4096, 4096), {512: 245.3, 1024: 242.6}),
]


@pytest.mark.parametrize("mnk,measured", CE_CHUNKS_H100, ids=lambda v: "x".join(map(str, v))
                         if isinstance(v, tuple) else None)
def test_the_copy_engine_reduce_scatter_takes_the_chunk_measured_fastest(mnk, measured):
    m, n, k = mnk
    chosen, why = default_config(_bp(RS, 2, M=m, N=n, K=k), _target("NVIDIA H100"))
    assert chosen.comm == "copy_engine", why
    assert measured[chosen.comm_block_m] <= 1.05 * min(measured.values()), chosen


def test_the_tuners_space_has_the_alternatives_the_default_weighs():
    # the 1,024-row chunks the default takes at 4096^3, W = 2: the tuner can measure them
    from tilelink.tune import space

    bp = _bp(RS, 2, M=4096, N=4096, K=4096)
    cands = space.candidates(bp, _target("NVIDIA H100"))
    chunks = {(c.comm_block_m, c.comm_block_n) for c in cands if c.comm == "copy_engine"}
    assert {(512, 32), (1024, 16)} <= chunks


def test_host_time_counts_the_copy_engine_programs_ops():
    # a driver call an op (Lowering.ce_ops): 1,024-row chunks save the host 6 of 13 ops
    t, dev = _target("NVIDIA H100"), device_spec("NVIDIA H100")
    bp = _bp(RS, 2, M=4096, N=4096, K=4096)
    small = estimate(bp, _config(bp, t, "comm=copy_engine comm_block_m=512 comm_block_n=32"),
                     dev).host
    large = estimate(bp, _config(bp, t, "comm=copy_engine comm_block_m=1024 comm_block_n=16"),
                     dev).host
    assert small - large == pytest.approx(6 * dev.host_ce_op_us * 1e-3)


# The never-slower matrix on H200s (`tilelink bench --suite matrix --rounds 3 [--graph]`,
# 2026-11-28, 4x H200 hosts lent as nvidia-h200-x4, GPUs 0-1 for W = 2; 8ce9699 (W = 4 eager),
# 5105a86 (W = 4 graph), 3945804 (W = 2, and AG-GEMM's copy engine on flags replayed at W = 4
# with `--config comm=copy_engine capturable=1`): each plan's time in the run that measured
# it (the library plans as the bench's baselines ran them).
H200_MATRIX = [
    # W = 4, graph replays (copy_engine at 28672 / 49152: the flag protocol, a run of its own
    # against async-TP 1.581 / 3.776 there; the SM kernel 1.463 / 3.875 in the matrix's run)
    (AG, 8192, 8192, 8192, 4, True, {"nccl": .699, "async_tp": .417, "copy_engine": .405}),
    (AG, 8192, 28672, 8192, 4, True, {"nccl": 1.717, "async_tp": 1.519, "sm": 1.463,
                                      "copy_engine": 1.489}),
    (AG, 8192, 49152, 12288, 4, True, {"nccl": 4.022, "async_tp": 3.774, "sm": 3.875,
                                       "copy_engine": 3.712}),
    (AG, 2048, 28672, 8192, 4, True, {"nccl": .458, "async_tp": .380, "copy_engine": .422}),
    (AG, 1024, 8192, 8192, 4, True, {"nccl": .115, "async_tp": .111}),
    (RS, 8192, 8192, 28672, 4, True, {"nccl": 1.788, "async_tp": 1.448}),
    (RS, 8192, 8192, 29568, 4, True, {"nccl": 1.839, "async_tp": 1.510}),
    (RS, 8192, 8192, 8192, 4, True, {"nccl": .729, "async_tp": .524}),
    (RS, 2048, 8192, 28672, 4, True, {"nccl": .431, "async_tp": .360}),
    (AR, 128, 8192, 8192, 4, True, {"nccl": .046, "symm_one_shot": .042, "symm_two_shot": .036}),
    (AR, 512, 8192, 8192, 4, True, {"nccl": .096, "symm_one_shot": .118, "symm_two_shot": .081}),
    (AR, 2048, 8192, 8192, 4, True, {"nccl": .292, "symm_one_shot": .432,
                                     "symm_two_shot": .269}),
    (AR, 4096, 8192, 8192, 4, True, {"nccl": .541, "symm_one_shot": .837,
                                     "symm_two_shot": .508}),
    # W = 4, eager calls
    (AG, 8192, 8192, 8192, 4, False, {"nccl": .698, "async_tp": .638, "copy_engine": .414}),
    (AG, 8192, 28672, 8192, 4, False, {"nccl": 1.704, "async_tp": 1.504, "copy_engine": 1.293}),
    (AG, 8192, 49152, 12288, 4, False, {"nccl": 4.012, "async_tp": 3.708,
                                        "copy_engine": 3.455}),
    (AG, 2048, 28672, 8192, 4, False, {"nccl": .441, "async_tp": .652, "copy_engine": .409}),
    (AG, 1024, 8192, 8192, 4, False, {"nccl": .121, "async_tp": .660}),
    (RS, 8192, 8192, 28672, 4, False, {"nccl": 1.741, "async_tp": 1.448, "copy_engine": 1.388}),
    (RS, 8192, 8192, 29568, 4, False, {"nccl": 1.793, "async_tp": 1.495, "copy_engine": 1.449}),
    (RS, 8192, 8192, 8192, 4, False, {"nccl": .729, "async_tp": .775, "copy_engine": .498}),
    (RS, 2048, 8192, 28672, 4, False, {"nccl": .417, "async_tp": .741, "copy_engine": .379}),
    (AR, 128, 8192, 8192, 4, False, {"nccl": .179, "symm_one_shot": .058,
                                     "symm_two_shot": .054}),
    (AR, 512, 8192, 8192, 4, False, {"nccl": .207, "symm_one_shot": .127,
                                     "symm_two_shot": .093}),
    (AR, 2048, 8192, 8192, 4, False, {"nccl": .301, "symm_one_shot": .442,
                                      "symm_two_shot": .277}),
    (AR, 4096, 8192, 8192, 4, False, {"nccl": .553, "symm_one_shot": .859,
                                      "symm_two_shot": .518}),
    # W = 2, graph replays
    (AG, 8192, 8192, 8192, 2, True, {"nccl": 1.064, "async_tp": .787, "copy_engine": .734}),
    (AG, 8192, 28672, 8192, 2, True, {"nccl": 3.104, "async_tp": 2.884, "copy_engine": 2.752}),
    (AG, 8192, 49152, 12288, 2, True, {"nccl": 7.744, "async_tp": 7.525,
                                       "copy_engine": 7.649}),
    (AG, 2048, 28672, 8192, 2, True, {"nccl": .768, "async_tp": .781, "copy_engine": .679}),
    (AG, 1024, 8192, 8192, 2, True, {"nccl": .151, "async_tp": .119, "copy_engine": .112}),
    (RS, 8192, 8192, 28672, 2, True, {"nccl": 3.105, "async_tp": 2.936}),
    (RS, 8192, 8192, 29568, 2, True, {"nccl": 3.188, "async_tp": 3.030}),
    (RS, 8192, 8192, 8192, 2, True, {"nccl": 1.088, "async_tp": .897}),
    (RS, 2048, 8192, 28672, 2, True, {"nccl": .768, "async_tp": .701}),
    (AR, 128, 8192, 8192, 2, True, {"nccl": .059, "symm_one_shot": .043, "symm_two_shot": .041}),
    (AR, 512, 8192, 8192, 2, True, {"nccl": .105, "symm_one_shot": .102, "symm_two_shot": .086}),
    (AR, 2048, 8192, 8192, 2, True, {"nccl": .337, "symm_one_shot": .374,
                                     "symm_two_shot": .310}),
    (AR, 4096, 8192, 8192, 2, True, {"nccl": .638, "symm_one_shot": .734,
                                     "symm_two_shot": .600}),
    # W = 2, eager calls
    (AG, 8192, 8192, 8192, 2, False, {"nccl": 1.051, "async_tp": .807, "copy_engine": .755}),
    (AG, 8192, 28672, 8192, 2, False, {"nccl": 3.114, "async_tp": 2.902, "copy_engine": 2.700}),
    (AG, 8192, 49152, 12288, 2, False, {"nccl": 7.717, "async_tp": 7.547,
                                        "copy_engine": 7.583}),
    (AG, 2048, 28672, 8192, 2, False, {"nccl": .767, "async_tp": .776, "copy_engine": .677}),
    (AG, 1024, 8192, 8192, 2, False, {"nccl": .151, "async_tp": .394}),
    (RS, 8192, 8192, 28672, 2, False, {"nccl": 3.113, "async_tp": 2.935, "copy_engine": 2.927}),
    (RS, 8192, 8192, 29568, 2, False, {"nccl": 3.227, "async_tp": 3.055, "copy_engine": 3.081}),
    (RS, 8192, 8192, 8192, 2, False, {"nccl": 1.090, "async_tp": .918, "copy_engine": .827}),
    (RS, 2048, 8192, 28672, 2, False, {"nccl": .781, "async_tp": .762, "copy_engine": .757}),
    (AR, 128, 8192, 8192, 2, False, {"nccl": .128, "symm_one_shot": .044,
                                     "symm_two_shot": .045}),
    (AR, 512, 8192, 8192, 2, False, {"nccl": .162, "symm_one_shot": .107,
                                     "symm_two_shot": .091}),
    (AR, 2048, 8192, 8192, 2, False, {"nccl": .339, "symm_one_shot": .378,
                                      "symm_two_shot": .312}),
    (AR, 4096, 8192, 8192, 2, False, {"nccl": .636, "symm_one_shot": .732,
                                      "symm_two_shot": .600}),
]


def test_an_eager_fused_library_call_near_host_bound_does_not_win_a_tie():
    # W = 2 GEMM-RS 2048 x 8192 x 28672 on H200, eager (2026-11-28): the copy engine 0.757 ms,
    # async-TP 0.762, NCCL + cuBLAS 0.781. The model puts async-TP within the margin of the
    # copy engine (0.743 against 0.726) with 0.56 ms of host: the kernel is taken
    from tilelink.schedule.cost import runs_fused_library

    bp, t = _bp("gemm_rs", 2, M=2048, N=8192, K=28672), _target("NVIDIA H200")
    chosen, why = default_config(bp, t)
    assert chosen.comm == "copy_engine", why
    replayed, _ = default_config(bp, t, graph=True)  # (replays have no host work: async-TP)
    assert replayed.comm == "none" and runs_fused_library(bp, replayed)


@pytest.mark.parametrize("device,case", [("NVIDIA H100", c) for c in H100_MATRIX]
                         + [("NVIDIA H200", c) for c in H200_MATRIX],
                         ids=lambda v: v.split()[-1].lower() if isinstance(v, str) else
                         "-".join(map(str, v[:5])) + ("-graph" if v[5] else ""))
def test_the_default_is_within_5_percent_of_the_fastest_plan_measured(device, case):
    name, m, n, k, w, graph, measured = case
    _default_within(_bp(name, w, M=m, N=n, K=k), measured, 1.05, graph, device)


# distributed flash-decode, B = 1, H = 32, S = 131072, D = 128 (2026-11-27, 4x H100, 8152601,
# graph replays): the non-overlapped plan (torch's flash SDPA over the slice, NCCL all-gather
# of the partials, the combine); and attention_partial's split-KV kernel alone over W = 2's
# slice (65536 keys: 1 GiB of keys and values) on one H100: 0.401 ms
FLASH_PLAN_H100 = {2: 0.388, 4: 0.225}
SPLIT_KERNEL_H100 = 0.401


@pytest.mark.parametrize("w", list(FLASH_PLAN_H100))
@pytest.mark.parametrize("graph", [False, True])
def test_flash_decode_times_the_split_kernel_and_the_plan_as_measured(w, graph):
    bp = _bp("flash_decode", w, B=1, H=32, S=131072, D=128)
    t = _target("NVIDIA H100")
    dev = device_spec(t.device)
    over, _ = default_config(bp, t, allow_fallback=False)
    plan = replace(over, comm="none")
    # the kernel streams the slice's keys on every SM: at W = 2 its measured time plus the
    # gather of the partials (a few KB), at W = 4 half the keys
    kernel_ms = SPLIT_KERNEL_H100 * 2 / w
    assert 0.8 < estimate(bp, over, dev, True).total / kernel_ms < 1.2
    assert 0.8 < estimate(bp, plan, dev, True).total / FLASH_PLAN_H100[w] < 1.2
    # the default follows the model (no decision written down for these sizes)
    chosen, _ = default_config(bp, t, graph=graph)
    faster = estimate(bp, over, dev, graph).total < \
        (1 - OVERLAP_MARGIN) * estimate(bp, plan, dev, graph).total
    assert chosen.comm == ("sm" if faster else "none")
    # the test sizes keep the kernel (the dist suite's flash-decode cases run it)
    small = _bp("flash_decode", w, B=4, H=8, S=2400, D=64)
    assert default_config(small, t, graph=graph)[0].comm == "sm"


# distributed flash-decode at B = 1, H = 32, S = 131072, D = 128, CUDA-graph replays on 4x
# H100 (2026-11-27, 3356429): the split-KV kernel against the non-overlapped plan, ms per call
FLASH_DECODE_H100 = [
    ("flash_decode", {}, 2, {"sm": .399, "nccl": .389}),
    ("flash_decode", {}, 4, {"sm": .217, "nccl": .221}),
    ("flash_decode_gqa", {"HKV": 8}, 2, {"sm": .115, "nccl": .135}),
    ("flash_decode_gqa", {"HKV": 8}, 4, {"sm": .074, "nccl": .092}),
]


@pytest.mark.parametrize("name,heads,w,measured", FLASH_DECODE_H100)
def test_flash_decode_takes_the_plan_measured_faster(name, heads, w, measured):
    # the kernel's programs stream below torch's SDPA (attention.SPLIT_PROGRAM_GBS): at
    # W = 2 with a key head per query head the plan's SDPA measured 2.5% faster
    _default_within(_bp(name, w, B=1, H=32, S=131072, D=128, **heads), measured, 1.03,
                    graph=True)


# 2x H200 (2026-11-28, c17cba3, W = 2, S = 262144 / 131072 keys in all, D = 128, CUDA-graph
# replays; `--check` passed on both large ones): the kernel against the plan, ms per call.
# (MHA's row, B = 1 at 262144 keys, measured the kernel on the CUDA cores, 0.823 against the
# plan's 0.572; its kernel now runs on the tensor cores: see the test after this one)
FLASH_DECODE_H200 = [
    ("flash_decode_gqa", dict(B=8, H=32, HKV=8, S=131072), {"sm": .505, "nccl": .541}),
    ("flash_decode_gqa", dict(B=1, H=32, HKV=8, S=131072), {"sm": .0854, "nccl": .1236}),
]


@pytest.mark.parametrize("name,sizes,measured", FLASH_DECODE_H200,
                         ids=[f"{c[0]}-B{c[1]['B']}" for c in FLASH_DECODE_H200])
def test_flash_decode_on_h200_within_a_tenth_of_the_faster(name, sizes, measured):
    # the kernel's per-program rates on H200 (attention.SPLIT_PROGRAM_GBS_ON: the group kernel
    # follows the faster HBM, the one-head kernel does not) put it within 15% of each run
    # (B = 1 the least close: each item's fixed cost, not modelled, weighs more there). A
    # known miss: GQA at B = 8 the kernel 0.505 ms against the plan's 0.541, which the model
    # says 0.513 (SDPA's rate on H200 not measured apart), so within the overlap margin the
    # default keeps the plan, 7% slower
    bp = _bp(name, 2, D=128, **sizes)
    t = _target("NVIDIA H200")
    chosen, why = default_config(bp, t, graph=True)
    assert measured[_plan(chosen)] <= 1.10 * min(measured.values()), (why, measured)
    kernel = estimate(bp, _config(bp, t, "comm=sm"), device_spec(t.device), True).total
    assert kernel == pytest.approx(measured["sm"], rel=0.15), kernel
    # the decisions as they stand, the miss included: a model change that fixes it (or
    # turns another case) must update this table with what it then picks
    want = {"B8": "nccl", "B1": "sm"}[f"B{sizes['B']}"]
    assert _plan(chosen) == want, why


# one H200 of a 4x H200 host (2026-11-28; the kernel as this code renders it: a query head
# per key head on the tensor cores, 64-key blocks), `tools/decode_bw.py --graph --heads 32/32
# --configs block_n=64` at W = 1 (a named config: the kernel alone; W = 1's default is torch's
# SDPA), D = 128, ms: (B, keys, key heads) -> measured
DECODE_ALONE_H200 = {(8, 32768, 32): 0.995, (8, 131072, 32): 4.036, (1, 32768, 32): 0.135,
                     (1, 131072, 32): 0.513}


@pytest.mark.parametrize("case", list(DECODE_ALONE_H200), ids=str)
def test_the_decode_kernel_alone_on_h200_as_measured(case, tmp_path):
    # the per-program rate of `attention.SPLIT_PROGRAM_GBS_ON` (33 GB/s on H200, measured for
    # query groups at W = 2, now MHA's too) puts the kernel within 10% of each run
    b, keys, hkv = case
    path = tmp_path / "decode.tl"
    path.write_text("pattern decode_partial(B = 1, H = 32, HKV = 32, S = 32768, D = 128, "
                    "dtype = bf16)\n    q : [B, H, D] dtype replicated\n"
                    "    k : [B, S, HKV, D] dtype\n    v : [B, S, HKV, D] dtype\n"
                    "    part = attention_partial(q, k, v)\n    return part\n")
    bp = load_pattern(str(path)).bind({"B": b, "H": 32, "HKV": hkv, "S": keys, "D": 128}, 1)
    t = _target("NVIDIA H200")
    kernel = estimate(bp, _config(bp, t, "comm=sm"), device_spec(t.device), True).total
    assert kernel == pytest.approx(DECODE_ALONE_H200[case], rel=0.10), kernel


# AG-MoE on 2x / 4x H100 (2026-11-27, 3356429, bench, ms per call): the grouped kernel on SMs
# against the non-overlapped plan (NCCL all-gather + torch._grouped_mm on rows sorted by
# expert). Mixtral-8x7B's layer (8192 tokens, K = 4096, N = 14336, E = 8, top-2) and a
# DeepSeek-MoE-like one (K = 2048, N = 1408, E = 64, top-6)
MOE_H100 = [
    (dict(T=8192, K=4096, N=14336, E=8, TOPK=2), 2, False, {"sm": 1.929, "nccl": 2.399}),
    (dict(T=8192, K=4096, N=14336, E=8, TOPK=2), 2, True, {"sm": 1.917, "nccl": 2.298}),
    (dict(T=8192, K=4096, N=14336, E=8, TOPK=2), 4, False, {"sm": 1.162, "nccl": 1.437}),
    (dict(T=8192, K=4096, N=14336, E=8, TOPK=2), 4, True, {"sm": 1.162, "nccl": 1.327}),
    # E = 64 with the routing on many programs (2026-11-27, 49d8f75; on one program it took
    # 2.410 / 2.356 ms and the plan was faster)
    (dict(T=8192, K=2048, N=1408, E=64, TOPK=6), 2, False, {"sm": 0.411, "nccl": 0.971}),
    (dict(T=8192, K=2048, N=1408, E=64, TOPK=6), 4, False, {"sm": 0.357, "nccl": 0.872}),
]


@pytest.mark.parametrize("sizes,w,graph,measured", MOE_H100,
                         ids=[f"E{c[0]['E']}-W{c[1]}" + ("-graph" if c[2] else "")
                              for c in MOE_H100])
def test_ag_moe_takes_the_plan_measured_faster(sizes, w, graph, measured):
    bp = _bp("ag_moe", w, **sizes)
    t = _target("NVIDIA H100")
    chosen, why = default_config(bp, t, graph=graph)
    want = min(measured, key=measured.get)
    # (the copy engine's gather was refused on GPUs when these ran; the eager default takes
    # it now, measured faster than SMs on H200s: MOE_H200)
    assert _plan(chosen) == want or (want, _plan(chosen), graph) == (
        "sm", "copy_engine", False), why
    dev = device_spec(t.device)
    for plan, ms in measured.items():  # and the model within 30% of each measurement
        if (sizes["E"], w, plan) in MOE_KNOWN_MISSES:
            continue
        cfg = _config(bp, t, "comm=sm" if plan == "sm" else NCCL)
        assert 0.7 < estimate(bp, cfg, dev, graph).total / ms < 1.3, (plan, ms)


# AG-MoE on 2x H200 (2026-11-28, 259c016, bench --rounds 5, eager): the gather on the copy
# engine against SMs (16 of the kernel's 132 programs push) and NCCL + torch._grouped_mm, with
# the grouped kernel's defaults of that commit (tile_group=8, the weights through TMA). (W = 4,
# measured on 4x H200 with the kernel before them, 1476066: 0.911 / 0.985 / 1.425 ms at
# Mixtral's layer, the same order.)
MOE_H200 = [
    (dict(T=8192, K=4096, N=14336, E=8, TOPK=2), 2,
     {"copy_engine": 1.472, "sm": 1.733, "nccl": 2.265}),
    (dict(T=8192, K=2048, N=1408, E=64, TOPK=6), 2,
     {"copy_engine": 0.364, "sm": 0.405, "nccl": 0.735}),
]


@pytest.mark.parametrize("sizes,w,measured", MOE_H200,
                         ids=[f"E{c[0]['E']}-W{c[1]}" for c in MOE_H200])
def test_ag_moe_eager_takes_the_copy_engine_measured_faster_on_h200(sizes, w, measured):
    bp = _bp("ag_moe", w, **sizes)
    t = _target("NVIDIA H200")
    dev = device_spec(t.device)
    chosen, why = default_config(bp, t)
    assert _plan(chosen) == min(measured, key=measured.get), why
    for plan in measured:  # the model within 30% of each, in the measured order
        cfg = _config(bp, t, NCCL if plan == "nccl" else f"comm={plan}")
        assert 0.7 < estimate(bp, cfg, dev).total / measured[plan] < 1.3, plan
    est = {p: estimate(bp, _config(bp, t, NCCL if p == "nccl" else f"comm={p}"), dev).total
           for p in measured}
    assert sorted(est, key=est.get) == sorted(measured, key=measured.get), est


# causal SP attention (GQA 32 / 8, D = 128) at W = 2 in CUDA-graph replays on 2x H200
# (2026-11-28, bff268b, bench --graph --rounds 3): the SM kernel, whose two gathers' pushes
# take 32 of its 132 programs, against the non-overlapped plan (NCCL all-gathers + SDPA).
# Before the model charged those programs, it took the kernel (predicted 21.6 ms at S = 32768).
SP_CAUSAL_GRAPH_H200 = [(8192, {"sm": 1.833, "nccl": 1.553}),
                        (32768, {"sm": 27.975, "nccl": 20.817})]


@pytest.mark.parametrize("s,measured", SP_CAUSAL_GRAPH_H200,
                         ids=[f"S{c[0]}" for c in SP_CAUSAL_GRAPH_H200])
def test_causal_sp_replays_take_the_plan_measured_faster_on_h200(s, measured):
    bp = _bp("sp_attention_causal", 2, S=s, H=32, HKV=8, D=128)
    t = _target("NVIDIA H200")
    chosen, why = default_config(bp, t, graph=True)
    assert _plan(chosen) == "nccl", why
    dev = device_spec(t.device)
    sm = estimate(bp, _config(bp, t, "comm=sm"), dev, True).total
    assert 0.8 < sm / measured["sm"] < 1.2, sm  # (the plan it puts 3-16% slow)


# the model's grouped-GEMM efficiency follows rows per expert only; at E = 64, W = 4 (N / W =
# 352) torch._grouped_mm ran 98 TFLOP/s, below what that predicts (0.557 ms against 0.836),
# and TileLink's grouped kernel 0.357 ms where the model, with its tiles' empty columns
# counted, says 0.258: both narrow GEMMs run below the model's rate, the decision stands
MOE_KNOWN_MISSES = {(64, 4, "nccl"), (64, 4, "sm")}


# decode sizes, CUDA-graph replays (2026-11-27, ms per call): a Llama-3-8B layer's four GEMM +
# collective pairs at 8 tokens; W = 2 on 2x H100 (1b25fa1), W = 4 on 4x H100 (a1e6070); the
# SM kernel against NCCL + cuBLAS. A skinny GEMM has few tiles, so few programs stream its
# weights (`DeviceSpec.skinny_hbm`); NCCL's all-gather of a few rows took 10 us at
# W = 2 and 27-50 at W = 4 (per ring step in the model), its reduce-scatter 10-12 at both
# (the model had 40 for every NCCL call, its all-reduce's)
AG1, RS1 = ("ag_gemm", {"M": 8, "N": 6144, "K": 4096}), ("gemm_rs", {"M": 8, "N": 4096, "K": 4096})
AG2, RS2 = ("ag_gemm", {"M": 8, "N": 28672, "K": 4096}), ("gemm_rs", {"M": 8, "N": 4096, "K": 14336})
DECODE_H100 = [
    (*AG1, 2, {"sm": .039, "nccl": .019}), (*RS1, 2, {"sm": .034, "nccl": .016}),
    (*AG2, 2, {"sm": .057, "nccl": .058}), (*RS2, 2, {"sm": .063, "nccl": .036}),
    (*AG1, 4, {"sm": .036, "nccl": .020}), (*RS2, 4, {"sm": .056, "nccl": .019}),
    (*RS1, 4, {"sm": .044, "nccl": .018}),
    (*AG2, 4, {"sm": .054, "nccl": .050}),
]
# W = 4 was measured on two 4x H100 hosts: AG1's NCCL + cuBLAS took 0.058 ms in the first
# run and 0.020 in the second (its gather alone 0.015), so the kernel (0.037 / 0.036) won
# the first and lost the second; pinned is the second, where the plan is the safe choice.
# AG 8 x 28672 x 4096 at W = 4: the kernel 0.052-0.057 ms, as at W = 2 with half the weights a
# rank, against NCCL + cuBLAS 0.050-0.051 (the model once said 0.038 and took the kernel);
# in the decoder layer replayed (2026-11-27, 960452b) every pair on the plan took 0.116 ms a
# layer against 0.133 with this pair on the kernel


def _pair_id(v) -> str:
    """A decode pair case's id: its sizes (M8-N6144-K4096), else the value itself."""
    return "-".join(f"{k}{x}" for k, x in v.items()) if isinstance(v, dict) and "M" in v \
        else str(v)


@pytest.mark.parametrize("name,sizes,w,measured", DECODE_H100, ids=_pair_id)
def test_decode_sizes_replayed_take_the_plan_measured_faster(name, sizes, w, measured):
    bp = _bp(name, w, **sizes)
    _default_within(bp, measured, 1.05, graph=True)
    # and the kernel's time within 30% of its measurement (the tiles that stream its weights)
    dev = device_spec("NVIDIA H100")
    # (the GEMM-RS kernels measured: the GEMM, then the reduction in a kernel of its own)
    sm = "comm=sm" + (" flatten=1 reduce_after=1" if name == "gemm_rs" else "")
    kernel = estimate(bp, _config(bp, _target("NVIDIA H100"), sm), dev, True).total
    assert kernel == pytest.approx(measured["sm"], rel=0.3), kernel


# the same pairs on 4x H200 (2026-11-28, e7f6964 / b0d92d0, graph replays, ms per call; W = 2
# on GPUs 0-1): the SM kernel ran as on H100 where the H200 row had said 0.019-0.027 (a
# skinny GEMM's programs stream at one SM's rate, not at a share of the faster HBM), and
# NCCL's scatter of a few rows took ~10 us. In the decoder layer replayed (W = 4, 8 tokens):
# every op as the plan 0.105-0.110 ms, the defaults before (the kernel for q/k/v and o)
# 0.135, every op on SMs 0.161, inductor's NCCL layer 0.117-0.125.
DECODE_H200 = [
    (*RS1, 2, {"sm": .028, "nccl": .0173}), (*RS1, 4, {"sm": .0346, "nccl": .0179}),
    (*RS2, 4, {"sm": .0473, "nccl": .0231}), (*AG2, 2, {"sm": .0468, "nccl": .042}),
    (*AG2, 4, {"sm": .0436, "nccl": .0477}),
    (*AG1, 2, {"sm": .0346, "nccl": .0199}),
]
# AG 8 x 6144 x 4096 alone measured both ways: at W = 2 the kernel 0.0348 / 0.0346 against
# NCCL + cuBLAS 0.0553 in one run and 0.0199 in the next (pinned: the second, as the layer's
# gathers took ~17 us); at W = 4 the kernel 0.0265 against 0.0314, where the model prefers the
# plan (0.035 against the kernel's 0.039) and the layer with every op as the plan was fastest.
# AG 28672 at W = 4: the kernel 0.0436 against 0.0477 (0.91x) in one run; the plan the model
# takes measured 0.0651 / 0.0644 for itself / NCCL + cuBLAS in the run before (NCCL's spread)


@pytest.mark.parametrize("name,sizes,w,measured", DECODE_H200, ids=_pair_id)
def test_decode_sizes_replayed_on_h200_take_the_plan(name, sizes, w, measured):
    bp = _bp(name, w, **sizes)
    chosen, why = default_config(bp, _target("NVIDIA H200"), graph=True)
    assert _plan(chosen) == "nccl", why
    # each estimate within 30% of its measurement: the plan's, and the kernel's except at
    # W = 4 for o's GEMM-RS (the model 0.022 ms against 0.035: its pushes to three peers at
    # 8 rows are not modelled closer; the decision holds either way, the plan measured 0.018)
    dev, t = device_spec("NVIDIA H200"), _target("NVIDIA H200")
    plan = estimate(bp, _config(bp, t, "comm=none"), dev, True).total
    if (name, w, sizes["N"]) != ("ag_gemm", 2, 6144):  # (0.030: between its two runs)
        assert plan == pytest.approx(measured["nccl"], rel=0.3), plan
    kernel = estimate(bp, _config(bp, t, "comm=sm"), dev, True).total
    if (name, w, sizes["K"]) != ("gemm_rs", 4, 4096):
        assert kernel == pytest.approx(measured["sm"], rel=0.3), kernel


def test_ragged_decode_takes_the_kernel_where_the_plans_fp32_path_measured_90x_slower():
    # 4x H100 (2026-11-27, W = 2, B = 8, 32 / 8 heads, 131072 keys, D = 128, CUDA-graph
    # replays of random lengths over 0 .. S): the kernel 0.586 ms, the plan 53.8 (with
    # kv_len it is fp32 torch ops, not SDPA); the default had been the plan
    bp = _bp("flash_decode_varlen", 2, B=8, H=32, HKV=8, S=131072, D=128)
    for graph in (False, True):
        chosen, why = default_config(bp, _target("NVIDIA H100"), graph=graph)
        assert chosen.comm == "sm", why
    dev = device_spec("NVIDIA H100")
    plan = estimate(bp, _config(bp, _target("NVIDIA H100"), "comm=none"), dev, True).total
    assert plan == pytest.approx(53.8, rel=0.6)


# EP dispatch and straight back (examples/ep_dispatch_combine.tl: top-8, hidden 7168, bf16),
# eager calls, 4x H100 (2026-11-27, 5cbca45, `tilelink bench`, W = 2 on GPUs 0-1; ms per
# call): the SM kernel against the non-overlapped plan (padded all_to_all_single) and the
# plan with NCCL's count exchange. The plan's torch steps (the padded send buffers, the
# combine's fp32 gather and sum) cost it 2-6x the bytes the model once charged.
EP_H100 = [
    ({"T": 128, "CAP": 1024}, 2, {"sm": .213, "nccl": 2.828, "nccl_counts": 2.918}),
    ({"T": 4096, "CAP": 20480}, 2, {"sm": 2.562, "nccl": 7.151, "nccl_counts": 7.321}),
    ({"T": 128, "CAP": 1024}, 4, {"sm": .329, "nccl": 4.090, "nccl_counts": 3.360}),
    ({"T": 4096, "CAP": 10240}, 4, {"sm": 4.195, "nccl": 7.918, "nccl_counts": 7.930}),
]


@pytest.mark.parametrize("sizes,w,measured", EP_H100,
                         ids=lambda v: "-".join(f"{k}{x}" for k, x in v.items())
                         if isinstance(v, dict) and "T" in v else str(v))
def test_ep_dispatch_combine_takes_the_kernel_measured_faster(sizes, w, measured):
    bp = _bp("ep_dispatch_combine", w, TOPK=8, H=7168, **sizes)
    t = _target("NVIDIA H100")
    _default_within(bp, measured, 1.05)
    # and the model within 25% of the plan measured at 4096 tokens (at 128 both are
    # host-bound: the plan's chain of small torch calls measured ~10x the model's host time)
    if sizes["T"] == 4096:
        dev = device_spec(t.device)
        est = estimate(bp, _config(bp, t, NCCL), dev).total
        assert est == pytest.approx(measured["nccl"], rel=0.25), est


def test_compute_tiles_are_charged_the_roles_of_their_own_kernel_only():
    # AG-MoE on SMs: the gather's push shares the grouped kernel (16 of 132 programs);
    # flash-decode on SMs: the partials' kernel runs alone (every program), the gather of
    # the partials pushes beside the combine in the next kernel
    from tilelink.schedule.cost import _compute_programs, _kernels
    from tilelink.schedule.lowering import op_sites

    def programs(bp, text):
        cfg = _config(bp, t, text)
        return _compute_programs(_kernels(bp, cfg, op_sites(bp, cfg, None)))

    t = _target("NVIDIA H200")
    moe = _bp("ag_moe", 2, T=8192, K=2048, N=1408, E=64, TOPK=6)
    assert programs(moe, "comm=sm") == {"y": 116}
    assert programs(moe, "comm=copy_engine") == {"y": 132}
    fd = _bp("flash_decode", 2, B=32, H=32, S=131072, D=128)
    assert programs(fd, "comm=sm") == {"part": 132, "o": 116}


def test_the_pushes_of_one_kernel_move_the_bytes_together():
    """EP dispatch + combine on SMs: the dispatch's push and the push back share a kernel, so
    their 2 x 16 programs move the bytes at once; the model then meets the time measured on
    2x H200 (4a95433, 4096 tokens a rank, top-8, hidden 7168: 1.542 ms; one role's 16
    programs alone would put it near 3.0). Each kernel's bytes go at its own roles' rate:
    Ulysses pushes q, k and v side by side in its first kernel (3 x 16 programs) and o in
    its second, whose copy_out copies within the GPU and moves nothing between ranks."""
    from tilelink.schedule.cost import _kernels, _sm_moving_ms, moved_bytes, share, sm_copy_gbs
    from tilelink.schedule.lowering import op_sites

    t = _target("NVIDIA H200")
    dev = device_spec(t.device)

    def moving_ms(bp, text):
        cfg = _config(bp, t, text)
        sites = op_sites(bp, cfg, None)
        return _sm_moving_ms(dev, bp, cfg, sites, _kernels(bp, cfg, sites),
                             moved_bytes(bp, cfg))

    def at(programs, nbytes, w=2):
        return nbytes / (sm_copy_gbs(dev, programs, nbytes) * share(dev, "sm", w - 1) * 1e9) * 1e3

    ep = _bp("ep_dispatch_combine", 2, T=4096, TOPK=8, H=7168, CAP=20480)
    for text, programs in (("comm=sm", 32), ("comm=sm comm_programs=8", 16)):
        nbytes = moved_bytes(ep, _config(ep, t, text))
        assert moving_ms(ep, text) == pytest.approx(at(programs, nbytes))
    uly = _bp("sp_ulysses", 2, S=32768, H=32, D=128)
    nbytes = moved_bytes(uly, _config(uly, t, "comm=sm"))
    assert moving_ms(uly, "comm=sm") == pytest.approx(at(48, 0.75 * nbytes)
                                                      + at(16, 0.25 * nbytes))
    model = estimate(ep, _config(ep, t, "comm=sm"), dev).total
    assert abs(model / 1.542 - 1.0) < 0.10, model
