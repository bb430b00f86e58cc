"""The operator-cost seam: every operator time in planner comes through this interface."""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Sequence

import numpy as np

from costmodel.core.kinds import CostSource
from costmodel.core.specs.hardware import Hardware
from costmodel.graph.ops import Op


@dataclass
class CostResult:
    """Times for a batch of operators (seconds, one entry per operator, for ``count`` = 1)."""

    time_s: np.ndarray
    """Point prediction per operator, seconds."""
    low_s: np.ndarray | None = None
    """Lower end of the prediction interval (None = no interval)."""
    high_s: np.ndarray | None = None
    """Upper end of the prediction interval."""
    method: list[str] = field(default_factory=list)
    """Per operator: which model produced it (e.g. 'roofline', 'xgboost:a100-80gb')."""
    source: list[CostSource] = field(default_factory=list)
    """Per operator: the kind of source behind ``method`` (empty when a model does not say)."""
    warnings: list[str] = field(default_factory=list)
    """Out-of-range, fallback and similar notes (deduplicated)."""


class OperatorCostModel(ABC):
    """Predict operator times on given hardware.

    Implementations follow a fit/predict shape: ``fit`` learns from measured samples (analytical
    models may ignore it and return ``self``), ``predict`` returns one time per operator.
    """

    name: str = "base"

    def fit(self, ops: Sequence[Op], times_s: Sequence[float], hardware: Hardware) -> "OperatorCostModel":
        """Learn from measured operator times; returns self."""
        return self

    @abstractmethod
    def supports(self, kind: str, hardware: Hardware) -> bool:
        """True when this model can cost operators of ``kind`` on ``hardware``."""

    @abstractmethod
    def predict(self, ops: Sequence[Op], hardware: Hardware) -> CostResult:
        """Times for ``ops`` on ``hardware`` (count is *not* applied)."""
