"""Attention operators beyond the dense block of :mod:`costmodel.graph.build`: multi-head latent attention (MLA) and
sliding-window attention, one layer and one micro-batch on one GPU.

:func:`costmodel.graph.build.layer_operators` calls these (this module sits between ``graph`` and ``opbuild`` in the
layers of pyproject.toml; its operator records are built with ``costmodel.graph.opbuild``, as graph's are).

Sources
-------
* [DSV2] DeepSeek-AI, "DeepSeek-V2", arXiv 2405.04434, sec. 2.1.2-2.1.3, eq. 9-19: c_Q = W_DQ h (eq. 12), q_C =
  W_UQ c_Q (13), q_R = RoPE(W_QR c_Q) (14), c_KV = W_DKV h (9), k_C = W_UK c_KV (10), k_R = RoPE(W_KR h) (15, one
  rotary key shared by all heads), v_C = W_UV c_KV (11), q = [q_C; q_R], k = [k_C; k_R] (16-17), o = softmax(q k^T
  / sqrt(d_h + d_R)) v (18), u = W_O o (19).
* [MCORE-MLA] Megatron-Core ``megatron/core/transformer/multi_latent_attention.py`` (MLASelfAttention) and
  ``megatron/core/models/gpt/gpt_layer_specs.py`` (``linear_q_down_proj=backend.linear()``,
  ``linear_kv_down_proj=backend.linear()``: TELinear with ``parallel_mode='duplicated'``): in training the down
  projections W_DQ and [W_DKV; W_KR] are replicated over TP and run on the layer's sequence-parallel shard
  ("q_compressed: [s / TP, b, q_lora_rank]", "kv_compressed: [s / TP, b, kv_lora_rank]"), followed by the
  q/kv RMSNorms; the up projections ``linear_q_up_proj`` / ``linear_kv_up_proj`` (W_UQ with W_QR fused, W_UK with
  W_UV fused) are column-parallel (heads / TP) and gather the sequence; ``k_pos_emb`` is gathered from the
  sequence-parallel region; the core runs with ``k_channels = qk_head_dim + qk_pos_emb_head_dim`` and
  ``v_channels = v_head_dim``; ``linear_proj`` is row-parallel. With ``q_lora_rank = None`` the query is one
  column-parallel ``linear_q_proj`` (h -> heads * (nope + rope)).
* [FA2-WINDOW] FlashAttention-2 ``window_size=(left, right)`` (Dao-AILab/flash-attention README, "sliding window
  local attention"): query i attends keys in [i - left, i + right]; causal sliding window = (w - 1, 0), i.e. the
  w most recent keys including itself; blocks outside the band are skipped.

Conventions
-----------
* Attention-core FLOPs count the two matmuls (QK^T and PV), 2 FLOPs per multiply-add, over the score pairs a
  query actually sees. Causal full attention: ``0.5 * s * S`` pairs per head (s local queries, S keys; the
  convention of ``graph.layer_operators``, the diagonal's half not added). Causal sliding window of ``w < S``
  keys: query p sees ``min(w, p + 1)`` keys; summed over the sequence that is ``S w - w (w - 1) / 2``, taken as
  ``S w - w^2 / 2`` so that w = S gives exactly the causal half, i.e. ``s (w - w^2 / (2 S))`` pairs per head on a
  rank holding s of the S queries. For w << S that is ``s w``: a window layer costs ~``4 b s w heads d`` FLOPs,
  not the causal half of it.
* Features of a window layer's attention: ``(b, s, w_k, heads, kv_heads, d, causal=0)``: a non-causal s x w_k
  attention (what the fitted attention models know how to cost), w_k = the keys the kernel visits per query
  (:func:`band_keys`: whole key tiles of :data:`KEY_TILE`, the band of a query tile spanning w + 127 keys); the
  FLOPs are the exact band count above (the MFU convention). With w >= S the operators are the causal full
  attention, bit for bit.
* Attention sinks (gpt-oss: a learned logit per head that joins every row's softmax; Megatron-Bridge runs it as
  Transformer Engine's ``softmax_type = "learnable"``, NeMo AutoModel as a FlexAttention score modification) add
  one score per query and head: no matmul, O(s heads) next to the band's O(s w heads d); not costed.
* MLA core: Q and K heads are ``d_qk = nope + rope`` wide, V and O heads ``d_v = v_head_dim``. FLOPs per pair and
  head: ``2 d_qk + 2 d_v``. The feature ``head_dim`` is ``(d_qk + d_v) / 2``, the width of an equal-dims attention
  with the same FLOPs (``4 * pairs * heads * head_dim``), so a model fitted on equal-dims kernels sees the MLA
  core's arithmetic; DeepSeek-V3 (192 / 128): 160. Bytes: Q, K of d_qk and V, O of d_v per head and token
  (every head has its own K: kv_heads = heads).
* The backward of an attention core: 2.5x the forward FLOPs and 2x its bytes (as ``graph.layer_operators``:
  FlashAttention-2, Dao 2023 sec. 3.1, five matmuls backward vs two forward).
"""

from __future__ import annotations

from costmodel.core.kinds import Phase
from costmodel.core.specs.model import ModelSpec
from costmodel.core.specs.plan import ParallelPlan
from costmodel.graph.opbuild import elem_bytes, gemm_fwd_bwd
from costmodel.graph.opbuild import mem as _mem
from costmodel.graph.ops import Op

ATTENTION_BWD_FLOPS = 2.5
"""Backward over forward FLOPs of a flash-attention core (FlashAttention-2, Dao 2023 sec. 3.1: 5 matmuls vs 2)."""
ATTENTION_BWD_BYTES = 2.0
"""Backward over forward bytes of a flash-attention core (reads Q, K, V, O, dO; writes dQ, dK, dV), as
graph/build.py."""


def norm_ops(name: str, rows: int, width: int, rms: int, dtype: str) -> list[Op]:
    """A norm over ``rows`` x ``width`` forward and backward (the records of graph/build.py's attn_norm)."""
    nbytes = rows * width * elem_bytes(dtype)
    return [_mem("norm", name, Phase.FWD, (rows, width, rms), 2 * nbytes, 8.0 * rows * width),
            _mem("norm", name, Phase.BWD, (rows, width, rms), 4 * nbytes, 16.0 * rows * width)]


def rope_ops(name: str, tokens: int, heads: int, d: int, dtype: str) -> list[Op]:
    """Rotary embedding of ``heads`` vectors of width d per token, forward and backward (graph/build.py's rope)."""
    elems = tokens * heads * d
    nbytes = 2 * elems * elem_bytes(dtype)
    return [_mem("rope", name, Phase.FWD, (tokens, heads, d), nbytes, 3.0 * elems),
            _mem("rope", name, Phase.BWD, (tokens, heads, d), nbytes, 3.0 * elems)]


KEY_TILE = 128
"""Keys per tile of the attention kernels that skip whole tiles outside a sliding window: FlashAttention-2
(Dao-AILab/flash-attention csrc/flash_attn/src/flash_fwd_launch_template.h, run_mha_fwd_hdim64/128: kBlockN
128 for head dim 64, 64-128 above), FlashAttention-3 (hopper/flash_fwd_launch_template.h run_mha_fwd_hdim64:
192 x 128 tiles for local attention) and FlexAttention's default sparse block (torch.nn.attention.flex_attention
``_DEFAULT_SPARSE_BLOCK_SIZE = 128``). The rows of a query tile of 128 see keys [i - w + 1, i + 127]: w + 127
keys, in whole tiles."""


def band_keys(window: int, s_full: int) -> int:
    """Keys a sliding-window kernel visits per query (masked ones included): the w + KEY_TILE - 1 keys a query tile
    needs, in whole tiles of :data:`KEY_TILE`, at most the sequence (window 128: 256 keys)."""
    return min(s_full, KEY_TILE * -(-(window + KEY_TILE - 1) // KEY_TILE))


def attention_pairs(s: int, s_full: int, window: int = 0) -> float:
    """Score pairs per head that ``s`` local queries of an ``s_full``-token causal sequence compute: ``0.5 s S``
    for full causal attention (``window`` 0 or >= S), ``s (w - w^2 / (2 S))`` for a sliding window of w keys
    (module Conventions)."""
    if window <= 0 or window >= s_full:
        return 0.5 * s * s_full
    return s * (window - window * window / (2.0 * s_full))


def attention_core_ops(b: int, s: int, s_full: int, heads: int, kv_heads: int, d: int, dtype: str, *,
                       window: int = 0, d_v: int = 0, name: str = "attention") -> list[Op]:
    """Forward and backward flash-attention core of one layer and micro-batch on one rank.

    b sequences, ``s`` local queries (S / CP) of ``s_full`` = S tokens, ``heads`` / ``kv_heads`` on this rank, Q/K
    head width ``d``; ``d_v`` = V/O head width when it differs (MLA; 0 = d); ``window`` = sliding-window span in
    keys (0 = full causal). With window 0 (or >= S) and d_v 0 the two operators are exactly those of
    ``graph.layer_operators``' dense attention: features (b, s, S, heads, kv_heads, d, 1), FLOPs
    ``4 b s S heads d / 2``, bytes of Q, K, V, O. Window < S: features (b, s, band_keys(w, S), heads, kv_heads, d,
    0) and the band's FLOPs; d_v: feature head_dim (d + d_v) / 2 (module Conventions)."""
    eb = elem_bytes(dtype)
    dv = d_v or d
    tokens = b * s
    pairs = b * heads * attention_pairs(s, s_full, window)
    flops = 2.0 * pairs * (d + dv)
    if dv == d:
        feat_d: float = d
    else:
        feat_d = (d + dv) // 2 if (d + dv) % 2 == 0 else (d + dv) / 2
    if 0 < window < s_full:
        feat = (b, s, band_keys(window, s_full), heads, kv_heads, feat_d, 0)
    else:
        feat = (b, s, s_full, heads, kv_heads, feat_d, 1)
    if dv == d:
        qkvo_bytes = eb * tokens * (2 * heads + 2 * kv_heads) * d
        if not (0 < window < s_full):
            flops = 4.0 * b * s * s_full * heads * d * 0.5  # the expression of graph/build.py, for bit-equal floats
    else:
        qkvo_bytes = eb * tokens * (heads * d + kv_heads * d + kv_heads * dv + heads * dv)
    return [_mem("attention_fwd", name, Phase.FWD, feat, qkvo_bytes, flops),
            _mem("attention_bwd", name, Phase.BWD, feat, ATTENTION_BWD_BYTES * qkvo_bytes,
                 ATTENTION_BWD_FLOPS * flops)]


def layer_window(model: ModelSpec, layer: int) -> int:
    """Sliding-window span of layer ``layer`` (0 = full attention), ``ModelSpec.uses_sliding_window``."""
    return model.sliding_window if model.uses_sliding_window(layer) else 0


# ------------------------------------------------------------------------------------------------ MLA
def mla_dims(model: ModelSpec) -> tuple[int, int, int]:
    """(nope, rope, v) per-head widths of an MLA model: Q/K head = nope + rope = ``head_dim``."""
    rope = model.qk_rope_head_dim
    return model.head_dim - rope, rope, model.v_head_dim or model.head_dim


def mla_tp_entry_bytes(model: ModelSpec, plan: ParallelPlan) -> float:
    """Bytes of the [s, b, width] tensor crossing the TP boundary at the entry of an MLA block, for
    ``graph.tp_boundary('qkv', True, plan, <this>, topo)`` in place of the dense block's ``tokens * h``:

    with sequence parallelism the replicated down projections run on the sequence shard and the column-parallel up
    projections all-gather their inputs, c_Q (q_lora_rank) and c_KV (kv_lora_rank), plus the rotary key k_R
    (qk_rope_head_dim) gathered for all heads [MCORE-MLA]; without SP the same widths' input gradients are
    all-reduced in backward. Without a query down projection (q_lora_rank 0) the query side gathers h."""
    tokens = plan.mbs * plan.seq_len // plan.cp
    q_in = model.q_lora_rank or model.hidden_size
    return float(tokens * (q_in + model.kv_lora_rank + model.qk_rope_head_dim) * elem_bytes(plan.dtype))


def mla_replicated_params(model: ModelSpec) -> int:
    """MLA weights replicated over TP per layer (W_DQ, [W_DKV; W_KR] and the q/kv norms [MCORE-MLA]); with sequence
    parallelism their gradients are partial sums over the TP ranks' sequence shards and are all-reduced over TP
    once per iteration (Megatron-Core finalize_model_grads all-reduces sequence-parallel parameters' grads)."""
    if not model.is_mla:
        return 0
    h, rope = model.hidden_size, model.qk_rope_head_dim
    q = h * model.q_lora_rank + model.q_lora_rank if model.q_lora_rank else 0
    return q + h * (model.kv_lora_rank + rope) + model.kv_lora_rank


def mla_attention_operators(model: ModelSpec, plan: ParallelPlan, window: int = 0) -> list[Op]:
    """Compute operators of one MLA self-attention block, one micro-batch, one GPU, forward and backward: from
    after the input norm (``attn_norm``) to the output projection (``attn_out``) inclusive.

    The TP collectives are not included: the caller wraps the list with ``tp_boundary('qkv', True, plan,
    mla_tp_entry_bytes(model, plan), topo)`` before and ``tp_boundary('attn_out', False, ...)`` after (the exit is
    the dense block's [s, b, h]). Recompute is the caller's too (``graph.recomputed`` of the FWD operators).

    T = b s tokens of the rank (s = S / CP), T_sp = T / TP with sequence parallelism, a = heads / TP, (nope, rope,
    v) from :func:`mla_dims` [DSV2] eq. 9-19 as run by Megatron-Core [MCORE-MLA]:
      mla.q_down (T_sp, q_lora, h), mla.q_norm (T_sp x q_lora), mla.q_up (T, a (nope + rope), q_lora)
        - or mla.q_proj (T, a (nope + rope), h) when q_lora_rank is 0;
      mla.kv_down (T_sp, kv_lora + rope, h), mla.kv_norm (T_sp x kv_lora), mla.kv_up (T, a (nope + v), kv_lora);
      mla.rope on the a query rope parts and the one shared rotary key: (T, a + 1, rope);
      attention core (:func:`attention_core_ops`, d = nope + rope, d_v = v, kv_heads = a);
      attn_out (T, h, a v).
    Each GEMM with its dgrad and wgrad. The down projections are replicated over TP (each rank runs them on its own
    T_sp rows; without SP every TP rank runs them on all T tokens). Forward GEMM FLOPs summed over the TP group are
    ``2 b S/CP x (attention_params - norm weights)``."""
    dtype = plan.dtype
    t = plan.tp
    b, s_full = plan.mbs, plan.seq_len
    s = s_full // plan.cp
    tokens = b * s
    sp_tokens = tokens // t if plan.sp else tokens
    h = model.hidden_size
    a = model.num_heads // t
    nope, rope, v = mla_dims(model)
    rms = 1 if model.norm == "rmsnorm" else 0
    ops: list[Op] = []
    if model.q_lora_rank:
        ops += gemm_fwd_bwd("mla.q_down", sp_tokens, model.q_lora_rank, h, dtype)
        ops += norm_ops("mla.q_norm", sp_tokens, model.q_lora_rank, rms, dtype)
        ops += gemm_fwd_bwd("mla.q_up", tokens, a * (nope + rope), model.q_lora_rank, dtype)
    else:
        ops += gemm_fwd_bwd("mla.q_proj", tokens, a * (nope + rope), h, dtype)
    ops += gemm_fwd_bwd("mla.kv_down", sp_tokens, model.kv_lora_rank + rope, h, dtype)
    ops += norm_ops("mla.kv_norm", sp_tokens, model.kv_lora_rank, rms, dtype)
    ops += gemm_fwd_bwd("mla.kv_up", tokens, a * (nope + v), model.kv_lora_rank, dtype)
    if rope:
        ops += rope_ops("mla.rope", tokens, a + 1, rope, dtype)
    ops += attention_core_ops(b, s, s_full, a, a, nope + rope, dtype, window=window, d_v=v)
    ops += gemm_fwd_bwd("attn_out", tokens, h, a * v, dtype)
    return ops
