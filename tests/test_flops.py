from dataclasses import replace

import pytest

from costmodel.core.specs.presets import get_preset, preset_names
from costmodel.schedule.flops import (
    CAUSAL_FRACTION,
    attended_keys,
    forward_flops_per_token_layer,
    hardware_flops_per_iteration,
    layer_forward_flops,
    layerwise,
    model_flops_per_iteration,
    narayanan_eq3,
    published_flops_per_iteration,
)
from tests.helpers import gpt, llama


@pytest.mark.parametrize("layers,hidden,heads,batch",
                         [(96, 12288, 96, 1536), (24, 2304, 24, 512), (40, 6144, 48, 1024)])
def test_published_full_recompute_matches_narayanan_eq3(layers, hidden, heads, batch):
    m = gpt(layers=layers, hidden=hidden, heads=heads, vocab=51200)
    got = published_flops_per_iteration(m, batch, 2048, "full")
    assert got == pytest.approx(narayanan_eq3(batch, 2048, layers, hidden, 51200), rel=1e-12)


def test_model_flops_close_to_6N_tokens():
    # 6 * N * tokens (Kaplan et al. 2020) ignores attention and counts embedding parameters, so the two
    # agree to within those terms; planner's attention term is causal (half of the s x s matrix).
    m = llama(layers=80, hidden=8192, heads=64, kv=8, ffn=28672, vocab=32000, seq=4096)
    tokens = 1024 * 4096
    six_n = 6 * m.non_embedding_params() * tokens
    got = model_flops_per_iteration(m, 1024, 4096)
    head = 6 * m.hidden_size * m.vocab_size * tokens
    attn = 3 * 4 * 4096 * m.q_dim * CAUSAL_FRACTION * m.num_layers * tokens
    # differences are only norm parameters (tiny): dense GEMM FLOPs = 6 * matrix params * tokens
    assert got - head - attn == pytest.approx(six_n, rel=1e-3)


def test_causal_model_flops_are_published_minus_half_the_attention():
    m = llama(seq=8192)
    full = published_flops_per_iteration(m, 8, 8192, "none")
    attn_full = 3 * 4 * 8192 * m.q_dim * m.num_layers * 8 * 8192
    assert model_flops_per_iteration(m, 8, 8192) == pytest.approx(full - attn_full / 2, rel=1e-12)


def test_recompute_ordering():
    m = llama()
    hw = [hardware_flops_per_iteration(m, 64, 4096, r) for r in ("none", "selective", "full")]
    # selective recomputation re-runs the attention core, which the FlashAttention backward already does
    assert hw[0] == hw[1] < hw[2]
    assert model_flops_per_iteration(m, 64, 4096) < hw[0]
    pub = [published_flops_per_iteration(m, 64, 4096, r) for r in ("none", "selective", "full")]
    assert pub[0] < pub[1] < pub[2]


# ---- MoE, MLA and sliding-window conventions (issue #17; costmodel/schedule/flops.py module docstring)

MOE_PRESETS = ["mixtral-8x7b", "mixtral-8x22b", "qwen3-30b-a3b", "qwen3-235b-a22b", "deepseek-v3", "gpt-oss-20b",
               "gpt-oss-120b"]


def _active_matrix_params(m, i):
    """Weights of layer i a token multiplies with: active params minus norms, MLA latent norms and biases."""
    n = m.active_layer_params(i) - m.norm_params() - (m.q_lora_rank + m.kv_lora_rank)
    if m.linear_bias:  # gpt-oss: biases on QKV/output and on each active expert (2F + h)
        n -= m.q_dim + 2 * m.kv_dim + m.hidden_size
        experts = m.experts_per_token if m.is_moe_layer(i) else 0
        width = m.expert_ffn if m.is_moe_layer(i) else m.ffn_hidden_size
        n -= max(experts, 1) * (2 * width + m.hidden_size)
    if m.attention_sinks:
        n -= m.num_heads
    return n


def test_dense_presets_keep_the_closed_form():
    # every dense preset takes the unchanged code path, and the per-layer sums agree with it (a sliding window on
    # some layers, Gemma 2's, takes the per-layer sums)
    for name in preset_names():
        m = get_preset(name)
        if m.is_moe or m.sliding_window:
            assert layerwise(m), name
            continue
        assert not layerwise(m), name
        dense, attn = forward_flops_per_token_layer(m, 4096)
        g, a = layer_forward_flops(m, 4096, 0)
        assert (g, a) == pytest.approx((dense, attn), rel=1e-12), name


@pytest.mark.parametrize("name", MOE_PRESETS)
def test_moe_gemm_flops_are_twice_the_active_parameters(name):
    m = get_preset(name)
    assert layerwise(m)
    for i in range(m.num_layers):
        gemm, _ = layer_forward_flops(m, 4096, i)
        assert gemm == 2 * _active_matrix_params(m, i), (name, i)


def test_moe_model_flops_are_6_n_active_tokens_plus_attention_and_head():
    m = get_preset("mixtral-8x7b")
    tokens = 256 * 4096
    n_active = m.active_params() - m.embedding_params() - m.head_params() - m.num_layers * m.norm_params()
    attn = 3 * m.num_layers * 2 * (4096 / 2) * m.num_heads * 2 * m.head_dim * tokens
    head = 6 * m.hidden_size * m.vocab_size * tokens
    assert model_flops_per_iteration(m, 256, 4096) == pytest.approx(6 * n_active * tokens + attn + head, rel=1e-12)
    # a token's FLOPs do not grow with experts it is not routed to: only the router GEMM (h x E) does
    twice = replace(m, num_experts=16)
    diff = model_flops_per_iteration(twice, 256, 4096) - model_flops_per_iteration(m, 256, 4096)
    assert diff == pytest.approx(6 * m.num_layers * m.hidden_size * 8 * tokens, rel=1e-9)


def test_deepseek_v3_dense_layers_shared_expert_and_mla_core():
    m = get_preset("deepseek-v3")
    h, s = 7168, 4096
    attn_w = (h * 1536 + 1536 * 128 * 192) + (h * (512 + 64) + 512 * 128 * (128 + 128)) + 128 * 128 * h
    g0, a0 = layer_forward_flops(m, s, 0)
    g3, a3 = layer_forward_flops(m, s, 3)
    assert g0 == 2 * (attn_w + 3 * h * 18432)                                  # first_dense_layers: dense MLP
    assert g3 == 2 * (attn_w + h * 256 + 3 * h * 2048 * (8 + 1))                # router + top-8 + 1 shared
    assert a0 == a3 == 2 * (s / 2) * 128 * (192 + 128)                          # QK^T over 192, PV over 128


def test_sliding_window_core_counts_the_band():
    m = get_preset("gpt-oss-120b")
    s = 4096
    assert attended_keys(m, s, 0) == 128 - 128 * 128 / (2 * s)                 # sliding layer
    assert attended_keys(m, s, 1) == s / 2                                      # full causal layer
    assert attended_keys(m, 64, 0) == 32 == attended_keys(m, 64, 1)              # window >= s: plain causal
    assert attended_keys(m, s, 0, causal=False) == 128                          # published convention: the band
    _, a0 = layer_forward_flops(m, s, 0)
    _, a1 = layer_forward_flops(m, s, 1)
    assert a0 < a1 / 10


@pytest.mark.parametrize("name", MOE_PRESETS)
def test_moe_hardware_flops_bound_model_flops(name):
    m = get_preset(name)
    hw = [hardware_flops_per_iteration(m, 64, 4096, r) for r in ("none", "selective", "full")]
    assert model_flops_per_iteration(m, 64, 4096) < hw[0] == hw[1] < hw[2]
    pub = [published_flops_per_iteration(m, 64, 4096, r) for r in ("none", "selective", "full")]
    assert model_flops_per_iteration(m, 64, 4096) < pub[0] < pub[1] < pub[2]
