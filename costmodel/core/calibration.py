"""What the cost model needs of a calibration (:class:`Calibration`); planner's fitted calibration
(:class:`planner.calibrate.Calibration`, a JSON file from `planner calibrate`) is one.

A calibration acts on the composition, never on single operators' shapes: it scales compute and collective
operator times (:meth:`Calibration.scaler`), limits how much of the DP gradient reduction hides under backward
(``overlap_efficiency``) and adds a fixed framework overhead per iteration (``iteration_overhead_s``).
Where a function takes ``calibration: Calibration | None``, None is the uncalibrated cost model (every scale
1, overlap efficiency 1, no overhead).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

from costmodel.core.specs.hardware import Hardware
from costmodel.core.specs.model import ModelSpec
from costmodel.core.specs.plan import ParallelPlan


class Calibration(Protocol):
    """A named set of composition constants the cost model applies to a plan's operator times and timeline."""

    @property
    def name(self) -> str:
        """Name the outputs report."""
        ...

    @property
    def overlap_efficiency(self) -> float:
        """Fraction of the DP gradient reduction that can hide under the last backward (1 = all)."""
        ...

    @property
    def iteration_overhead_s(self) -> float:
        """Fixed seconds added to every iteration (<= 0: none)."""
        ...

    def scaler(self, plan: ParallelPlan, hardware: Hardware, model: ModelSpec | None = None) -> Callable[[dict], dict]:
        """The scaling of operator times (keyed by Op.key()) for ``plan`` of ``model`` on ``hardware`` (its
        framework, GPU and whether the model is a mixture of experts may matter)."""
        ...

    def applies_to(self, hardware: Hardware) -> bool:
        """Whether the calibration is applied on ``hardware`` (a calibration fitted on GPU runs is not
        applied to the CPU device)."""
        ...

    def warnings_for(self, cost_model_name: str) -> list[str]:
        """Notes on applying the calibration on top of the cost model named ``cost_model_name``."""
        ...

    def interval_group(self, gpu: str, framework: str, moe: bool = False) -> tuple[str, dict] | None:
        """(group, {n, q_low, q_high}) of the calibration's 80 % interval for plans on ``gpu`` run by ``framework``
        (log residuals of held-out runs, planner.intervals; ``moe``: its table for mixture-of-experts plans);
        None = no such table."""
        ...
