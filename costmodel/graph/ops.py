"""Operator records: what the operator graph emits and the cost models consume.

Each operator kind has a fixed feature vector (``FEATURES``); FLOPs and bytes moved are carried
alongside so an analytical model and a learned model can share one record.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from costmodel.core.kinds import FEATURES, Category, Phase


@dataclass(frozen=True, slots=True)
class Op:
    """One operator instance (per micro-batch unless the phase says otherwise)."""

    kind: str
    """Operator kind, a key of FEATURES."""
    name: str
    """Role in the model, e.g. 'qkv', 'mlp_down.dgrad', 'tp_allreduce'."""
    phase: Phase
    """When it runs (a plain string such as 'fwd' is converted; ValueError for an unknown phase)."""
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
    category: Category | None = None
    """Where its time counts in a prediction's breakdown (set by :func:`costmodel.graph.build.build_graph` for
    every operator of a training step; None for operators built outside a step, e.g. sampling)."""
    _key: tuple = field(default=(), init=False, repr=False, compare=False, hash=False)

    def __post_init__(self) -> None:
        if type(self.phase) is not Phase:
            object.__setattr__(self, "phase", Phase(self.phase))
        if self.category is not None and type(self.category) is not Category:
            object.__setattr__(self, "category", Category(self.category))
        # computed once: cost lookups ask for it many times per prediction. The bytes belong to it: a
        # memory-bound operator of an fp32 plan has the features and dtype label of its bf16 twin but twice
        # the bytes, and without them a cost cached for one plan was reused for the other (the result of a
        # batch line depended on the lines before it)
        object.__setattr__(self, "_key", (self.kind, self.dtype, self.features, self.phase is Phase.BWD,
                                          self.bytes))

    @property
    def backward(self) -> bool:
        """True for backward-pass operators (their kernels differ from the forward ones)."""
        return self.phase is Phase.BWD

    def key(self) -> tuple:
        """Identity of the operator for cost caching: kind, dtype, features, direction and bytes moved
        (independent of name and count)."""
        return self._key

    def feature_dict(self) -> dict:
        return dict(zip(FEATURES[self.kind], self.features))
