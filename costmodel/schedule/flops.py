"""Closed-form training FLOPs (for MFU/HFU reporting).

Convention (README "MFU convention"):

* **Model FLOPs** (MFU) count the math a step needs once: 2 FLOPs per multiply-add over every weight
  matrix (QKV, output, MLP, LM head) and the attention core Q K^T and P V over the *causal* half of the
  s x s score matrix, backward = 2 x forward. This is Megatron-LM's current
  ``megatron/training/training.py`` ``num_floating_point_operations`` (``seq_len / 2  # causal mask``),
  generalised to GQA, gated MLPs and F != 4h. Narayanan et al. SC21 (arXiv 2104.04473) eq. 3 and
  PaLM (Chowdhery et al. 2022, appendix B) count the full s x s matrix instead; they are kept as
  :func:`published_flops_per_iteration` because published TFLOP/s figures use them (planner validate
  compares those figures in their own convention).
* **Hardware FLOPs** (HFU) count what the operator graph (costmodel/graph/build.py) executes: the same GEMMs,
  the causal attention forward, the FlashAttention backward at 2.5 x its forward (5 matmuls vs 2, Dao
  2023 §3.1: it recomputes the scores itself, so selective recomputation adds nothing), and with full
  recomputation one more forward of every layer. Hence MFU <= HFU, and hardware FLOP/s <= the peak
  of the dtype the kernels are costed at.

MFU conventions for MoE, MLA and sliding-window attention (issue #17; dense models take the code path above,
unchanged, bit for bit):

* **MoE: model FLOPs count active parameters** - per token, the router GEMM (h x E), the top-k routed experts and
  the shared experts of each MoE layer (2 FLOPs per multiply-add over their weights), never the experts a token is
  not routed to; layers before ``first_dense_layers`` and between MoE layers (``moe_layer_freq``) count their dense
  MLP. This is the convention of Megatron-LM's ``num_floating_point_operations`` (MoE branch: ``moe_router_topk``
  x expert FFN + shared expert FFN) and of DeepSeek-V3's and Mixtral's "active parameters". Dropped tokens
  (a capacity factor) are still counted: model FLOPs are what the model needs, not what a dropping run executes.
* **MLA** (DeepSeek-V2/V3): the attention GEMMs are the down and up projections of Q and of the KV latent, the
  decoupled RoPE key and the output projection, as trained (K and V up-projected, not absorbed); the core is
  Q K^T over the Q/K head width (nope + rope) and P V over ``v_head_dim``.
* **Sliding-window layers** attend, per query, to the keys of its band: w - w^2 / (2 s) on average for a window
  w < s (the band of a causal s x s matrix, counted as the causal half s/2 of a full layer is), s/2 when w >= s.
  Attention sinks add one score column per head and no GEMM: not counted.
* **Multi-token prediction** (DeepSeek-V3's MTP depths, ``ModelSpec.mtp_layers``): each depth is counted as one
  more layer of the last layer's kind plus its 2h -> h projection and one more pass of the output head
  (:func:`mtp_forward_flops`), as Megatron-LM's counter does; the per-token sums below include them.
* Hardware FLOPs follow the same per-layer sums with the FlashAttention backward factor and full recomputation as
  above, plus the forward GEMMs of Megatron-Core's ``--recompute-modules`` (:func:`recomputed_module_flops_per_token`);
  the published-convention FLOPs count the full band (s keys, or w on sliding layers).
"""

from __future__ import annotations

from dataclasses import replace

from costmodel.core.specs.model import ModelSpec

CAUSAL_FRACTION = 0.5
"""Share of the s x s score matrix a causal mask keeps (Megatron-LM transformer_flops: seq_len / 2)."""
FLASH_BWD_OVER_FWD = 2.5
"""FlashAttention backward FLOPs / forward FLOPs: 5 matmuls (incl. the recomputed Q K^T) vs 2 (Dao 2023,
FlashAttention-2 §3.1); costmodel/graph/build.py costs attention_bwd with the same factor."""


def forward_flops_per_token_layer(model: ModelSpec, seq_len: int) -> tuple[float, float]:
    """(dense GEMM FLOPs, causal attention-core FLOPs) of one layer's forward for one token.

    Dense: 2 FLOPs per multiply-add over the QKV, output and MLP weights (SC21 eq. 3 derivation:
    24*h^2 per token for h-wide MHA with F=4h). Attention core: Q K^T and P V, 2 * 2 * s * a*d, times
    :data:`CAUSAL_FRACTION`.
    """
    h, f = model.hidden_size, model.ffn_hidden_size
    dense = 2.0 * (h * (model.q_dim + 2 * model.kv_dim) + model.q_dim * h + h * f * (3 if model.gated else 2))
    attn = 4.0 * seq_len * model.q_dim * CAUSAL_FRACTION
    return dense, attn


def layerwise(model: ModelSpec) -> bool:
    """Whether the model needs the per-layer sums (MoE, MLA or sliding-window layers); dense models keep the
    closed form of :func:`forward_flops_per_token_layer`."""
    return model.is_moe or model.is_mla or (model.sliding_window > 0 and model.sliding_window_every > 0)


def _attention_gemm_weights(model: ModelSpec) -> int:
    """Multiply-adds per token of one layer's attention projections (MLA: its down/up projections, no norms)."""
    h, a = model.hidden_size, model.num_heads
    if model.is_mla:
        rope, q_rank, kv_rank = model.qk_rope_head_dim, model.q_lora_rank, model.kv_lora_rank
        v = model.v_head_dim or model.head_dim
        q = h * q_rank + q_rank * a * model.head_dim if q_rank else h * a * model.head_dim
        kv = h * (kv_rank + rope) + kv_rank * a * (model.head_dim - rope + v)
        return q + kv + a * v * h
    return h * (model.q_dim + 2 * model.kv_dim) + model.q_dim * h


def attended_keys(model: ModelSpec, seq_len: int, layer: int, causal: bool = True) -> float:
    """Keys one query attends to on average in ``layer`` (see the module docstring): s/2 causal (s without the
    mask), a sliding window w < s: w - w^2 / (2 s) causal (w without)."""
    w = model.sliding_window
    if model.uses_sliding_window(layer) and w < seq_len:
        return w - w * w / (2.0 * seq_len) if causal else float(w)
    return seq_len * CAUSAL_FRACTION if causal else float(seq_len)


def layer_forward_flops(model: ModelSpec, seq_len: int, layer: int, causal: bool = True) -> tuple[float, float]:
    """(GEMM FLOPs, attention-core FLOPs) of layer ``layer``'s forward for one token: attention projections, and the
    dense MLP or (MoE layer) router + top-k routed experts + shared experts; the core Q K^T over the Q/K head width
    and P V over the V head width for :func:`attended_keys` keys."""
    h = model.hidden_size
    mlp_per_width = h * (3 if model.gated else 2)
    if model.is_moe_layer(layer):
        mlp = h * model.num_experts + mlp_per_width * (model.experts_per_token * model.expert_ffn + model.shared_ffn)
    else:
        mlp = mlp_per_width * model.ffn_hidden_size
    gemm = 2.0 * (_attention_gemm_weights(model) + mlp)
    v = model.v_head_dim or model.head_dim
    attn = 2.0 * attended_keys(model, seq_len, layer, causal) * model.num_heads * (model.head_dim + v)
    return gemm, attn


def _layer_sums(model: ModelSpec, seq_len: int, causal: bool = True) -> tuple[float, float]:
    """(GEMM, attention-core) forward FLOPs per token summed over all layers, and over the multi-token-prediction
    depths (:func:`mtp_forward_flops`)."""
    per_layer = [layer_forward_flops(model, seq_len, i, causal) for i in range(model.num_layers)]
    gemm, attn = sum(g for g, _ in per_layer), sum(a for _, a in per_layer)
    if model.mtp_layers:
        mtp_gemm, mtp_attn = mtp_forward_flops(model, seq_len, causal)
        gemm, attn = gemm + mtp_gemm, attn + mtp_attn
    return gemm, attn


def mtp_forward_flops(model: ModelSpec, seq_len: int, causal: bool = True) -> tuple[float, float]:
    """(GEMM, attention-core) forward FLOPs per token of the multi-token-prediction depths (costmodel.memory.mtp): per
    depth a layer of the last layer's kind, the 2h -> h ``eh_proj`` and one more output head (2 h V), as Megatron-LM's
    num_floating_point_operations counts them (@d98e8a64: the MTP depth as one more layer, "MTP eh proj", logits
    "(mtp_num_layers + 1)"; its 3h norm term is element-wise work, left out as every norm is here)."""
    gemm, attn = layer_forward_flops(model, seq_len, model.num_layers - 1, causal)
    h = model.hidden_size
    return model.mtp_layers * (gemm + 2.0 * 2 * h * h + 2.0 * h * model.vocab_size), model.mtp_layers * attn


def model_flops_per_iteration(model: ModelSpec, global_batch: int, seq_len: int) -> float:
    """Model FLOPs of one training step: 3 x forward (causal attention, no recomputation), LM head 2*h*V
    per token forward (MoE: active parameters, see the module docstring)."""
    if layerwise(model):
        gemm, attn = _layer_sums(model, seq_len)
        return 3.0 * global_batch * seq_len * (gemm + attn + 2.0 * model.hidden_size * model.vocab_size)
    dense, attn = forward_flops_per_token_layer(model, seq_len)
    tokens = global_batch * seq_len
    head = 2.0 * model.hidden_size * model.vocab_size
    return 3.0 * tokens * (model.num_layers * (dense + attn) + head)


def executed_model(model: ModelSpec, tp: int) -> ModelSpec:
    """The model as TP ranks execute it (costmodel/graph/build.py): each rank holds max(1, kv_heads // TP) KV heads, so
    KV heads are replicated when TP exceeds them (Megatron-LM GQA with TP > num_query_groups), and the LM head is
    padded to a multiple of TP. HFU counts these executed FLOPs; MFU counts the model's own."""
    kv = tp * max(1, model.num_kv_heads // tp)
    vocab = -(-model.vocab_size // tp) * tp
    if kv == model.num_kv_heads and vocab == model.vocab_size:
        return model
    return replace(model, num_kv_heads=kv, vocab_size=vocab)


def hardware_flops_per_iteration(model: ModelSpec, global_batch: int, seq_len: int, recompute: str,
                                 modules: tuple[str, ...] = ()) -> float:
    """FLOPs the operator graph executes: GEMMs forward + dgrad + wgrad, causal attention forward plus the
    FlashAttention backward (:data:`FLASH_BWD_OVER_FWD`), and with ``recompute == "full"`` one more
    forward of every layer. ``selective`` (the attention core, Korthikanti et al. 2022 §5) adds nothing:
    the FlashAttention backward already recomputes the scores; with Megatron-Core's ``--recompute-modules``
    (``modules`` = ParallelPlan.recompute_modules) the GEMMs those modules re-run are counted once more
    (:func:`recomputed_module_flops_per_token`)."""
    modules_flops = recomputed_module_flops_per_token(model, modules) if modules else 0.0
    if layerwise(model):
        gemm, attn = _layer_sums(model, seq_len)
        total = 3.0 * gemm + (1.0 + FLASH_BWD_OVER_FWD) * attn + (gemm + attn if recompute == "full" else 0.0)
        total += modules_flops
        return global_batch * seq_len * (total + 3.0 * 2.0 * model.hidden_size * model.vocab_size)
    dense, attn = forward_flops_per_token_layer(model, seq_len)
    tokens = global_batch * seq_len
    head = 2.0 * model.hidden_size * model.vocab_size
    layer = 3.0 * dense + (1.0 + FLASH_BWD_OVER_FWD) * attn
    if recompute == "full":
        layer += dense + attn
    return tokens * (model.num_layers * layer + 3.0 * head + modules_flops)


def recomputed_module_flops_per_token(model: ModelSpec, modules: tuple[str, ...]) -> float:
    """Forward GEMM FLOPs per token, summed over the layers, that Megatron-Core's selective recompute by module
    re-runs in backward (the operators of costmodel/graph/selective.py): "mlp" the dense MLP of non-MoE layers, "moe"
    the MoE block (router, top-k routed experts, shared experts), "shared_experts" the shared experts (once, when
    "moe" is chosen too), "mla_up_proj" the MLA Q up projection (the Q projection without a Q LoRA rank) and the
    KV up projection. "core_attn" adds nothing (the FlashAttention backward already recomputes the scores, as
    for ``selective``); "layernorm" and "moe_act" re-run element-wise kernels, which FLOP counts leave out."""
    h = model.hidden_size
    mlp_per_width = h * (3 if model.gated else 2)
    macs = 0.0
    for i in range(model.num_layers):
        if model.is_moe_layer(i):
            if "moe" in modules:
                macs += h * model.num_experts + mlp_per_width * (model.experts_per_token * model.expert_ffn
                                                                 + model.shared_ffn)
            elif "shared_experts" in modules:
                macs += mlp_per_width * model.shared_ffn
        elif "mlp" in modules:
            macs += mlp_per_width * model.ffn_hidden_size
        if "mla_up_proj" in modules and model.is_mla:
            a, rope, v = model.num_heads, model.qk_rope_head_dim, model.v_head_dim or model.head_dim
            q_rank, kv_rank = model.q_lora_rank, model.kv_lora_rank
            macs += (q_rank or h) * a * model.head_dim + kv_rank * a * (model.head_dim - rope + v)
    return 2.0 * macs


def published_flops_per_iteration(model: ModelSpec, global_batch: int, seq_len: int, recompute: str) -> float:
    """FLOPs of one step in the convention of published Megatron-era TFLOP/s figures (SC21 eq. 3, PaLM
    appendix B): full s x s attention, backward = 2 x forward, and with ``recompute`` "full" one more
    forward of every layer, "selective" one more attention core (Korthikanti et al. 2022 §5). For
    GPT-3-style models with full recomputation this is eq. 3 exactly (:func:`narayanan_eq3`)."""
    if layerwise(model):
        gemm, attn = _layer_sums(model, seq_len, causal=False)
        tokens = global_batch * seq_len
        base = 3.0 * tokens * (gemm + attn + 2.0 * model.hidden_size * model.vocab_size)
        extra = {"full": gemm + attn, "selective": attn}.get(recompute, 0.0)
        return base + tokens * extra
    dense, attn = forward_flops_per_token_layer(model, seq_len)
    attn /= CAUSAL_FRACTION
    tokens = global_batch * seq_len
    head = 2.0 * model.hidden_size * model.vocab_size
    base = 3.0 * tokens * (model.num_layers * (dense + attn) + head)
    if recompute == "full":
        return base + tokens * model.num_layers * (dense + attn)
    if recompute == "selective":
        return base + tokens * model.num_layers * attn
    return base


def narayanan_eq3(batch: int, seq_len: int, layers: int, hidden: int, vocab: int) -> float:
    """SC21 eq. 3 verbatim: 96 B s l h^2 (1 + s/(6h) + V/(16 l h)) (with full recomputation)."""
    return 96.0 * batch * seq_len * layers * hidden**2 * (1 + seq_len / (6 * hidden) + vocab / (16 * layers * hidden))
