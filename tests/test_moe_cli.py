"""Expert parallelism through the planner layer (issue 17): request keys and flags, the search's EP/ETP
dimensions, plan records and tables, and the MoE settings of the exports."""

import dataclasses
import json
import shlex
import tomllib

import pytest
import yaml
from typer.testing import CliRunner

from costmodel.core.errors import PlannerError
from costmodel.core.specs.catalogue import load_catalogue
from costmodel.core.specs.model import ModelSpec
from costmodel.core.specs.plan import ParallelPlan
from planner.cli import app
from planner.export import export_plan
from planner.export_moe import pattern_text
from planner.requests import PlanRequest
from planner.search.records import PlanRecord, display_rows, plan_text
from planner.search.space import (
    SearchProblem,
    Target,
    candidate_plan,
    dimension_choices,
    enumerate_candidates,
    load_space,
    neighbours,
)

runner = CliRunner()
CAT = load_catalogue()
H100 = CAT.resolve("h100-sxm")
# Mixtral-8x7B's shape (mistralai/Mixtral-8x7B-v0.1 config.json: 32 layers, hidden 4096, 32 heads, 8 KV heads,
# FFN 14336, 8 experts, top-2) built in Python, so these tests do not depend on the presets.
MIXTRAL = ModelSpec(name="mixtral-test", num_layers=32, hidden_size=4096, num_heads=32, num_kv_heads=8,
                    ffn_hidden_size=14336, vocab_size=32000, activation="swiglu", norm="rmsnorm", max_seq_len=4096,
                    num_experts=8, experts_per_token=2)
# a DeepSeek-like pattern: 1 dense layer first, 2 shared experts, sigmoid router, narrow experts
DSLIKE = ModelSpec(name="ds-test", num_layers=8, hidden_size=1024, num_heads=8, num_kv_heads=8, ffn_hidden_size=4096,
                   vocab_size=32000, activation="swiglu", norm="rmsnorm", max_seq_len=4096, num_experts=16,
                   experts_per_token=4, moe_ffn_hidden_size=512, num_shared_experts=2, first_dense_layers=1,
                   router="sigmoid")
QWEN3_MOE = ModelSpec(name="qwen3-moe-test", num_layers=16, hidden_size=2048, num_heads=32, num_kv_heads=4,
                      head_dim=128, ffn_hidden_size=6144, vocab_size=151936, activation="swiglu", norm="rmsnorm",
                      max_seq_len=4096, num_experts=64, experts_per_token=8, moe_ffn_hidden_size=768,
                      extra={"qk_norm": True})
DENSE = ModelSpec(name="dense-test", num_layers=32, hidden_size=4096, num_heads=32, num_kv_heads=8,
                  ffn_hidden_size=14336, vocab_size=32000, activation="swiglu", norm="rmsnorm", max_seq_len=4096)


# ------------------------------------------------------------------------------ requests and flags
def test_request_moe_keys_reach_the_plan():
    req = PlanRequest.from_dict({"model": "llama-13b", "gpu": "h100-sxm", "gpus": 64, "tp": 2, "ep": 8, "etp": 1,
                                 "moe_dispatcher": "allgather", "moe_imbalance": 1.25, "moe_overlap_comm": True})
    plan = req.to_plan(MIXTRAL, 8)
    assert (plan.ep, plan.etp, plan.moe_dispatcher, plan.moe_imbalance, plan.moe_overlap_comm) == \
        (8, 1, "allgather", 1.25, True)
    assert plan.expert_dp == 64 // (1 * 8 * 1)


def test_default_request_builds_the_dense_plan_as_before():
    req = PlanRequest.from_dict({"model": "llama-13b", "gpu": "h100-sxm", "gpus": 64, "tp": 4})
    assert req.moe_fields() == {}
    plan = req.to_plan(DENSE, 8)
    assert (plan.ep, plan.etp, plan.moe_imbalance) == (1, 4, None)  # ETP None -> TP (Megatron-Core's default)


@pytest.mark.parametrize("key, value, words", [
    ("ep", "x", "must be an integer"), ("ep", 0, "positive"), ("etp", -1, "positive"),
    ("moe_dispatcher", "nccl", "alltoall, allgather, flex"), ("moe_imbalance", 0.5, ">= 1"),
    ("moe_imbalance", float("nan"), ">= 1"), ("moe_imbalance", "1.2", "number"),
    ("moe_overlap_comm", 1, "true or false"),
])
def test_bad_moe_keys_refused_in_one_line(key, value, words):
    with pytest.raises(PlannerError) as exc:
        PlanRequest.from_dict({"model": "llama-13b", "gpu": "h100-sxm", "gpus": 8, key: value})
    assert words in str(exc.value) and key in str(exc.value) and "\n" not in str(exc.value)


@pytest.mark.parametrize("flags, words", [
    (["--ep", "2"], "EP=2 needs a mixture-of-experts model"),
    (["--moe-dispatcher", "nccl"], "moe_dispatcher='nccl' must be one of"),
    (["--moe-imbalance", "0.9"], "moe_imbalance=0.9 must be a number >= 1"),
    (["--etp", "0"], "etp=0 must be a positive integer"),
])
def test_cli_bad_moe_flags_exit_2(flags, words):
    r = runner.invoke(app, ["predict", "--model", "llama-13b", "--gpu", "h100-sxm", "--gpus", "8", *flags])
    assert r.exit_code == 2
    assert words in r.output and len(r.output.strip().splitlines()) == 1


def test_batch_moe_keys_refused_per_line(tmp_path):
    f = tmp_path / "b.jsonl"
    f.write_text('{"id": 1, "model": "llama-13b", "gpu": "h100-sxm", "gpus": 8, "moe_imbalance": 0.5}\n'
                 '{"id": 2, "model": "llama-13b", "gpu": "h100-sxm", "gpus": 8, "ep": 2}\n')
    r = runner.invoke(app, ["predict", "--batch", str(f)])
    lines = [json.loads(x) for x in r.output.splitlines()]
    assert [x["id"] for x in lines] == [1, 2]
    assert ">= 1" in lines[0]["error"] and "mixture-of-experts" in lines[1]["error"]


def test_dense_predict_json_has_no_moe_keys_and_csv_has_ep_columns():
    args = ["predict", "--model", "llama-13b", "--gpu", "a100-80gb", "--gpus", "128", "--tp", "2", "--pp", "2"]
    rec = json.loads(runner.invoke(app, [*args, "--format", "json"]).output)
    assert "ep" not in rec["plan"] and "etp" not in rec["plan"]
    head, row = runner.invoke(app, [*args, "--format", "csv"]).output.splitlines()[:2]
    cells = dict(zip(head.split(","), row.split(",")))
    assert (cells["EP"], cells["ETP"]) == ("1", "2")


# ------------------------------------------------------------------------------------ search space
def _problem(model, gpus=64, **space):
    sp = load_space("default").override(**space)
    return SearchProblem(model, (Target(H100, gpus),), sp, gbs=512, seq_len=4096)


def test_dense_search_has_no_expert_dimension():
    p = _problem(DENSE)
    assert "ep" not in dimension_choices(p) and "etp" not in dimension_choices(p)
    assert {(c.ep, c.etp) for c in enumerate_candidates(p)} == {(1, 0)}


def test_moe_search_enumerates_ep_divisors_and_etp_under_megatron_rules():
    p = _problem(MIXTRAL)
    cands = list(enumerate_candidates(p))
    assert {c.ep for c in cands} == {1, 2, 4, 8}  # the divisors of 8 experts
    assert dimension_choices(p)["ep"] == [1, 2, 4, 8] and dimension_choices(p)["etp"] == [0, 1]
    for c in cands:
        plan = candidate_plan(p, c)
        expert_rules = [x for x in plan.problems(MIXTRAL) if "ETP" in x or "EP=" in x or "experts=" in x]
        assert expert_rules == [], (c, expert_rules)
        assert not (c.ep > 1 and c.tp > 1 and not c.sequence_parallel)
    # ETP = 1 is searched beside ETP = TP where TP > 1
    assert any(c.tp > 1 and c.etp == 1 for c in cands) and any(c.tp > 1 and c.etp == 0 for c in cands)


def test_moe_search_space_takes_ep_choices_and_refuses_bad_ones():
    p = _problem(MIXTRAL, ep=(1, 4), etp=(0,))
    assert {c.ep for c in enumerate_candidates(p)} == {1, 4}
    assert {c.etp for c in enumerate_candidates(p)} == {0}
    with pytest.raises(PlannerError, match="ep value 0"):
        load_space("default").override(ep=[0])


def test_study_identity_of_dense_problems_has_no_expert_dimensions():
    assert "ep" not in _problem(DENSE).describe()["space"]  # studies stored before EP existed still match
    assert _problem(MIXTRAL).describe()["space"]["etp"] == [0, 1]


def test_neighbours_step_ep():
    p = _problem(MIXTRAL)
    ch = dimension_choices(p)
    c = next(c for c in enumerate_candidates(p) if c.ep == 2 and c.tp == 2)
    eps = {n.ep for n in neighbours(c, ch) if n._replace(ep=c.ep) == c}
    assert eps == {1, 4}


def _record(**kw) -> PlanRecord:
    base = dict(model="m", gpu="h100-sxm", cluster="dgx-h100", nodes=8, gpus_per_node=8, gpus=64, tp=2, pp=1, dp=32,
                cp=1, vpp=1, mbs=1, gbs=512, seq_len=4096, num_microbatches=16, recompute="selective",
                sequence_parallel=True, zero=1, dtype="bf16", iteration_time_s=1.0, iteration_time_low_s=None,
                iteration_time_high_s=None, tokens_per_s=1e6, mfu=0.4, model_tflops_per_gpu=400.0,
                memory_gib_per_gpu=40.0, memory_limit_gib=80.0, price_usd_per_gpu_hour=None, usd_per_mtoken=None,
                time_to_train_s=None, cost_to_train_usd=None, bottleneck="compute", bubble_fraction=0.0,
                cost_model="roofline")
    return PlanRecord(**{**base, **kw})


def test_tables_show_ep_only_where_a_plan_has_it():
    dense = _record(etp=2)
    head, _ = display_rows([dense])
    assert "EP" not in head and "EP" not in plan_text(dense)
    moe = _record(ep=8, etp=1)
    head, rows = display_rows([dense, moe])
    i = head.index("EP")
    assert head[i + 1] == "ETP" and [r[i:i + 2] for r in rows] == [["1", "2"], ["8", "1"]]
    assert plan_text(moe).endswith("EP8 ETP1")
    assert moe.key() != _record(ep=4, etp=1).key() and moe.to_plan().ep == 8


def test_records_written_before_ep_existed_read_back_as_dense():
    d = _record().to_dict()
    d.pop("ep"), d.pop("etp")
    r = PlanRecord.from_dict(d)
    assert (r.ep, r.to_plan().etp) == (1, r.tp)


# ----------------------------------------------------------------------------------------- exports
def _flags(text: str) -> dict:
    tokens = shlex.split(text, comments=True)
    out, i = {}, 0
    while i < len(tokens):
        if i + 1 < len(tokens) and not tokens[i + 1].startswith("--"):
            out[tokens[i]] = tokens[i + 1]
            i += 2
        else:
            out[tokens[i]] = True
            i += 1
    return out


P_MOE = ParallelPlan(gpus=64, gpus_per_node=8, gbs=256, seq_len=4096, tp=2, pp=2, ep=8, etp=1,
                     moe_dispatcher="flex", moe_imbalance=1.0, moe_overlap_comm=True)


def test_megatron_export_moe_flags():
    f = _flags(export_plan(DSLIKE, P_MOE, H100, None, "megatron"))
    assert f["--num-experts"] == "16" and f["--moe-router-topk"] == "4" and f["--moe-ffn-hidden-size"] == "512"
    assert f["--moe-shared-expert-intermediate-size"] == "1024"  # 2 shared experts x 512
    assert f["--moe-layer-freq"] == "([0]*1+[1]*7)" and f["--moe-router-score-function"] == "sigmoid"
    assert f["--expert-model-parallel-size"] == "8" and f["--expert-tensor-parallel-size"] == "1"
    assert f["--moe-token-dispatcher-type"] == "flex" and f["--moe-enable-deepep"] is True
    assert f["--moe-grouped-gemm"] is True and f["--moe-router-force-load-balancing"] is True
    assert f["--overlap-moe-expert-parallel-comm"] is True


def test_megatron_export_default_moe_plan_and_dense_plan():
    p = ParallelPlan(gpus=64, gpus_per_node=8, gbs=256, seq_len=4096, tp=2, ep=4)
    f = _flags(export_plan(MIXTRAL, p, H100, None, "megatron"))
    assert f["--expert-tensor-parallel-size"] == "2" and f["--moe-token-dispatcher-type"] == "alltoall"
    assert "--moe-layer-freq" not in f and "--moe-shared-expert-intermediate-size" not in f
    assert "--moe-router-force-load-balancing" not in f  # imbalance left to the default: no forced balance
    dense = _flags(export_plan(DENSE, ParallelPlan(gpus=64, gpus_per_node=8, gbs=256,
                                                   seq_len=4096, tp=2), H100, None, "megatron"))
    assert not any(k.startswith(("--moe", "--expert", "--num-experts")) for k in dense)


def test_layer_pattern_text_reads_back_as_megatron_evaluates_it():
    assert pattern_text([0, 1, 1, 0, 1]) == "([0]*1+[1]*2+[0]*1+[1]*1)"
    assert eval(pattern_text([0, 0, 1, 1, 1])) == [0, 0, 1, 1, 1]  # Megatron-LM _eval_pattern: eval of the list


def test_nemo_and_torchtitan_export_moe_keys():
    text = export_plan(DSLIKE, P_MOE, H100, None, "nemo")
    m = yaml.safe_load(text)["model"]
    assert (m["num_moe_experts"], m["moe_router_topk"], m["expert_model_parallel_size"],
            m["expert_tensor_parallel_size"], m["moe_token_dispatcher_type"], m["moe_grouped_gemm"]) == \
        (16, 4, 8, 1, "flex", True)
    assert m["moe_layer_freq"] == [0] + [1] * 7 and m["moe_shared_expert_intermediate_size"] == 1024
    fsdp = ParallelPlan(gpus=64, gpus_per_node=8, gbs=256, seq_len=4096, tp=2, ep=8, zero=3)
    with pytest.raises(PlannerError, match="has no model for mixtral-test"):  # torchtitan has no Mixtral model
        export_plan(MIXTRAL, fsdp, H100, None, "torchtitan")
    text = export_plan(QWEN3_MOE, fsdp, H100, None, "torchtitan")  # a QK-norm MoE: torchtitan's qwen3 model
    t = tomllib.loads(text)  # the header lines are TOML comments
    par = t["parallelism"]
    assert t["model"]["name"] == "qwen3" and t["model"]["flavor"] == QWEN3_MOE.name
    assert par["expert_parallel_degree"] == 8 and par["data_parallel_shard_degree"] == 32
    assert "expert_tensor_parallel_degree" not in par  # ETP = TP: torchtitan's default pairing
    assert "borrows data_parallel_shard_degree" not in text  # CP <= EP <= dp_shard x CP holds
    etp1 = tomllib.loads(export_plan(QWEN3_MOE, dataclasses.replace(fsdp, etp=1), H100, None, "torchtitan"))
    assert etp1["parallelism"]["expert_tensor_parallel_degree"] == 1
    # without ZeRO-3 torchtitan still shards (it refuses DDP next to TP), so EP 8 <= 32 x CP fits
    sharded = export_plan(QWEN3_MOE, ParallelPlan(gpus=64, gpus_per_node=8, gbs=256,
                                                  seq_len=4096, tp=2, ep=8), H100, None, "torchtitan")
    assert "DDP has not supported > 1D parallelism" in sharded


# ----------------------------------------------------------------------------- end to end (presets)
def test_predict_mixtral_preset_with_ep_shows_the_moe_operators():
    r = runner.invoke(app, ["predict", "--model", "mixtral-8x7b", "--gpu", "h100-sxm", "--gpus", "64", "--tp", "1",
                            "--pp", "4", "--ep", "8", "--seq-len", "4096", "--format", "json"])
    assert r.exit_code == 0, r.output
    rec = json.loads(r.output)
    assert (rec["plan"]["ep"], rec["plan"]["etp"], rec["plan"]["expert_dp"]) == (8, 1, 2)
    ops = {b["operator"] for b in rec["breakdown"]}
    assert {"moe.router", "moe.dispatch", "moe.expert.up", "moe.combine"} <= ops
    table = runner.invoke(app, ["predict", "--model", "mixtral-8x7b", "--gpu", "h100-sxm", "--gpus", "64", "--tp",
                                "1", "--pp", "4", "--ep", "8", "--seq-len", "4096"]).output
    assert "EP=8 ETP=1" in table and "MoE layer operators" in table and "moe.dispatch" in table


def test_grouped_gemm_key_and_flag_change_only_the_expert_operators(tmp_path):
    req = PlanRequest.from_dict({"model": "llama-13b", "gpu": "h100-sxm", "gpus": 64, "ep": 8,
                                 "moe_grouped_gemm": False})
    assert req.moe_fields()["moe_grouped_gemm"] is False and req.to_plan(MIXTRAL, 8).moe_grouped_gemm is False
    assert PlanRequest.from_dict({"model": "llama-13b", "gpu": "h100-sxm", "gpus": 8}).moe_fields() == {}
    with pytest.raises(PlannerError, match="moe_grouped_gemm=1 must be true or false"):
        PlanRequest.from_dict({"model": "llama-13b", "gpu": "h100-sxm", "gpus": 8, "moe_grouped_gemm": 1})
    # 8 local experts of 128 tokens each: grouped GEMMs pay the per-expert floors once (costmodel.cost.moe_kernels; from
    # 1,024 tokens per expert a training grouped GEMM runs as the per-expert GEMMs and the flag changes nothing)
    args = ["predict", "--model", "mixtral-8x7b", "--gpu", "h100-sxm", "--gpus", "64", "--tp", "1", "--pp", "4",
            "--ep", "1", "--seq-len", "512", "--cuda-graphs", "--format", "json"]  # graphs: GPU times set the step
    recs = []
    for flag in ("--moe-grouped-gemm", "--no-moe-grouped-gemm"):
        r = runner.invoke(app, args + [flag])
        assert r.exit_code == 0, r.output
        recs.append(json.loads(r.output))
    assert [rec["plan"]["moe_grouped_gemm"] for rec in recs] == [True, False]
    on, off = ({(b["operator"], b["phase"]): b["time_s"] for b in rec["breakdown"]} for rec in recs)
    assert on.keys() == off.keys()
    moved = {k[0] for k in on if off[k] != pytest.approx(on[k], rel=1e-9)}
    moved.discard("pipeline_bubble+p2p")     # the bubble follows the stage times, and so does what of the
    moved -= {"dp.grad_reduce (exposed)", "dp.param_allgather (exposed)"}  # DP communication the backward hides
    assert "moe.expert.up" in moved and all(name.startswith("moe.expert") for name in moved), moved
    f = tmp_path / "b.jsonl"
    f.write_text(json.dumps({"model": "mixtral-8x7b", "gpu": "h100-sxm", "gpus": 64, "pp": 4, "ep": 1,
                             "seq_len": 512, "cuda_graphs": True, "moe_grouped_gemm": False}) + "\n")
    line = json.loads(runner.invoke(app, ["predict", "--batch", str(f)]).output)
    assert line["plan"]["moe_grouped_gemm"] is False and line["iteration_time_s"] == recs[1]["iteration_time_s"]


def test_search_moe_preset_searches_ep_and_json_carries_it():
    r = runner.invoke(app, ["search", "--model", "mixtral-8x7b", "--gpus", "64", "--gpu", "h100-sxm", "--seq-len",
                            "4096", "--tp", "1,2", "--pp", "1,2", "--no-progress", "--format", "json", "--top", "50"])
    assert r.exit_code == 0, r.output
    plans = json.loads(r.output)["plans"]
    assert all("ep" in p and "etp" in p for p in plans)
    assert len({p["ep"] for p in plans}) > 1 and max(p["ep"] for p in plans) > 1  # EP is a searched dimension
    r = runner.invoke(app, ["search", "--model", "mixtral-8x7b", "--gpus", "64", "--gpu", "h100-sxm", "--seq-len",
                            "4096", "--tp", "2", "--pp", "1", "--ep", "4", "--etp", "1", "--no-progress", "--format",
                            "json"])
    assert r.exit_code == 0, r.output
    assert {(p["ep"], p["etp"]) for p in json.loads(r.output)["plans"]} == {(4, 1)}


def test_search_etp_flag_refuses_bad_values():
    r = runner.invoke(app, ["search", "--model", "mixtral-8x7b", "--gpus", "64", "--etp", "x", "--no-progress"])
    assert r.exit_code == 2 and "--etp 'x' must list 'tp'" in r.output


def test_dense_search_json_plans_carry_ep_1():
    r = runner.invoke(app, ["search", "--model", "llama-13b", "--gpus", "16", "--tp", "2", "--pp", "1,2",
                            "--no-progress", "--format", "json"])
    assert r.exit_code == 0, r.output
    assert {(p["ep"], p["etp"] == p["tp"]) for p in json.loads(r.output)["plans"]} == {(1, True)}


def test_megatron_and_nemo_export_mla_flags_of_deepseek_v3():
    # DeepSeek-V3 (config.json: q_lora_rank 1536, kv_lora_rank 512, qk_nope_head_dim 128, qk_rope_head_dim 64,
    # v_head_dim 128, first_k_dense_replace 3 of 61 layers); the values of Megatron-LM's DeepSeek-V3 recipes
    args = ["export", "--model", "deepseek-v3", "--gpu", "h100-sxm", "--gpus", "1024", "--pp", "16", "--ep", "64",
            "--seq-len", "4096"]
    f = _flags(runner.invoke(app, [*args, "--to", "megatron"]).stdout)
    assert f["--multi-latent-attention"] is True
    assert (f["--q-lora-rank"], f["--kv-lora-rank"], f["--qk-head-dim"], f["--qk-pos-emb-head-dim"],
            f["--v-head-dim"]) == ("1536", "512", "128", "64", "128")
    assert f["--moe-layer-freq"] == "([0]*3+[1]*58)" and f["--num-experts"] == "256"
    m = yaml.safe_load(runner.invoke(app, [*args, "--to", "nemo"]).stdout)["model"]
    assert (m["multi_latent_attention"], m["q_lora_rank"], m["qk_head_dim"], m["v_head_dim"]) == (True, 1536, 128, 128)
    p8 = ParallelPlan(gpus=8, gpus_per_node=8, gbs=8, seq_len=4096)
    assert "--multi-latent-attention" not in _flags(export_plan(MIXTRAL, p8, H100, None, "megatron"))


def test_moe_prediction_gets_the_band_of_moe_runs_never_the_dense_one():
    """The shipped calibration carries a band of MoE runs (scripts/fit_default_calibration.py: residuals of
    moe_runs.csv, every run held out from the dense fit): an MoE plan gets that band and says so; a dense plan the
    dense band; a calibration with dense bands only gives an MoE plan none, and says why."""
    import dataclasses

    from costmodel.core.specs.presets import resolve_model as resolve
    from planner.calibrate import calibration_option
    from planner.intervals import MOE_TABLE, time_band
    from planner.prediction import predict

    hw = load_catalogue().resolve("h100-sxm")
    cal = calibration_option(None)
    moe = predict(resolve("mixtral-8x7b"), ParallelPlan(64, 8, 128, 4096, pp=4, ep=8), hw, calibration=cal)
    assert moe.interval.startswith("80 % interval") and "mixture-of-experts runs" in moe.interval
    band = cal.intervals[MOE_TABLE]["groups"]["pooled"]
    assert (moe.iteration_time_low_s, moe.iteration_time_high_s) == pytest.approx(
        time_band(moe.iteration_time_s, band))
    dense = predict(resolve("llama3-8b"), ParallelPlan(64, 8, 128, 4096, tp=2), hw, calibration=cal)
    assert dense.interval.startswith("80 % interval") and "mixture-of-experts" not in dense.interval
    dense_only = dataclasses.replace(cal, intervals={k: v for k, v in cal.intervals.items() if k != MOE_TABLE})
    moe = predict(resolve("mixtral-8x7b"), ParallelPlan(64, 8, 128, 4096, pp=4, ep=8), hw, calibration=dense_only)
    assert not moe.interval.startswith("80 % interval")
    assert any("no 80 % interval for mixture-of-experts" in w for w in moe.warnings)
