"""Sampling harness: real micro-benchmarks of every operator kind (Zhang et al. arXiv 2509.22832 §III-A).

The only part of the project that imports torch, and only lazily (inside functions), so that
``import costmodel.profiling.sampling`` and the planner CLI work without torch installed.

* :mod:`~costmodel.profiling.sampling.plans` -- sampling plans (TOML data files: grids / Latin hypercubes)
* :mod:`~costmodel.profiling.sampling.plan` -- reading plans and expanding them into samples
* :mod:`~costmodel.profiling.sampling.operators` -- one benchmark per compute operator kind, timed with
  ``torch.utils.benchmark.Timer``
* :mod:`~costmodel.profiling.sampling.collectives` -- the ``torchrun`` worker sweeping collectives
* :mod:`~costmodel.profiling.sampling.journal` -- the resumable per-kind JSONL journal
* :mod:`~costmodel.profiling.sampling.runner` -- ``run_plan``: plan -> journal -> Datasets
* :mod:`~costmodel.profiling.sampling.fingerprint` -- the environment fingerprint stored with every dataset
"""

from costmodel.core.errors import PlannerError

TORCH_MISSING = "torch is not installed: pip install 'planner[profile]'"


def require_torch():
    """Import and return torch, or raise the one-line PlannerError telling how to install it."""
    try:
        import torch  # deferred: torch is optional (planner[profile]); only the sampling harness imports it
    except ImportError:
        raise PlannerError(TORCH_MISSING) from None
    return torch
