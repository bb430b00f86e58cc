"""Per-GPU memory terms of one transformer layer or stage: parameters on one GPU, micro-batches in flight, and the
activations a layer stores for backward (per recompute policy and framework), for :mod:`costmodel.memory.per_gpu`, which
assembles them per pipeline stage. Sources: the [TAGS] of costmodel/memory/per_gpu.py's module docstring."""

from __future__ import annotations

from costmodel.core.specs.framework import get_framework
from costmodel.core.specs.model import ModelSpec
from costmodel.core.specs.plan import ParallelPlan
from costmodel.memory.moe_memory import (
    layer_param_parts,
    mla_activation_bytes,
    moe_mlp_activation_bytes,
    offloaded_moe_bytes,
    selective_cuts,
)
from costmodel.memory.mtp import mtp_param_parts_per_gpu

# ----------------------------------------------------------------------------- constants
BYTES_ACT = 2.0
"""bf16/fp16 activation element [KORTHIKANTI] Sec. 4.1."""
BYTES_MASK = 1.0
"""Dropout mask element [KORTHIKANTI] Sec. 4.1."""
BYTES_LOGIT = 4.0
"""Logits are cast to fp32 for Megatron's vocab-parallel cross entropy
(megatron/core/tensor_parallel/cross_entropy.py, called on ``logits.float()``) [KORTHIKANTI] Sec. 4.3."""
BYTES_TOKEN_ID = 8.0
"""int64 token ids held by the embedding [MEGATRON-TM] ("Input to embedding", 8 * s * b)."""
BYTES_LSE = 4.0
"""fp32 log-sum-exp per (head, token) saved by flash attention [FLASH2]."""

BYTES_FP8_GEMM_INPUT = 1.0
"""fp8 copy of a GEMM input saved for the weight gradient [TE-FP8]."""


def gemm_input_bytes(plan: ParallelPlan) -> float:
    """Bytes per element of the input a linear layer saves for its weight-gradient GEMM: 1 with fp8 GEMMs on
    Transformer Engine (Megatron stacks; [TE-FP8]), else the activation bytes."""
    if plan.dtype in ("fp8", "fp8-block") and plan.framework == "megatron":
        return BYTES_FP8_GEMM_INPUT
    return _act_bytes(plan)


def _act_bytes(plan: ParallelPlan) -> float:
    """Bytes per stored activation element: 4 for fp32 training, else 2 (bf16/fp16; fp8 GEMMs
    keep bf16 activations between operators)."""
    return 4.0 if plan.dtype == "fp32" else BYTES_ACT


VOCAB_PAD_MULTIPLE = 128
"""Megatron pads the vocabulary to a multiple of ``make_vocab_size_divisible_by * TP``; the
argument's default is 128 (megatron/training/arguments.py, ``--make-vocab-size-divisible-by``)."""

# ----------------------------------------------------------------------------- helpers
def padded_vocab(model: ModelSpec, tp: int) -> int:
    """Vocabulary padded to a multiple of 128 * TP as Megatron does (``_vocab_size_with_padding``)."""
    mult = VOCAB_PAD_MULTIPLE * tp
    return -(-model.vocab_size // mult) * mult


def _kv_heads_per_rank(model: ModelSpec, tp: int) -> float:
    """KV heads on one TP rank: a_kv / t, or 1 when TP exceeds a_kv (heads replicated, Megatron GQA)."""
    return model.num_kv_heads / tp if model.num_kv_heads >= tp else 1.0


def layer_params_per_gpu(model: ModelSpec, tp: int, ep: int = 1, etp: int | None = None,
                         layer: int | None = None) -> float:
    """Parameters of one transformer block on one TP rank (Megatron column/row-parallel layout).

    Q/K/V and fc1 are column-parallel (weights and biases split over TP), the output projection and
    fc2 are row-parallel (weights split, bias replicated); norms are replicated. Mirrors
    ``ModelSpec.params_per_layer`` (equal at tp=1). MoE and MLA models: :func:`layer_param_parts` of
    ``layer`` (default: the block ``params_per_layer`` describes) on a GPU of expert grid ``ep`` x ``etp``.
    """
    if model.is_moe or model.is_mla:
        if layer is None:
            layer = max(i for i in range(model.num_layers) if model.is_moe_layer(i)) if model.is_moe else 0
        dense, expert = layer_param_parts(model, layer, tp, ep, etp)
        return dense + expert
    h = model.hidden_size
    q = model.q_dim / tp
    kv = _kv_heads_per_rank(model, tp) * model.head_dim
    f = model.ffn_hidden_size / tp
    experts = max(model.num_experts, 1)
    attn = h * (q + 2 * kv) + q * h
    mlp = h * f * (3 if model.gated else 2) * experts + (h * experts if experts > 1 else 0)
    norms = 2 * h * (2 if model.norm == "layernorm" else 1)
    bias = 0.0
    if model.linear_bias:
        bias = (q + 2 * kv) + h + ((2 * f if model.gated else f) + h) * experts
    return attn + mlp + norms + bias


def _embedding_params_per_gpu(model: ModelSpec, tp: int) -> float:
    """Vocab-parallel word embedding (V_pad * h / t) plus a replicated learned position table."""
    pos = model.max_seq_len * model.hidden_size if model.position_embedding == "learned" else 0
    return padded_vocab(model, tp) * model.hidden_size / tp + pos


def _head_params_per_gpu(model: ModelSpec, tp: int, pp: int) -> float:
    """Final norm (replicated) plus the vocab-parallel LM head on the last stage.

    With tied embeddings and PP > 1 Megatron keeps a copy of the word embedding on the last stage
    (``shared_embedding``, kept in sync by an all-reduce over the embedding group), so the copy
    counts here with its gradient and optimizer state; with PP = 1 the one table serves both.
    """
    final_norm = model.hidden_size * (2 if model.norm == "layernorm" else 1)
    head = padded_vocab(model, tp) * model.hidden_size / tp
    if model.tied_embeddings and pp == 1:
        head = 0.0
    return final_norm + head


def stage_params(model: ModelSpec, plan: ParallelPlan) -> list[float]:
    """Parameters held by one GPU of each pipeline stage (before any ZeRO sharding)."""
    if model.is_moe or model.is_mla:
        out = [d + e for d, e, _ in _stage_param_parts(model, plan)]
        out[0] += _embedding_params_per_gpu(model, plan.tp)
        out[-1] += _head_params_per_gpu(model, plan.tp, plan.pp) + sum(
            mtp_param_parts_per_gpu(model, plan, padded_vocab(model, plan.tp)))
        return out
    per_layer = layer_params_per_gpu(model, plan.tp)
    layers = plan.stage_layers(model.num_layers)
    out = [n * per_layer for n in layers]
    out[0] += _embedding_params_per_gpu(model, plan.tp)
    out[-1] += _head_params_per_gpu(model, plan.tp, plan.pp)
    return out


def _stage_param_parts(model: ModelSpec, plan: ParallelPlan) -> list[tuple[float, float, float]]:
    """(non-expert, expert, largest layer) parameters of the layers of each stage on one GPU (no embedding/head)."""
    out = []
    parts: dict[bool, tuple[float, float]] = {}
    for idx in plan.stage_layer_indices(model.num_layers):
        dense = expert = unit = 0.0
        for i in idx:
            moe = model.is_moe_layer(i)
            if moe not in parts:
                parts[moe] = layer_param_parts(model, i, plan.tp, plan.ep, plan.etp)
            d, e = parts[moe]
            dense, expert, unit = dense + d, expert + e, max(unit, d + e)
        out.append((dense, expert, unit))
    return out


def inflight_microbatches(pp: int, stage: int, num_microbatches: int, vpp: int = 1, group: int = 0) -> float:
    """Micro-batches whose activations stage ``stage`` holds at its peak, in whole-stage units.

    Plain 1F1B: ``min(p - i, m)`` ([NARAYANAN] Sec. 2.2; [KORTHIKANTI] Sec. 4.2.3).
    Interleaved (v chunks per stage): the stage runs ``2 (p - i - 1) + (v - 1) p`` warm-up chunk
    forwards and one more before its first backward ([MEGATRON-SCHED]), capped at all ``m v`` chunk
    micro-batches; each chunk holds 1/v of the stage's layers, so the count is divided by v. For
    stage 0 this is ``p (1 + (p - 1) / (p v))``, Korthikanti's interleaving factor (Sec. 4.2.3);
    for p = 1 it is 1.
    With a micro-batch group N != p (``group``; Megatron-Core's microbatch_group_size_per_vp_stage, needed
    when m is not a multiple of p) the warm-up is ``2 (p - i - 1) + (v - 1) N`` chunk forwards
    (schedules.py get_pp_rank_microbatches).
    """
    m = max(num_microbatches, 1)
    if vpp <= 1:
        return float(min(pp - stage, m))
    chunks = min(2 * (pp - stage - 1) + (vpp - 1) * (group or pp) + 1, m * vpp)
    return chunks / vpp


def layout_inflight(chunk_layers: list[int], pp: int, stage: int, num_microbatches: int, group: int = 0) -> float:
    """:func:`inflight_microbatches` for a stage whose chunks differ in size (``chunk_layers[a]``: layers of its
    chunk a; ``ParallelPlan.pipeline_layout``): the peak of the layers whose activations it holds over its
    interleaved op order (warm-up forwards as above, then one forward / one backward, backward chunks in
    reverse: Megatron-Core schedules.py, as costmodel.schedule.timeline's simulator orders them), in whole-stage units.
    Equal chunks give :func:`inflight_microbatches` exactly."""
    v, n, m = len(chunk_layers), group or pp, max(num_microbatches, 1)
    table = [c for g in range(0, m, n) for c in range(v) for _ in range(g, min(g + n, m))]
    w = min(2 * (pp - stage - 1) + (v - 1) * n, m * v - 1)
    held = sum(chunk_layers[table[k]] for k in range(w))
    peak = held
    for j in range(m * v - w):
        held += chunk_layers[table[w + j]]
        peak = max(peak, held)
        held -= chunk_layers[v - 1 - table[j]]
    return peak / max(sum(chunk_layers), 1)


# ----------------------------------------------------------------------------- activations
def activation_bytes_per_layer(model: ModelSpec, plan: ParallelPlan, flash_attention: bool = True) -> float:
    """Activation bytes one transformer layer stores for one micro-batch on one GPU.

    Term by term from [KORTHIKANTI] Sec. 4.1 (s = seq_len / CP, b = micro-batch, h = hidden,
    q = a * d_head, k = a_kv * d_head, F = ffn width, t = TP; 2 bytes per element, 1 per mask):

    Sequence-parallel region (replicated over TP, divided by t with SP; Sec. 4.2.2):
      LayerNorm-1 input 2sbh, QKV-GEMM input 2sbh, LayerNorm-2 input 2sbh, fc1 input 2sbh,
      attention-output and MLP-output dropout masks sbh each  -> 8sbh (+2sbh with dropout).
    Tensor-parallel region (divided by t):
      Q 2sbq and K 2sbk (inputs of QK^T), V 2sbk (input of softmax.V), attention output 2sbq
      (input of the output projection); activation-function input 2sbF (2 * 2sbF for a gated MLP:
      gate and up outputs, Megatron's fused ``bias_swiglu`` saves only its input) and output 2sbF
      (fc2 input).
    Attention core, recompute='none' only:
      without flash attention: softmax output 2as^2b, dropout mask as^2b, dropout output 2as^2b
      (5as^2b; 2as^2b without dropout); with flash attention only the fp32 log-sum-exp 4asb [FLASH2].
    For GPT (q = k = h, F = 4h, dropout) these add up to Korthikanti's 34 = 11 (attention) + 19 (MLP)
    + 4 (norms) and reproduce Table 2: sbh(34 + 5as/h), sbh(10 + 24/t + 5as/(ht)),
    sbh(34/t + 5as/(ht)), sbh(10 + 24/t), 34sbh/t. Selective recompute drops the attention core
    (Table 2); flash attention makes recompute='none' equal to selective plus the log-sum-exp.
    recompute='full' keeps only the layer input, 2sbh (Table 2), which Megatron stores sharded by
    SP (2sbh/t).
    With GQA and TP > a_kv each rank holds one replicated KV head. With CP the s^2 terms use
    (s/CP)^2 (a lower bound: non-flash attention is not used with CP in Megatron).
    """
    return _layer_activation_bytes(model, plan, plan.recompute, flash_attention)


def _layer_activation_bytes(model: ModelSpec, plan: ParallelPlan, recompute: str, flash_attention: bool,
                            moe: bool = False) -> float:
    """activation_bytes_per_layer with the recompute mode given explicitly; ``moe``: an MoE layer's
    (``moe_memory.moe_mlp_activation_bytes`` instead of the dense MLP). MLA: ``moe_memory.mla_activation_bytes``."""
    t = plan.tp
    sp_div = t if plan.sp else 1
    tokens = plan.seq_len / plan.cp * plan.mbs
    h = model.hidden_size
    act_b = _act_bytes(plan)
    if recompute == "full":
        return act_b * tokens * h / sp_div

    dropout = model.dropout
    gemm_b = gemm_input_bytes(plan)
    # norm inputs, and the QKV and fc1 inputs (the norms' outputs, saved by the GEMMs)
    seq_region = tokens * h * (2 * act_b + 2 * gemm_b + (2 * BYTES_MASK if dropout else 0.0))
    q = model.q_dim / t
    kv = _kv_heads_per_rank(model, t) * model.head_dim
    f = model.ffn_hidden_size / t
    # Q, K, V and the attention output O; an fp8 output projection saves its own fp8 copy of O [TE-FP8]
    attn = tokens * act_b * (q + 2 * kv + q) + (tokens * gemm_b * q if gemm_b != act_b else 0.0)
    mlp = tokens * (act_b * f * (2 if model.gated else 1) + gemm_b * f)
    if recompute == "selective" and _op_sac(plan) and not (moe or model.is_mla):
        return _op_sac_activation_bytes(model, plan, tokens, act_b, q, kv, f, sp_div)
    if model.is_mla:
        attn = mla_activation_bytes(model, plan, tokens, act_b)
    if moe:
        mlp = moe_mlp_activation_bytes(model, plan, tokens, act_b, gemm_b)
    core = 0.0
    if recompute == "none" or (recompute == "selective" and plan.recompute_modules
                               and "core_attn" not in plan.recompute_modules):
        heads = model.num_heads / t
        if flash_attention:
            core = BYTES_LSE * heads * tokens
        else:
            s = plan.seq_len / plan.cp
            per_score = act_b + ((BYTES_MASK + act_b) if dropout else 0.0)
            core = per_score * heads * plan.mbs * s * s
    if recompute == "selective" and plan.recompute_modules:  # Megatron-Core --recompute-modules
        return seq_region / sp_div + attn + mlp + core - selective_cuts(model, plan, moe, tokens, act_b, mlp, gemm_b)
    return seq_region / sp_div + attn + mlp + core


def _op_sac(plan: ParallelPlan) -> bool:
    """The plan's selective recompute is torchtitan's per-op selective AC (``Framework.selective_recompute``)."""
    return plan.recompute == "selective" and get_framework(plan.framework).selective_recompute == "op"


def _op_sac_activation_bytes(model: ModelSpec, plan: ParallelPlan, tokens: float, act_b: float, q: float, kv: float,
                             f: float, sp_div: int) -> float:
    """What torchtitan's per-op selective AC keeps of one dense layer until its backward (parallelize_llama.py
    ``_save_list`` / ``_custom_policy``: the outputs of mm except every second one, of the SDPA flash op and of the
    TP reduce-scatters; everything else is recomputed): the block input (checkpoint input, sequence-sharded with
    SP), the outputs of the 1st, 3rd, 5th and 7th mm in execution order (wq, wv, w1 and, with a gate, w2: wk, wo
    and w3 are recomputed), the attention output with its fp32 logsumexp, and with SP the two reduce-scatter
    outputs."""
    saved = h_in = model.hidden_size / sp_div
    saved += q + kv + f + (model.hidden_size if model.gated else 0.0)   # mm outputs kept (odd-numbered)
    saved += q                                                            # SDPA output
    if plan.tp > 1 and plan.sp:
        saved += 2 * h_in                                                 # reduce_scatter_tensor outputs
    return tokens * (act_b * saved + BYTES_LSE * model.num_heads / plan.tp)


OFFLOAD_KEPT_LAYERS = 2
"""Layers whose offloaded activations are on the GPU at the backward's start: the last forward layer's (Megatron-Core
keeps the last offload group on the device to avoid a reload stall, docs/user-guide/features/
fine_grained_activation_offloading.md "the last-group margin") and the one being reloaded ahead of its backward."""


def offloaded_layer_bytes(model: ModelSpec, plan: ParallelPlan, moe: bool = False) -> float:
    """Bytes of one layer and micro-batch that fine-grained activation offloading moves to the host
    (``plan.offload_modules``, [MCORE-OFFLOAD]): each module's input as the layer stores it (this module's terms of
    :func:`activation_bytes_per_layer`): ``attn_norm`` / ``mlp_norm`` the norm inputs, ``qkv_linear`` the QKV input,
    ``core_attn`` Q, K and V, ``attn_proj`` the attention output O (and its fp8 copy), ``expert_fc1`` / ``moe_act``
    in MoE layers (:func:`costmodel.memory.moe_memory.offloaded_moe_bytes`). A module whose input the recompute policy
    does not store moves nothing (recompute='full' keeps only the layer input and is refused with offloading)."""
    mods = plan.offload_modules
    if not mods or plan.recompute == "full":
        return 0.0
    t = plan.tp
    tokens = plan.seq_len / plan.cp * plan.mbs
    seq = tokens * model.hidden_size / (t if plan.sp else 1)
    act_b, gemm_b = _act_bytes(plan), gemm_input_bytes(plan)
    q = model.q_dim / t
    out = act_b * seq * (("attn_norm" in mods) + ("mlp_norm" in mods)) + (gemm_b * seq if "qkv_linear" in mods else 0)
    if "core_attn" in mods and not model.is_mla:
        out += act_b * tokens * (q + 2 * _kv_heads_per_rank(model, t) * model.head_dim)
    if "attn_proj" in mods:
        out += tokens * q * (act_b + (gemm_b if gemm_b != act_b else 0.0))
    if moe:
        out += offloaded_moe_bytes(model, plan, tokens, act_b, gemm_b)
    return out


def first_stage_extra_bytes(model: ModelSpec, plan: ParallelPlan) -> float:
    """Per-micro-batch activations of the embedding on stage 0: int64 token ids 8sb ([MEGATRON-TM])
    and, with dropout, the embedding-dropout mask sbh (sbh/t with SP) ([KORTHIKANTI] Sec. 4.3).
    The embedding output itself is the first layer's input, already counted in the layer."""
    tokens = plan.seq_len / plan.cp * plan.mbs
    sp_div = plan.tp if plan.sp else 1
    mask = BYTES_MASK * tokens * model.hidden_size / sp_div if model.dropout else 0.0
    return BYTES_TOKEN_ID * tokens + mask


def last_stage_extra_bytes(model: ModelSpec, plan: ParallelPlan) -> float:
    """Per-micro-batch activations of the head on the last stage ([KORTHIKANTI] Sec. 4.3):
    final-norm input 2sbh and output-layer input 2sbh (each /t with SP) and fp32 logits for the
    vocab-parallel cross entropy 4sbV/t, i.e. 4sbh/t (1 + V/h) with SP."""
    tokens = plan.seq_len / plan.cp * plan.mbs
    sp_div = plan.tp if plan.sp else 1
    hidden = 2 * _act_bytes(plan) * tokens * model.hidden_size / sp_div
    logit_bytes = get_framework(plan.framework).loss_logit_bytes  # BYTES_LOGIT for Megatron
    logits = logit_bytes * tokens * padded_vocab(model, plan.tp) / plan.tp
    return hidden + logits
