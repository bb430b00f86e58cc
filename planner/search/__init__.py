"""Plan search: search space, Optuna / exhaustive engines, ranked records, compare and size.

Called, the package runs a search: ``planner.search(model="llama-13b", gpus=128)`` is
:func:`planner.search.api.search` (the command `planner search` as a function; its module also has
:func:`~planner.search.api.size` and :func:`~planner.search.api.compare`). Engine entry points:
:func:`planner.search.engine.search` (returns a SearchResult whose ``records`` are ranked :class:`PlanRecord`),
:func:`planner.search.sizing.compare`, :func:`planner.search.sizing.size`.
"""

import sys
import types

from planner.search import api as _api
from planner.search.engine import SearchResult, exhaustive_search, optuna_search, search
from planner.search.records import PlanRecord, pareto_front, rank
from planner.search.space import SearchProblem, SearchSpace, Target, build_problem, load_space, make_target

__all__ = ["PlanRecord", "SearchProblem", "SearchResult", "SearchSpace", "Target", "build_problem",
           "exhaustive_search", "load_space", "make_target", "optuna_search", "pareto_front", "rank", "search"]


class _SearchPackage(types.ModuleType):
    """This package, callable as the Python API's search (a module's class may be set to a subclass of
    ModuleType: Python reference, "Customizing module attribute access")."""

    def __call__(self, **flags):
        """planner.search(**flags): :func:`planner.search.api.search`."""
        return _api.search(**flags)


sys.modules[__name__].__class__ = _SearchPackage
