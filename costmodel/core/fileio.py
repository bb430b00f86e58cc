"""Atomic file writes: a temporary file beside the target, fsync, then os.replace (atomic on POSIX
and Windows). A crash or an exception leaves the old file as it was and no half-written file that a
later run could load. Every writer in planner and costmodel goes through here."""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any, Iterator

from costmodel.core.errors import PlannerError
from costmodel.core.paths import require_data_dir


@contextlib.contextmanager
def atomic_writer(path: str | os.PathLike, binary: bool = False) -> Iterator:
    """Open a temporary file beside ``path``; on success it replaces ``path``, on an exception it is
    removed and ``path`` is left untouched."""
    if not str(path).strip() or Path(path).name in ("", ".", ".."):
        raise PlannerError(f"output path {str(path)!r} names no file; pass a file path such as reports/out.md.")
    path = Path(path)
    if path.is_dir():
        raise PlannerError(f"output path {str(path)!r} is a folder; pass a file path inside it.")
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{uuid.uuid4().hex[:12]}.tmp")
    # mode 0o666 less the umask, as an ordinary open() would give (mkstemp would make it 0o600)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_BINARY", 0), 0o666)
    try:
        fh: IO[Any] = os.fdopen(fd, "wb") if binary else os.fdopen(fd, "w", encoding="utf-8", newline="")
        with fh:
            yield fh
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


def atomic_write_text(path: str | os.PathLike, text: str) -> Path:
    """Write ``text`` (UTF-8, line ends as given) to ``path`` atomically."""
    with atomic_writer(path) as fh:
        fh.write(text)
    return Path(path)


def atomic_write_bytes(path: str | os.PathLike, data: bytes) -> Path:
    """Write ``data`` to ``path`` atomically."""
    with atomic_writer(path, binary=True) as fh:
        fh.write(data)
    return Path(path)


def fitted_table_main(argv: list[str] | None, description: str, default_out: Path,
                      fit: Callable[[Path], Any]) -> int:
    """Command line of a derived data table (``python -m costmodel.<module>``): ``fit`` the shared data folder
    (:func:`costmodel.core.paths.require_data_dir`) and write its JSON (indent 1, sorted keys) atomically to
    ``--out`` (default ``default_out``), the form the modules' regeneration tests compare with."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--out", default=str(default_out))
    args = parser.parse_args(argv)
    atomic_write_text(args.out, json.dumps(fit(require_data_dir()), indent=1, sort_keys=True) + "\n")
    print(f"wrote {args.out}")
    return 0
