"""Uneven pipeline stages: Megatron-expressible splits, the split chosen by predicted
stage time, its use in predict / search / export, and the refusal for VPP chunks Megatron cannot build."""

from __future__ import annotations

import re
import shlex
import tomllib
from dataclasses import replace

import pytest
import yaml
from typer.testing import CliRunner

from costmodel.core.specs.plan import (
    ParallelPlan,
    chunk_layers,
    default_layer_split,
    describe_split,
    layer_split_candidates,
    uneven_split_problem,
)
from planner.cli import app
from planner.export import megatron_args, nemo_config, torchtitan_config
from planner.prediction import predict
from planner.requests import build_request
from planner.search.objective import Evaluator
from planner.search.records import display_rows
from planner.search.space import SearchSpace, build_problem, enumerate_candidates, factorizations, make_target

LLAMA405 = {"model": "llama3-405b", "gpu": "h100-sxm", "gpus": 16384, "tp": 8, "pp": 16, "mbs": 1, "gbs": 2048,
            "seq_len": 8192}


def _megatron_ok(split, num_layers, pp, vpp):
    """Megatron-Core TransformerConfig's uneven-PP rules for --decoder-first/last-pipeline-num-layers, or the
    split --account-for-embedding/loss-in-pipeline-split builds ((layers + e + l) / PP per rank, % VPP)."""
    first, last, mid = split[0], split[-1], split[1:-1]
    for e, loss in ((1, 1), (1, 0), (0, 1)):
        per = (num_layers + e + loss) // pp
        if ((num_layers + e + loss) % pp == 0 and per % vpp == 0 and len(split) == pp
                and tuple(split) == (per - e,) + (per,) * (pp - 2) + (per - loss,)):
            return True
    return (sum(split) == num_layers and len(split) == pp and first > 0 and last > 0
            and first % vpp == 0 and last % vpp == 0 and len(set(mid)) <= 1 and all(m % vpp == 0 for m in mid))


def _parse_layout(layout: str) -> list[list[str]]:
    """Megatron's PipelineParallelLayerLayout.parse_str_to_list rules: commas cosmetic, x*n unrolled, '|' splits."""
    s = layout.replace(",", "")
    s = re.sub(r"\(([^)]+)\)\*(\d+)", lambda m: m.group(1) * int(m.group(2)), s)
    s = re.sub(r"(.)\*(\d+)", lambda m: m.group(1) * int(m.group(2)), s)
    return [list(stage) for stage in s.split("|")]


@pytest.mark.parametrize("layers,pp,vpp", [(126, 16, 1), (70, 12, 1), (105, 35, 1), (126, 8, 2), (10, 3, 1),
                                           (78, 4, 1), (9, 2, 1)])
def test_candidates_follow_megatron_rules(layers, pp, vpp):
    cands = layer_split_candidates(layers, pp, vpp)
    assert cands and all(_megatron_ok(c, layers, pp, vpp) for c in cands)
    default = default_layer_split(layers, pp, vpp)
    assert default in cands


def test_account_for_embedding_and_loss_split_is_the_default_for_llama3_405b():
    # (126 + 1 + 1) / 16 = 8 per stage counting embedding and loss: 7 on the first and last stage
    assert default_layer_split(126, 16) == (7,) + (8,) * 14 + (7,)
    assert describe_split(default_layer_split(126, 16)) == "7,8x14,7"


def test_account_for_embedding_and_loss_builds_the_nemo_405b_vpp8_split():
    # NeMo's Llama 3.1 405B recipe (TP8 PP8 CP2 VPP8): (126 + 2) / 8 = 16 per rank, 2 per chunk; the first
    # and last chunk hold one layer (embedding / loss take the other place)
    assert uneven_split_problem(126, 8, 8) is None
    assert default_layer_split(126, 8, 8) == (15,) + (16,) * 6 + (15,)
    chunks = chunk_layers((15,) + (16,) * 6 + (15,), 8)
    assert chunks[0][0] == 1 and chunks[-1][-1] == 1 and sum(map(sum, chunks)) == 126


def test_vpp_that_cannot_split_the_layers_is_refused_naming_the_rule():
    why = uneven_split_problem(126, 4, 5)
    assert why and "multiple of VPP" in why and "--decoder-first/last-pipeline-num-layers" in why
    assert uneven_split_problem(126, 130, 1) and "fewer than PP" in uneven_split_problem(126, 130, 1)
    res = CliRunner().invoke(app, ["predict", "--model", "llama3-405b", "--gpu", "h100-sxm", "--gpus", "2048",
                                   "--tp", "8", "--pp", "4", "--vpp", "5", "--gbs", "512", "--seq-len", "8192"])
    assert res.exit_code == 2 and "multiple of VPP" in res.output


def test_llama3_405b_production_layout_predicts_with_a_time_balanced_split():
    r = build_request(LLAMA405)
    pred = predict(r.model, r.plan, r.hardware)
    split = tuple(pred.layer_split)
    assert _megatron_ok(split, 126, 16, 1)
    assert len(pred.stage_times_s) == 16 and pred.iteration_time_s > 0
    # the LM head + loss make the last stage heavier than a middle stage with as many layers
    mid = pred.stage_times_s[1]
    assert split[-1] <= split[1]
    assert sum(pred.stage_times_s[-1]) < sum(mid) * split[-1] / split[1] + sum(mid)


def test_chosen_split_is_no_slower_than_any_expressible_alternative_near_balance():
    base = {"model": "gpt3-175b", "gpu": "a100-80gb", "gpus": 448, "tp": 8, "pp": 7, "gbs": 448, "seq_len": 2048}
    r = build_request(base)
    chosen = predict(r.model, r.plan, r.hardware)
    assert chosen.layer_split is not None and sum(chosen.layer_split) == 96
    for split in layer_split_candidates(96, 7):
        if max(abs(x - 96 / 7) for x in split) > 3:
            continue
        alt = build_request({**base, "layer_split": list(split)})
        assert chosen.iteration_time_s <= predict(alt.model, alt.plan, alt.hardware).iteration_time_s * (1 + 1e-3)


def test_even_plans_report_no_split_and_keep_the_even_split():
    r = build_request({"model": "llama3-70b", "gpu": "h100-sxm", "gpus": 512, "tp": 8, "pp": 4, "vpp": 5, "gbs": 1024})
    pred = predict(r.model, r.plan, r.hardware)
    assert pred.layer_split is None and r.plan.stage_layers(80) == (20, 20, 20, 20)
    explicit = build_request({"model": "llama3-70b", "gpu": "h100-sxm", "gpus": 512, "tp": 8, "pp": 4, "vpp": 5,
                              "gbs": 1024, "layer_split": [20, 20, 20, 20]})
    assert predict(explicit.model, explicit.plan, explicit.hardware).iteration_time_s == pred.iteration_time_s


def test_batch_line_returns_the_chosen_split():
    from planner.cli_predict import predict_one

    out = predict_one(dict(LLAMA405, id=1))
    assert out["layer_split"] == out["plan"]["layer_split"] and sum(out["layer_split"]) == 126


def _split_from_megatron_flags(args: list[str], layers: int, pp: int) -> tuple[int, ...]:
    """Rebuild the per-stage layers the way Megatron-Core does from the exported flags."""
    flags = {}
    for i, a in enumerate(args):
        if a.startswith("--"):
            flags[a] = args[i + 1] if i + 1 < len(args) and not args[i + 1].startswith("--") else True
    if "--account-for-embedding-in-pipeline-split" in flags or "--account-for-loss-in-pipeline-split" in flags:
        e = int("--account-for-embedding-in-pipeline-split" in flags)
        last = int("--account-for-loss-in-pipeline-split" in flags)
        per = (layers + e + last) // pp
        return (per - e,) + (per,) * (pp - 2) + (per - last,)
    if "--pipeline-model-parallel-layout" in flags:
        stages = _parse_layout(flags["--pipeline-model-parallel-layout"])
        vpp = len(stages) // pp
        return tuple(sum(stages[a * pp + b].count("t") for a in range(vpp)) for b in range(pp))
    first = int(flags.get("--decoder-first-pipeline-num-layers", 0)) or None
    last = int(flags.get("--decoder-last-pipeline-num-layers", 0)) or None
    rest, left = layers - (first or 0) - (last or 0), pp - (first is not None) - (last is not None)
    mid = rest // left
    return ((first or mid),) + (mid,) * (pp - 2) + ((last or mid),)


@pytest.mark.parametrize("split,vpp", [((8,) * 15 + (6,), 1), ((16,) * 7 + (14,), 2), ((32, 30, 32, 32), 2),
                                       ((15,) + (16,) * 6 + (15,), 8)])
def test_export_writes_flags_that_rebuild_the_split(split, vpp):
    r = build_request(dict(LLAMA405, gpus=128 * len(split), pp=len(split), vpp=vpp, gbs=64 * len(split),
                           layer_split=list(split)))
    args, _ = megatron_args(r.model, r.plan)
    assert _split_from_megatron_flags(args, 126, len(split)) == split
    text = " ".join(args)
    if "--pipeline-model-parallel-layout" in text:
        assert "--num-virtual-stages-per-pipeline-rank" not in text  # validate_args: at most one of them
    elif vpp > 1:
        assert f"--num-virtual-stages-per-pipeline-rank {vpp}" in text
    cfg, _ = nemo_config(r.model, r.plan)
    m = yaml.safe_load(yaml.safe_dump(cfg))["model"]
    if m.get("account_for_embedding_in_pipeline_split") or m.get("account_for_loss_in_pipeline_split"):
        assert _split_from_megatron_flags(args, 126, len(split)) == split and "--account-for" in text
    elif "pipeline_model_parallel_layout" in m:
        stages = _parse_layout(m["pipeline_model_parallel_layout"])
        assert stages[0][0] == "E" and stages[-1][-1] == "L"
        assert sum(s.count("t") for s in stages) == 126
    else:
        assert (m["num_layers_in_first_pipeline_stage"], m["num_layers_in_last_pipeline_stage"]) == (split[0],
                                                                                                      split[-1])
    sections, _ = torchtitan_config(r.model, r.plan)
    from planner.export import dump_toml

    parts = tomllib.loads(dump_toml(sections))["parallelism"]["module_fqns_per_model_part"]
    assert len(parts) == len(split) * vpp
    per_rank = [sum(sum(1 for x in parts[a * len(split) + b] if x.startswith("layers.")) for a in range(vpp))
                for b in range(len(split))]
    assert tuple(per_rank) == split
    flat = [x for p in parts for x in p if x.startswith("layers.")]
    assert sorted(flat, key=lambda x: int(x.split(".")[1])) == [f"layers.{i}" for i in range(126)]


def test_cli_export_uses_the_predicted_split():
    res = CliRunner().invoke(app, ["export", "--model", "llama3-405b", "--gpu", "h100-sxm", "--gpus", "16384",
                                   "--tp", "8", "--pp", "16", "--gbs", "2048", "--seq-len", "8192", "--to", "megatron"])
    assert res.exit_code == 0, res.output
    text = "\n".join(line for line in res.output.splitlines() if not line.startswith("warning:"))
    args = shlex.split(text, comments=True)
    r = build_request(LLAMA405)
    assert list(_split_from_megatron_flags(args, 126, 16)) == predict(r.model, r.plan, r.hardware).layer_split


def test_search_space_keeps_pps_that_do_not_divide_the_layers():
    r = build_request(LLAMA405)
    space = SearchSpace(name="t", tp=(8,), pp=(7, 8, 14, 16), vpp=(1, 2))
    target = make_target(r.hardware, 14336)  # 8 x 7 x 256: PP 7, 8, 14 and 16 all divide it
    assert {f[1] for f in factorizations(r.model, target, space)} == {7, 8, 14, 16}
    problem = build_problem(r.model, [target], space, gbs=2048, seq_len=8192)
    assert {(c.pp, c.vpp) for c in enumerate_candidates(problem)} == {(p, v) for p in (7, 8, 14, 16) for v in (1, 2)}
    # PP 14 x VPP 2 = 28 chunks for 126 layers: the search costs it with a Megatron-expressible uneven split
    full = build_problem(r.model, [target], replace(space, recompute=("full",)), gbs=2048, seq_len=8192)
    (cand,) = [c for c in enumerate_candidates(full) if (c.pp, c.vpp) == (14, 2)]
    ev = Evaluator(full).evaluate(cand)
    assert ev.status == "ok", ev.reason
    split = tuple(ev.record.layer_split)
    assert _megatron_ok(split, 126, 14, 2) and len(set(split)) > 1


def test_search_table_shows_the_split():
    res = CliRunner().invoke(app, ["search", "--model", "llama3-405b", "--gpu", "h100-sxm", "--gpus", "16384",
                                   "--tp", "8", "--pp", "8,16", "--seq-len", "8192", "--format", "json",
                                   "--exhaustive"])
    assert res.exit_code == 0, res.output
    import json

    plans = json.loads(res.output[res.output.index("{"):])["plans"]
    assert plans and all(p["layer_split"] and sum(p["layer_split"]) == 126 for p in plans)
    from planner.search.records import PlanRecord

    recs = [PlanRecord.from_dict(p) for p in plans]
    head, rows = display_rows(recs)
    pp_col = head.index("PP")
    assert all("(" in row[pp_col] for row in rows)
    assert recs[0].to_plan().layer_split == tuple(plans[0]["layer_split"])
    # the one-line plan text of size / compare / reports carries the split too
    from planner.search.records import describe_split, plan_text

    assert f"PP{recs[0].pp} ({describe_split(recs[0].layer_split)})" in plan_text(recs[0])


def test_plan_validation_accepts_uneven_layers_without_a_split():
    from costmodel.core.specs.presets import resolve_model

    model = resolve_model("llama3-405b")
    plan = ParallelPlan(gpus=128, gpus_per_node=8, gbs=64, seq_len=8192, tp=8, pp=16)
    assert plan.problems(model) == [] and plan.needs_layer_split(126)
    assert plan.stage_layers(126) == default_layer_split(126, 16)


def test_the_fastest_split_that_fits_in_memory_wins():
    """balanced_layer_split takes a memory test: when the fastest split does not fit, the fastest one that does
    (here: a fake test that refuses the unconstrained choice); when none fits, still the fastest."""
    from costmodel.estimate import default_cost_model
    from costmodel.graph.build import build_graph
    from costmodel.schedule.compose import cost_operators
    from costmodel.schedule.layer_split import balanced_layer_split

    r = build_request({"model": "gpt3-175b", "gpu": "a100-80gb", "gpus": 448, "tp": 8, "pp": 7, "gbs": 448,
                       "seq_len": 2048})
    graph = build_graph(r.model, r.plan)
    times = cost_operators(graph, r.hardware, default_cost_model()).time_s
    fastest = balanced_layer_split(graph, times, r.hardware, 96)
    assert balanced_layer_split(graph, times, r.hardware, 96, fits=lambda s: True) == fastest
    assert balanced_layer_split(graph, times, r.hardware, 96, fits=lambda s: False) == fastest
    other = balanced_layer_split(graph, times, r.hardware, 96, fits=lambda s: s != fastest)
    assert other != fastest and sum(other) == 96 and _megatron_ok(other, 96, 7, 1)
    smaller_first = balanced_layer_split(graph, times, r.hardware, 96, fits=lambda s: s[0] < fastest[0] - 1)
    assert smaller_first[0] < fastest[0] - 1
