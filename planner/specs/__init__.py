"""The three inputs of the cost model: model spec, parallel plan, hardware."""

from planner.specs.model import ModelSpec
from planner.specs.plan import ParallelPlan
from planner.specs.hardware import GPUSpec, ClusterSpec, Hardware

__all__ = ["ModelSpec", "ParallelPlan", "GPUSpec", "ClusterSpec", "Hardware"]
