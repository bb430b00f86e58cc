"""Megatron-Core's selective recompute by module (ParallelPlan.recompute_modules, costmodel.graph.selective): which
forward operators each module re-runs in backward and which activations it stops storing."""

from __future__ import annotations

import dataclasses

import pytest

from costmodel.core.kinds import Phase
from costmodel.core.specs.model import ModelSpec
from costmodel.core.specs.plan import RECOMPUTE_MODULES, ParallelPlan
from costmodel.graph.build import layer_operators
from costmodel.memory import per_gpu as mem


def dsv3(layers: int = 5) -> ModelSpec:
    """DeepSeek-V3's widths (config.json of deepseek-ai/DeepSeek-V3), fewer layers, first 3 dense: MLA, shared
    expert, dense and MoE layers."""
    return ModelSpec(name="dsv3-like", num_layers=layers, hidden_size=7168, num_heads=128, num_kv_heads=128,
                     ffn_hidden_size=18432, vocab_size=129280, head_dim=192, activation="swiglu", norm="rmsnorm",
                     num_experts=256, experts_per_token=8, moe_ffn_hidden_size=2048, num_shared_experts=1,
                     first_dense_layers=3, router="sigmoid", q_lora_rank=1536, kv_lora_rank=512,
                     qk_rope_head_dim=64, v_head_dim=128)


def llama() -> ModelSpec:
    return ModelSpec(name="llama-like", num_layers=4, hidden_size=4096, num_heads=32, num_kv_heads=8,
                     ffn_hidden_size=14336, vocab_size=32000, activation="swiglu", norm="rmsnorm")


def plan(modules=(), *, tp=2, ep=8, overlap=False, **kw) -> ParallelPlan:
    return ParallelPlan(gpus=64, gpus_per_node=8, gbs=64, seq_len=4096, tp=tp, ep=ep,
                        recompute_modules=tuple(modules), moe_overlap_comm=overlap, **kw)


def recomputed(ops) -> list[str]:
    return sorted(o.name for o in ops if o.phase is Phase.RECOMPUTE)


def layer(model, p, moe):
    return layer_operators(model, p, moe=moe)


@pytest.mark.parametrize("moe", [False, True])
def test_empty_and_core_attn_only_are_todays_selective(moe):
    m = dsv3()
    base = layer(m, plan(), moe)
    assert layer(m, plan(["core_attn"]), moe) == base
    assert not recomputed(base[0])


def test_each_module_reruns_its_forward_operators():
    m = dsv3()
    ln = recomputed(layer(m, plan(["layernorm"]), True)[0])
    assert ln == ["attn_norm", "mlp_norm"]                       # MLA input norm, MoE pre-MLP norm
    assert recomputed(layer(m, plan(["layernorm"]), False)[0]) == ["attn_norm"]  # dense MLP norm fused (TE)
    assert recomputed(layer(llama(), plan(["layernorm"], ep=1), False)[0]) == []   # both fused
    act = recomputed(layer(m, plan(["moe_act"]), True)[0])
    assert act == ["moe.expert.act"]
    sh = recomputed(layer(m, plan(["shared_experts"]), True)[0])
    assert sh == sorted(["moe.shared.up", "moe.shared.act", "moe.shared.down", "tp.moe_shared_up.allgather",
                         "tp.moe_shared_down.reducescatter"])
    up = recomputed(layer(m, plan(["mla_up_proj"]), False)[0])
    assert up == ["mla.kv_up", "mla.q_up", "mla.rope"]
    mlp = recomputed(layer(m, plan(["mlp"]), False)[0])
    assert mlp == sorted(["mlp_norm", "mlp_up", "act.swiglu", "mlp_down", "tp.mlp_up.allgather",
                          "tp.mlp_down.reducescatter"])
    assert recomputed(layer(m, plan(["mlp"]), True)[0]) == []    # "mlp" skips MoE layers (transformer_layer.py)


def test_moe_module_reruns_the_whole_block_with_its_all_to_alls():
    m = dsv3()
    ops, _ = layer(m, plan(["moe"]), True)
    names = recomputed(ops)
    fwd_block = sorted(o.name for o in ops if o.phase is Phase.FWD and (o.name.startswith("moe.")
                                                                          or o.name.startswith("tp.moe_shared_")))
    assert names == fwd_block
    assert names.count("moe.dispatch") == 1 and names.count("moe.combine") == 1
    # with the EP overlap the re-run all-to-alls join the overlapped list, as with full recompute
    _, over = layer(m, plan(["moe"], overlap=True), True)
    _, over0 = layer(m, plan(overlap=True), True)
    assert {o.name for o in over} - {o.name for o in over0} == {
        "moe.dispatch.recompute", "moe.combine.recompute",                              # EP all-to-alls
        "moe.dispatch.etp_allgather.recompute", "moe.combine.etp_reducescatter.recompute"}  # ETP = TP = 2
    # modules overlapping the whole block add nothing twice
    assert recomputed(layer(m, plan(["moe", "moe_act", "shared_experts"]), True)[0]) == names


def test_unfused_attention_core_is_recomputed_only_with_core_attn():
    m = llama()
    core = recomputed(layer(m, plan(["core_attn"], ep=1, attention="unfused"), False)[0])
    assert "attention.scores" in core
    assert recomputed(layer(m, plan(["layernorm"], ep=1, attention="unfused"), False)[0]) == []


def _act(m, p, moe):
    return mem._layer_activation_bytes(m, p, "selective", True, moe=moe)


def test_each_module_stops_storing_its_activations():
    m = dsv3()
    tokens, eb = 4096, 2

    def cut(module, moe):  # with core_attn, as Megatron's default list, so only the module's terms move
        return (_act(m, plan(moe_imbalance=1.0), moe)
                - _act(m, plan([module, "core_attn"], moe_imbalance=1.0), moe))

    norm_out = eb * tokens * 7168 / 2                                    # one [s, b, h] / TP (SP)
    assert cut("layernorm", True) == pytest.approx(2 * norm_out)         # MLA input norm + MoE pre-MLP norm
    assert cut("layernorm", False) == pytest.approx(norm_out)
    received = tokens / 2 * 8 * 2                                        # T/TP x k x ETP(=TP)
    assert cut("moe_act", True) == pytest.approx(eb * received * 2048 / 2)
    assert cut("shared_experts", True) == pytest.approx(eb * tokens * 2048 / 2 * 3)
    assert cut("moe", True) == pytest.approx(mem.moe_mlp_activation_bytes(m, plan(moe_imbalance=1.0), tokens, eb))
    assert cut("mlp", False) == pytest.approx(eb * tokens * (2 * 18432 / 2 + 18432 / 2) + norm_out)
    assert cut("mla_up_proj", False) == pytest.approx(eb * tokens * 64 * (2 * 192 + 128))
    # without core_attn the attention core keeps its fp32 log-sum-exp, as recompute='none'
    lse = mem.BYTES_LSE * 64 * tokens
    assert _act(m, plan(["moe"]), True) - _act(m, plan(["moe", "core_attn"]), True) == pytest.approx(lse)


def test_stage_memory_drops_and_working_layer_is_counted():
    m = dsv3(8)
    p0 = plan(pp=2).validate(m)
    p1 = dataclasses.replace(p0, recompute_modules=("moe",))
    a0 = [t[3] for t in mem._stage_terms(m, p0, True)]
    a1 = [t[3] for t in mem._stage_terms(m, p1, True)]
    assert all(x < y for x, y in zip(a1, a0))
    # "mlp" cuts only dense layers: the second stage (MoE layers 4..7) stores and re-materialises as before
    a2 = [t[3] for t in mem._stage_terms(m, dataclasses.replace(p0, recompute_modules=("mlp", "core_attn")), True)]
    assert a2[0] < a0[0] and a2[1] == a0[1]


def test_validation_of_the_field():
    assert RECOMPUTE_MODULES == ("core_attn", "moe_act", "layernorm", "mla_up_proj", "mlp", "moe", "shared_experts")
    assert not plan(["moe", "layernorm"]).problems()
    assert "unknown: attn" in plan(["attn"]).problems()[0]
    assert "needs recompute=selective" in plan(["moe"], recompute="full").problems()[0]
    assert "per operator" in plan(["moe"], framework="torchtitan").problems()[0]
    assert plan(["moe"]).recompute_modules == ("moe",)


# ------------------------------------------------------------------------------ requests, CLI, export
def test_request_key_and_cli_flag_reach_the_plan_and_its_json():
    import json

    from typer.testing import CliRunner

    from costmodel.core.errors import PlannerError
    from planner.cli import app
    from planner.requests import PlanRequest

    req = PlanRequest.from_dict({"model": "mixtral-8x7b", "gpu": "h100-sxm", "gpus": 64, "pp": 4, "ep": 8,
                                 "recompute_modules": ["moe_act", "layernorm"]})
    assert req.recompute_modules == ("moe_act", "layernorm")
    assert PlanRequest.from_dict({"model": "m", "gpu": "g", "gpus": 8, "recompute_modules": "moe, mlp"}
                                 ).recompute_modules == ("moe", "mlp")
    with pytest.raises(PlannerError, match="unknown attn"):
        PlanRequest.from_dict({"model": "m", "gpu": "g", "gpus": 8, "recompute_modules": ["attn"]})
    with pytest.raises(PlannerError, match="needs recompute=selective"):
        PlanRequest.from_dict({"model": "m", "gpu": "g", "gpus": 8, "recompute": "full", "recompute_modules": "moe"})
    base = "predict --model mixtral-8x7b --gpu h100-sxm --gpus 64 --pp 4 --ep 8 --format json"
    r0 = CliRunner().invoke(app, base.split())
    r1 = CliRunner().invoke(app, base.split() + ["--recompute-modules", "moe"])
    assert r0.exit_code == 0 and r1.exit_code == 0, r1.output
    j0, j1 = json.loads(r0.output), json.loads(r1.output)
    assert "recompute_modules" not in j0["plan"] and j1["plan"]["recompute_modules"] == ["moe"]
    assert j1["iteration_time_s"] > j0["iteration_time_s"]          # the MoE block runs twice forward
    bad = CliRunner().invoke(app, base.split() + ["--recompute-modules", "moe", "--recompute", "full"])
    assert bad.exit_code == 2 and "needs recompute=selective" in bad.output


def test_megatron_and_nemo_exports_carry_the_modules():
    from costmodel.core.specs.catalogue import load_catalogue
    from planner.export import export_plan, nemo_config
    from tests.helpers import hf_model, parse_megatron, plan

    HW = load_catalogue().resolve("a100-80gb")
    model = hf_model("deepseek-v3")
    p = plan(gpus=64, tp=1, pp=1, ep=64, moe_imbalance=1.0, recompute_modules=("moe_act", "layernorm"))
    a = parse_megatron(export_plan(model, p, HW, None, "megatron"))
    assert a.recompute_granularity == "selective" and a.recompute_modules == ["moe_act", "layernorm"]
    d = parse_megatron(export_plan(model, dataclasses.replace(p, recompute_modules=()), HW, None, "megatron"))
    assert d.recompute_granularity == "selective" and d.recompute_modules is None
    assert nemo_config(model, p)[0]["model"]["recompute_modules"] == ["moe_act", "layernorm"]
    assert "recompute_modules" not in nemo_config(model, dataclasses.replace(p, recompute_modules=()))[0]["model"]


def test_export_cli_flag_writes_the_megatron_flag():
    from typer.testing import CliRunner

    from planner.cli import app

    cmd = "export --model mixtral-8x7b --gpu h100-sxm --gpus 64 --pp 4 --ep 8 --to megatron".split()
    r = CliRunner().invoke(app, cmd + ["--recompute-modules", "moe_act,layernorm"])
    assert r.exit_code == 0, r.output
    assert "--recompute-modules moe_act layernorm" in r.output
    assert "--recompute-modules" not in CliRunner().invoke(app, cmd).output



# ---------------------------------------------------------------------- hardware FLOPs of the re-run modules
@pytest.mark.parametrize("modules, moe", [(["moe"], True), (["shared_experts"], True),
                                          (["moe", "shared_experts"], True), (["mla_up_proj"], False),
                                          (["mlp"], False), (["mlp"], True)])
def test_hfu_counts_the_gemms_each_module_reruns(modules, moe):
    """The closed-form FLOPs the modules add per token and layer equal the GEMM FLOPs of the layer's RECOMPUTE
    operators in the graph (one rank holding the whole layer: TP 1, EP 1); element-wise kernels are not counted."""
    from costmodel.schedule.flops import recomputed_module_flops_per_token

    m = dataclasses.replace(dsv3(), num_layers=2, first_dense_layers=1)    # layer 0 dense, layer 1 MoE
    p = plan(modules, tp=1, ep=1)
    ops, _ = layer(m, p, moe)
    graph = sum(o.flops * o.count for o in ops if o.phase is Phase.RECOMPUTE and o.kind == "gemm")
    one_kind = dataclasses.replace(m, num_layers=1, first_dense_layers=0) if moe else \
        dataclasses.replace(m, num_experts=0, experts_per_token=0, moe_ffn_hidden_size=0, num_shared_experts=0,
                            first_dense_layers=0, num_layers=1)
    assert graph / (p.mbs * p.seq_len) == recomputed_module_flops_per_token(one_kind, tuple(modules))


def test_moe_module_recompute_raises_hfu_not_mfu():
    """--recompute-modules moe re-runs the MoE block's forward in backward: hardware FLOPs grow by exactly those
    GEMMs (router, top-k experts, shared expert) on every MoE layer; model FLOPs (MFU) do not move; core_attn
    alone (today's selective) adds nothing."""
    from costmodel.core.specs.catalogue import load_catalogue
    from costmodel.schedule.compose import metrics
    from costmodel.schedule.flops import recomputed_module_flops_per_token

    m, hw = dsv3(), load_catalogue().resolve("h100-sxm")
    base, moe, attn = (metrics(m, plan(mods), hw, 10.0) for mods in ((), ("moe",), ("core_attn",)))
    assert moe.hardware_tflops_per_gpu > base.hardware_tflops_per_gpu and moe.mfu == base.mfu
    assert moe.model_tflops_per_gpu == base.model_tflops_per_gpu
    p = plan(("moe",))
    extra = recomputed_module_flops_per_token(m, ("moe",)) * p.tokens_per_iteration / (10.0 * p.gpus) / 1e12
    assert extra > 0 and moe.hardware_tflops_per_gpu - base.hardware_tflops_per_gpu == pytest.approx(extra)
    assert attn.hardware_tflops_per_gpu == base.hardware_tflops_per_gpu
