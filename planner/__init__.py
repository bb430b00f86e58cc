"""planner: predict LLM training iteration time, memory and cost for a parallel layout."""

from costmodel.core.errors import PlanError, PlannerError

__all__ = ["PlannerError", "PlanError"]
__version__ = "0.1.0"
