"""Operator records: what the operator graph emits and the cost models consume.

Each operator kind has a fixed feature vector (``FEATURES``); FLOPs and bytes moved are carried
alongside so an analytical model and a learned model can share one record.
"""

from __future__ import annotations

from dataclasses import dataclass, field

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


@dataclass(frozen=True, slots=True)
class Op:
    """One operator instance (per micro-batch unless the phase says otherwise)."""

    kind: str
    """Operator kind, a key of FEATURES."""
    name: str
    """Role in the model, e.g. 'qkv', 'mlp_down.dgrad', 'tp_allreduce'."""
    phase: str
    """One of PHASES."""
    features: tuple
    """Values in the order of FEATURES[kind]."""
    flops: float = 0.0
    """Floating-point operations (0 for collectives)."""
    bytes: float = 0.0
    """HBM bytes moved (compute) or message bytes (collectives, nccl-tests convention)."""
    dtype: str = "bf16"
    """Precision of the operator's main math."""
    count: float = 1.0
    """How many times it runs where it appears (e.g. per layer)."""
    _key: tuple = field(default=(), init=False, repr=False, compare=False, hash=False)

    def __post_init__(self) -> None:
        # computed once: cost lookups ask for it many times per prediction
        object.__setattr__(self, "_key", (self.kind, self.dtype, self.features, self.phase == "bwd"))

    @property
    def backward(self) -> bool:
        """True for backward-pass operators (their kernels differ from the forward ones)."""
        return self.phase == "bwd"

    def key(self) -> tuple:
        """Identity of the operator for cost caching (independent of name and count)."""
        return self._key

    def feature_dict(self) -> dict:
        return dict(zip(FEATURES[self.kind], self.features))
