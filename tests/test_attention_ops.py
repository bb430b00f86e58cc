"""MLA and sliding-window attention operators (costmodel/graph/attention_ops.py) against the math they model."""

from __future__ import annotations

import pytest

from costmodel.core.kinds import Phase
from costmodel.core.specs.model import ModelSpec
from costmodel.core.specs.plan import ParallelPlan
from costmodel.graph import attention_ops as ao
from costmodel.graph import build as graph


def dsv3_like(q_lora: int = 1536, layers: int = 4) -> ModelSpec:
    """DeepSeek-V3's attention and MoE widths (config.json of deepseek-ai/DeepSeek-V3), fewer layers."""
    return ModelSpec(name="dsv3-like", num_layers=layers, hidden_size=7168, num_heads=128, num_kv_heads=128,
                     ffn_hidden_size=18432, vocab_size=129280, head_dim=192, activation="swiglu", norm="rmsnorm",
                     num_experts=256, experts_per_token=8, moe_ffn_hidden_size=2048, num_shared_experts=1,
                     first_dense_layers=1, router="sigmoid", q_lora_rank=q_lora, kv_lora_rank=512,
                     qk_rope_head_dim=64, v_head_dim=128)


def llama() -> ModelSpec:
    return ModelSpec(name="llama-like", num_layers=4, hidden_size=4096, num_heads=32, num_kv_heads=8,
                     ffn_hidden_size=14336, vocab_size=128256, activation="swiglu", norm="rmsnorm")


def mkplan(tp=1, cp=1, sp=True, seq=4096, mbs=2, dtype="bf16", **kw) -> ParallelPlan:
    return ParallelPlan(gpus=tp * cp, gpus_per_node=8, gbs=mbs, seq_len=seq, tp=tp, cp=cp,
                        mbs=mbs, sequence_parallel=sp, dtype=dtype, **kw)


def fwd_gemm_flops(ops) -> float:
    return sum(o.flops * o.count for o in ops if o.kind == "gemm" and o.phase is Phase.FWD)


def test_mla_params_match_megatron_theoretical_memory_usage():
    # megatron/training/theoretical_memory_usage.py, multi_latent_attention branch (RMSNorm: norm_size = 1)
    m = dsv3_like()
    h, a, n, r, v = 7168, 128, 128, 64, 128
    q_term = 1536 * (h + a * (n + r) + 1)
    self_attn = q_term + 512 * (h + a * (n + v) + 1) + h * r + a * v * h
    assert m.attention_params() == self_attn


@pytest.mark.parametrize("q_lora", [1536, 0])
@pytest.mark.parametrize("tp,cp", [(1, 1), (8, 1), (4, 2)])
def test_mla_gemm_flops_are_two_flops_per_param_per_token(q_lora, tp, cp):
    m = dsv3_like(q_lora)
    p = mkplan(tp=tp, cp=cp)
    ops = ao.mla_attention_operators(m, p)
    tokens = p.mbs * p.seq_len // cp
    norm_weights = q_lora + m.kv_lora_rank
    # TP ranks together: the column/row-parallel GEMMs split the heads, the replicated down projections the
    # sequence (sequence parallelism)
    assert fwd_gemm_flops(ops) * tp == pytest.approx(2.0 * tokens * (m.attention_params() - norm_weights), rel=1e-12)
    bwd = sum(o.flops for o in ops if o.kind == "gemm" and o.phase is Phase.BWD)
    assert bwd == pytest.approx(2 * fwd_gemm_flops(ops), rel=1e-12)


def test_mla_down_projections_are_replicated_without_sp():
    m = dsv3_like()
    p = mkplan(tp=8, sp=False)
    ops = ao.mla_attention_operators(m, p)
    tokens = p.mbs * p.seq_len
    replicated = m.hidden_size * (m.q_lora_rank + m.kv_lora_rank + m.qk_rope_head_dim)
    split = m.attention_params() - m.q_lora_rank - m.kv_lora_rank - replicated
    assert fwd_gemm_flops(ops) == pytest.approx(2.0 * tokens * (split / 8 + replicated), rel=1e-12)
    down = [o for o in ops if o.name == "mla.kv_down" and o.phase is Phase.FWD][0]
    assert down.features == (tokens, m.kv_lora_rank + m.qk_rope_head_dim, m.hidden_size)


def test_mla_shapes_megatron_order():
    m = dsv3_like()
    p = mkplan(tp=8)
    ops = {o.name: o for o in ao.mla_attention_operators(m, p) if o.phase is Phase.FWD}
    t = p.mbs * p.seq_len
    assert ops["mla.q_down"].features == (t // 8, 1536, 7168)
    assert ops["mla.q_up"].features == (t, 16 * 192, 1536)
    assert ops["mla.kv_up"].features == (t, 16 * (128 + 128), 512)
    assert ops["mla.kv_norm"].features == (t // 8, 512, 1)
    assert ops["mla.rope"].features == (t, 17, 64)
    assert ops["attn_out"].features == (t, 7168, 16 * 128)
    core = ops["attention"]
    assert core.features == (2, 4096, 4096, 16, 16, 160, 1)
    # QK^T over 192-wide heads and PV over 128-wide heads, causal half of the s x s scores
    assert core.flops == pytest.approx(2 * 2 * 16 * 0.5 * 4096 * 4096 * (192 + 128))
    assert {o.kind for o in ao.mla_attention_operators(m, p)} <= {"gemm", "norm", "rope", "attention_fwd",
                                                                  "attention_bwd"}


def test_mla_tp_entry_bytes():
    m = dsv3_like()
    p = mkplan(tp=8)
    assert ao.mla_tp_entry_bytes(m, p) == 2 * 4096 * (1536 + 512 + 64) * 2
    assert ao.mla_tp_entry_bytes(dsv3_like(0), p) == 2 * 4096 * (7168 + 512 + 64) * 2
    assert ao.mla_replicated_params(m) == 7168 * (1536 + 512 + 64) + 1536 + 512
    assert ao.mla_replicated_params(llama()) == 0


@pytest.mark.parametrize("tp,cp,dtype", [(1, 1, "bf16"), (2, 2, "bf16"), (4, 1, "fp32")])
def test_core_norm_and_rope_are_the_dense_graph_records(tp, cp, dtype):
    # the dense block's attention core, norm and rope of graph.layer_operators, field for field
    m = llama()
    p = mkplan(tp=tp, cp=cp, dtype=dtype)
    ops, _ = graph.layer_operators(m, p)
    dense = [o for o in ops if o.kind in ("attention_fwd", "attention_bwd")]
    s = p.seq_len // cp
    mine = ao.attention_core_ops(p.mbs, s, p.seq_len, 32 // tp, max(1, 8 // tp), 128, dtype)
    assert mine == dense and [o.key() for o in mine] == [o.key() for o in dense]
    norm = [o for o in ops if o.name == "attn_norm"]
    sp_tokens = p.mbs * s // (tp if p.sp else 1)
    assert ao.norm_ops("attn_norm", sp_tokens, 4096, 1, dtype) == norm
    rope = [o for o in ops if o.kind == "rope"]
    assert ao.rope_ops("rope", p.mbs * s, 32 // tp + max(1, 8 // tp), 128, dtype) == rope


@pytest.mark.parametrize("window", [4096, 8192, 10**6])
def test_window_at_least_the_sequence_is_full_causal_attention(window):
    full = ao.attention_core_ops(2, 4096, 4096, 8, 2, 128, "bf16")
    assert ao.attention_core_ops(2, 4096, 4096, 8, 2, 128, "bf16", window=window) == full


def test_window_flops_count_the_band():
    b, s, heads, d, w = 1, 32768, 8, 64, 128
    fwd, bwd = ao.attention_core_ops(b, s, s, heads, heads, d, "bf16", window=w)
    # exact band: query p sees min(w, p + 1) keys; the convention takes w^2/2 for w(w-1)/2
    exact = sum(min(w, p + 1) for p in range(s))
    assert fwd.flops == pytest.approx(4.0 * b * heads * d * exact, rel=w / (2 * exact) + 1e-12)
    assert fwd.flops == pytest.approx(4.0 * b * s * w * heads * d, rel=w / (2 * s) + 1e-12)  # w << s: no halving
    # the kernel visits whole key tiles: a query tile of 128 rows needs w + 127 keys, 2 tiles of 128 for w = 128
    assert fwd.features == (b, s, 256, heads, heads, d, 0) and ao.band_keys(w, s) == 256
    assert ao.band_keys(4096, s) == 4224 and ao.band_keys(4096, 4200) == 4200 and ao.band_keys(1, s) == 128
    assert bwd.flops == pytest.approx(2.5 * fwd.flops) and bwd.features == fwd.features
    # continuous into full causal attention and increasing in the window
    near = ao.attention_core_ops(b, s, s, heads, heads, d, "bf16", window=s - 1)[0]
    full = ao.attention_core_ops(b, s, s, heads, heads, d, "bf16")[0]
    assert near.flops < full.flops and near.flops == pytest.approx(full.flops, rel=1e-4)
    flops = [ao.attention_core_ops(b, s, s, heads, heads, d, "bf16", window=x)[0].flops for x in (64, 512, 4096)]
    assert flops == sorted(flops)


def test_window_with_context_parallel_counts_local_queries():
    # a rank holding s = S / CP queries computes 1/CP of the band
    one = ao.attention_core_ops(1, 8192, 8192, 8, 8, 64, "bf16", window=1024)[0]
    two = ao.attention_core_ops(1, 4096, 8192, 8, 8, 64, "bf16", window=1024)[0]
    assert two.flops == pytest.approx(one.flops / 2)


def test_layer_window_follows_the_model():
    m = ModelSpec(name="oss-like", num_layers=4, hidden_size=2880, num_heads=64, num_kv_heads=8, head_dim=64,
                  ffn_hidden_size=2880, vocab_size=201088, activation="swiglu", norm="rmsnorm", sliding_window=128,
                  sliding_window_every=2)
    assert [ao.layer_window(m, i) for i in range(4)] == [128, 0, 128, 0]
    assert ao.layer_window(llama(), 0) == 0


def test_mla_core_takes_the_window():
    m = dsv3_like()
    p = mkplan(tp=1)
    core = [o for o in ao.mla_attention_operators(m, p, window=512) if o.kind == "attention_fwd"][0]
    assert core.features[2] == ao.band_keys(512, p.seq_len) == 640 and core.features[6] == 0
