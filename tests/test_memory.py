"""Tests of costmodel.memory.per_gpu against Korthikanti et al. 2022 and Megatron-LM's published rules."""

from __future__ import annotations

import math

import pytest

from costmodel.core.specs.hardware import GPUSpec
from costmodel.core.specs.model import ModelSpec
from costmodel.core.specs.plan import ParallelPlan
from costmodel.memory import moe_memory as mm
from costmodel.memory import per_gpu as mem

GIB = 2 ** 30


def gpt(name: str, layers: int, h: int, a: int, vocab: int = 51200) -> ModelSpec:
    """A GPT of Korthikanti et al. Table 3: MHA, ffn 4h, GeLU, LayerNorm, biases, dropout, tied."""
    return ModelSpec(name=name, num_layers=layers, hidden_size=h, num_heads=a, num_kv_heads=a,
                     ffn_hidden_size=4 * h, vocab_size=vocab, activation="gelu", norm="layernorm",
                     tied_embeddings=True, position_embedding="learned", linear_bias=True, dropout=True)


def llama(layers: int = 32, h: int = 4096, a: int = 32, kv: int = 8, f: int = 14336,
          vocab: int = 128256, tied: bool = False) -> ModelSpec:
    """A Llama-3-8B-shaped model (GQA, SwiGLU, RMSNorm, RoPE, no bias, no dropout)."""
    return ModelSpec(name="llama-like", num_layers=layers, hidden_size=h, num_heads=a, num_kv_heads=kv,
                     ffn_hidden_size=f, vocab_size=vocab, activation="swiglu", norm="rmsnorm",
                     tied_embeddings=tied, position_embedding="rope")


def plan(model: ModelSpec | None = None, *, tp=1, pp=1, cp=1, dp=1, vpp=1, mbs=1, m=None, seq=2048,
         recompute="selective", sp=True, zero=1, layer_split=None) -> ParallelPlan:
    m = pp if m is None else m
    p = ParallelPlan(gpus=tp * pp * cp * dp, gpus_per_node=8, gbs=mbs * dp * m,
                     seq_len=seq, tp=tp, pp=pp, cp=cp, vpp=vpp, mbs=mbs, recompute=recompute,
                     sequence_parallel=sp, zero=zero, layer_split=layer_split)
    if model is not None:
        p.validate(model)
    return p


# ---------------------------------------------------------------- Korthikanti et al. Table 2
S, B, H, A, T = 2048, 1, 12288, 96, 8
GPT175 = gpt("gpt3-175b", 96, H, A)
SBH = S * B * H


@pytest.mark.parametrize("tp,sp,recompute,expected", [
    (1, False, "none", SBH * (34 + 5 * A * S / H)),                       # no parallelism
    (T, False, "none", SBH * (10 + 24 / T + 5 * A * S / (H * T))),        # tensor parallel
    (T, True, "none", SBH * (34 / T + 5 * A * S / (H * T))),              # tensor + sequence parallel
    (T, False, "selective", SBH * (10 + 24 / T)),                         # TP + selective recompute
    (T, True, "selective", SBH * 34 / T),                                 # TP + SP + selective recompute
    (T, False, "full", SBH * 2),                                          # full recompute
    (T, True, "full", SBH * 2 / T),                                       # Megatron keeps the input SP-sharded
])
def test_korthikanti_table2_rows(tp, sp, recompute, expected):
    p = plan(GPT175, tp=tp, pp=1, sp=sp, recompute=recompute, seq=S, mbs=B)
    got = mem.activation_bytes_per_layer(GPT175, p, flash_attention=False)
    assert got == pytest.approx(expected, rel=1e-12)


def test_flash_attention_removes_s2_terms_and_keeps_lse():
    p_none = plan(GPT175, tp=T, recompute="none")
    p_sel = plan(GPT175, tp=T, recompute="selective")
    flash_none = mem.activation_bytes_per_layer(GPT175, p_none, flash_attention=True)
    sel = mem.activation_bytes_per_layer(GPT175, p_sel)
    assert sel == pytest.approx(SBH * 34 / T)
    assert flash_none - sel == pytest.approx(4 * (A / T) * S * B)  # fp32 log-sum-exp per head and token
    assert flash_none < mem.activation_bytes_per_layer(GPT175, p_none, flash_attention=False)


def test_no_dropout_drops_masks():
    nodrop = ModelSpec(**{**GPT175.__dict__, "dropout": False, "extra": {}})
    p = plan(nodrop, tp=T, sp=False, recompute="none")
    got = mem.activation_bytes_per_layer(nodrop, p, flash_attention=False)
    # 34 -> 32 (two sbh masks gone) and 5as/h -> 2as/h (softmax output only).
    assert got == pytest.approx(SBH * (8 + 24 / T + 2 * A * S / (H * T)))


def test_gqa_and_swiglu_terms():
    m = llama()
    p = plan(m, tp=4, sp=True)
    h, q, kv, f, t = 4096, 4096, 8 * 128, 14336, 4
    expected = S * (8 * h / t + 2 * (q + 2 * kv + q) / t + 2 * (2 * f + f) / t)
    assert mem.activation_bytes_per_layer(m, p) == pytest.approx(expected)
    # TP larger than the KV heads: one KV head replicated per rank.
    p16 = plan(m, tp=16, sp=True)
    t = 16
    expected16 = S * (8 * h / t + 2 * (q / t + 2 * 128 + q / t) + 2 * (2 * f + f) / t)
    assert mem.activation_bytes_per_layer(m, p16) == pytest.approx(expected16)


# ---------------------------------------------------------------- Korthikanti et al. Figure 1 / 7
# Figure 1 values (GiB per GPU) as transcribed by Calculon, calculon-ai/calculon
# calculon/llm/validation.py (seqsel_fig1); layouts from Korthikanti Table 3 and Calculon's
# validation/seqsel/fig1/*.json (t=8, b=1 except 22B b=4, interleaving 3 for 175B and 530B).
FIG1 = {
    # name: (layers, h, a, tp, pp, vpp, mbs, gbs, {mode: (par_opt, act)})
    "megatron-22B": (48, 6144, 64, 8, 1, 1, 4, 4, {"none": (45.5625, 59.25), "seqsel": (45.5625, 9.5625)}),
    "gpt3-175B": (96, 12288, 96, 8, 8, 3, 1, 64, {"none": (45.5625, 66.84375), "seqsel": (45.5625, 12.3515625)}),
    "turing-530B": (105, 20480, 128, 8, 35, 3, 1, 280,
                    {"none": (31.640625, 114.0234375), "seqsel": (31.640625, 23.076171875)}),
    "megatron-1T": (128, 25600, 160, 8, 64, 1, 1, 512, {"none": (32.958984375, 131.25),
                                                        "seqsel": (32.958984375, 26.5625)}),
}


def _fig1_case(name, mode):
    layers, h, a, tp, pp, vpp, mbs, gbs, vals = FIG1[name]
    model = gpt(name, layers, h, a)
    p = ParallelPlan(gpus=tp * pp, gpus_per_node=8, gbs=gbs, seq_len=2048, tp=tp, pp=pp,
                     vpp=vpp, mbs=mbs, recompute="none" if mode == "none" else "selective",
                     sequence_parallel=(mode == "seqsel"), zero=0).validate(model)
    return model, p, vals[mode]


@pytest.mark.parametrize("name", list(FIG1))
@pytest.mark.parametrize("mode", ["none", "seqsel"])
def test_korthikanti_figure1_activations(name, mode):
    model, p, (_, act_gib) = _fig1_case(name, mode)
    st0 = mem.stage_memory(model, p, flash_attention=False)[0]
    layers0 = p.stage_layers(model.num_layers)[0]
    per_layer = mem.activation_bytes_per_layer(model, p, flash_attention=False)
    # Figure 1 counts the transformer layers of the first stage only: exact match.
    assert layers0 * per_layer * st0.inflight_microbatches == pytest.approx(act_gib * GIB, rel=1e-9)
    # Our total adds the Sec. 4.3 embedding (and, with PP=1, head) terms on top.
    extra = mem.first_stage_extra_bytes(model, p) * st0.inflight_microbatches
    if p.pp == 1:
        extra += mem.last_stage_extra_bytes(model, p)
    assert st0.activations == pytest.approx(act_gib * GIB + extra, rel=1e-9)
    assert st0.activations <= act_gib * GIB * 1.03


@pytest.mark.parametrize("name", list(FIG1))
def test_korthikanti_figure1_params_and_optimizer(name):
    model, p, (par_opt_gib, _) = _fig1_case(name, "seqsel")
    stages = mem.stage_memory(model, p)
    # Figure 1 counts 12 L h^2 weights at 18 bytes (no embedding, biases or norms). A middle stage has
    # no embedding, so only biases and norms (~13h per layer) differ; with PP=1 the embedding is there.
    st = stages[len(stages) // 2] if p.pp > 2 else stages[0]
    ours = (st.weights + st.gradients + st.optimizer) / GIB
    tol = 2e-3 if p.pp > 2 else 2e-2
    assert ours == pytest.approx(par_opt_gib, rel=tol)


# Figure 7: activation memory relative to TP-only without recompute (percent), as transcribed in
# calculon/llm/validation.py (seqsel_fig7). Per-layer formulas match within 0.2 percentage points.
FIG7 = {
    "megatron-22B": {"seq": 66.84, "sel": 49.42, "seqsel": 16.18, "full": 7.64},
    "gpt3-175B": {"seq": 62.04, "sel": 56.53, "seqsel": 18.49, "full": 8.71},
    "turing-530B": {"seq": 58.31, "sel": 62.04, "seqsel": 20.27, "full": 9.42},
    "megatron-1T": {"seq": 58.31, "sel": 62.04, "seqsel": 20.27, "full": 9.42},
}
FIG7_MODES = {"seq": ("none", True), "sel": ("selective", False), "seqsel": ("selective", True),
              "full": ("full", False)}


@pytest.mark.parametrize("name", list(FIG7))
def test_korthikanti_figure7_ratios(name):
    layers, h, a, tp, pp, vpp, mbs, gbs, _ = FIG1[name]
    model = gpt(name, layers, h, a)

    def per_layer(recompute, sp):
        p = plan(model, tp=tp, pp=pp, vpp=vpp, mbs=mbs, m=gbs // mbs, recompute=recompute, sp=sp, zero=0)
        return mem.activation_bytes_per_layer(model, p, flash_attention=False)

    base = per_layer("none", False)
    for mode, ref in FIG7[name].items():
        assert 100 * per_layer(*FIG7_MODES[mode]) / base == pytest.approx(ref, abs=0.2), mode


# ---------------------------------------------------------------- Megatron-LM rules
@pytest.mark.parametrize("dp", [1, 2, 8, 64])
def test_megatron_bytes_per_parameter(dp):
    m = llama(layers=8)
    for zero, expected in ((0, 18.0), (1, 6.0 + 12.0 / dp)):
        p = plan(m, tp=1, pp=1, dp=dp, zero=zero)
        b = mem.memory_per_gpu(m, p)
        params = mem.stage_params(m, p)[0]
        assert (b.weights + b.gradients + b.optimizer) / params == pytest.approx(expected, rel=1e-12)


def _megatron_weight_and_optimizer_bytes(model, tp, pp, dp, distributed_optimizer):
    """Transcription of compute_weight_and_optimizer_memory in Megatron-LM
    megatron/training/theoretical_memory_usage.py (dense, no MTP, GQA, untied)."""
    h, a, g = model.hidden_size, model.num_heads, model.num_kv_heads
    norm_size = 1 if model.norm == "rmsnorm" else 2
    gated = 3 / 2 if model.gated else 1
    self_attn = 2 * h * h * ((1 + g / a) * (model.q_dim / h))
    layer = 2 * h * (model.ffn_hidden_size * gated + norm_size) + self_attn
    embedding = h * mem.padded_vocab(model, tp)
    block = layer * model.num_layers + norm_size * h
    shard = (block / pp + embedding) / tp
    if not model.tied_embeddings and pp == 1:
        shard += embedding / tp
    per_param = 18 if not distributed_optimizer else 6 + 12 / dp
    return shard * per_param


@pytest.mark.parametrize("zero", [0, 1])
def test_matches_megatron_theoretical_weight_memory(zero):
    m = llama()
    p = plan(m, tp=1, pp=1, dp=8, zero=zero)
    b = mem.memory_per_gpu(m, p)
    ref = _megatron_weight_and_optimizer_bytes(m, 1, 1, 8, zero == 1)
    assert b.weights + b.gradients + b.optimizer == pytest.approx(ref, rel=1e-12)
    # With TP Megatron also divides the (replicated) norms by t: agreement to 5e-4.
    p8 = plan(m, tp=8, pp=1, dp=8, zero=zero)
    b8 = mem.memory_per_gpu(m, p8)
    ref8 = _megatron_weight_and_optimizer_bytes(m, 8, 1, 8, zero == 1)
    assert b8.weights + b8.gradients + b8.optimizer == pytest.approx(ref8, rel=5e-4)


def _megatron_activation_bytes(model, p):
    """Transcription of compute_activation_memory (SP + selective) in Megatron-LM
    megatron/training/theoretical_memory_usage.py."""
    s, b, h, t, pp = p.seq_len, p.mbs, model.hidden_size, p.tp, p.pp
    act = s * b * h * (18 + 4 * model.ffn_hidden_size / h) * model.num_layers
    act += 8 * s * b * pp + s * b * h * pp
    if p.vpp > 1:
        act *= 1 + (pp - 1) / (pp * p.vpp)
    elif pp > 1:
        act *= min(1, p.num_microbatches / pp)
    if pp == 1:
        act += s * b * h * 4 * (1 + mem.padded_vocab(model, t) / h)
    return act / t


@pytest.mark.parametrize("tp,pp,vpp,m", [(1, 1, 1, 4), (1, 4, 1, 8), (1, 4, 1, 2), (1, 4, 2, 8),
                                          (8, 1, 1, 4), (8, 4, 1, 8), (8, 4, 3, 8)])
def test_matches_megatron_theoretical_activation_memory(tp, pp, vpp, m):
    model = gpt("gpt-2.7b-like", 24 if vpp != 3 else 48, 2560, 32)
    p = plan(model, tp=tp, pp=pp, vpp=vpp, m=m, mbs=2, recompute="selective", sp=True)
    st0 = mem.stage_memory(model, p)[0]
    ref = _megatron_activation_bytes(model, p)
    # Exact at t=1; with TP Megatron also divides the int64 token ids by t (8sb vs 8sb/t).
    assert st0.activations == pytest.approx(ref, rel=1e-12 if tp == 1 else 1e-3)


def test_stage_params_consistent_with_modelspec():
    for m in (llama(), gpt("g", 24, 2048, 16), llama(tied=True)):
        assert mem.layer_params_per_gpu(m, 1) == m.params_per_layer()
        p = plan(m, tp=1, pp=4)
        v, v_pad, h = m.vocab_size, mem.padded_vocab(m, 1), m.hidden_size
        # Padded embedding and head; with tied weights and PP > 1 the last stage holds a copy.
        expected = m.total_params() + ((2 * v_pad - v) * h if m.tied_embeddings else 2 * (v_pad - v) * h)
        assert sum(mem.stage_params(m, p)) == expected


def test_tied_embedding_copy_on_last_stage_only_with_pp():
    m = llama(tied=True)
    v = mem.padded_vocab(m, 2) * m.hidden_size / 2
    one = mem.stage_params(m, plan(m, tp=2, pp=1))
    untied = llama(tied=False)
    assert mem.stage_params(untied, plan(untied, tp=2, pp=1))[0] - one[0] == pytest.approx(v)
    four = mem.stage_params(m, plan(m, tp=2, pp=4))
    four_untied = mem.stage_params(untied, plan(untied, tp=2, pp=4))
    assert four == four_untied  # the copy on the last stage has the size of the LM head


# ---------------------------------------------------------------- pipeline schedule
@pytest.mark.parametrize("p", [1, 2, 4, 8, 35])
@pytest.mark.parametrize("v", [1, 2, 3, 4])
def test_interleaved_factor(p, v):
    if p == 1 and v > 1:
        # p = 1 with the interleaving formula still gives one micro-batch.
        assert mem.inflight_microbatches(1, 0, 16, v) == pytest.approx(1.0)
        return
    m = 4 * p
    got = mem.inflight_microbatches(p, 0, m, v)
    if v == 1:
        assert got == p
    else:
        assert got == pytest.approx(p * (1 + (p - 1) / (p * v)))
    # Later stages hold fewer micro-batches; the last holds one (1F1B) or ((v-1)p+1)/v.
    seq = [mem.inflight_microbatches(p, i, m, v) for i in range(p)]
    assert all(x >= y for x, y in zip(seq, seq[1:]))
    assert seq[-1] == pytest.approx(1.0 if v == 1 else ((v - 1) * p + 1) / v)


def test_inflight_capped_by_microbatches():
    assert mem.inflight_microbatches(8, 0, 3) == 3
    assert mem.inflight_microbatches(8, 6, 3) == 2
    assert mem.inflight_microbatches(4, 0, 4, 2) == pytest.approx(4.0)  # all 8 chunk-micro-batches


def test_first_stage_is_peak_for_even_1f1b():
    for model in (gpt("gpt-13b", 40, 5120, 40), llama()):
        for pp in (2, 4, 8):
            p = plan(model, tp=2, pp=pp, dp=2, m=4 * pp)
            b = mem.memory_per_gpu(model, p)
            assert b.stage == 0
            assert b.inflight_microbatches == pp
            totals = [s.total for s in mem.stage_memory(model, p)]
            assert b.total == max(totals)


def test_uneven_layer_split_moves_peak():
    model = llama()
    p = plan(model, tp=2, pp=4, m=16, layer_split=(2, 14, 8, 8))
    b = mem.memory_per_gpu(model, p)
    assert b.stage == 1
    assert b.inflight_microbatches == 3
    totals = [s.total for s in mem.stage_memory(model, p)]
    assert b.total == max(totals) and totals.index(b.total) == 1


# ---------------------------------------------------------------- monotonicity
MODELS = [gpt("gpt-13b", 40, 5120, 40), llama(), llama(layers=80, h=8192, a=64, kv=8, f=28672)]


@pytest.mark.parametrize("model", MODELS, ids=lambda m: m.name + str(m.num_layers))
def test_more_tp_never_increases_memory(model):
    for recompute in ("none", "selective", "full"):
        for zero in (0, 1, 3):
            totals = [mem.memory_per_gpu(model, plan(model, tp=t, pp=2, dp=4, recompute=recompute, zero=zero,
                                                     m=8)).total for t in (1, 2, 4, 8)]
            assert all(a >= b for a, b in zip(totals, totals[1:])), (recompute, zero, totals)


@pytest.mark.parametrize("model", MODELS, ids=lambda m: m.name + str(m.num_layers))
def test_more_pp_never_increases_memory(model):
    for recompute in ("none", "selective", "full"):
        totals = [mem.memory_per_gpu(model, plan(model, tp=4, pp=p, dp=2, recompute=recompute, m=16)).total
                  for p in (1, 2, 4, 8)]
        assert all(a >= b for a, b in zip(totals, totals[1:])), (recompute, totals)


@pytest.mark.parametrize("model", MODELS, ids=lambda m: m.name + str(m.num_layers))
def test_higher_zero_never_increases_memory(model):
    for dp, cp in ((1, 1), (2, 1), (8, 1), (4, 2)):
        for pp in (1, 4):
            totals = [mem.memory_per_gpu(model, plan(model, tp=2, pp=pp, dp=dp, cp=cp, zero=z, m=8)).total
                      for z in (0, 1, 2, 3)]
            assert all(a >= b for a, b in zip(totals, totals[1:])), (dp, cp, pp, totals)


@pytest.mark.parametrize("model", MODELS, ids=lambda m: m.name + str(m.num_layers))
def test_recompute_order(model):
    for flash in (True, False):
        for tp, pp in ((1, 1), (4, 2), (8, 4)):
            tot = {r: mem.memory_per_gpu(model, plan(model, tp=tp, pp=pp, recompute=r, m=8),
                                         flash_attention=flash).activations
                   for r in ("none", "selective", "full")}
            assert tot["full"] <= tot["selective"] <= tot["none"], (flash, tp, pp, tot)


def test_zero_shards_over_dp_times_cp():
    m = llama()
    a = mem.memory_per_gpu(m, plan(m, tp=2, dp=8, cp=1, zero=1))
    b = mem.memory_per_gpu(m, plan(m, tp=2, dp=4, cp=2, zero=1))
    assert a.optimizer == pytest.approx(b.optimizer)
    assert a.weights == b.weights and a.gradients == b.gradients


def test_cp_divides_sequence():
    m = llama()
    one = mem.activation_bytes_per_layer(m, plan(m, tp=2, cp=1, seq=8192))
    four = mem.activation_bytes_per_layer(m, plan(m, tp=2, cp=4, seq=8192))
    assert four == pytest.approx(one / 4)


def test_zero3_keeps_a_working_set():
    m = llama()
    p = plan(m, tp=1, dp=8, zero=3)
    b = mem.memory_per_gpu(m, p)
    params = mem.stage_params(m, p)[0]
    # Largest unit: the LM head with the final RMSNorm (larger than one layer for a 128k vocabulary).
    unit = max(mem.layer_params_per_gpu(m, 1), mem.padded_vocab(m, 1) * m.hidden_size + m.hidden_size)
    assert b.weights == pytest.approx(2 * (params / 8 + 2 * unit))
    assert b.gradients == pytest.approx(4 * (params / 8 + unit))
    assert b.optimizer == pytest.approx(12 * params / 8)


# ---------------------------------------------------------------- workspace, fit, speed
def _gpu(hbm_gb: float, fp8: bool = True) -> GPUSpec:
    peaks = {"bf16": 1.0, **({"fp8": 2.0} if fp8 else {})}  # peaks are irrelevant to memory
    return GPUSpec(name="test-gpu", display_name="test", peak_tflops=peaks, hbm_gb=hbm_gb, hbm_bw_gbs=1.0,
                   nvlink_bw_gbs=0.0, default_cluster="none")


def test_workspace_and_fit():
    m = llama()
    p = plan(m, tp=8, dp=1)
    b = mem.memory_per_gpu(m, p)
    assert b.workspace == mem.DEFAULT_WORKSPACE_BYTES
    assert mem.memory_per_gpu(m, p, _gpu(80, fp8=False)).workspace < b.workspace
    assert mem.memory_per_gpu(m, p, workspace_bytes=0).total == pytest.approx(b.total - b.workspace)
    total_gb = b.total / 1e9
    # the allocator's fragmentation is a term of the total; no headroom on top unless asked for
    assert b.allocator == pytest.approx(mem.ALLOCATOR_FRAGMENTATION * (b.total - b.workspace - b.allocator))
    assert mem.fits_in_memory(b, _gpu(total_gb + 0.01))
    assert not mem.fits_in_memory(b, _gpu(total_gb - 0.01))
    assert not mem.fits_in_memory(b, _gpu(total_gb + 0.01), headroom=0.05)
    assert mem.fits_in_memory(b, _gpu(total_gb / 0.95 + 0.01), headroom=0.05)


def test_llama70b_interleaved_stage_by_hand():
    # llama-70b shape, TP 8 x PP 8 x DP 4, VPP 2, 32 micro-batches, ZeRO-1 (its speed:
    # benchmarks/bench_components.py memory_per_gpu_s). Parameters of the first stage on one GPU, by hand:
    # a layer's QKV h(a + 2 a_kv)d, output h^2 and SwiGLU 3hf over TP, plus two RMSNorms (replicated):
    # (8192 * 10240 + 8192**2 + 3 * 8192 * 28672) / 8 + 2 * 8192 = 106,971,136; 10 layers; the embedding of the
    # vocabulary padded to 128 x TP (129,024 rows) over TP: 129024 * 8192 / 8 = 132,120,576.
    m = llama(layers=80, h=8192, a=64, kv=8, f=28672)
    p = plan(m, tp=8, pp=8, dp=4, vpp=2, m=32)
    b = mem.memory_per_gpu(m, p)
    params = 10 * 106_971_136 + 132_120_576
    assert b.stage == 0
    assert b.weights == 2 * params and b.gradients == 4 * params  # bf16 weights, fp32 main gradients
    assert b.optimizer == 12 * params / 4  # fp32 master + Adam m, v sharded over DP = 4 (ZeRO-1)
    # the first stage of the interleaved 1F1B schedule holds p + (p - 1) / v micro-batches in flight
    # (Korthikanti et al. 2022, sec. 4.2.3: p (1 + (p - 1) / (p v))): 8 + 7 / 2; activations scale with them
    # against VPP 1 (p = 8)
    assert b.inflight_microbatches == 11.5
    flat = mem.memory_per_gpu(m, plan(m, tp=8, pp=8, dp=4, vpp=1, m=32))
    assert flat.inflight_microbatches == 8 and b.activations == pytest.approx(flat.activations * 11.5 / 8)
    assert b.total == b.weights + b.gradients + b.optimizer + b.activations + b.workspace + b.allocator
    assert mem.memory_per_gpu(m, p) == b  # repeatable


# ---------------------------------------------------------------- capacity as the driver reports it
def test_capacity_is_the_driver_figure_and_the_message_is_consistent():
    from costmodel.core.specs.catalogue import load_catalogue

    cat = load_catalogue()
    a100 = cat.gpu("a100-80gb")
    gib = 2**30
    assert a100.hbm_bytes == 80 * gib                   # nvidia-smi 81,920 MiB, not 80e9 bytes (74.5 GiB)
    assert cat.gpu("h100-sxm").hbm_bytes == 81559 * 2**20  # nvidia-smi 81,559 MiB (79.65 GiB)
    # 79 GiB: above the old 80e9-byte capacity (74.5 GiB) and under the 80 GiB the driver reports.
    b = mem.MemoryBreakdown(79 * gib, 0.0, 0.0, 0.0, 0.0, 0, 1.0)
    assert 80e9 < b.total and mem.fits_in_memory(b, a100)
    assert mem.memory_message(b, a100) == ("fits: 79.0 GiB per GPU needed on stage 0, a100-80gb has 80.0 GiB "
                                           "usable (80.0 GiB capacity)")
    big = mem.MemoryBreakdown(77 * gib, 0.0, 0.0, 0.0, 0.0, 2, 1.0, allocator=3.5 * gib)
    assert not mem.fits_in_memory(big, a100)            # 77 < 80 GiB, but not with the allocator's 3.5 GiB
    assert mem.memory_message(big, a100).startswith("does not fit: 80.5 GiB per GPU needed on stage 2, "
                                                    "a100-80gb has 80.0 GiB usable")
    assert mem.memory_message(b, a100, headroom=0.05).endswith("76.0 GiB usable (80.0 GiB capacity less 5% "
                                                               "headroom)")
    # without a driver figure the vendor GB stands in
    assert _gpu(80).hbm_bytes == 80e9


# ---------------------------------------------------------------- MoE and MLA
def mixtral(layers: int = 32) -> ModelSpec:
    """Mixtral-8x7B's widths (config.json of mistralai/Mixtral-8x7B-v0.1)."""
    return ModelSpec(name="mixtral-like", num_layers=layers, hidden_size=4096, num_heads=32, num_kv_heads=8,
                     ffn_hidden_size=14336, vocab_size=32000, activation="swiglu", norm="rmsnorm",
                     num_experts=8, experts_per_token=2)


def dsv3(layers: int = 8) -> ModelSpec:
    """DeepSeek-V3's widths (config.json of deepseek-ai/DeepSeek-V3), fewer layers, first 3 dense."""
    return ModelSpec(name="dsv3-like", num_layers=layers, hidden_size=7168, num_heads=128, num_kv_heads=128,
                     ffn_hidden_size=18432, vocab_size=129280, head_dim=192, activation="swiglu", norm="rmsnorm",
                     num_experts=256, experts_per_token=8, moe_ffn_hidden_size=2048, num_shared_experts=1,
                     first_dense_layers=3, router="sigmoid", q_lora_rank=1536, kv_lora_rank=512,
                     qk_rope_head_dim=64, v_head_dim=128)


def moe_plan(model, *, gpus=64, tp=1, pp=4, ep=8, etp=None, mbs=1, seq=4096, zero=1, imbalance=None,
             recompute="selective", dispatcher="alltoall") -> ParallelPlan:
    dp = gpus // (tp * pp)
    p = ParallelPlan(gpus=gpus, gpus_per_node=8, gbs=mbs * dp * pp, seq_len=seq, tp=tp, pp=pp,
                     mbs=mbs, zero=zero, ep=ep, etp=etp, moe_imbalance=imbalance, recompute=recompute,
                     moe_dispatcher=dispatcher)
    return p.validate(model)


@pytest.mark.parametrize("model", [mixtral(4), dsv3(5)])
def test_layer_parts_sum_to_the_model_at_one_gpu(model):
    for i in range(model.num_layers):
        d, e = mem.layer_param_parts(model, i, 1)
        assert d + e == model.layer_params(i)
        assert mem.layer_params_per_gpu(model, 1, layer=i) == model.layer_params(i)


def test_moe_layer_matches_megatron_theoretical_memory_usage():
    # megatron/training/theoretical_memory_usage.py num_parameters_in_transformer_layer_moe (swiglu: 3/2, RMSNorm:
    # norm_size 1; it leaves out the router's h x E)
    m = dsv3()
    h = m.hidden_size
    megatron = 2 * h * (2048 * 256 * 1.5 + 2048 * 1.5 + 1) + m.attention_params()
    d, e = mem.layer_param_parts(m, 5, 1)
    assert d + e - h * 256 == megatron


def test_experts_split_over_ep_and_etp_shared_and_router_as_dense():
    m = dsv3()
    d1, e1 = mem.layer_param_parts(m, 5, 1)
    d, e = mem.layer_param_parts(m, 5, tp=8, ep=32, etp=2)
    assert e == pytest.approx(256 / 32 * m.expert_params() / 2)
    # MLA: down projections and latent norms replicated over TP, up/output projections split
    repl = 7168 * (1536 + 512 + 64) + 1536 + 512
    attn = repl + (m.attention_params() - repl) / 8
    shared = m.mlp_params(m.shared_ffn) / 8
    assert d == pytest.approx(attn + m.norm_params() + m.router_params() + shared)
    assert e1 == 256 * m.expert_params() and d1 > d


def test_expert_states_shard_over_expert_data_parallel():
    m = mixtral(8)
    p = moe_plan(m, gpus=64, tp=2, pp=4, ep=4)          # DP = 8, expert DP = 64 / (2 * 4 * 4) = 2
    assert p.dp == 8 and p.expert_dp == 2
    parts = mem._stage_param_parts(m, p)
    st = mem.stage_memory(m, p)
    dense, expert, _ = parts[1]
    assert expert == pytest.approx(2 * 2 * m.expert_params() / 2)  # 2 layers x 2 local experts / ETP 2
    assert st[1].optimizer == pytest.approx(12 * (dense / 8 + expert / 2))
    assert st[1].weights == pytest.approx(2 * (dense + expert))
    assert st[1].gradients == pytest.approx(4 * (dense + expert))
    # more EP: fewer experts per GPU, never more memory
    more = mem.memory_per_gpu(m, moe_plan(m, gpus=64, tp=2, pp=4, ep=8))
    assert more.weights < mem.memory_per_gpu(m, p).weights


def test_dense_layers_of_an_moe_model_are_counted_per_stage():
    m = dsv3(8)                                             # layers 0-2 dense, 3-7 MoE
    p = moe_plan(m, gpus=64, tp=1, pp=2, ep=8)
    (d0, e0, u0), (d1, e1, u1) = mem._stage_param_parts(m, p)
    assert e0 == 1 * 32 * m.expert_params() and e1 == 4 * 32 * m.expert_params()
    assert d0 + d1 == pytest.approx(sum(mem.layer_param_parts(m, i, 1)[0] for i in range(8)))


def test_moe_activations_grow_with_imbalance_by_the_received_copies():
    m = mixtral(4)
    base = moe_plan(m, gpus=8, tp=2, pp=1, ep=4, mbs=1, seq=4096, imbalance=1.0)
    worse = moe_plan(m, gpus=8, tp=2, pp=1, ep=4, mbs=1, seq=4096, imbalance=1.5)
    rank = mm.moe_imbalance(m, worse)                        # busiest expert 1.5x -> busiest rank (2 experts)
    assert 1.0 < rank < 1.5
    a0 = mem._layer_activation_bytes(m, base, "selective", True, moe=True)
    a1 = mem._layer_activation_bytes(m, worse, "selective", True, moe=True)
    t_in = 4096 / 2
    received = t_in * 2 * 2                                  # T_in x top-2 x ETP (= TP = 2)
    per_copy = 2 * (4096 + 14336 / 2 * 3)                    # fc1 input h, gated fc1 output 2F/etp, act F/etp
    assert a1 - a0 == pytest.approx((rank - 1) * received * per_copy)
    dense_mlp = 2 * 4096 * (14336 / 2 * 3)
    assert a0 - mem._layer_activation_bytes(m, base, "selective", True) == pytest.approx(
        2 * t_in * (8 + 2) + received * per_copy - dense_mlp)
    # full recompute keeps only the layer input, MoE or not
    assert mem._layer_activation_bytes(m, base, "full", True, moe=True) == 2 * 4096 * 4096 / 2


def test_imbalance_default_and_capacity_cap_agree_with_the_engine():
    moe = pytest.importorskip("costmodel.graph.moe")
    m = mixtral(4)
    capped = ModelSpec(**{**m.__dict__, "capacity_factor": 1.25, "extra": {}})
    for model, imb in ((m, None), (m, 2.0), (capped, 2.0), (capped, None)):
        p = moe_plan(model, gpus=8, tp=1, pp=1, ep=8, imbalance=imb)
        assert mm.moe_imbalance(model, p) == moe.routing_imbalance(model, p)
    assert mm.moe_imbalance(capped, moe_plan(capped, gpus=8, tp=1, pp=1, ep=8, imbalance=2.0)) == 1.25


def test_dispatcher_working_set_and_mla_activations():
    m = mixtral(4)
    a2a = moe_plan(m, gpus=8, tp=2, pp=1, ep=4, imbalance=1.0)
    ag = moe_plan(m, gpus=8, tp=2, pp=1, ep=4, dispatcher="allgather", imbalance=1.0)
    t_in = 4096 / 2
    assert mm.moe_dispatch_working_bytes(m, a2a, 2) == 2 * 4096 * (t_in * 2 + t_in * 2 * 2)
    assert mm.moe_dispatch_working_bytes(m, ag, 2) == 2 * 4096 * t_in * 4 * 2
    d = dsv3()
    p = moe_plan(d, gpus=64, tp=8, pp=1, ep=8)
    tokens = 4096
    mla = 2 * (2 * (1536 + 512) * tokens / 8 + tokens * 16 * (2 * 192 + 2 * 128))
    assert mm.mla_activation_bytes(d, p, tokens, 2) == mla
    total = mem.memory_per_gpu(d, p)
    assert math.isfinite(total.total) and total.activations > 0
