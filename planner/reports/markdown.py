"""Markdown writing helpers: atomic file writes, tables, image links, the report header.

Reports are date-free on purpose: regenerating one for the same inputs gives the same file, so a
checked-in report changes only when the numbers do.
"""

from __future__ import annotations

import os
import shlex
import sys

from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence

from costmodel.core.errors import PlannerError
from costmodel.core.fileio import atomic_write_bytes, atomic_write_text, atomic_writer  # noqa: F401 (re-exported)
from planner import __version__


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
    models = ", ".join(sorted(set(cost_models))) or "-"
    lines = [f"# {title}", "", "Produced by:", "", "```sh", command, "```", "",
             f"planner {__version__}; operator cost model: {models}."]
    lines += list(extra)
    return "\n".join(lines) + "\n"
