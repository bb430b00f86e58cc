"""Every door to a prediction gives the same numbers: `planner predict` (one plan), `planner explain`,
`planner predict --batch`, the search's record of the plan (as a search evaluates it, iteration time only, and
completed) and the Python API (``planner.predict``) agree on the iteration time and the memory per GPU of every
plan below, to the last bit, because they all cost the plan with costmodel.estimate.estimate and the same
default calibration."""

from __future__ import annotations

import json

import pytest

import planner
from planner.calibrate import calibration_option
from planner.requests import PlanRequest
from planner.search.objective import Evaluator
from planner.search.space import Candidate, build_problem, load_space, make_target
from tests.helpers import cli_flags, cli_json, run_cli

A = dict  # one plan: batch-line keys, every one of them a plan the search can place too
PLANS = [
    # dense, A100-80GB (DGX and Perlmutter 4-GPU nodes)
    A(model="llama-13b", gpu="a100-80gb", gpus=16, tp=2, pp=2, gbs=64, seq_len=4096),
    A(model="llama-13b", gpu="a100-80gb", gpus=32, tp=2, pp=4, vpp=5, gbs=128, seq_len=4096),
    A(model="llama-13b", gpu="a100-80gb", gpus=24, tp=2, pp=3, gbs=96, seq_len=4096),            # 40 layers / 3
    A(model="llama-13b", gpu="a100-80gb", gpus=32, tp=4, pp=1, mbs=2, gbs=128, seq_len=4096, recompute="none"),
    A(model="llama-7b", gpu="a100-80gb", gpus=16, tp=1, pp=1, zero=3, gbs=64, seq_len=2048, framework="fsdp"),
    A(model="llama-7b", gpu="a100-80gb", gpus=8, tp=1, pp=1, zero=3, mbs=2, gbs=64, seq_len=2048, recompute="full"),
    A(model="llama-7b", gpu="a100-80gb", gpus=8, tp=2, pp=1, cp=2, gbs=32, seq_len=8192),
    A(model="llama-7b", gpu="a100-80gb", gpus=16, tp=2, pp=1, zero=0, gbs=64, seq_len=2048, sequence_parallel=False),
    A(model="gpt3-175b", gpu="a100-80gb", gpus=512, tp=8, pp=16, gbs=512, seq_len=2048, recompute="full"),
    A(model="llama-13b", gpu="a100-80gb", gpus=16, cluster="perlmutter", tp=4, pp=2, gbs=64, seq_len=4096),
    A(model="llama-7b", gpu="a100-80gb", gpus=16, cluster="perlmutter", tp=2, cp=2, gbs=64, seq_len=8192),
    A(model="mpt-7b", gpu="a100-80gb", gpus=16, tp=2, pp=2, gbs=64, seq_len=2048, framework="deepspeed"),
    A(model="gpt-20b", gpu="a100-80gb", gpus=24, tp=4, pp=3, gbs=96, seq_len=2048),                # 44 / 3
    A(model="llama-7b", gpu="a100-40gb", gpus=16, tp=2, pp=2, gbs=64, seq_len=2048),
    # dense, H100 / H200 / GH200 / B200 / GB200
    A(model="llama3-8b", gpu="h100-sxm", gpus=8, tp=1, pp=1, gbs=64, seq_len=8192, dtype="fp8", recompute="full"),
    A(model="llama3-8b", gpu="h100-sxm", gpus=8, tp=2, pp=1, gbs=64, seq_len=8192, dtype="fp8-block"),
    A(model="llama3-8b", gpu="h100-sxm", gpus=24, tp=2, pp=3, gbs=48, seq_len=8192),              # 32 / 3
    A(model="llama3-8b", gpu="h100-sxm", gpus=16, tp=2, cp=4, gbs=16, seq_len=32768),
    A(model="llama3-8b", gpu="h100-sxm", gpus=16, tp=1, pp=1, zero=3, gbs=64, seq_len=8192, framework="torchtitan"),
    A(model="llama3-8b", gpu="h100-sxm", gpus=16, tp=2, pp=1, zero=3, cp=2, gbs=32, seq_len=16384,
      framework="torchtitan"),
    A(model="llama3-70b", gpu="h100-sxm", gpus=64, tp=8, pp=4, vpp=5, gbs=128, seq_len=8192),
    A(model="llama3-70b", gpu="h100-sxm", gpus=64, tp=8, pp=4, gbs=128, seq_len=8192, dtype="fp8"),
    A(model="llama3-70b", gpu="h100-sxm", gpus=96, tp=8, pp=3, gbs=96, seq_len=8192, recompute="full"),  # 80 / 3
    A(model="llama3-70b", gpu="h100-sxm", gpus=64, tp=4, pp=1, zero=3, gbs=64, seq_len=8192, framework="fsdp",
      recompute="full"),
    A(model="llama3-70b", gpu="h100-sxm", gpus=128, tp=8, pp=2, cp=2, gbs=64, seq_len=16384),
    A(model="mistral-7b", gpu="h100-sxm", gpus=8, tp=1, pp=1, gbs=64, seq_len=4096, recompute="none", zero=1),
    A(model="llama3-8b", gpu="h200", gpus=8, tp=1, pp=1, gbs=64, seq_len=8192),
    A(model="llama3-70b", gpu="h200", gpus=32, tp=4, pp=4, gbs=64, seq_len=8192),
    A(model="llama-13b", gpu="gh200", gpus=8, tp=1, pp=2, gbs=64, seq_len=4096),
    A(model="llama-7b", gpu="gh200", gpus=4, tp=1, pp=1, zero=3, gbs=32, seq_len=4096, framework="fsdp"),
    A(model="llama3-70b", gpu="gh200", gpus=32, tp=1, pp=16, gbs=64, seq_len=4096, recompute="full"),
    A(model="llama3-8b", gpu="b200", gpus=8, tp=1, pp=1, mbs=2, gbs=64, seq_len=8192, dtype="fp8"),
    A(model="llama3-70b", gpu="b200", gpus=32, tp=4, pp=2, gbs=64, seq_len=8192, dtype="fp8-block"),
    A(model="llama3-405b", gpu="b200", gpus=256, tp=8, pp=8, gbs=256, seq_len=8192, recompute="full"),
    A(model="llama3-70b", gpu="gb200", gpus=72, tp=4, pp=2, gbs=72, seq_len=8192),
    A(model="llama3-8b", gpu="h100-sxm", gpus=4, tp=4, pp=1, gbs=16, seq_len=8192, dtype="fp8"),
    A(model="llama3-405b", gpu="h100-sxm", gpus=1024, tp=8, pp=16, vpp=2, gbs=512, seq_len=8192, recompute="full"),
    # mixture of experts
    A(model="mixtral-8x7b", gpu="h100-sxm", gpus=32, tp=2, pp=1, ep=8, gbs=64, seq_len=4096),
    A(model="mixtral-8x7b", gpu="h100-sxm", gpus=32, tp=2, pp=2, ep=4, etp=1, gbs=64, seq_len=4096),
    A(model="mixtral-8x7b", gpu="h100-sxm", gpus=64, tp=1, pp=2, ep=8, gbs=128, seq_len=4096, dtype="fp8"),
    A(model="mixtral-8x7b", gpu="a100-80gb", gpus=32, tp=2, pp=4, ep=4, gbs=64, seq_len=4096, recompute="full"),
    A(model="mixtral-8x22b", gpu="h100-sxm", gpus=128, tp=2, pp=4, ep=8, gbs=128, seq_len=4096, recompute="full"),
    A(model="mixtral-8x22b", gpu="h100-sxm", gpus=96, tp=2, pp=3, ep=8, etp=1, gbs=96, seq_len=4096,
      recompute="full"),                                                                            # 56 / 3
    A(model="qwen3-30b-a3b", gpu="h100-sxm", gpus=16, tp=1, pp=2, ep=8, gbs=64, seq_len=4096),
    A(model="qwen3-30b-a3b", gpu="h100-sxm", gpus=32, tp=2, pp=1, ep=16, etp=1, gbs=64, seq_len=4096),
    A(model="qwen3-30b-a3b", gpu="b200", gpus=16, tp=1, pp=1, ep=16, gbs=64, seq_len=4096, dtype="fp8"),
    A(model="qwen3-235b-a22b", gpu="h100-sxm", gpus=256, tp=4, pp=8, ep=8, etp=1, gbs=256, seq_len=4096,
      recompute="full"),
    A(model="gpt-oss-20b", gpu="h100-sxm", gpus=8, tp=1, pp=1, ep=8, gbs=32, seq_len=4096),
    A(model="gpt-oss-120b", gpu="b200", gpus=32, tp=2, pp=2, ep=8, gbs=64, seq_len=4096),
    A(model="deepseek-v3", gpu="h100-sxm", gpus=1024, tp=2, pp=16, ep=32, etp=1, gbs=1024, seq_len=4096,
      recompute="full"),
    A(model="mixtral-8x7b", gpu="gh200", gpus=32, tp=1, pp=4, ep=8, gbs=64, seq_len=4096),
    A(model="mixtral-8x7b", gpu="h200", gpus=16, tp=2, pp=1, ep=8, gbs=32, seq_len=4096, zero=3, framework="fsdp"),
    A(model="mixtral-8x7b", gpu="h100-sxm", gpus=32, tp=2, pp=1, cp=2, ep=4, gbs=32, seq_len=16384, recompute="full"),
    A(model="qwen3-30b-a3b", gpu="a100-80gb", gpus=48, tp=2, pp=3, ep=8, gbs=96, seq_len=4096, recompute="full"),
    A(model="llama3-8b", gpu="h100-sxm", gpus=32, tp=2, pp=2, vpp=4, gbs=128, seq_len=8192),
    A(model="llama-13b", gpu="h100-sxm", gpus=96, tp=2, pp=6, gbs=64, seq_len=4096),
]

EXTRA = [  # plans a search does not place (fixed splits, layouts, kernels, dispatchers): all doors but the search's
    A(model="llama3-8b", gpu="h100-sxm", gpus=24, tp=2, pp=3, layer_split=[12, 10, 10], gbs=48, seq_len=8192),
    A(model="llama3-8b", gpu="h100-sxm", gpus=16, tp=2, pp=2, pipeline_layout=[4, 4, 4, 4, 4, 4, 4, 4], gbs=64,
      seq_len=8192),
    A(model="mixtral-8x7b", gpu="h100-sxm", gpus=32, tp=2, ep=8, recompute_modules=["moe_act", "layernorm"], gbs=64,
      seq_len=4096),
    A(model="mixtral-8x7b", gpu="h100-sxm", gpus=32, tp=2, ep=8, moe_dispatcher="allgather", moe_overlap_comm=True,
      moe_imbalance=1.0, gbs=64, seq_len=4096),
    A(model="mixtral-8x7b", gpu="h100-sxm", gpus=32, tp=2, ep=8, moe_grouped_gemm=False, gbs=64, seq_len=4096),
    A(model="llama-7b", gpu="a100-80gb", gpus=16, tp=2, attention="flash2", gbs=64, seq_len=4096),
    A(model="llama-13b", gpu="a100-80gb", gpus=16, cluster="perlmutter", tp=8, pp=2, tokens_per_batch="1M"),
]
ALL = PLANS + EXTRA
IDS = [f"{i}-{p['model']}-{p['gpus']}x{p['gpu']}" for i, p in enumerate(ALL)]


def _figures(obj) -> tuple[float, float]:
    """(iteration time, memory per GPU) of a prediction object or its JSON."""
    if isinstance(obj, dict):
        return obj["iteration_time_s"], obj["memory_gib_per_gpu"]
    return obj.iteration_time_s, obj.memory_gib_per_gpu


@pytest.fixture(scope="module")
def api() -> list:
    """The Python API's prediction of every plan (the reference the other doors are held to)."""
    return [planner.predict(**p) for p in ALL]


def test_the_plans_cover_every_kind():
    assert len(PLANS) >= 50
    kinds = {"moe": any(p.get("ep", 1) > 1 for p in PLANS), "fp8": any(p.get("dtype") == "fp8" for p in PLANS),
             "fp8-block": any(p.get("dtype") == "fp8-block" for p in PLANS),
             "cp": any(p.get("cp", 1) > 1 for p in PLANS), "zero3": any(p.get("zero") == 3 for p in PLANS),
             "vpp": any(p.get("vpp", 1) > 1 for p in PLANS),
             "frameworks": len({p.get("framework", "megatron") for p in PLANS}) >= 4,
             "gpus": len({p["gpu"] for p in PLANS}) >= 6}
    assert all(kinds.values()), kinds


def test_uneven_pipelines_are_among_them(api):
    chosen = [r.layer_split for r, p in zip(api, ALL) if p in PLANS and r.layer_split is not None]
    assert len(chosen) >= 5  # PP x VPP not dividing the layers: the split estimate() chooses


def test_cli_predict_is_the_python_api(api):
    for p, ref in zip(ALL, api):
        rec = cli_json(["predict", *cli_flags(p)])
        assert rec == ref.to_dict(), p


def test_batch_is_the_python_api(api):
    lines = "\n".join(json.dumps({"id": i, **p}) for i, p in enumerate(ALL))
    text = run_cli(["predict", "--batch", "-", "--format", "jsonl"], stdin=lines).stdout
    out = [json.loads(x) for x in text.split("\n") if x.strip()]
    assert [r["id"] for r in out] == list(range(len(ALL)))
    for rec, ref, p in zip(out, api, ALL):
        assert "error" not in rec, rec
        assert {k: v for k, v in rec.items() if k != "id"} == ref.to_dict(), p


def test_explain_is_predict(api):
    for p, ref in zip(ALL, api):
        ex = cli_json(["explain", *cli_flags(p)])
        assert _figures(ex["prediction"]) == _figures(ref), p
        assert ex["prediction"] == planner.explain(**p).to_dict()["prediction"]


@pytest.mark.parametrize("light", [True, False], ids=["search-record", "search-record-detailed"])
def test_the_searchs_record_of_the_plan_is_the_python_api(api, light):
    cal = calibration_option(None)  # what a search applies, as predict does
    for p, ref in zip(PLANS, api):
        res = PlanRequest.from_dict(p).resolve()
        plan = res.plan
        problem = build_problem(res.model, [make_target(res.hardware, p["gpus"])], load_space("default"),
                                gbs=p["gbs"], seq_len=p["seq_len"], calibration=cal)
        ev = Evaluator(problem, light=light)
        got = ev.evaluate(Candidate(0, plan.tp, plan.pp, plan.cp, plan.vpp, plan.mbs, plan.recompute,
                                    plan.sequence_parallel, plan.zero, plan.dtype, plan.framework, plan.ep,
                                    plan.etp if plan.etp != plan.tp else 0))
        assert got.status == "ok", (p, got.reason)
        rec = got.record
        assert rec.quick == light
        assert _figures(rec) == _figures(ref), p
        assert rec.layer_split == ref.layer_split
        if light:
            assert _figures(ev.detailed(rec)) == _figures(ref), p


def test_a_search_reports_breakdown_adds_up_to_the_records_time():
    from planner.reports.search_report import plan_details

    ranked = planner.search(model="llama-7b", gpus=16, tp="1,2", pp="1,2", progress=False)
    problem = ranked.result.problem
    hw = problem.targets[0].hardware
    (detail,) = plan_details([("#1", ranked.best)], problem.model, lambda r: hw, calibration=problem.calibration)
    assert sum(detail.categories.values()) == pytest.approx(ranked.best.iteration_time_s, rel=1e-9)
