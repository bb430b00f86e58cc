"""The one skip of the data-backed tests (tests.helpers.require_shared): a skip on a developer's
machine, a loud failure under CI=true."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers import ROOT, require_shared


@pytest.mark.parametrize("ci", ["true", "1", "TRUE", "yes"])
def test_missing_shared_data_fails_under_ci(monkeypatch, ci):
    monkeypatch.setenv("CI", ci)
    with pytest.raises(pytest.fail.Exception, match="CI=true"):
        require_shared(None, "shared data")


@pytest.mark.parametrize("ci", [None, "", "false", "0"])
def test_missing_shared_data_skips_outside_ci(monkeypatch, ci):
    if ci is None:
        monkeypatch.delenv("CI", raising=False)
    else:
        monkeypatch.setenv("CI", ci)
    with pytest.raises(pytest.skip.Exception, match="PLANNER_DATA_DIR"):
        require_shared(None, "shared data")


def test_found_folder_is_returned_in_and_out_of_ci(monkeypatch, tmp_path):
    for ci in ("true", "false"):
        monkeypatch.setenv("CI", ci)
        assert require_shared(tmp_path) == tmp_path


def _run_data_backed_test(tmp_path: Path, ci: str | None) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "CI"}
    env["PLANNER_DATA_DIR"] = str(tmp_path / "no-such-data")  # set: the checkout's ../shared is not searched
    if ci is not None:
        env["CI"] = ci
    test = "tests/test_catalogue.py::test_build_script_output_equals_checked_in_toml"  # uses shared_data
    return subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", test],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)


def test_the_shared_data_fixture_fails_a_real_test_under_ci_and_skips_it_otherwise(tmp_path):
    failed = _run_data_backed_test(tmp_path, "true")
    assert failed.returncode == 1, failed.stdout + failed.stderr
    assert "1 error" in failed.stdout and "data-backed tests must run in CI" in failed.stdout
    skipped = _run_data_backed_test(tmp_path, None)
    assert skipped.returncode == 0, skipped.stdout + skipped.stderr
    assert "1 skipped" in skipped.stdout
