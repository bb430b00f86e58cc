"""Errors that the CLI turns into one line on stderr and exit code 2."""


class PlannerError(ValueError):
    """A user-facing error: bad input, impossible plan, unknown name.

    The message is one sentence that names the problem and how to fix it.
    """


class PlanError(PlannerError):
    """An invalid parallel plan; the message lists every factor."""


class Interrupted(KeyboardInterrupt):
    """Ctrl-C, caught where the command can say how to go on: the CLI prints "interrupted; <hint>" (or
    "interrupted") as one line and exits with 130 (planner.cli.main)."""

    def __init__(self, hint: str = "", resumable: bool = False):
        super().__init__(hint)
        self.hint = hint
        self.resumable = resumable
