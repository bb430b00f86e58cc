"""The `planner` command line (typer).

Each command group lives in its own module with a ``register(app)`` function; this file only
assembles them and turns :class:`~costmodel.core.errors.PlannerError` into one line + exit code 2.
"""

from __future__ import annotations

import importlib
import sys

import typer

from costmodel.core.errors import PlannerError

app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    help="Predict LLM training iteration time, memory and cost per token; search parallel layouts.",
    pretty_exceptions_enable=False,
)



@app.callback()
def _root() -> None:
    """Predict LLM training iteration time, memory and cost per token; search parallel layouts."""


# Modules that add commands. A module listed here must define register(app).
COMMAND_MODULES = (
    "planner.cli_predict",
    "planner.cli_catalogue",
    "planner.cli_models",
    "planner.cli_validate",
    "planner.cli_search",
    "planner.cli_export",
    "planner.cli_profile",
    "planner.cli_fit",
    "planner.cli_calibrate",
)

for _mod in COMMAND_MODULES:
    try:
        importlib.import_module(_mod).register(app)
    except ModuleNotFoundError as exc:  # a command module not written yet must not break the others
        if exc.name != _mod:
            raise


def fail(message: str) -> "typer.Exit":
    """Print one line to stderr and return the exit (code 2) to raise."""
    typer.echo(f"error: {message}", err=True)
    return typer.Exit(code=2)


def main(argv: list[str] | None = None) -> None:
    try:
        app(args=argv, standalone_mode=True)
    except PlannerError as exc:
        typer.echo(f"error: {exc}", err=True)
        sys.exit(2)


if __name__ == "__main__":
    main()
