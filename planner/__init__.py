"""planner: predict LLM training iteration time, memory and cost for a parallel layout."""

from planner.errors import PlanError, PlannerError

__all__ = ["PlannerError", "PlanError"]
__version__ = "0.1.0"
