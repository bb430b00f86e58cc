"""planner: predict LLM training iteration time, memory and cost for a parallel layout.

The Python API is the command line as functions, with the same keywords (flag names with underscores) and
defaults; each returns a typed result whose ``to_dict()`` is the command's ``--format json`` object:

- ``planner.predict(model="llama-13b", gpu="a100-80gb", gpus=16, tp=2, pp=2)`` (:func:`planner.api.predict`)
- ``planner.explain(...)``, the same keywords (:func:`planner.api.explain`)
- ``planner.search(model="llama-13b", gpus=128)`` (:func:`planner.search.api.search`)
- ``planner.size(model=..., tokens="300B", deadline="21d")`` (:func:`planner.search.api.size`)
- ``planner.compare(model=..., gpu=["a100-80gb", "gh200"], gpus=64)`` (:func:`planner.search.api.compare`)

Bad input raises :class:`PlannerError` (a layout that does not fit the model: :class:`PlanError`).
"""

__version__ = "0.1.0"  # before the imports below: planner.calibrate reads it

from costmodel.core.errors import PlanError, PlannerError  # noqa: E402
from planner import search  # noqa: E402  (the package, callable: planner.search(...) runs a search)
from planner.api import explain, predict  # noqa: E402
from planner.search.api import compare, size  # noqa: E402

__all__ = ["PlanError", "PlannerError", "compare", "explain", "predict", "search", "size"]
