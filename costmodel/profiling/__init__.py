"""Profiling harness: operator and collective sampling, torchrun workloads (the only torch users)."""
