"""The three inputs of the cost model: model spec, parallel plan, hardware."""

from costmodel.core.specs.hardware import ClusterSpec, GPUSpec, Hardware
from costmodel.core.specs.model import ModelSpec
from costmodel.core.specs.plan import ParallelPlan

__all__ = ["ModelSpec", "ParallelPlan", "GPUSpec", "ClusterSpec", "Hardware"]
