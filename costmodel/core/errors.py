"""Errors that the CLI turns into one line on stderr and exit code 2."""


class PlannerError(ValueError):
    """A user-facing error: bad input, impossible plan, unknown name.

    The message is one sentence that names the problem and how to fix it.
    """


class PlanError(PlannerError):
    """An invalid parallel plan; the message lists every factor."""
