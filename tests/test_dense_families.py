"""Qwen3 (dense), Gemma 2 and Falcon: what their config.json states reaches the spec, and the operator graph costs
what changes (a parallel block: one residual add fewer, one or two input norms; Gemma 2: four norms per block,
final logit soft-capping as an element-wise pass, sliding windows on alternate layers; attention soft-capping is
said to be uncosted)."""

import dataclasses
from pathlib import Path

import pytest

from costmodel.core.errors import PlannerError
from costmodel.core.kinds import Phase
from costmodel.core.specs.catalogue import load_catalogue
from costmodel.core.specs.hf_config import from_hf_config
from costmodel.core.specs.plan import ParallelPlan
from costmodel.core.specs.presets import get_preset
from costmodel.graph.build import build_graph, layer_operators
from planner.prediction import predict

FIX = Path(__file__).parent / "fixtures" / "hf_configs"
HW = load_catalogue().resolve("h100-sxm")
PLAN = ParallelPlan(gpus=8, gpus_per_node=8, gbs=64, seq_len=4096, tp=2)


def _names(ops, phase=Phase.FWD):
    return [o.name for o in ops if o.phase is phase]


def test_parallel_block_has_one_residual_add_and_its_norms():
    f7, f40 = get_preset("falcon-7b"), get_preset("falcon-40b")
    plan = dataclasses.replace(PLAN, tp=1)  # Falcon-7B's 71 heads split over no TP
    sequential = dataclasses.replace(f7, parallel_attention=False, norms_per_layer=2)
    seq_ops, _ = layer_operators(sequential, plan)
    par7, _ = layer_operators(f7, plan)
    par40, _ = layer_operators(f40, plan)
    assert _names(seq_ops).count("residual_add") == 2 and _names(par7).count("residual_add") == 1
    assert "mlp_norm" in _names(seq_ops) and "mlp_norm" not in _names(par7) + _names(par7, Phase.BWD)
    assert _names(par40).count("residual_add") == 1 and "mlp_norm" in _names(par40)
    t_seq = predict(sequential, plan, HW).iteration_time_s
    t_par = predict(f7, plan, HW).iteration_time_s
    assert t_par < t_seq  # the same GEMMs, one norm and one residual add fewer per layer


def test_gemma2_norms_softcap_and_alternating_windows():
    g = from_hf_config(FIX / "gemma-2-9b.json")
    ops, _ = layer_operators(g, PLAN)
    fwd = _names(ops)
    assert {"attn_norm", "mlp_norm", "post_attn_norm", "post_mlp_norm"} <= set(fwd)
    assert g.norm_params() == 4 * g.hidden_size
    graph = build_graph(g, dataclasses.replace(PLAN, seq_len=8192))
    head = [o for o in graph.stages[-1].stage_ops if "logit_softcap" in o.name]
    assert {o.phase for o in head} == {Phase.FWD, Phase.BWD}
    capped = predict(g, PLAN, HW)
    plain = predict(dataclasses.replace(g, final_logit_softcap=0.0, attn_logit_softcap=0.0), PLAN, HW)
    assert capped.iteration_time_s > plain.iteration_time_s  # the logit pass over the vocabulary
    assert any("attention logit soft-capping (cap 50)" in w and "not costed" in w for w in capped.warnings)
    assert not any("soft-capping" in w for w in plain.warnings)
    # layer 0 slides (Gemma2DecoderLayer.is_sliding = not layer_idx % 2), layer 1 attends to everything
    assert g.uses_sliding_window(0) and not g.uses_sliding_window(1)


def test_qwen3_dense_and_falcon_kv_heads():
    q = from_hf_config(FIX / "qwen3-4b.json")
    assert not q.is_moe and q.extra["qk_norm"] is True and "unread_keys" not in q.extra
    f7 = from_hf_config(FIX / "falcon-7b-instruct.json")
    assert f7.num_kv_heads == 1  # multi_query wins over num_kv_heads 71 without new_decoder_architecture
    f40 = from_hf_config(FIX / "falcon-40b-instruct.json")
    assert f40.num_kv_heads == 8 and f40.norms_per_layer == 2
    rw = from_hf_config({"model_type": "falcon", "hidden_size": 64, "num_attention_heads": 4, "num_hidden_layers": 2,
                         "vocab_size": 100, "parallel_attn": False, "alibi": True, "multi_query": False})
    assert (rw.parallel_attention, rw.norms_per_layer, rw.position_embedding, rw.num_kv_heads) == (
        False, 2, "alibi", 4)


def test_new_fields_are_validated():
    with pytest.raises(PlannerError, match="norms_per_layer=3 must be 1, 2 or 4"):
        dataclasses.replace(get_preset("falcon-7b"), norms_per_layer=3)
    with pytest.raises(PlannerError, match="attn_logit_softcap=-1"):
        dataclasses.replace(get_preset("gemma-2-9b"), attn_logit_softcap=-1)
