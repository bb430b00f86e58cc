"""The `planner` command line (typer).

Each command group lives in its own module with a ``register(app)`` function; this file imports
them by name (a missing or broken module is an ImportError, never a silently missing command),
registers them in the order of :data:`COMMAND_MODULES`, and turns
:class:`~costmodel.core.errors.PlannerError` into one line + exit code 2.
"""

from __future__ import annotations

import sys

import typer

from costmodel.core.errors import PlannerError
from planner import (
    cli_calibrate,
    cli_catalogue,
    cli_export,
    cli_fit,
    cli_models,
    cli_predict,
    cli_profile,
    cli_runs,
    cli_search,
    cli_validate,
)

app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    help="Predict LLM training iteration time, memory and cost per token; search parallel layouts.",
    pretty_exceptions_enable=False,
    # plain-text help: rich markup would eat bracketed units ("[us]") and make ":b:" of "A:B:STEP" an emoji
    rich_markup_mode=None,
)


@app.callback()
def _root() -> None:
    """Predict LLM training iteration time, memory and cost per token; search parallel layouts."""


# The modules that add commands, in the order of `planner --help`; each defines register(app).
COMMAND_MODULES = (
    cli_predict,
    cli_catalogue,
    cli_models,
    cli_validate,
    cli_search,
    cli_export,
    cli_profile,
    cli_fit,
    cli_calibrate,
    cli_runs,
)

for _module in COMMAND_MODULES:
    _module.register(app)


def main(argv: list[str] | None = None) -> None:
    try:
        app(args=argv, standalone_mode=True)
    except PlannerError as exc:
        typer.echo(f"error: {exc}", err=True)
        sys.exit(2)
    except KeyboardInterrupt as exc:  # Ctrl-C outside a command (typer turns one inside into exit 130)
        _interrupted(exc)
    except SystemExit as exc:
        ki = _interrupt_cause(exc)
        if ki is None:
            raise
        _interrupted(ki)


def _interrupt_cause(exc: BaseException) -> KeyboardInterrupt | None:
    """The Ctrl-C behind an exit (typer raises Exit(130) from the KeyboardInterrupt), else None."""
    seen: BaseException | None = exc
    while seen is not None:
        if isinstance(seen, KeyboardInterrupt):
            return seen
        seen = seen.__cause__ or (None if seen.__suppress_context__ else seen.__context__)
    return None


def _interrupted(exc: KeyboardInterrupt) -> None:
    """One line ("interrupted" and how to go on, where the command said) and exit code 130."""
    hint = getattr(exc, "hint", "")
    typer.echo(f"interrupted; {hint}" if hint else "interrupted", err=True)
    sys.exit(130)


if __name__ == "__main__":
    main()
