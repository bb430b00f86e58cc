"""Markdown writing helpers: atomic file writes, tables, image links, the report header.

Reports are date-free on purpose: regenerating one for the same inputs gives the same file, so a
checked-in report changes only when the numbers do.
"""

from __future__ import annotations

import os
import shlex
import sys
import uuid
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator, Sequence

from planner.errors import PlannerError


@dataclass
class ReportFiles:
    """Files one report writer produced."""

    markdown: Path
    """The .md report."""
    images: list[Path] = field(default_factory=list)
    """PNG plots beside it, linked relatively from the .md."""


def report_path(path: str | os.PathLike) -> Path:
    """The report path checked: it must name a .md file (its folder is created when written)."""
    p = Path(path)
    if p.suffix.lower() != ".md" or not p.stem:
        raise PlannerError(f"--report {str(path)!r} must be a Markdown file path ending in .md, "
                           "e.g. reports/llama-13b.md.")
    if p.exists() and p.is_dir():
        raise PlannerError(f"--report {str(path)!r} is a folder; give a file path such as {p / 'report.md'}.")
    return p


def sibling(md_path: Path, suffix: str) -> Path:
    """``reports/NAME.md`` + ``'pareto'`` -> ``reports/NAME_pareto.png``."""
    return md_path.with_name(f"{md_path.stem}_{suffix}.png")


@contextmanager
def atomic_writer(path: str | os.PathLike, binary: bool = False) -> Iterator:
    """Open a temporary file beside ``path``; on success it replaces ``path`` (os.replace, atomic on
    POSIX and Windows), on an exception it is removed and ``path`` is left as it was."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{uuid.uuid4().hex[:12]}.tmp")
    # mode 0o666 less the umask, as an ordinary open() would give (mkstemp would make it 0o600)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_BINARY", 0), 0o666)
    try:
        with os.fdopen(fd, "wb" if binary else "w", **({} if binary else {"encoding": "utf-8", "newline": "\n"})) as fh:
            yield fh
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise


def atomic_write_text(path: str | os.PathLike, text: str) -> Path:
    """Write ``text`` (UTF-8, LF line ends) to ``path`` atomically."""
    with atomic_writer(path) as fh:
        fh.write(text)
    return Path(path)


def atomic_write_bytes(path: str | os.PathLike, data: bytes) -> Path:
    """Write ``data`` to ``path`` atomically."""
    with atomic_writer(path, binary=True) as fh:
        fh.write(data)
    return Path(path)


def command_line(argv: Sequence[str] | None = None) -> str:
    """The command that produced a report, shell-quoted, with ``planner`` as the program name
    (``argv`` defaults to sys.argv)."""
    argv = list(sys.argv if argv is None else argv)
    return shlex.join(["planner", *argv[1:]])


def md_escape(cell: object) -> str:
    """A table cell: pipes escaped, line breaks flattened."""
    return str(cell).replace("|", "\\|").replace("\n", " ")


def md_table(headers: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    """A GitHub-flavoured Markdown table (ends with a newline)."""
    lines = ["| " + " | ".join(md_escape(h) for h in headers) + " |", "|" + "---|" * len(headers)]
    lines += ["| " + " | ".join(md_escape(c) for c in row) + " |" for row in rows]
    return "\n".join(lines) + "\n"


def image_link(alt: str, image: Path, md_path: Path) -> str:
    """``![alt](relative/path.png)`` relative to the folder of the .md, with forward slashes."""
    rel = os.path.relpath(Path(image).resolve(), Path(md_path).resolve().parent)
    return f"![{alt}]({Path(rel).as_posix()})"


def header(title: str, command: str, cost_models: Sequence[str], extra: Sequence[str] = ()) -> str:
    """Title, the command in a code block, the planner version and the cost model(s) used."""
    from planner import __version__

    models = ", ".join(sorted(set(cost_models))) or "-"
    lines = [f"# {title}", "", "Produced by:", "", "```sh", command, "```", "",
             f"planner {__version__}; operator cost model: {models}."]
    lines += list(extra)
    return "\n".join(lines) + "\n"
