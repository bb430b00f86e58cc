"""Bottom layer: the vocabulary every other part of planner shares.

Errors, atomic file IO, data-folder paths, the three cost-model inputs (model spec, parallel plan,
hardware; :mod:`costmodel.core.specs`) and the operator kind tables (:mod:`costmodel.core.kinds`).
Nothing here imports from the rest of ``costmodel`` or from ``planner`` (checked by import-linter,
``pyproject.toml`` ``[tool.importlinter]``).
"""
