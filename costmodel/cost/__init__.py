"""Operator cost models behind one seam (:class:`OperatorCostModel`)."""

from costmodel.cost.base import CostResult, OperatorCostModel

__all__ = ["CostResult", "OperatorCostModel"]
