"""Where fitted operator models are written (`planner fit`) and read (predict, search, explain, validate).

`planner fit` never writes into the installed package: by default it writes to the user's cache,
``$XDG_CACHE_HOME/planner/models`` (``~/.cache/planner/models`` when XDG_CACHE_HOME is unset; the XDG Base
Directory Specification's user cache directory), or to ``--out DIR``. Predictions read fitted models from
``--models DIR`` or ``$PLANNER_MODELS_DIR`` (:data:`costmodel.cost.measured.ENV_MODELS_DIR`), then from the
models shipped with planner (``costmodel/data/models``), GPU by GPU
(:class:`costmodel.cost.measured.MeasuredCostModel`).
A fit into the default user folder is not picked up silently: the fit says how to use it.
"""

from __future__ import annotations

import os
from pathlib import Path

import typer

from costmodel.core.errors import PlannerError
from costmodel.cost.measured import ENV_MODELS_DIR
from costmodel.cost.regressors.artifacts import INDEX, SHIPPED_MODELS_DIR


def user_models_dir() -> Path:
    """Default output folder of `planner fit`: ``$XDG_CACHE_HOME/planner/models`` or ``~/.cache/planner/models``."""
    xdg = os.environ.get("XDG_CACHE_HOME", "").strip()
    # XDG Base Directory Specification: a relative XDG_CACHE_HOME is invalid and must be ignored
    base = Path(xdg) if xdg and Path(xdg).is_absolute() else Path.home() / ".cache"
    return base / "planner" / "models"


def fit_output_dir(out: Path | None) -> Path:
    """Where `planner fit` writes: ``out``, else :func:`user_models_dir`. The shipped models folder is written
    only when ``--out`` names it (maintainers regenerating the shipped models from a source checkout)."""
    target = Path(out).expanduser() if out is not None else user_models_dir()
    if target.resolve() == SHIPPED_MODELS_DIR.resolve():
        typer.echo(f"note: --out is planner's shipped models folder ({SHIPPED_MODELS_DIR}): regenerating the "
                   "shipped models", err=True)
    return target


def use_models_dir(path: Path | None) -> None:
    """Make ``path`` (a folder written by `planner fit`) the first place predictions look for fitted models in
    this process (sets $PLANNER_MODELS_DIR, which the catalogue also reads for a fitted ``hardware.toml``);
    None leaves the environment as it is."""
    if path is None:
        return
    path = Path(path).expanduser()
    if not (path / INDEX).is_file():
        raise PlannerError(f"--models {path} holds no {INDEX}; pass a folder written by `planner fit --out DIR`")
    os.environ[ENV_MODELS_DIR] = str(path.resolve())
    from costmodel.estimate import default_cost_model  # deferred: the estimate imports the whole cost stack

    default_cost_model.cache_clear()


def models_dir_for(gpu: str, cost_model=None) -> str:
    """The models folder predictions of ``gpu`` read ('' when no fitted model covers it: roofline only),
    following :class:`~costmodel.cost.measured.MeasuredCostModel`'s order (its ``dirs``, first with the GPU)."""
    if cost_model is None:
        from costmodel.estimate import default_cost_model  # deferred: the estimate imports the whole cost stack

        cost_model = default_cost_model()
    for d in getattr(cost_model, "dirs", ()):
        if (Path(d) / gpu).is_dir() and (Path(d) / INDEX).exists():
            return str(d)
    return ""


def announce_models_dir() -> None:
    """One stderr line naming the user models folder in effect ($PLANNER_MODELS_DIR or --models), if any."""
    env = os.environ.get(ENV_MODELS_DIR)
    if env:
        typer.echo(f"fitted models: {env} (PLANNER_MODELS_DIR / --models), shipped models for other GPUs", err=True)
