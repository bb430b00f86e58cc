"""Operator kinds and phases: the vocabulary shared by the operator graph, the cost models, the datasets
and the sampling harness (bottom layer: imports nothing from the project)."""

from __future__ import annotations

# Feature names per operator kind. norm: rms = 1 for RMSNorm and 0 for LayerNorm (different kernels:
# e.g. estimate-train-time's RMSNorm is an unfused Megatron implementation). activation: width = elements per token of its input (2F for gated
# MLPs), gated = 1 for gated (SwiGLU) and 0 for plain (GELU, squared ReLU). Collectives' ``bytes`` is the per-rank buffer in the
# nccl-tests convention: all_reduce = the full buffer; all_gather = the full *output* buffer;
# reduce_scatter = the full *input* buffer; send_recv = the message; all_to_all = the full buffer.
FEATURES: dict[str, tuple[str, ...]] = {
    "gemm": ("m", "n", "k"),
    "attention_fwd": ("batch", "seq_q", "seq_kv", "heads", "kv_heads", "head_dim", "causal"),
    "attention_bwd": ("batch", "seq_q", "seq_kv", "heads", "kv_heads", "head_dim", "causal"),
    "norm": ("tokens", "hidden", "rms"),
    "activation": ("tokens", "width", "gated"),
    "rope": ("tokens", "heads", "head_dim"),
    "residual_add": ("elements",),
    "embedding": ("tokens", "hidden", "vocab"),
    "cross_entropy": ("tokens", "vocab"),
    "optimizer": ("params",),
    "all_reduce": ("bytes", "ranks", "nodes", "ranks_per_node"),
    "all_gather": ("bytes", "ranks", "nodes", "ranks_per_node"),
    "reduce_scatter": ("bytes", "ranks", "nodes", "ranks_per_node"),
    "send_recv": ("bytes", "ranks", "nodes", "ranks_per_node"),
    "all_to_all": ("bytes", "ranks", "nodes", "ranks_per_node"),
}
COMPUTE_KINDS = frozenset(k for k in FEATURES if k not in
                          ("all_reduce", "all_gather", "reduce_scatter", "send_recv", "all_to_all"))
COLLECTIVE_KINDS = frozenset(FEATURES) - COMPUTE_KINDS

PHASES = ("fwd", "bwd", "recompute", "optimizer", "dp_comm", "pp_comm", "zero_comm")
