"""Operator records: what the operator graph emits and the cost models consume.

Each operator kind has a fixed feature vector (``FEATURES``); FLOPs and bytes moved are carried
alongside so an analytical model and a learned model can share one record.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from costmodel.core.kinds import FEATURES


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
