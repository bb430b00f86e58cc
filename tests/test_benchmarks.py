"""benchmarks/bench_components.py: the pieces it times run, and a missed budget is reported (exit 1)."""

import importlib.util
import json
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _bench():
    spec = importlib.util.spec_from_file_location("bench_components", ROOT / "benchmarks" / "bench_components.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_per_call_is_the_median_mean_time_of_one_call():
    bench = _bench()
    calls = []

    def sleep_2ms():
        calls.append(1)
        time.sleep(0.002)

    t = bench._per_call(sleep_2ms, 10, rounds=3)
    assert len(calls) == 1 + 3 * 10  # one warm-up call, then rounds x n timed ones
    assert 0.002 <= t < 0.01  # per call (sleep overshoots a little), not per round (>= 0.02 s)


def _recorder(monkeypatch, owner, attr):
    """Replace ``owner.attr`` by a wrapper that records each call's arguments and calls the original."""
    real = getattr(owner, attr)
    calls = []

    def wrapper(*args, **kwargs):
        calls.append((args, kwargs))
        return real(*args, **kwargs)

    monkeypatch.setattr(owner, attr, wrapper)
    return calls


def _capture_per_call(monkeypatch, bench):
    """Make ``bench._per_call`` return 0.125 and keep what it was asked to time."""
    seen = {}

    def per_call(fn, n, rounds=5):
        seen.update(fn=fn, n=n)
        return 0.125

    monkeypatch.setattr(bench, "_per_call", per_call)
    return seen


def test_timed_pieces_call_what_they_name(monkeypatch):
    # each piece hands _per_call a function that runs the named operation on the named input, and reports
    # what _per_call measured
    from costmodel.core.specs import catalogue
    from costmodel.cost.roofline import RooflineCostModel
    from costmodel.memory import per_gpu as memory
    from costmodel.schedule import timeline

    bench = _bench()
    seen = _capture_per_call(monkeypatch, bench)
    pieces = {n: f for n, _, _, f in bench.BUDGETS}

    cat = _recorder(monkeypatch, catalogue, "load_catalogue")
    assert pieces["catalogue_cached_s"]() == 0.125 and seen["n"] == 100
    seen["fn"]()
    assert cat == [((), {})]

    roof = _recorder(monkeypatch, RooflineCostModel, "predict")
    assert pieces["roofline_cached_s"]() == 0.125
    seen["fn"]()
    (args, _), = roof
    assert len(args[1]) == 92 and args[2].gpu.name == "h100-sxm"  # 62 compute + 30 all-reduce operators

    mem = _recorder(monkeypatch, memory, "memory_per_gpu")
    assert pieces["memory_per_gpu_s"]() == 0.125 and seen["n"] == 500
    seen["fn"]()
    (args, _), = mem
    assert args[0].name == "llama-70b" and (args[1].tp, args[1].pp, args[1].vpp, args[1].gpus) == (8, 8, 2, 256)

    pipe = _recorder(monkeypatch, timeline, "pipeline_time")
    assert pieces["pipeline_closed_form_s"]() == 0.125 and seen["n"] == 2000
    seen["fn"]()
    (args, _), = pipe
    assert (len(args[0]), args[2], args[3]) == (8, 64, 4)  # 8 stages, 64 micro-batches, VPP 4


def test_measured_cost_model_piece_times_a_cold_load_and_a_warm_predict(monkeypatch):
    from costmodel.cost.measured import MeasuredCostModel

    bench = _bench()
    seen = _capture_per_call(monkeypatch, bench)
    calls = _recorder(monkeypatch, MeasuredCostModel, "predict")
    t0 = time.perf_counter()
    cold, warm = bench.measured_cost_model()
    assert 0 < cold <= time.perf_counter() - t0 and warm == 0.125
    assert len(calls) == 1 and len(calls[0][0][1]) == 62  # the cold run predicts the 62 operators once
    seen["fn"]()
    assert len(calls) == 2 and calls[1][0][1] == calls[0][0][1]  # the warm one predicts the same again


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
