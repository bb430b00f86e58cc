"""Cost model, one package per concern: :mod:`costmodel.graph` (operator graph), :mod:`costmodel.cost` (operator costs
and their adjustments), :mod:`costmodel.memory`, :mod:`costmodel.schedule` (composition, pipeline timeline),
:mod:`costmodel.fitting` (offline fits), :mod:`costmodel.profiling` (the harness); :func:`costmodel.estimate.estimate`
costs a plan; :mod:`costmodel.core` is the shared vocabulary at the bottom.

Nothing here imports torch except :mod:`costmodel.profiling.sampling` (the profiling harness).
"""
