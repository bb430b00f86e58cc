"""Operator kinds and phases: the vocabulary shared by the operator graph, the cost models, the datasets
and the sampling harness (bottom layer: imports nothing from the project)."""

from __future__ import annotations

from collections.abc import Mapping
from enum import StrEnum

# Feature names per operator kind. norm: rms = 1 for RMSNorm and 0 for LayerNorm (different kernels:
# e.g. estimate-train-time's RMSNorm is an unfused Megatron implementation). activation: width = elements
# per token of its input (2F for gated MLPs), gated = 1 for gated (SwiGLU) and 0 for plain (GELU, squared
# ReLU). Collectives' ``bytes`` is the per-rank buffer in the nccl-tests convention: all_reduce = the full
# buffer; all_gather = the full *output* buffer; reduce_scatter = the full *input* buffer; send_recv = the
# message; all_to_all = the full buffer.
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



class Phase(StrEnum):
    """When an operator runs in a training iteration (the values of PHASES, in that order)."""

    FWD = "fwd"
    """Forward pass, per micro-batch."""
    BWD = "bwd"
    """Backward pass, per micro-batch."""
    RECOMPUTE = "recompute"
    """Forward operators re-run in the backward pass (activation recomputation), per micro-batch."""
    OPTIMIZER = "optimizer"
    """The optimizer step, once per iteration."""
    DP_COMM = "dp_comm"
    """Data-parallel gradient reduction, once per iteration."""
    PP_COMM = "pp_comm"
    """Pipeline send/receive between adjacent stages, per micro-batch."""
    ZERO_COMM = "zero_comm"
    """Distributed-optimizer parameter all-gather, once per iteration."""


class Category(StrEnum):
    """Where an operator's time counts in a prediction's breakdown and bottleneck. The values are the
    category names planner prints (bottleneck, search reports)."""

    COMPUTE = "compute"
    PIPELINE_BUBBLE = "pipeline bubble"
    TP_COMM = "exposed TP comm"
    CP_COMM = "exposed CP comm"
    PP_COMM = "exposed PP comm"
    DP_COMM = "exposed DP comm"
    ZERO_COMM = "exposed ZeRO comm"
    EP_COMM = "exposed EP comm"
    """MoE token dispatch / combine over the expert-parallel (and expert-tensor-parallel) group."""
    OPTIMIZER = "optimizer"
    FRAMEWORK = "framework overhead"
    RANK_SKEW = "rank skew wait"


class CostSource(StrEnum):
    """Where one operator's time came from (what the cost models in costmodel/cost/ distinguish)."""

    MEASURED = "measured"
    """A regressor fitted on measured samples of this operator kind and direction."""
    DERIVED = "derived"
    """A measured regressor of another kind or direction, through a recorded derivation (e.g. a backward
    GEMM through the forward GEMM model, attention backward as a ratio of the forward model)."""
    ROOFLINE = "roofline"
    """The analytical roofline / alpha-beta model."""
    NONE = "none"
    """No cost: a collective over one rank or of zero bytes."""


def describe_cost_sources(counts: Mapping[str, int], cost_model: str = "") -> str:
    """'measured 41 ops, roofline 6, derived 3' from counts per cost source ({source: operators}, in the
    order to print); ``cost_model`` (or 'n/a') when there are no counts."""
    parts = [f"{name} {n}" for name, n in counts.items()]
    if not parts:
        return cost_model or "n/a"
    parts[0] += " ops"
    return ", ".join(parts)


PHASES: tuple[str, ...] = tuple(p.value for p in Phase)
"""The phase names, in the order of :class:`Phase`."""
