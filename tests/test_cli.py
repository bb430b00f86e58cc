"""The command line registers its commands explicitly: every command of the README's command table
exists, and a missing or broken command module stops `import planner.cli` instead of silently taking
its command away."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest
import typer

from planner import cli
from tests.helpers import ROOT


def _readme_commands() -> list[tuple[str, ...]]:
    """The command paths of the README's command table (`planner costmodel report` -> ('costmodel', 'report'))."""
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    table = text[text.index("| command | what it does |"):].split("\n\n")[0]
    paths = []
    for line in table.splitlines()[2:]:
        m = re.match(r"\|\s*`planner ((?:[a-z][a-z-]*\s?)+)", line)
        assert m, f"README command row not understood: {line}"
        paths.append(tuple(m.group(1).split()))
    return paths


def _resolve(path: tuple[str, ...]):
    """The click command at ``path`` (typer's click: groups have a ``commands`` dict), or None."""
    command = typer.main.get_command(cli.app)
    for name in path:
        command = getattr(command, "commands", {}).get(name)
    return command


README_COMMANDS = _readme_commands()


def test_readme_table_was_read():
    names = {p[0] for p in README_COMMANDS}
    assert len(README_COMMANDS) >= 14 and {"predict", "search", "costmodel", "calibrate"} <= names


@pytest.mark.parametrize("path", README_COMMANDS, ids=" ".join)
def test_every_readme_command_is_registered(path):
    command = _resolve(path)
    assert command is not None, f"`planner {' '.join(path)}` is in the README but not registered"
    assert getattr(command, "commands", None) != {}, f"`planner {' '.join(path)}` is an empty group"


def test_every_registered_command_is_in_the_readme():
    registered = set(typer.main.get_command(cli.app).commands)
    assert registered == {p[0] for p in README_COMMANDS}


_BLOCK = """
import importlib.abc, sys
class Block(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name == {name!r}:
            raise ModuleNotFoundError(f"No module named {{name!r}}", name=name)  # as if renamed or deleted
        return None
sys.meta_path.insert(0, Block())
import planner.cli
"""

_BROKEN = """
import sys, types
class Broken(types.ModuleType):
    def __getattr__(self, attr):
        raise AttributeError(attr)
sys.modules[{name!r}] = Broken({name!r})  # imports, but has no register()
import planner.cli
"""


@pytest.mark.parametrize("module", [m.__name__ for m in cli.COMMAND_MODULES])
def test_a_missing_command_module_is_an_import_error(module):
    r = subprocess.run([sys.executable, "-c", _BLOCK.format(name=module)], cwd=ROOT, capture_output=True,
                       text=True, timeout=120)
    short = module.rpartition(".")[2]
    assert r.returncode == 1 and re.search(rf"ImportError: .*'(planner\.)?{short}'", r.stderr), r.stderr


def test_a_command_module_without_register_is_an_error():
    r = subprocess.run([sys.executable, "-c", _BROKEN.format(name="planner.cli_fit")], cwd=ROOT,
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 1 and "AttributeError: register" in r.stderr, r.stderr
