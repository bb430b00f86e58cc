"""Closed-form training FLOPs (for MFU/HFU reporting).

Convention: Narayanan et al. SC21 (arXiv 2104.04473) eq. 3 and PaLM (Chowdhery et al. 2022,
appendix B) count the full s x s attention score matrix (not halved for causal masking) and
backward = 2 x forward. Generalised here term by term to GQA (K/V width a_kv*d), gated MLPs (three
h x F matrices) and F != 4h; for GPT-3-style models it reduces exactly to eq. 3.
"""

from __future__ import annotations

from costmodel.core.specs.model import ModelSpec


def forward_flops_per_token_layer(model: ModelSpec, seq_len: int) -> tuple[float, float]:
    """(dense GEMM FLOPs, attention-core FLOPs) of one layer's forward for one token.

    Dense: 2 FLOPs per multiply-add over the QKV, output and MLP weights (SC21 eq. 3 derivation:
    24*h^2 per token for h-wide MHA with F=4h). Attention core: Q K^T and P V, 2 * 2 * s * a*d.
    """
    h, f = model.hidden_size, model.ffn_hidden_size
    dense = 2.0 * (h * (model.q_dim + 2 * model.kv_dim) + model.q_dim * h + h * f * (3 if model.gated else 2))
    attn = 4.0 * seq_len * model.q_dim
    return dense, attn


def model_flops_per_iteration(model: ModelSpec, global_batch: int, seq_len: int) -> float:
    """Model FLOPs of one training step (forward + backward, no recomputation).

    = 3 x forward (SC21 eq. 3 without the recompute forward), LM head 2*h*V per token forward.
    """
    dense, attn = forward_flops_per_token_layer(model, seq_len)
    tokens = global_batch * seq_len
    head = 2.0 * model.hidden_size * model.vocab_size
    return 3.0 * tokens * (model.num_layers * (dense + attn) + head)


def hardware_flops_per_iteration(model: ModelSpec, global_batch: int, seq_len: int, recompute: str) -> float:
    """FLOPs actually executed, counting the recomputed forward.

    full: every layer's forward runs twice (SC21 eq. 3: factor 4 instead of 3 on the layers);
    selective: the attention core is recomputed (Korthikanti et al. 2022 §5);
    none: equal to the model FLOPs.
    """
    dense, attn = forward_flops_per_token_layer(model, seq_len)
    tokens = global_batch * seq_len
    base = model_flops_per_iteration(model, global_batch, seq_len)
    if recompute == "full":
        return base + tokens * model.num_layers * (dense + attn)
    if recompute == "selective":
        return base + tokens * model.num_layers * attn
    return base


def narayanan_eq3(batch: int, seq_len: int, layers: int, hidden: int, vocab: int) -> float:
    """SC21 eq. 3 verbatim: 96 B s l h^2 (1 + s/(6h) + V/(16 l h)) (with full recomputation)."""
    return 96.0 * batch * seq_len * layers * hidden**2 * (1 + seq_len / (6 * hidden) + vocab / (16 * layers * hidden))
