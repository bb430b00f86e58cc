"""Tables that fit the terminal: one console and one fitting rule for every rich table the CLI prints.

Width: ``$COLUMNS`` when set, else a terminal's own width, else :data:`DEFAULT_WIDTH` (piped output); ``--wide``
(:func:`use_wide`) lifts the limit and shows every column. :func:`fit` drops a table's optional columns (each table
names them, least useful first; columns of one value go first and the note says the value) until every column fits
at its narrowest (a cell wraps only at its spaces, so a number stays whole), then gives each column a width, so
rich never folds or ellipsizes a cell; what it dropped is said under the table. :func:`legend` explains the
markers a table uses; :func:`progress_bar` is the progress display of long commands (stderr, terminals only).
"""

from __future__ import annotations

import os
import shutil
import sys
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager

from rich.console import Console
from rich.markup import escape
from rich.measure import Measurement
from rich.table import Column, Table
from rich.text import Text

DEFAULT_WIDTH = 100
"""Columns of piped output when $COLUMNS is not set (a common terminal width; issue reports used 100)."""
WIDE_WIDTH = 100_000
"""Width of a --wide console: no limit in practice (tables take their natural width)."""
_STATE = {"wide": False}


def use_wide(value: bool) -> bool:
    """--wide callback: every column at its natural width from now on in this process."""
    _STATE["wide"] = bool(value)
    return value


def is_wide() -> bool:
    return _STATE["wide"]


def output_width(stream=None) -> int:
    """Columns for ``stream`` (stdout by default): --wide: no limit; else $COLUMNS when set, a terminal's width,
    or DEFAULT_WIDTH when piped."""
    if is_wide():
        return WIDE_WIDTH
    stream = stream or sys.stdout
    columns = os.environ.get("COLUMNS", "")
    if columns.isdigit() and int(columns) > 0:
        return int(columns)
    if hasattr(stream, "isatty") and stream.isatty():
        return shutil.get_terminal_size((DEFAULT_WIDTH, 24)).columns
    return DEFAULT_WIDTH


def console(stderr: bool = False, **kwargs) -> Console:
    """The console every table and its notes print to (:func:`output_width`)."""
    return Console(stderr=stderr, width=output_width(sys.stderr if stderr else sys.stdout), **kwargs)


def header_text(col: Column) -> str:
    """A column's header as printed (markup escapes removed)."""
    return Text.from_markup(col.header).plain if isinstance(col.header, str) else str(col.header)


def _content_range(con: Console, col: Column) -> tuple[int, int, int]:
    """(narrowest, widest cell, widest with the header) content width of a column, padding excluded."""
    lo = cells = head = 1
    options = con.options.update_width(WIDE_WIDTH)
    for i, cell in enumerate((col.header, *col.cells)):
        m = Measurement.get(con, options, con.render_str(cell) if isinstance(cell, str) else cell)
        lo = max(lo, m.maximum if col.no_wrap else m.minimum)
        head = max(head, m.maximum)
        if i:
            cells = max(cells, m.maximum)
    return lo, max(lo, cells), head


def _padding(table: Table) -> int:
    """Padding columns of each cell (left + right), as rich counts them when it sizes a column."""
    _, right, _, left = table.padding
    return left + right


def _frame(table: Table) -> int:
    """Border columns: the edges and one rule between columns (rich's Table._extra_width)."""
    if not table.box:
        return 0
    return (2 if table.show_edge else 0) + len(table.columns) - 1


def _needed(con: Console, table: Table) -> tuple[list[tuple[int, int, int]], int]:
    """Content ranges per column and the columns the frame and padding take."""
    ranges = [_content_range(con, c) for c in table.columns]
    return ranges, _frame(table) + _padding(table) * len(table.columns)


def _constant(table: Table, headers: list[str]) -> list[str]:
    """The columns among ``headers`` whose cells are all the same (dropping them loses nothing said elsewhere)."""
    return [header_text(c) for c in table.columns
            if header_text(c) in headers and len(cells := list(map(str, c.cells))) > 1 and len(set(cells)) == 1]


def fit(table: Table, con: Console, drop: Iterable[str] = ()) -> list[str]:
    """Make ``table`` fit ``con``'s width: while its narrowest layout is too wide, drop a column named in ``drop``
    (headers; first those whose cells are all equal, then in ``drop``'s order), then size each column between its
    narrowest and widest. Returns what it dropped ('CP' or 'CP = 1' for a column of one value), for the note under
    the table."""
    dropped: list[str] = []
    order = [h for h in drop if h in {header_text(c) for c in table.columns}]
    order = _constant(table, order) + [h for h in order if h not in _constant(table, order)]
    ranges, frame = _needed(con, table)
    while sum(r[0] for r in ranges) + frame > con.width and order:
        header = order.pop(0)
        at = next(i for i, c in enumerate(table.columns) if header_text(c) == header)
        cells = set(map(str, table.columns[at].cells))
        dropped.append(f"{header} = {Text.from_markup(cells.pop()).plain}" if len(cells) == 1 else header)
        del table.columns[at]
        ranges, frame = _needed(con, table)
    _set_widths(table, ranges, con.width - frame)
    return dropped


def _shrink(widths: list[int], floors: list[int], excess: int) -> int:
    """Take up to ``excess`` columns from ``widths`` (not below ``floors``), in proportion to each one's slack;
    returns the excess left."""
    slack = [w - f for w, f in zip(widths, floors)]
    total = sum(slack)
    if total <= 0 or excess <= 0:
        return max(excess, 0)
    for i, sl in enumerate(slack):
        cut = min(sl, excess * sl // total)
        widths[i] -= cut
        slack[i] -= cut
    left = excess - (total - sum(slack))
    while left > 0 and any(slack):  # rounding: one at a time from the column with most slack left
        i = max(range(len(slack)), key=slack.__getitem__)
        widths[i] -= 1
        slack[i] -= 1
        left -= 1
    return left


def _set_widths(table: Table, ranges: list[tuple[int, int, int]], room: int) -> None:
    """Widths between each column's narrowest and widest adding up to ``room``: headers wrap first, then cells
    (at their spaces); none set when everything fits at full width."""
    widths = [head for _, _, head in ranges]
    excess = sum(widths) - room
    if excess <= 0:
        return
    excess = _shrink(widths, [cells for _, cells, _ in ranges], excess)
    _shrink(widths, [lo for lo, _, _ in ranges], excess)
    for col, w in zip(table.columns, widths):
        col.width = w


def dropped_note(dropped: list[str], con: Console) -> str:
    """The line under a table that lost columns to the width."""
    return (f"columns left out to fit {con.width}: {', '.join(dropped)} (--wide shows every column)"
            if dropped else "")


def legend(markers: dict[str, str], cells: Iterable[str]) -> str:
    """'legend: * = ...; e = ...' for the markers of ``markers`` found in ``cells`` ('' when none is used)."""
    text = " ".join(cells)
    used = [f"{m} = {why}" for m, why in markers.items() if m in text]
    return "legend: " + "; ".join(used) if used else ""


def print_table(con: Console, table: Table, drop: Iterable[str] = (), markers: dict[str, str] | None = None,
                marked: Iterable[str] = ()) -> None:
    """Fit ``table`` (:func:`fit`), print it, then its legend (the ``markers`` found in the ``marked`` cells)
    and which columns it left out."""
    dropped = fit(table, con, drop)
    con.print(table)
    for line in (legend(markers or {}, marked), dropped_note(dropped, con)):
        if line:
            con.print(escape(line))


@contextmanager
def progress_bar(description: str, enabled: bool = True) -> Iterator[Callable[[int, int], None]]:
    """A rich progress bar on stderr while the block runs (a terminal only, and ``enabled``), gone when done; yields
    the ``update(done, total)`` callback that feeds it."""
    # deferred: rich's progress display loads only around long work
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    err = Console(stderr=True)
    if not (enabled and err.is_terminal):  # no display object at all: rich 13's disabled Live still writes a newline
        yield lambda done, total: None
        return
    with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  console=err, transient=True) as bar:
        task = bar.add_task(description, total=None)
        yield lambda done, total: bar.update(task, completed=done, total=total)
