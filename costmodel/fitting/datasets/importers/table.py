"""Reading a source CSV: the header is checked against the layout its PROVENANCE.md describes.

One reader and one SHA-256 cache serve every importer and the efficiency fit (:mod:`costmodel.fitting.efficiency`).
"""

from __future__ import annotations

import csv
import hashlib
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from costmodel.core.errors import PlannerError

_SHA: dict[Path, str] = {}


def sha256(path: Path) -> str:
    path = Path(path).resolve()
    if path not in _SHA:
        _SHA[path] = hashlib.sha256(path.read_bytes()).hexdigest()
    return _SHA[path]


class Table:
    """A source CSV whose header was checked: columns by name, rows in file order."""

    def __init__(self, path: Path, rel: str, header: list[str], rows: list[list[str]]):
        self.path, self.rel, self.header = path, rel, header
        self.n = len(rows)
        self._cols = {name: list(col) for name, col in zip(header, zip(*rows))} if rows else \
            {name: [] for name in header}

    def __contains__(self, name: str) -> bool:
        return name in self._cols

    def text(self, name: str) -> np.ndarray:
        return np.array(self._cols[name], dtype=object)

    def num(self, name: str) -> np.ndarray:
        col = self._cols[name]
        try:
            return np.array(col, dtype=float)
        except ValueError:
            for i, v in enumerate(col):
                try:
                    float(v)
                except ValueError:
                    raise PlannerError(f"{self.rel} line {i + 2}, column {name!r}: {v!r} is not a number; "
                                       "restore the original file from its source") from None
            raise

    def __getitem__(self, name: str) -> np.ndarray:  # the filters' table interface
        col = self._cols[name]
        try:
            return np.array(col, dtype=float)
        except ValueError:
            return np.array(col, dtype=object)

    def keys(self):
        return self._cols.keys()

    def values(self):
        return (self[k] for k in self._cols)


def read_table(data: Path, path: Path, expected: Sequence[str] | Sequence[Sequence[str]],
               strip: bool = False) -> Table:
    """Read ``path`` and check its header against ``expected`` (one header, or a list of allowed headers).

    A header that differs raises a PlannerError naming the file and the first differing column.
    """
    rel = str(path.relative_to(data)) if path.is_relative_to(data) else str(path)
    allowed: list[list[str]] = ([[str(c) for c in expected]] if isinstance(expected[0], str)
                                else [list(e) for e in expected])
    try:
        with open(path, encoding="utf-8", newline="") as fh:
            rows = [r for r in csv.reader(fh, skipinitialspace=strip) if r]
    except FileNotFoundError:
        raise PlannerError(f"source file {rel} does not exist under {data}; restore it from its source") from None
    except (UnicodeDecodeError, csv.Error) as exc:
        raise PlannerError(f"source file {rel} is not a readable CSV ({exc}); restore it from its source") from None
    if strip:
        rows = [[c.strip() for c in r] for r in rows]
    if not rows:
        raise PlannerError(f"source file {rel} is empty; restore it from its source")
    header, body = rows[0], rows[1:]
    if header not in allowed:
        exp = min(allowed, key=lambda e: -sum(a == b for a, b in zip(e, header)))
        i = next((i for i, (a, b) in enumerate(zip(header, exp)) if a != b), min(len(header), len(exp)))
        got = repr(header[i]) if i < len(header) else "(no column)"
        want = repr(exp[i]) if i < len(exp) else "(no column)"
        raise PlannerError(f"source file {rel}: column {i + 1} of the header is {got}, expected {want}; the file "
                           "does not have the layout its PROVENANCE.md describes (restore it or update the importer)")
    for i, r in enumerate(body):
        if len(r) != len(header):
            raise PlannerError(f"source file {rel} line {i + 2} has {len(r)} fields, expected {len(header)} "
                               "(truncated or corrupted file; restore it from its source)")
    return Table(path, rel, header, body)

