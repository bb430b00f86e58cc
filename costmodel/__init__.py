"""Cost model: operator graph, operator costs, timeline and memory.

Nothing here imports torch except :mod:`costmodel.profiling.sampling` (the profiling harness).
"""
