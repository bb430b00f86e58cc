"""Safety (issue #6): nothing planner reads is loaded with a code-executing loader, and no user-supplied
path is imported or executed. A static scan of the source, so a new loader cannot slip in unnoticed."""

from __future__ import annotations

import ast

from tests.helpers import python_sources

SCANNED = ("planner", "costmodel", "search_spaces", "scripts", "benchmarks")
CODE_LOADING_MODULES = {"pickle", "cPickle", "dill", "cloudpickle", "joblib", "marshal", "shelve", "runpy"}
IMPORT_MODULE_ALLOWED = {
    "costmodel/cost/regressors/__init__.py": "lazy import of the package's own estimator modules",
}


def _problems(rel: str, tree: ast.AST) -> list[str]:
    out = []
    for node in ast.walk(tree):
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else [node.module or ""]
            for n in names:
                if n.split(".")[0] in CODE_LOADING_MODULES:
                    out.append(f"{rel}:{node.lineno} imports {n}")
        if not isinstance(node, ast.Call):
            continue
        f = node.func
        name = f.attr if isinstance(f, ast.Attribute) else (f.id if isinstance(f, ast.Name) else "")
        owner = getattr(f.value, "id", "") if isinstance(f, ast.Attribute) else ""
        kw = {k.arg: k.value for k in node.keywords}
        if isinstance(f, ast.Name) and name in ("eval", "exec", "compile", "__import__"):
            out.append(f"{rel}:{node.lineno} calls {name}()")
        elif name in ("load", "unsafe_load", "full_load") and owner == "yaml":
            out.append(f"{rel}:{node.lineno} yaml.{name} (use yaml.safe_load)")
        elif name == "load" and owner in ("np", "numpy"):
            v = kw.get("allow_pickle")
            if not (isinstance(v, ast.Constant) and v.value is False):
                out.append(f"{rel}:{node.lineno} np.load without allow_pickle=False")
        elif name in ("read_array",) and owner in ("format",):
            v = kw.get("allow_pickle")
            if not (isinstance(v, ast.Constant) and v.value is False):
                out.append(f"{rel}:{node.lineno} read_array without allow_pickle=False")
        elif name == "load" and owner == "torch":
            v = kw.get("weights_only")
            if not (isinstance(v, ast.Constant) and v.value is True):
                out.append(f"{rel}:{node.lineno} torch.load without weights_only=True")
        elif name == "import_module" and rel not in IMPORT_MODULE_ALLOWED:
            out.append(f"{rel}:{node.lineno} importlib.import_module")
        elif name in ("system", "popen") and owner == "os":
            out.append(f"{rel}:{node.lineno} os.{name}")
    return out


def test_no_code_executing_loaders():
    problems, n = [], 0
    for rel, tree in python_sources(SCANNED):
        n += 1
        problems += _problems(rel, tree)
    assert n > 50
    assert not problems, problems


def test_scanner_catches_each_pattern():
    src = ("import pickle\nfrom joblib import load\neval('1')\nimport yaml\nyaml.load(s)\nimport numpy as np\n"
           "np.load(p)\nnp.load(p, allow_pickle=False)\ntorch.load(p)\nimportlib.import_module(x)\nos.system(c)\n"
           "yaml.safe_load(s)\n")
    got = _problems("x.py", ast.parse(src))
    assert [int(g.split(":")[1].split()[0]) for g in got] == [1, 2, 3, 5, 7, 9, 10, 11]
