"""The architecture rules, checked on the source so they cannot regress.

Layers (README "Layout"): ``costmodel.core`` (errors, file IO, paths, specs, operator kinds) at the
bottom, the rest of ``costmodel`` on it, ``planner`` on top; the prediction path never imports the profiling
harness (``costmodel.profiling``) or torch; no function in ``planner/`` or ``costmodel/`` is longer than
MAX_FUNCTION_LINES. The import graph is built here from every
``import`` statement in every module, top-level and deferred (inside functions), with :mod:`ast`, so the
checks need no tool; ``test_import_linter_contracts`` also runs the import-linter contracts in
``pyproject.toml``, and ``test_ruff`` / ``test_mypy`` run the linters configured there.
"""

from __future__ import annotations

import ast
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("planner", "costmodel", "search_spaces")
MAX_FUNCTION_LINES = 80
"""Longest function (first decorator to last line; a nested function counts inside its parent's span) in
planner/ and costmodel/: a reader sees a function whole."""
LONG_FUNCTIONS_BEING_SPLIT = {
    # file::function -> its length when listed. These are being split on other branches; the list only lets the
    # test pass until they merge, and empties then (a listed top-level function within the limit fails the test,
    # so its entry goes; a listed function may not grow).
}
DEFERRED_TAG = "# deferred:"


def _modules() -> dict[str, Path]:
    out = {}
    for pkg in PACKAGES:
        for path in sorted((ROOT / pkg).rglob("*.py")):
            parts = list(path.relative_to(ROOT).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts = parts[:-1]
            out[".".join(parts)] = path
    return out


MODULES = _modules()


def _resolve(module: str, node: ast.ImportFrom | ast.Import, is_pkg: bool) -> list[str]:
    """Project modules one import statement names (``from a import b`` counts ``a.b`` when it is a module)."""
    names: list[str] = []
    if isinstance(node, ast.Import):
        names = [a.name for a in node.names]
    else:
        if node.level:
            base = module.split(".")
            base = base if is_pkg else base[:-1]
            base = base[: len(base) - (node.level - 1)]
            stem = ".".join(base + ([node.module] if node.module else []))
        else:
            stem = node.module or ""
        names = [f"{stem}.{a.name}" if f"{stem}.{a.name}" in MODULES else stem for a in node.names]
    found = []
    for name in names:
        # the deepest project module the name points into
        parts = name.split(".")
        while parts and ".".join(parts) not in MODULES:
            parts.pop()
        if parts:
            found.append(".".join(parts))
    return found


def _in_type_checking(node: ast.AST, parents: dict) -> bool:
    while node in parents:
        node = parents[node]
        if isinstance(node, ast.If) and ast.unparse(node.test) in ("TYPE_CHECKING", "typing.TYPE_CHECKING"):
            return True
    return False


def _imports() -> dict[str, list[tuple[str, int, bool]]]:
    """module -> [(imported project module, line, deferred)] for every runtime import statement."""
    graph = {}
    for mod, path in MODULES.items():
        tree = ast.parse(path.read_text(encoding="utf-8"))
        parents = {child: node for node in ast.walk(tree) for child in ast.iter_child_nodes(node)}
        edges = []
        for node in ast.walk(tree):
            if not isinstance(node, (ast.Import, ast.ImportFrom)) or _in_type_checking(node, parents):
                continue
            deferred = parents.get(node) is not tree
            for target in _resolve(mod, node, path.name == "__init__.py"):
                if target != mod:
                    edges.append((target, node.lineno, deferred))
        graph[mod] = edges
    return graph


GRAPH = _imports()


def test_the_graph_sees_deferred_imports():
    # the checks below are only as good as the graph: it must hold imports made inside functions
    assert any(deferred for edges in GRAPH.values() for _, _, deferred in edges)
    assert "costmodel.core.errors" in {t for t, _, _ in GRAPH["costmodel.core.fileio"]}


def test_costmodel_never_imports_planner():
    bad = [f"{m}:{line} imports {t}" for m, edges in GRAPH.items() if m.startswith("costmodel")
           for t, line, _ in edges if t.split(".")[0] == "planner"]
    assert not bad, bad


def test_core_imports_only_core():
    bad = [f"{m}:{line} imports {t}" for m, edges in GRAPH.items() if m.startswith("costmodel.core")
           for t, line, _ in edges if not (t.startswith("costmodel.core") or t.startswith("search_spaces"))]
    assert not bad, bad


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out = []
    counter = 0
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on.add(root)
        while work:
            v, it = work[-1]
            w = next(it, None)
            if w is not None:
                if w not in index:
                    index[w] = low[w] = counter
                    counter += 1
                    stack.append(w)
                    on.add(w)
                    work.append((w, iter(sorted(graph.get(w, ())))))
                elif w in on:
                    low[v] = min(low[v], index[w])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                comp = []
                while True:
                    w = stack.pop()
                    on.discard(w)
                    comp.append(w)
                    if w == v:
                        break
                if len(comp) > 1:
                    out.append(sorted(comp))
    return out


def test_cycle_finder_finds_a_cycle():
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert _cycles({"a": {"b"}, "b": set()}) == []


def test_no_import_cycles():
    # a package's __init__ re-exporting its own submodules is not a cycle in the sense of this rule
    # (Python finishes the package first); every other edge counts, deferred imports included
    graph = {m: {t for t, _, _ in edges if not m.startswith(t + ".")} for m, edges in GRAPH.items()}
    assert not _cycles(graph), _cycles(graph)


def _function_lengths(path: Path) -> dict[str, int]:
    """qualified name (Class.method) -> lines, for the functions and methods of one module that are not nested
    in another function (a nested function's lines count in its parent's)."""
    out: dict[str, int] = {}

    def visit(node: ast.AST, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                start = min([child.lineno, *(d.lineno for d in child.decorator_list)])
                out[prefix + child.name] = child.end_lineno - start + 1
            elif isinstance(child, ast.ClassDef):
                visit(child, f"{prefix}{child.name}.")
            else:
                visit(child, prefix)

    visit(ast.parse(path.read_text(encoding="utf-8")), "")
    return out


def test_function_lengths_are_measured_with_nested_functions_inside(tmp_path):
    src = "@dec\ndef f():\n    def g():\n        return 1\n    return g\n\n\nclass C:\n    def m(self):\n        pass\n"
    path = tmp_path / "sample.py"
    path.write_text(src, encoding="utf-8")
    assert _function_lengths(path) == {"f": 5, "C.m": 2}


def test_no_function_over_the_length_limit():
    lengths = {f"{p.relative_to(ROOT)}::{name}": n for pkg in ("planner", "costmodel")
               for p in sorted((ROOT / pkg).rglob("*.py")) for name, n in _function_lengths(p).items()}
    assert "costmodel/schedule/compose.py::compose" in lengths
    long = {f: n for f, n in lengths.items() if n > MAX_FUNCTION_LINES and f not in LONG_FUNCTIONS_BEING_SPLIT}
    assert not long, f"functions over {MAX_FUNCTION_LINES} lines (split them): {long}"
    grown = {f: n for f, n in lengths.items() if f in LONG_FUNCTIONS_BEING_SPLIT and n > LONG_FUNCTIONS_BEING_SPLIT[f]
             and n > MAX_FUNCTION_LINES}
    assert not grown, f"listed long functions grew: {grown}"
    done = sorted(f for f in LONG_FUNCTIONS_BEING_SPLIT if f in lengths and lengths[f] <= MAX_FUNCTION_LINES)
    assert not done, f"remove from LONG_FUNCTIONS_BEING_SPLIT (within {MAX_FUNCTION_LINES} lines): {done}"


PREDICTION_PATH = ("costmodel.estimate", "costmodel.schedule", "costmodel.graph", "costmodel.cost", "costmodel.memory",
                   "planner.prediction")
"""What costs a plan (``costmodel.estimate`` and the packages it composes); with a package, its submodules too."""
PREDICTION_ENTRY_POINTS = ("costmodel.estimate", "planner.prediction")
"""What every command and the Python API call to cost a plan."""
HARNESS = "costmodel.profiling"
"""The profiling harness (sampling, torchrun workloads): the only code that imports torch."""


def _prediction_modules() -> list[str]:
    return sorted(m for m in MODULES for r in PREDICTION_PATH if m == r or m.startswith(r + "."))


def _prediction_closure() -> set[str]:
    """Every project module importing the prediction path runs: its roots, what they import (deferred imports
    included), and the packages above each."""
    roots = set(_prediction_modules())
    seen: set[str] = set()
    todo = sorted(roots)
    while todo:
        m = todo.pop()
        if m in seen:
            continue
        seen.add(m)
        parents = [".".join(m.split(".")[:i]) for i in range(1, m.count(".") + 1)]
        todo += [t for t, _, _ in GRAPH[m]] + [p for p in parents if p in MODULES]
    return seen


def _imports_torch(path: Path) -> bool:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    for node in ast.walk(tree):
        if isinstance(node, ast.Import) and any(a.name.split(".")[0] == "torch" for a in node.names):
            return True
        if isinstance(node, ast.ImportFrom) and not node.level and (node.module or "").split(".")[0] == "torch":
            return True
    return False


def test_prediction_path_never_imports_the_profiling_harness_or_torch():
    closure = _prediction_closure()
    assert {"costmodel.schedule.compose", "costmodel.graph.build", "costmodel.cost.base", "costmodel.memory.per_gpu",
            "costmodel.schedule.timeline", "costmodel.schedule.layer_split", "costmodel.schedule.straggler",
            "costmodel.estimate", "planner.prediction"} <= closure
    harness = sorted(m for m in closure if m == HARNESS or m.startswith(HARNESS + "."))
    assert not harness, f"the prediction path imports the profiling harness: {harness}"
    torch = sorted(m for m in closure if _imports_torch(MODULES[m]))
    assert not torch, f"the prediction path imports torch: {torch}"
    assert _imports_torch(MODULES["costmodel.profiling.sampling.operators"])  # the check sees torch where it is


def test_prediction_path_imports_without_torch():
    # the same at run time: torch made unimportable, what costs a plan imports and loads no harness module (the
    # entry points import the rest; scikit-learn, which only the regressors' estimator classes import for fitting,
    # does not import with torch made unimportable)
    mods = ", ".join(PREDICTION_ENTRY_POINTS)
    code = (f"import sys; sys.modules['torch'] = None; import {mods}; "
            f"bad = [m for m in sys.modules if m.startswith('{HARNESS}')]; assert not bad, bad")
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]


def test_tests_import_helpers_not_other_test_modules():
    # shared test code lives in tests/helpers.py (and tests/fuzzing.py); a test module imported by another one
    # runs its module-level code twice and couples the two. Strings count: subprocess code imports too.
    pattern = re.compile(r"(from|import)\s+(tests)?\.?test_\w+")
    bad = [f"{p.relative_to(ROOT)}:{i}" for p in sorted((ROOT / "tests").glob("*.py"))
           for i, line in enumerate(p.read_text(encoding="utf-8").splitlines(), 1) if pattern.search(line)]
    assert not bad, f"import tests/helpers.py instead of another test module: {bad}"


def _has_reason(lines: list[str], i: int) -> bool:
    """The tag on the import's line, or on a line of the run of imports and comments just above it
    (a group of deferred imports shares one reason)."""
    if DEFERRED_TAG in lines[i]:
        return True
    j = i - 1
    while j >= 0 and _import_or_comment(lines[j]):
        if DEFERRED_TAG in lines[j]:
            return True
        j -= 1
    return False


def _import_or_comment(line: str) -> bool:
    text = line.strip()
    # an import, a comment, or a line of a parenthesised multi-line import
    return text.startswith(("import ", "from ", "#", ")")) or text.endswith((",", "("))


def test_deferred_reason_may_head_a_group():
    lines = ["def f():", "    # deferred: optuna is slow to import", "    import optuna", "    import optuna.storages",
             "    x = 1", "    import json"]
    assert _has_reason(lines, 2) and _has_reason(lines, 3)
    assert not _has_reason(lines, 5)


def test_deferred_imports_say_why():
    """An import inside a function is allowed only where it saves start-up time, with a one-line reason."""
    missing = []
    for _mod, path in MODULES.items():
        lines = path.read_text(encoding="utf-8").splitlines()
        tree = ast.parse("\n".join(lines))
        parents = {child: node for node in ast.walk(tree) for child in ast.iter_child_nodes(node)}
        for node in ast.walk(tree):
            if isinstance(node, (ast.Import, ast.ImportFrom)) and parents.get(node) is not tree \
                    and not _in_type_checking(node, parents) and not isinstance(parents.get(node), ast.Try):
                if not _has_reason(lines, node.lineno - 1):
                    missing.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    assert not missing, f"deferred imports without a '{DEFERRED_TAG} <reason>' comment: {missing}"


def _tool(name: str) -> list[str]:
    exe = shutil.which(name, path=str(Path(sys.executable).parent)) or shutil.which(name)
    if exe is None:
        if os.environ.get("PLANNER_LINT_CHECKED_ELSEWHERE") == "1":
            # .ci/run's lower-bound venv: the linters need newer libraries than planner's lowest bounds
            # (import-linter 2.17 needs rich >= 14.2); the first venv of the same CI run ran them
            pytest.skip(f"{name}: run in .ci/run's first venv")
        if os.environ.get("CI") == "true":
            pytest.fail(f"{name} is not installed; .ci/run installs the [lint] extra")
        pytest.skip(f"{name} not installed (pip install -e '.[lint]')")
    return [exe]


def _run(cmd: list[str]) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600)


def test_import_linter_contracts():
    proc = _run(_tool("lint-imports") + ["--no-cache"])
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]


def test_ruff():
    proc = _run(_tool("ruff") + ["check", "--no-cache", "."])
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]


def test_mypy():
    proc = _run(_tool("mypy"))
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
