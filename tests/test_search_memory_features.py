"""Memory features in search, compare and size: every plan takes the settings `planner predict` takes by the same
flags (SearchSpace.plan_settings), the records carry them, and bad values are one-line errors."""

from __future__ import annotations

import dataclasses
import json

import pytest
from typer.testing import CliRunner

import planner
from costmodel.core.errors import PlannerError
from costmodel.core.specs.catalogue import load_catalogue
from costmodel.core.specs.presets import resolve_model
from costmodel.memory.per_gpu import fits_in_memory, memory_per_gpu
from planner.cli import app
from planner.search.api import plan_settings
from planner.search.records import PlanRecord, make_record, plan_text
from planner.search.space import (
    Candidate,
    build_problem,
    candidate_plan,
    enumerate_candidates,
    load_space,
    make_target,
)

runner = CliRunner()
# Llama 3 405B's layout (arXiv 2407.21783 Table 4), one plan: at ZeRO-1 with fp32 main gradients it needs 86 GiB
LLAMA3 = ["--model", "llama3-405b", "--gpu", "h100-sxm", "--gpus", "16384", "--tp", "8", "--pp", "16", "--vpp", "2",
          "--cp", "1", "--mbs", "1", "--gbs", "2048", "--seq-len", "8192", "--zero", "1", "--recompute", "selective",
          "--sp", "true", "--no-progress"]


def test_settings_are_checked_and_the_defaults_drop_out():
    space = load_space("default").override(plan_settings=plan_settings(main_grads_dtype="bf16",
                                                                      offload_modules="attn_norm,mlp_norm"))
    assert space.plan_settings == (("main_grads_dtype", "bf16"), ("offload_modules", ("attn_norm", "mlp_norm")))
    assert load_space("default").override(plan_settings=plan_settings()).plan_settings == ()
    for bad, text in ((dict(main_grads_dtype="fp64"), "main_grads_dtype='fp64' must be one of"),
                      (dict(offload_modules="attn_norm,bogus"), "unknown bogus"),
                      (dict(optimizer_offload_fraction=1.5), "must be a fraction in [0, 1]")):
        with pytest.raises(PlannerError, match=text.replace("[", r"\[").replace("]", r"\]")):
            load_space("default").override(plan_settings=plan_settings(**bad))


def test_every_candidate_plan_and_its_record_take_the_settings():
    model = resolve_model("llama-7b")
    hw = load_catalogue().resolve("a100-80gb")
    space = load_space("default").override(tp=[2], pp=[1], cp=[1], vpp=[1], mbs=[1], recompute=["selective"],
                                           zero=[1], plan_settings=plan_settings(main_grads_dtype="bf16"))
    problem = build_problem(model, [make_target(hw, 8)], space, gbs=64)
    assert any(n.startswith("every plan takes main_grads_dtype=bf16") for n in problem.notes)
    assert problem.describe()["space"]["plan_settings"] == [("main_grads_dtype", "bf16")]
    cand = next(enumerate_candidates(problem))
    assert isinstance(cand, Candidate)
    plan = candidate_plan(problem, cand)
    assert plan.main_grads_dtype == "bf16"
    pred = planner.predict(model="llama-7b", gpu="a100-80gb", gpus=8, tp=2, gbs=64, main_grads_dtype="bf16")
    rec = make_record(problem, problem.targets[0], plan, pred, None)
    assert rec.plan_settings == {"main_grads_dtype": "bf16"}
    assert rec.to_plan().main_grads_dtype == "bf16"
    plain = build_problem(model, [make_target(hw, 8)], load_space("default"), gbs=64)
    assert "plan_settings" not in plain.describe()["space"]  # studies stored before the feature keep their identity
    other = make_record(plain, plain.targets[0], candidate_plan(plain, cand), pred, None)
    assert other.plan_settings == {} and other.key() != rec.key()


def test_search_keeps_llama3_layout_at_zero1_only_with_a_memory_feature():
    """The 405B layout at Megatron's ZeRO-1 is out of memory with fp32 main gradients; with bf16 main gradients or
    the norms' inputs offloaded it is the plan the search returns, and its JSON names the setting."""
    refused = runner.invoke(app, ["search", *LLAMA3])
    assert refused.exit_code == 2 and "no plan fits" in refused.output
    assert "or memory features every plan takes (--main-grads-dtype bf16, --offload-modules auto)" \
        in " ".join(refused.output.split())
    norms = ["attn_norm", "mlp_norm"]
    for flags, setting in ((["--main-grads-dtype", "bf16"], {"main_grads_dtype": "bf16"}),
                           (["--offload-modules", ",".join(norms)], {"offload_modules": norms})):
        res = runner.invoke(app, ["search", *LLAMA3, *flags, "--format", "json"])
        assert res.exit_code == 0, res.output
        plans = json.loads(res.stdout)["plans"]
        assert [(p["tp"], p["pp"], p["dp"], p["zero"]) for p in plans] == [(8, 16, 128, 1)]
        assert plans[0]["plan_settings"] == setting
        assert plans[0]["memory_gib_per_gpu"] < plans[0]["memory_limit_gib"]


def test_a_setting_a_plan_cannot_take_makes_it_invalid_and_bad_values_exit_2():
    res = runner.invoke(app, ["search", *LLAMA3[:-5], "--recompute", "full", "--sp", "true", "--no-progress",
                              "--offload-modules", "attn_norm"])
    assert res.exit_code == 2 and "no valid plan" in res.output and "offload_modules with recompute" in res.output
    assert "or drop that memory flag" in res.output
    fp8 = runner.invoke(app, ["search", "--model", "llama-7b", "--gpus", "16", "--gpu", "h100-sxm", "--no-progress",
                              "--fp8-param-gather"])  # the reason keeps its digits: fp8, not fp
    assert fp8.exit_code == 2 and "fp8_param_gather keeps fp8 primary weights: needs dtype fp8 or fp8-block" in \
        " ".join(fp8.output.split())
    for command in (["search", "--model", "llama-7b", "--gpus", "8", "--no-progress"],
                    ["compare", "--model", "llama-7b", "--gpus", "8", "--gpu", "a100-80gb"],
                    ["size", "--model", "llama-7b", "--tokens", "1B", "--deadline", "7d", "--gpu", "a100-80gb",
                     "--no-progress"]):
        bad = runner.invoke(app, [*command, "--exp-avg-dtype", "int4"])
        assert bad.exit_code == 2, (command, bad.output)
        assert bad.output.strip().splitlines()[-1].startswith("error: exp_avg_dtype='int4' must be one of")


def test_compare_and_size_apply_the_settings_and_say_so():
    cmp = planner.compare(model="llama-7b", gpu=["a100-80gb"], gpus=16, main_grads_dtype="bf16")
    assert cmp.rows[0].best.plan_settings == {"main_grads_dtype": "bf16"}
    res = runner.invoke(app, ["compare", "--model", "llama-7b", "--gpus", "16", "--gpu", "a100-80gb",
                              "--main-grads-dtype", "bf16"], env={"COLUMNS": "300"})
    assert res.exit_code == 0 and "note: every plan takes main_grads_dtype=bf16" in res.output
    res = runner.invoke(app, ["size", "--model", "llama-7b", "--tokens", "20B", "--deadline", "7d", "--gpu",
                              "h100-sxm", "--max-gpus", "64", "--no-progress", "--main-grads-dtype", "bf16",
                              "--format", "json"])
    assert res.exit_code == 0, res.output
    data = json.loads(res.stdout)
    assert any(n.startswith("every plan takes main_grads_dtype=bf16") for n in data["notes"])


def test_offload_auto_lets_a_plan_that_does_not_fit_take_the_first_offload_set_that_fits():
    """--offload-modules auto: Llama 3's ZeRO-1 layout (out of memory as it is) becomes feasible with the norms'
    inputs offloaded and is faster than the full-recompute plans; plans that fit take no offloading."""
    res = runner.invoke(app, ["search", *LLAMA3[:-5], "--recompute", "selective,full", "--sp", "true",
                              "--no-progress", "--offload-modules", "auto", "--format", "json"])
    assert res.exit_code == 0, res.output
    plans = json.loads(res.stdout)["plans"]
    by_recompute = {p["recompute"]: p for p in plans}
    assert by_recompute["selective"]["plan_settings"] == {"offload_modules": ["attn_norm", "mlp_norm"]}
    assert by_recompute["full"]["plan_settings"] == {}
    assert plans[0]["recompute"] == "selective"  # the offloaded plan is the fastest
    table = runner.invoke(app, ["search", *LLAMA3[:-5], "--recompute", "selective,full", "--sp", "true",
                                "--no-progress", "--offload-modules", "auto", "--wide"], env={"COLUMNS": "400"})
    assert "note: --offload-modules auto: a Megatron plan that does not fit takes the first of" in table.output
    head = next(x for x in table.output.splitlines() if "ZeRO" in x and "offload" in x)
    cells = [c.strip() for c in head.split("┃")]
    col = cells.index("offload")
    rows = [[c.strip() for c in x.split("│")] for x in table.output.splitlines() if x.startswith("│")]
    assert sorted(r[col] for r in rows) == ["-", "attn_norm,mlp_norm"]  # selective offloads, full needs none
    assert plan_text(PlanRecord.from_dict(by_recompute["selective"])).endswith("offload attn_norm,mlp_norm")
    small = planner.search(model="llama-7b", gpus=16, tp="1,2", pp="1,2", progress=False, offload_modules="auto")
    # a plan offloads only where it does not fit without: costed again without the offloading, it does not fit
    hw = load_catalogue().resolve("a100-80gb")
    for r in small.result.records:
        if r.plan_settings:
            bare = dataclasses.replace(r.to_plan(), offload_modules=())
            assert not fits_in_memory(memory_per_gpu(resolve_model("llama-7b"), bare, hw.gpu), hw.gpu,
                                      small.result.problem.space.memory_headroom), r
    assert any(not r.plan_settings for r in small.result.records)
    assert any(r.plan_settings for r in small.result.records)  # the large micro-batches need it
    space = load_space("default").override(plan_settings=plan_settings(offload_modules="auto"), offload_auto=True)
    assert space.plan_settings == () and space.offload_auto


def test_moe_models_offload_the_experts_first():
    """For a mixture-of-experts model the sets tried start with the routed experts' fc1 input and activation (the
    Megatron-MoE-ModelZoo Qwen3-235B GB200 recipe's --offload-modules expert_fc1 moe_act): Qwen3-235B on 256 H100
    at TP2 PP8 EP8 ZeRO-1 does not fit as it is, and fits with those two."""
    from costmodel.core.specs.memory_features import MOE_OFFLOAD_STEPS, OFFLOAD_STEPS, offload_steps

    assert offload_steps(True)[0] == ("expert_fc1", "moe_act") and offload_steps(False) == OFFLOAD_STEPS
    assert all(set(m) >= {"expert_fc1", "moe_act"} for m in MOE_OFFLOAD_STEPS)
    flags = ["--model", "qwen3-235b-a22b", "--gpu", "h100-sxm", "--gpus", "256", "--tp", "2", "--pp", "8", "--vpp",
             "4", "--ep", "8", "--etp", "1", "--mbs", "1", "--gbs", "2048"]
    space = ["--cp", "1", "--zero", "1", "--recompute", "selective", "--no-progress", "--format", "json"]
    assert runner.invoke(app, ["search", *flags, *space]).exit_code == 2
    res = runner.invoke(app, ["search", *flags, *space, "--offload-modules", "auto"])
    assert res.exit_code == 0, res.output
    assert [p["plan_settings"] for p in json.loads(res.stdout)["plans"]] == [
        {"offload_modules": ["expert_fc1", "moe_act"]}]
    advice = runner.invoke(app, ["predict", *flags, "--zero", "1"], env={"COLUMNS": "400"})
    line = next(x for x in advice.output.splitlines() if x.startswith("note: the same layout fits with"))
    assert "--offload-modules expert_fc1,moe_act (" in line
