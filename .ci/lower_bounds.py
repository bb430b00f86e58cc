"""Print pip constraints pinning every dependency of pyproject.toml (and the [test] extra) to its lower bound.

    python .ci/lower_bounds.py > lower.txt && pip install -c lower.txt -e ".[test]"

.ci/run installs the project this way in a second fresh venv, without torch, and runs the test suite
there: the lower bounds in pyproject.toml are the oldest versions CI has shown to work, and the suite
passes without the optional torch extra (issue #6).
"""

from __future__ import annotations

import re
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def lower_bounds(pyproject: Path = ROOT / "pyproject.toml", extras: tuple[str, ...] = ("test",)) -> list[str]:
    project = tomllib.loads(pyproject.read_text(encoding="utf-8"))["project"]
    reqs = list(project["dependencies"])
    for extra in extras:
        reqs += project.get("optional-dependencies", {}).get(extra, [])
    out = []
    for req in reqs:
        m = re.match(r"^\s*([A-Za-z0-9_.\-]+)\s*(?:\[[^\]]*\])?\s*(.*)$", req)
        name, spec = m.group(1), m.group(2)
        low = re.search(r">=\s*([0-9][^,;\s]*)", spec)
        if low is None:
            raise SystemExit(f"pyproject.toml: {req!r} has no lower bound (>=); every dependency needs one")
        out.append(f"{name}=={low.group(1)}")
    return out


if __name__ == "__main__":
    sys.stdout.write("\n".join(lower_bounds()) + "\n")
