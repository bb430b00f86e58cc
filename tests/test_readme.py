"""The README's "Python" section runs: its examples are doctests (they call the public API, planner.predict etc.,
and show what it returns)."""

from __future__ import annotations

import doctest
import re

from tests.helpers import ROOT


def _python_section() -> str:
    """The ```python blocks of README.md's "## Python" section, joined (fences removed: doctest would read a
    closing fence as expected output)."""
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    section = text.split("\n## Python\n", 1)[1].split("\n## ", 1)[0]
    blocks = re.findall(r"```python\n(.*?)```", section, flags=re.S)
    assert blocks, "README.md's Python section has no ```python examples"
    return "\n".join(blocks)


def test_readme_python_examples_run():
    parser = doctest.DocTestParser()
    test = parser.get_doctest(_python_section(), {}, "README.md (Python)", str(ROOT / "README.md"), 0)
    assert len(test.examples) >= 10
    runner = doctest.DocTestRunner(optionflags=doctest.NORMALIZE_WHITESPACE)
    runner.run(test)
    result = runner.summarize(verbose=False)
    assert result.failed == 0, f"{result.failed} of {result.attempted} README examples failed (see the output above)"


def test_a_wrong_example_fails():
    parser = doctest.DocTestParser()
    test = parser.get_doctest(">>> 1 + 1\n3\n", {}, "wrong", "wrong", 0)
    runner = doctest.DocTestRunner()
    runner.run(test, out=lambda _: None)
    assert runner.summarize(verbose=False).failed == 1
