"""Multi-token prediction (costmodel.memory.mtp, costmodel.graph.mtp_ops): the spec field from config.json, the last
stage's operators and weights, the FLOPs (planner's and Megatron's counter) and the memory term."""

import dataclasses

import pytest

from costmodel.core.specs.plan import ParallelPlan
from costmodel.core.specs.presets import resolve_model
from costmodel.graph.build import build_graph
from costmodel.memory.mtp import mtp_extra_params, mtp_params
from costmodel.memory.per_gpu import memory_per_gpu, stage_memory, stage_params
from costmodel.schedule.flops import model_flops_per_iteration, mtp_forward_flops
from planner.validation.moe_rows import megatron_flops

V3 = resolve_model("deepseek-v3")
NO_MTP = dataclasses.replace(V3, mtp_layers=0)


def _plan(**kw) -> ParallelPlan:
    args = dict(gpus=256, gpus_per_node=8, gbs=512, seq_len=4096, pp=8, ep=32,
                moe_imbalance=1.0)
    args.update(kw)
    return ParallelPlan(**args)


def test_deepseek_v3_has_one_mtp_depth_of_its_last_layer():
    """num_nextn_predict_layers = 1; the depth is an MoE block + eh_proj + 3 norms: the 14B module of the report."""
    assert V3.mtp_layers == 1 and NO_MTP.total_params() == V3.total_params()   # 671B leaves MTP out
    assert mtp_extra_params(V3) == 2 * 7168 * 7168 + 3 * 7168
    assert mtp_params(V3) == V3.layer_params(60) + mtp_extra_params(V3)
    assert 11.5e9 < mtp_params(V3) < 12.5e9        # + the 1.85B embedding and head copies: ~14B in the checkpoint


def test_last_stage_runs_the_mtp_block_and_holds_its_weights():
    plan = _plan()
    g, g0 = build_graph(V3, plan), build_graph(NO_MTP, plan)
    last, last0 = g.stages[-1], g0.stages[-1]
    mtp = [o for o in last.stage_ops if o.name.startswith("mtp.")]
    assert {"mtp.enorm", "mtp.hnorm", "mtp.eh_proj", "mtp.moe.expert.up", "mtp.lm_head", "mtp.cross_entropy",
            "mtp.embedding"} <= {o.name for o in mtp}
    assert not [o for o in g.stages[0].stage_ops if o.name.startswith("mtp.")]
    # the block is the decoder's MoE layer: the same operator keys (same costs)
    moe_keys = {o.key() for o in g0.stages[-1].layer_ops if o.name.startswith("moe.expert")}
    assert moe_keys and moe_keys <= {o.key() for o in mtp}
    # weights: the MTP depth and, with PP > 1, the embedding copy the last stage shares with the first
    assert last.params - last0.params == mtp_params(V3) + V3.vocab_size * V3.hidden_size
    assert last.expert_params - last0.expert_params == V3.num_experts * V3.expert_params()
    assert any(o.name == "pp.embedding_grad_allreduce" for o in last.iteration_ops)
    assert g.stages[1].stage_ops == g0.stages[1].stage_ops


def test_flops_count_mtp_as_megatron_does():
    """Planner's model FLOPs add one last-layer, the eh_proj and one more head per depth; Megatron's counter
    (training.py @d98e8a64) the same plus the norms' 3h, with its MTP layer of the last layer's kind."""
    gbs, s = 512, 4096
    extra = model_flops_per_iteration(V3, gbs, s) - model_flops_per_iteration(NO_MTP, gbs, s)
    gemm, attn = mtp_forward_flops(V3, s)
    assert extra == pytest.approx(3.0 * gbs * s * (gemm + attn))
    h, v = V3.hidden_size, V3.vocab_size
    assert gemm > 2.0 * h * v + 2.0 * 2 * h * h
    mtp_meg = megatron_flops(V3, gbs, s, causal=True) - megatron_flops(NO_MTP, gbs, s, causal=True)
    assert mtp_meg == pytest.approx(extra, rel=0.02)   # same terms but the router GEMM (planner) and norms (Megatron)


def test_memory_adds_the_mtp_weights_and_activations_on_the_last_stage():
    plan = _plan(layer_split=(8, 8, 8, 8, 8, 8, 8, 5))
    with_mtp, without = memory_per_gpu(V3, plan), memory_per_gpu(NO_MTP, plan)
    p1, p0 = stage_params(V3, plan), stage_params(NO_MTP, plan)
    assert p1[:-1] == p0[:-1] and p1[-1] > p0[-1]
    last, last0 = stage_memory(V3, plan)[-1], stage_memory(NO_MTP, plan)[-1]
    assert last.weights > last0.weights and last.activations > last0.activations
    assert with_mtp.total >= without.total
