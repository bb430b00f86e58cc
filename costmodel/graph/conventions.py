"""FLOP and byte conventions of the operator kinds, shared by the roofline cost model
(:mod:`costmodel.cost.roofline`), the regressors' derived features (:mod:`costmodel.cost.regressors.features`)
and the efficiency fit (:mod:`costmodel.fitting.efficiency`), so the three count work the same way.

GEMM FLOPs = 2mnk; attention forward FLOPs = 4·b·s_q·s_kv·h·d (Q·Kᵀ and P·V, FlashAttention-2 paper
§4.1 counting), halved when causal; memory-bound operators count the bytes of the activation tensors
read plus written (fp16/bf16 = 2 bytes per element), see :func:`mem_bytes`. Collective bus-bandwidth
factors follow nccl-tests doc/PERFORMANCE.md.
"""

from __future__ import annotations

import math

import numpy as np

MEMORY_KINDS = ("norm", "activation", "rope", "residual_add", "embedding", "cross_entropy", "optimizer")

# Adam step bytes per parameter: read fp32 param, grad, m, v (16 B), write param, m, v (12 B) —
# the tensors Apex FusedAdam's multi_tensor_adam kernel reads and writes (fp32 master weights and
# fp32 main grads as in Megatron-LM mixed precision).
ADAM_BYTES_PER_PARAM = 28.0


def dtype_bytes(dtype: str) -> float:
    """Bytes per element of a dtype (physical definition)."""
    return {"fp8": 1.0, "bf16": 2.0, "fp16": 2.0, "tf32": 4.0, "fp32": 4.0}.get(dtype, 2.0)


def gemm_flops(m, n, k):
    """2·m·n·k (one multiply-add = 2 FLOPs)."""
    return 2.0 * m * n * k


def gemm_bytes(m, n, k, dtype: str = "bf16"):
    """Read A[m,k], B[k,n], write C[m,n]; fp8 GEMMs read fp8 operands and write bf16."""
    e = dtype_bytes(dtype)
    return e * (m * k + k * n) + 2.0 * (m * n)


def attention_fwd_flops(batch, seq_q, seq_kv, heads, head_dim, causal):
    """4·b·s_q·s_kv·h·d for Q·Kᵀ plus P·V (FlashAttention-2, Dao 2023, §4.1); half when causal."""
    f = 4.0 * batch * seq_q * seq_kv * heads * head_dim
    return f * np.where(np.asarray(causal) > 0, 0.5, 1.0)


def attention_bytes(batch, seq_q, seq_kv, heads, kv_heads, head_dim):
    """Forward HBM traffic of a fused attention: read Q, K, V, write O (2 bytes per element)."""
    return 2.0 * batch * head_dim * (2.0 * seq_q * heads + 2.0 * seq_kv * kv_heads)


def mem_bytes(kind: str, features: dict, backward: bool):
    """Bytes read + written by a memory-bound operator (2 bytes per element; weights ignored).

    norm (tokens T, hidden H): fwd read x, write y = 2·T·H·2; bwd read dy, x, write dx = 3·T·H·2.
    activation (T, width W = elements per token of its input): fwd 2·T·W·2, bwd 3·T·W·2.
    rope (T, heads, head_dim): in place on one tensor, fwd and bwd 2·T·h·d·2.
    residual_add (elements E): read two, write one = 3·E·2 (fwd and bwd).
    embedding (T, H, V): fwd row gather, read + write 2·T·H·2; bwd read dy, write dW: (T·H + V·H)·2.
    cross_entropy (T, V): read logits, write softmax (fwd) / read softmax, write grad (bwd): 2·T·V·2.
    optimizer (params P): ADAM_BYTES_PER_PARAM·P.
    """
    f = features
    if kind == "norm":
        return (3.0 if backward else 2.0) * f["tokens"] * f["hidden"] * 2.0
    if kind == "activation":
        return (3.0 if backward else 2.0) * f["tokens"] * f["width"] * 2.0
    if kind == "rope":
        return 2.0 * f["tokens"] * f["heads"] * f["head_dim"] * 2.0
    if kind == "residual_add":
        return 3.0 * f["elements"] * 2.0
    if kind == "embedding":
        if backward:
            return (f["tokens"] * f["hidden"] + f["vocab"] * f["hidden"]) * 2.0
        return 2.0 * f["tokens"] * f["hidden"] * 2.0
    if kind == "cross_entropy":
        return 2.0 * f["tokens"] * f["vocab"] * 2.0
    if kind == "optimizer":
        return ADAM_BYTES_PER_PARAM * f["params"]
    raise KeyError(kind)


def inter_latency_steps(op: str, n: int) -> float:
    """How the fitted 2-node latency scales to ``n`` nodes (1.0 at n = 2).

    NCCL runs all-reduce across nodes as a double binary tree, whose latency grows with log2(n), and
    all-gather / reduce-scatter as a ring, whose latency grows with n - 1 steps (NCCL 2.4 release blog,
    "Massively Scale Your Deep Learning Training with NCCL 2.4", NVIDIA 2019; Sanders, Speck & Traeff 2009
    for the double tree). The measured inter-node alphas were fitted at 2 nodes.
    """
    if n <= 2:
        return 1.0
    if op == "all_reduce":
        return math.log2(n)
    if op in ("all_gather", "reduce_scatter", "all_to_all"):
        return float(n - 1)
    return 1.0


def busbw_factor_one(op: str, n: float) -> float:
    """:func:`busbw_factor` for one group size, in plain floats (graph building calls it per collective)."""
    if op == "all_reduce":
        return 2.0 * (n - 1.0) / n
    return 1.0 if op == "send_recv" else (n - 1.0) / n


def busbw_factor(op: str, n):
    """nccl-tests bus-bandwidth factor (doc/PERFORMANCE.md): bus bytes per buffer byte."""
    n = np.asarray(n, dtype=float)
    if op == "all_reduce":
        return 2.0 * (n - 1.0) / n
    if op == "send_recv":
        return np.ones_like(n)
    return (n - 1.0) / n
