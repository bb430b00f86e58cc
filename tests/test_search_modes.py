"""Issue 14 items 4 and 5: the default batch stays near 4M tokens at any DP, --tokens-per-batch, the search
mode chosen by counting the valid plans, and equivalent plans folded into one row. Deterministic: no
wall-clock assertion (speed is benchmarks/bench_search.py's)."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
from typer.testing import CliRunner

from costmodel.core.errors import PlannerError
from costmodel.core.specs.catalogue import load_catalogue
from costmodel.core.specs.presets import resolve_model
from costmodel.cost.roofline import RooflineCostModel
from planner.cli import app
from planner.requests import DEFAULT_BATCH_TOKENS, PlanRequest, batch_sequences
from planner.search.engine import choose_mode, count_plans, exhaustive_search, ranked_distinct, search
from planner.search.space import SearchSpace, build_problem, make_target

CM = RooflineCostModel()


# ------------------------------------------------------------------------------------------- batch
@pytest.mark.parametrize("seq", [512, 1024, 2048, 4096, 8192])
def test_default_batch_lands_nearest_4m_tokens_at_every_dp(seq):
    for dp in [2**k for k in range(13)] + [3, 6, 12, 24, 48, 96, 192, 384, 768, 1536, 3072]:
        for mbs in (1, 2, 4):
            unit = mbs * dp
            gbs = batch_sequences(seq, unit)
            assert gbs % unit == 0 and gbs >= unit
            # no other multiple of MBS x DP (at least one step) lands nearer 4M tokens
            err = abs(gbs * seq - DEFAULT_BATCH_TOKENS)
            for steps in range(1, gbs // unit + 3):
                assert err <= abs(steps * unit * seq - DEFAULT_BATCH_TOKENS)
            if unit * seq <= DEFAULT_BATCH_TOKENS:  # reachable: within half a step of 4M tokens
                assert err <= unit * seq / 2


def test_tokens_per_batch_request_and_conflict():
    req = PlanRequest(model="llama-13b", gpu="a100-80gb", gpus=128, tp=2, tokens_per_batch=2 * 1024 * 1024)
    assert req.resolve().plan.gbs == 512  # DP 64: 8 steps of 64 sequences of 4096 tokens
    with pytest.raises(PlannerError, match="pass only one"):
        PlanRequest(model="llama-13b", gpu="a100-80gb", gpus=128, gbs=512, tokens_per_batch=2_000_000)
    with pytest.raises(PlannerError, match="tokens_per_batch"):
        PlanRequest.from_dict({"model": "llama-13b", "gpu": "a100-80gb", "gpus": 8, "tokens_per_batch": -1})


def test_cli_tokens_per_batch():
    r = CliRunner().invoke(app, ["predict", "--model", "llama-13b", "--gpu", "a100-80gb", "--gpus", "128", "--tp",
                                 "2", "--tokens-per-batch", "2M", "--format", "json"])
    assert r.exit_code == 0, r.output
    assert json.loads(r.output)["plan"]["gbs"] == 512  # multiple of DP 64 nearest 2e6 / 4096 = 488.3 sequences
    r = CliRunner().invoke(app, ["predict", "--model", "llama-13b", "--gpu", "a100-80gb", "--gpus", "128",
                                 "--tokens-per-batch", "2M", "--gbs", "64"])
    assert r.exit_code == 2 and "pass only one" in r.output
    r = CliRunner().invoke(app, ["search", "--model", "llama-13b", "--gpus", "16", "--tp", "1,2", "--pp", "1",
                                 "--cp", "1", "--mbs", "1", "--zero", "1", "--recompute", "selective",
                                 "--tokens-per-batch", "1M", "--no-progress", "--format", "json"])
    assert r.exit_code == 0, r.output
    data = json.loads(r.output)
    assert data["search"]["global_batch_size"] is None  # each plan's own: the multiple of MBS x DP nearest 1M
    for plan in data["plans"]:
        assert plan["gbs"] == batch_sequences(4096, plan["mbs"] * plan["dp"], 1e6)  # DP 16: 240, DP 8: 248


def _problem(gpus=16, **dims):
    cat = load_catalogue()
    space = SearchSpace("t", **{"tp": (1, 2), "pp": (1, 2), "cp": (1,), "vpp": (1,), "mbs": (1, 2),
                                "recompute": ("none", "selective"), "zero": (1,), **dims})
    return build_problem(resolve_model("llama-13b"), [make_target(cat.resolve("a100-80gb"), gpus)], space)


# -------------------------------------------------------------------------------------------- modes
def test_mode_chosen_by_counting_valid_plans():
    p = _problem()
    n = count_plans(p)
    assert n == exhaustive_search(p, cost_model=CM).counts["ok"]  # counted with the cheap checks only
    assert count_plans(p, limit=3) == 4  # stops past the limit
    assert choose_mode(n, max_plans=n) == "exhaustive" and choose_mode(n, max_plans=n - 1) == "optuna"
    res = search(p, cost_model=CM, max_plans=n)
    assert res.method == "exhaustive" and f"{n:,} valid plans" in res.mode_note
    res = search(p, cost_model=CM, max_plans=n - 1, n_trials=12, seed=0)
    assert res.method == "optuna-tpe" and "more than" in res.mode_note
    assert search(p, cost_model=CM, mode="optuna", n_trials=12, seed=0).method == "optuna-tpe"
    assert search(p, cost_model=CM, exhaustive=True, max_plans=0).method == "exhaustive"
    with pytest.raises(PlannerError, match="--mode"):
        search(p, cost_model=CM, mode="fast")
    # the CLI says which ran
    r = CliRunner().invoke(app, ["search", "--model", "llama-13b", "--gpus", "16", "--tp", "1,2", "--pp", "1,2",
                                 "--cp", "1", "--vpp", "1", "--mbs", "1,2", "--zero", "1", "--no-progress"])
    assert r.exit_code == 0, r.output
    assert "search: exhaustive (auto: exhaustive, the space has" in r.output


# -------------------------------------------------------------------------------------- equivalents
def test_equivalent_plans_fold_into_one_row():
    recs = exhaustive_search(_problem(), cost_model=CM).records
    a = recs[0]
    twin = replace(a, recompute="selective" if a.recompute == "none" else "none",
                   memory_gib_per_gpu=a.memory_gib_per_gpu + 0.05, equivalent=[])
    far = replace(a, zero=3, memory_gib_per_gpu=a.memory_gib_per_gpu + 5.0, equivalent=[])
    other_batch = replace(a, gbs=a.gbs * 2, iteration_time_s=3 * a.iteration_time_s, recompute="full", equivalent=[])
    out, folded = ranked_distinct([twin, a, far, other_batch], "time")
    assert folded == 1 and len(out) == 3
    kept = out[0]
    assert kept.recompute == a.recompute and kept.equivalent == [f"recompute={twin.recompute} (+0.05 GiB)"]
    assert [r.rank for r in out] == [1, 2, 3]
    assert all(not r.equivalent for r in out[1:])  # 5 GiB more is not equivalent; another batch is not either
    # a real search never shows two rows with the same allocation, batch, time and memory
    seen = {(r.gpus, r.gbs, f"{r.iteration_time_s:.12g}", round(r.memory_gib_per_gpu, 1)) for r in recs}
    assert len(seen) == len(recs)


# ------------------------------------------------------------------------------- quick predictions
def test_quick_prediction_is_the_full_prediction_time():
    from planner.prediction import predict
    from planner.search.objective import Evaluator, quick_prediction
    from planner.search.space import candidate_plan, enumerate_candidates

    for model, gpus in (("llama-13b", 16), ("gpt-20b", 32)):  # gpt-20b: 44 layers, PP 8 splits unevenly
        cat = load_catalogue()
        p = build_problem(resolve_model(model), [make_target(cat.resolve("a100-80gb"), gpus)],
                          SearchSpace("t", tp=(1, 2, 4), pp=(1, 2, 8), cp=(1,), vpp=(1,), mbs=(1, 2),
                                      recompute=("selective", "full"), zero=(1, 3)))
        ev = Evaluator(p, CM)
        plans = [candidate_plan(p, c) for c in enumerate_candidates(p) if ev.feasible(c)]
        assert plans
        hw = p.targets[0].hardware
        for plan in plans:
            q, full = quick_prediction(p.model, plan, hw, CM), predict(p.model, plan, hw, CM)
            assert q.iteration_time_s == full.iteration_time_s and q.mfu == full.mfu
            assert q.memory_gib_per_gpu == full.memory_gib_per_gpu and q.layer_split == full.layer_split


def test_exhaustive_details_the_printed_plans_only():
    big = _problem(tp=(1, 2, 4), mbs=(1, 2, 4), zero=(1, 3))
    res = exhaustive_search(big, cost_model=CM, detail=3)
    assert len(res.records) > 4
    assert [r.quick for r in res.records[:4]] == [False, False, False, True]
    assert all(r.bottleneck for r in res.records[:3]) and res.records[0].cost_sources
    full = exhaustive_search(big, cost_model=CM, detail=len(res.records))
    assert [(r.key(), r.iteration_time_s) for r in full.records] == [(r.key(), r.iteration_time_s)
                                                                     for r in res.records]
