"""Operator cost models behind one seam (:class:`OperatorCostModel`)."""

from costmodel.cost.base import CostResult, CostSource, OperatorCostModel

__all__ = ["CostResult", "CostSource", "OperatorCostModel"]
