"""Operator cost models behind one seam (:class:`OperatorCostModel`), the regressors the measured one reads
(:mod:`costmodel.cost.regressors`), and the adjustments of operator times (:mod:`costmodel.cost.fp8_block`,
:mod:`costmodel.cost.framework_kernels`, :mod:`costmodel.cost.moe_kernels`)."""

from costmodel.cost.base import CostResult, CostSource, OperatorCostModel

__all__ = ["CostResult", "CostSource", "OperatorCostModel"]
