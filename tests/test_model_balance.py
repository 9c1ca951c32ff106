"""tilelink.model's joint decision over a forward's ops (tilelink.model.balance), tune and saved choices."""

from dataclasses import replace

import pytest
import torch

from tilelink.model import balance, plans
from tilelink.model.balance import Candidate
from tilelink.model.plans import Shape
from tilelink.schedule import get_target

CUDA = torch.device("cuda", 0)  # (a device name only: nothing runs on it here)
# a Llama-3-8B decoder layer's four TP ops: q/k/v and gate/up (AG-GEMM), o and down (GEMM-RS)
LLAMA = [Shape("ag_gemm", "g", 6144, 4096, torch.bfloat16, CUDA),
         Shape("gemm_rs", "g", 4096, 4096, torch.bfloat16, CUDA),
         Shape("ag_gemm", "g", 28672, 4096, torch.bfloat16, CUDA),
         Shape("gemm_rs", "g", 4096, 14336, torch.bfloat16, CUDA)]


def _h100():
    return replace(get_target("cuda:90"), device="NVIDIA H100")


@pytest.fixture(autouse=True)
def _clean():
    plans.clear()
    yield
    plans.clear()


def test_a_host_bound_forward_takes_the_candidates_that_save_host():
    own = Candidate((), gpu=0.20, host=0.15, label="own choice")
    sm = Candidate((("comm", "sm"),), gpu=0.25, host=0.03, label="comm=sm")
    # the rest of the model's host (0.25 ms a call) makes the host the pace: 4 x (0.15 +
    # 0.25) = 1.6 ms against 0.8 of GPU; on SMs 1.12 against 1.0
    picks, ms, own_ms = balance.choose([[own, sm]], [4], other_host_us=250)
    assert picks == [sm] and ms == pytest.approx(1.12) and own_ms == pytest.approx(1.6)
    # with no other host work the GPU sets the pace, and each op's own choice is faster
    picks, ms, own_ms = balance.choose([[own, sm]], [4], other_host_us=0)
    assert picks == [own] and ms == own_ms == pytest.approx(0.8)


def test_the_own_choice_stands_unless_another_wins_by_the_margin():
    own = Candidate((), gpu=1.0, host=0.1, label="own choice")
    close = Candidate((("comm", "sm"),), gpu=0.99, host=0.1, label="comm=sm")
    picks, ms, own_ms = balance.choose([[own, close]], [1], other_host_us=0)
    assert picks == [own] and ms == own_ms == 1.0


def test_one_op_at_a_time_finds_the_exhaustive_choice(monkeypatch):
    t = _h100()
    options = [balance.candidates(plans.PATTERNS[s.kind].bind(s.values(4096, 4), 4), t)
               for s in LLAMA]
    exhaustive = balance.choose(options, [1] * 4)
    assert exhaustive[0] != [o[0] for o in options]  # (a case where the search moves)
    monkeypatch.setattr(balance, "MAX_COMBINATIONS", 1)
    assert balance.choose(options, [1] * 4) == exhaustive


def test_the_llama_layer_at_w4_and_4096_tokens_runs_every_op_on_sms():
    # 4x H100, 2026-11-28 (docs/perf.md): each op's own choice (the plan for q/k/v, the copy
    # engine for the other three) ran the compiled layer at 0.74-0.82x NCCL + cuBLAS, every op
    # on SMs at 1.05-1.19x: the layer is host-bound there, which each op alone cannot see
    balance.decide(LLAMA, [4096], target=_h100(), world=4)
    picked = {(c["kind"], c["n"], c["k"]): c["override"] for c in plans.choices()}
    assert list(picked.values()) == [{"comm": "sm"}] * 4, picked
    note = plans.choices()[0]["note"]
    assert "predicted forward" in note and "own choice" in note


@pytest.mark.parametrize("world,tokens", [(2, 8192), (4, 8192), (4, 2048), (2, 8), (4, 64)])
def test_where_the_gpu_sets_the_pace_or_every_op_is_on_sms_the_own_choices_stand(world, tokens):
    balance.decide(LLAMA, [tokens], target=_h100(), world=world)
    assert [c["override"] for c in plans.choices()] == [{}] * 4


def test_calls_run_the_choice_unless_an_override_says_otherwise(monkeypatch):
    built = []

    def build(shape, rows, override, chosen=False):
        built.append((shape.n, rows, override, chosen))
        return object()

    monkeypatch.setattr(plans, "_build", build)
    balance.decide(LLAMA, [4096], target=_h100(), world=4)
    qkv = LLAMA[0]
    chosen, _ = plans.lookup(qkv, 4096)
    assert built[-1] == (6144, 4096, (("comm", "sm"),), True)
    with plans.config_override({"balance": "0"}):  # each op's own choice
        own, _ = plans.lookup(qkv, 4096)
        assert own is not chosen and built[-1] == (6144, 4096, (), False)
        balance.decide(LLAMA, [2048], target=_h100(), world=4)  # (off: nothing decided)
    with plans.config_override({"comm": "none"}):  # an explicit override wins
        plans.lookup(qkv, 4096)
        assert built[-1] == (6144, 4096, (("comm", "none"),), False)
    assert plans.lookup(qkv, 4096)[0] is chosen
    assert {c["rows"] for c in plans.choices()} == {4096}


def test_the_cpu_runs_the_plan_and_is_not_decided():
    cpu = [replace(s, device=torch.device("cpu")) for s in LLAMA]
    balance.decide(cpu, [4096], target=_h100(), world=4)
    assert plans.choices() == []


def _tune_on_gloo(rank: int, world: int, path: str) -> dict:
    from torch import nn

    from tilelink.errors import TileLinkError
    from tilelink.model import TPMLP, prepare, tune

    plans.clear()
    torch.manual_seed(3)
    hidden, inter, tokens = 16, 8 * world, 4 * world
    mlp = TPMLP.from_full(nn.Linear(hidden, inter, bias=False), nn.Linear(hidden, inter, bias=False),
                          nn.Linear(inter, hidden, bias=False))
    x = torch.randn(tokens, hidden).chunk(world)[rank]
    seen = []
    # the last rank alone fails to build the plan's ops: every rank must skip that assignment
    prepare_rows = plans.prepare_rows

    def flaky(shape, rows):
        if rank == world - 1 and ("comm", "none") in plans._override(shape, rows[0])[0]:
            raise TileLinkError("this rank's build failed")
        prepare_rows(shape, rows)

    plans.prepare_rows = flaky
    try:
        with torch.no_grad():
            res = tune(mlp, lambda t: mlp(x), [tokens], iters=2, warmup=1, rounds=2,
                       progress=seen.append, save=path)
    finally:
        plans.prepare_rows = prepare_rows
    picked = plans.choices()
    plans.clear()  # a later run: its prepare reads the file rank 0 wrote
    prepare(mlp, tokens=[tokens], choices=path)
    loaded = plans.choices()
    unwritable = None
    try:
        tune(mlp, lambda t: mlp(x), [tokens], iters=1, warmup=0, rounds=1,
             save=path + ".missing/dir/c.json")
    except TileLinkError as e:  # every rank, not rank 0 alone
        unwritable = str(e)
    return {"res": res, "seen": seen, "choices": picked, "loaded": loaded,
            "unwritable": unwritable}


def test_tune_times_every_assignment_and_records_the_pick_alike_on_every_rank(tmp_path):
    from tilelink.model import cpu_world

    path = str(tmp_path / "mlp-tp2-cpu.json")
    outs = cpu_world.run(_tune_on_gloo, 2, (path,), timeout=600)
    for out in outs:
        (entry,) = out["res"]
        # (the CPU runs the plan whatever the config; every assignment is timed there but
        # the one the last rank could not build, skipped on every rank)
        assert set(entry["ms"]) == {"own choice", "comm=sm", "comm=copy_engine"}
        assert any("comm=none cannot run" in line for line in out["seen"])
        # progress: a line per timed round, then the pick
        rounds = [ln for ln in out["seen"] if "timed (3 assignments)" in ln]
        assert [ln.split(": ")[1].split(" timed")[0] for ln in rounds] == \
            ["round 1 of 2", "round 2 of 2"], out["seen"]
        assert all(v > 0 for v in entry["ms"].values()) and entry["pick"] in entry["ms"]
        assert set(entry["host_ms"]) == set(entry["ms"])
        assert len(out["choices"]) == 2 and all(
            c["note"].startswith("measured by tune: " + entry["pick"]) for c in out["choices"])
        # saved by rank 0 and read back by every rank's prepare: the same picks, op by op
        key = lambda c: (c["kind"], c["n"], c["k"], c["rows"])  # noqa: E731
        assert sorted((key(c), c["override"]) for c in out["loaded"]) == \
            sorted((key(c), c["override"]) for c in out["choices"])
        assert all(path in c["note"] for c in out["loaded"])
        assert "could not write" in out["unwritable"]
    # the slowest rank's times: the same table and pick on both ranks
    assert outs[0]["res"] == outs[1]["res"]


def test_tune_refuses_a_model_without_tp_layers():
    from torch import nn

    from tilelink.errors import TileLinkError
    from tilelink.model import tune

    with pytest.raises(TileLinkError, match="no tensor-parallel TileLink layers"):
        tune(nn.Linear(4, 4), lambda t: None, [4])


def _saved(monkeypatch, device="NVIDIA H200", world=4):
    from tilelink.model import saved_choices

    monkeypatch.setattr(saved_choices, "device_name", lambda shape: device)
    monkeypatch.setattr(plans, "world_size", lambda name: world)
    return saved_choices


def test_saved_choices_come_back_for_the_same_ops(monkeypatch, tmp_path):
    sc = _saved(monkeypatch)
    balance.decide(LLAMA, [4096, 8192], target=_h100(), world=4)
    before = {(c["n"], c["k"], c["rows"]): c["override"] for c in plans.choices()}
    path = tmp_path / "llama-tp4.json"
    assert sc.save(path, LLAMA) == 8
    plans.clear()
    assert sc.load(path, LLAMA) == 8
    after = {(c["n"], c["k"], c["rows"]): c["override"] for c in plans.choices()}
    assert after == before and {"comm": "sm"} in after.values()
    assert all(str(path) in c["note"] for c in plans.choices())
    plans.clear()  # an op the file does not hold is left to the joint decision
    assert sc.load(path, LLAMA[:1]) == 2


@pytest.mark.parametrize("device,world,why", [("NVIDIA H100", 4, "device"),
                                              ("NVIDIA H200", 2, "world")])
def test_saved_choices_of_another_gpu_or_world_are_not_used(monkeypatch, tmp_path, device,
                                                           world, why):
    sc = _saved(monkeypatch)
    balance.decide(LLAMA, [4096], target=_h100(), world=4)
    path = tmp_path / "c.json"
    sc.save(path, LLAMA)
    plans.clear()
    _saved(monkeypatch, device, world)
    with pytest.warns(sc.ChoicesWarning, match=f"measured on {why}.*not used"):
        assert sc.load(path, LLAMA) == 0
    assert plans.choices() == []


def test_a_bad_choices_file_or_entry_warns_and_changes_nothing_else(monkeypatch, tmp_path):
    import json

    sc = _saved(monkeypatch)
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    with pytest.warns(sc.ChoicesWarning, match="not used"):
        assert sc.load(bad, LLAMA) == 0
    balance.decide(LLAMA, [4096], target=_h100(), world=4)
    path = tmp_path / "c.json"
    sc.save(path, LLAMA)
    record = json.loads(path.read_text())
    record["entries"][0]["override"] = {"carrier_pigeon": "1"}
    record["versions"] = {"torch": "0.1"}
    path.write_text(json.dumps(record))
    plans.clear()
    with pytest.warns(sc.ChoicesWarning) as caught:
        assert sc.load(path, LLAMA) == 3
    text = " ".join(str(w.message) for w in caught)
    assert "skipped" in text and "may no longer be the fastest" in text


def test_an_op_tune_cached_keeps_its_tuned_config(monkeypatch):
    from tilelink.schedule import tuned
    from tilelink.schedule.schedule import default_config

    t = _h100()
    bp = plans.PATTERNS["ag_gemm"].bind(LLAMA[0].values(4096, 4), 4)
    cached = default_config(bp, t)[0]
    monkeypatch.setattr(tuned, "lookup", lambda *a, **k: (cached, "cache.json"))
    (only,) = balance.candidates(bp, t)
    assert only.override == () and only.label == "own choice"


def test_captured_calls_of_a_chosen_config_run_what_an_unconfigured_op_would():
    from tilelink.runtime.gpu import _captured_as_unconfigured
    from tilelink.schedule import make_schedule
    from tilelink.schedule.schedule import default_config

    t = _h100()
    bp = plans.PATTERNS["gemm_rs"].bind(LLAMA[1].values(4096, 4), 4)
    sm = make_schedule(bp, t, {"comm": "sm"}).config
    ce = make_schedule(bp, t, {"comm": "copy_engine"}).config
    graph = default_config(bp, t, graph=True)[0]
    assert _captured_as_unconfigured(bp, t, ce, None, None, None) == (
        None if graph == ce else graph)
    assert _captured_as_unconfigured(bp, t, ce, None, sm, None) == sm  # the eager-tuned one
    assert _captured_as_unconfigured(bp, t, sm, ce, sm, None) == ce  # the graph-tuned one
    assert _captured_as_unconfigured(bp, t, sm, None, sm, None) is None  # (the same)
    assert _captured_as_unconfigured(bp, t, ce, None, sm, "drop_notify") is None


def test_a_changed_choice_builds_its_op_when_prepared_again(monkeypatch):
    built = []

    def build(shape, rows, override, chosen=False):
        built.append(override)
        return object()

    monkeypatch.setattr(plans, "_build", build)
    qkv = LLAMA[0]
    plans.record(qkv, 4096, (("comm", "sm"),), "a")
    plans.prepare_rows(qkv, [4096])
    sm_op, _ = plans.lookup(qkv, 4096)
    plans.record(qkv, 4096, (("comm", "none"),), "b")
    plans.prepare_rows(qkv, [4096])
    none_op, rows = plans.lookup(qkv, 4096)
    assert rows == 4096 and none_op is not sm_op
    assert built == [(("comm", "sm"),), (("comm", "none"),)]


def test_saving_again_keeps_the_other_token_counts_of_the_file(monkeypatch, tmp_path):
    sc = _saved(monkeypatch)
    balance.decide(LLAMA, [4096, 8192], target=_h100(), world=4)
    path = tmp_path / "c.json"
    assert sc.save(path, LLAMA, rows=[4096]) == 4
    plans.record(LLAMA[0], 8192, (("comm", "none"),), "measured")
    assert sc.save(path, LLAMA, rows=[8192]) == 4
    plans.clear()
    assert sc.load(path, LLAMA) == 8
    got = {(c["n"], c["rows"]): c["override"] for c in plans.choices()}
    assert got[(6144, 4096)] == {"comm": "sm"} and got[(6144, 8192)] == {"comm": "none"}
