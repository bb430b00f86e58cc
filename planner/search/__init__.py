"""Plan search: search space, Optuna / exhaustive engines, ranked records, compare and size.

Entry points: :func:`planner.search.engine.search` (returns a SearchResult whose ``records`` are
ranked :class:`PlanRecord`), :func:`planner.search.sizing.compare`, :func:`planner.search.sizing.size`.
"""

from planner.search.engine import SearchResult, exhaustive_search, optuna_search, search
from planner.search.records import PlanRecord, pareto_front, rank
from planner.search.space import SearchProblem, SearchSpace, Target, build_problem, load_space, make_target

__all__ = ["PlanRecord", "SearchProblem", "SearchResult", "SearchSpace", "Target", "build_problem",
           "exhaustive_search", "load_space", "make_target", "optuna_search", "pareto_front", "rank", "search"]
