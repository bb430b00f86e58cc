"""benchmarks/bench_components.py: the pieces it times run, and a missed budget is reported (exit 1)."""

import importlib.util
import json
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _bench():
    spec = importlib.util.spec_from_file_location("bench_components", ROOT / "benchmarks" / "bench_components.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.mark.parametrize("name", ["catalogue_cached_s", "roofline_cached_s", "memory_per_gpu_s",
                                  "pipeline_closed_form_s"])
def test_each_timed_piece_runs_and_returns_seconds(name):
    bench = _bench()
    fn = {n: f for n, _, _, f in bench.BUDGETS}[name]
    t = fn()
    assert isinstance(t, float) and 0 < t < 60


def test_measured_cost_model_piece_returns_cold_and_warm_seconds():
    cold, warm = _bench().measured_cost_model()
    assert 0 < warm and 0 < cold < 600


def test_a_missed_budget_fails_the_run_and_is_named(tmp_path, monkeypatch, capsys):
    bench = _bench()
    monkeypatch.setattr(bench, "measured_cost_model", lambda: (0.1, 0.001))
    monkeypatch.setattr(bench, "BUDGETS", [("fast_s", "inside", 1.0, lambda: 0.5),
                                           ("slow_s", "outside", 0.001, lambda: 0.5),
                                           ("absent_s", "no data", 1.0, lambda: None)])
    out = tmp_path / "bench.json"
    assert bench.main(["--json", str(out)]) == 1
    res = json.loads(out.read_text())
    assert res["missed"] == ["slow_s"]
    text = capsys.readouterr().out
    assert "slow_s" in text and "MISSED" in text and "skipped" in text
    monkeypatch.setattr(bench, "BUDGETS", [("fast_s", "inside", 1.0, lambda: 0.5)])
    assert bench.main([]) == 0
