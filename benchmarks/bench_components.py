"""Benchmark: the speed of the pieces every prediction and search step calls, against their budgets.

These budgets were timed assertions in the unit tests; a loaded CI machine could fail them without any
regression, and the project checks speed with benchmark scripts, not timed tests. Each budget is the
bound the test used: a gross-regression guard chosen by the project, not a published figure. On the
2-core development VM (2026-11-25) every piece ran 8x (pipeline_time) to over 1000x (cached catalogue)
inside its budget; ``measured_cold_s`` there reads the tree cache (~/.cache/planner), about 1.7 s
without it (issue #3's note).

Run: ``python benchmarks/bench_components.py [--json OUT]``; exit status 1 when a budget is missed.
Needs ``PLANNER_DATA_DIR`` (or ``../shared/data``) only for the importer line, which is skipped without it.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def _per_call(fn, n: int, rounds: int = 5) -> float:
    """Median over ``rounds`` of the mean time of ``n`` calls, seconds."""
    fn()
    samples = []
    for _ in range(rounds):
        t0 = time.perf_counter()
        for _ in range(n):
            fn()
        samples.append((time.perf_counter() - t0) / n)
    return statistics.median(samples)


def catalogue_cached() -> float:
    from costmodel.core.specs.catalogue import load_catalogue

    return _per_call(load_catalogue, 100)


def _ops():
    from costmodel.graph.build import _gemm
    from costmodel.graph.ops import Op

    ops = [_gemm("g", "fwd", 4096 * (i % 4 + 1), 4096, 1024 * (i % 5 + 1), "bf16") for i in range(60)]
    ops += [Op("attention_fwd", "a", "fwd", (1, 4096, 4096, 32, 8, 128, 1)),
            Op("attention_bwd", "a", "bwd", (1, 4096, 4096, 32, 8, 128, 1))]
    return ops


def measured_cost_model() -> tuple[float, float]:
    """(cold: load the shipped regressors and predict 62 operators; warm: the same 62 again), seconds."""
    from costmodel.core.specs.catalogue import load_catalogue
    from costmodel.cost.measured import MeasuredCostModel

    hw = load_catalogue().resolve("h100-sxm")
    ops = _ops()
    t0 = time.perf_counter()
    cm = MeasuredCostModel()
    cm.predict(ops, hw)
    cold = time.perf_counter() - t0
    return cold, _per_call(lambda: cm.predict(ops, hw), 20)


def roofline_cached() -> float:
    from costmodel.core.specs.catalogue import load_catalogue
    from costmodel.cost.roofline import RooflineCostModel
    from costmodel.graph.build import _coll

    hw = load_catalogue().resolve("h100-sxm")
    ops = _ops() + [_coll("all_reduce", "c", "fwd", 1e8 + i, 16, (2, 8)) for i in range(30)]
    m = RooflineCostModel()
    return _per_call(lambda: m.predict(ops, hw), 20)


def memory_per_gpu() -> float:
    from costmodel.core.specs.plan import ParallelPlan
    from costmodel.core.specs.presets import get_preset
    from costmodel.memory import per_gpu as mem

    m = get_preset("llama-70b")
    p = ParallelPlan(gpus=256, gpus_per_node=8, gbs=128, seq_len=2048, tp=8, pp=8, vpp=2,
                     mbs=1, recompute="selective", sequence_parallel=True, zero=1)
    p.validate(m)
    return _per_call(lambda: mem.memory_per_gpu(m, p), 500)


def pipeline_closed_form() -> float:
    from costmodel.schedule.timeline import pipeline_time

    f, b = [1.0] * 8, [2.0] * 8
    return _per_call(lambda: pipeline_time(f, b, 64, 4, 0.01), 2000)


def import_all() -> float | None:
    from costmodel.core.paths import data_dir
    from costmodel.fitting.datasets import importers

    d = data_dir()
    if d is None:
        return None
    t0 = time.perf_counter()
    importers.import_all(d)
    return time.perf_counter() - t0


def _fuzz_once(fn) -> float:
    """Median of 3 timed calls of ``fn``, which must refuse its malformed input with a PlannerError."""
    from costmodel.core.errors import PlannerError

    def call():
        try:
            fn()
        except PlannerError:
            return
        raise AssertionError("the malformed input was accepted")
    return _per_call(call, 1, rounds=3)


def fuzz_yaml_bomb() -> float:
    """load_catalogue on a hardware YAML with 100,000 '[' opened inside a flow mapping: the costliest
    input of tests/test_fuzz.py (about 600,000 Python calls, 0.9 s on the 2-core VM on 2026-11-26)."""
    from costmodel.core.fileio import atomic_write_text
    from costmodel.core.specs.catalogue import load_catalogue

    paths = iter(range(10))
    with tempfile.TemporaryDirectory() as tmp:
        def load():
            p = Path(tmp) / f"bomb{next(paths)}.yaml"  # a fresh path each call: the catalogue is cached per path
            atomic_write_text(p, "gpus:\n  fuzz-gpu:\n    peak_tflops: {bf16: " + "[" * 100_000
                              + " 900.0, fp8: 1800.0}\n")
            load_catalogue([p])
        return _fuzz_once(load)


def fuzz_bad_request() -> float:
    """predict_one on a batch request with 2**63 GPUs (refused before any graph is built)."""
    from planner.cli_predict import predict_one

    raw = {"id": "r1", "model": "llama-7b", "gpu": "a100-80gb", "gpus": 2**63, "tp": 2, "pp": 2, "mbs": 1,
           "gbs": 64, "seq_len": 2048, "recompute": "selective", "zero": 1, "dtype": "bf16"}
    return _fuzz_once(lambda: predict_one(raw))


# (name, what, budget in seconds, function returning seconds)
BUDGETS = [
    ("catalogue_cached_s", "load_catalogue(), cached", 5e-3, catalogue_cached),
    ("roofline_cached_s", "roofline predict of 92 cached operators", 0.5e-3, roofline_cached),
    ("memory_per_gpu_s", "memory_per_gpu, llama-70b TP8 PP8 VPP2", 500e-6, memory_per_gpu),
    ("pipeline_closed_form_s", "pipeline_time, 8 stages x 64 micro-batches, VPP 4", 100e-6, pipeline_closed_form),
    ("import_all_s", "import every shared dataset (planner fit's first step)", 30.0, import_all),
    # tests/test_fuzz.py bounds one malformed input's work by its Python calls; the wall-clock bound it used
    # to assert (2 s per input) is checked here, on its costliest input and a refused request
    ("fuzz_yaml_bomb_s", "load_catalogue refusing 100,000 nested [ in YAML", 2.0, fuzz_yaml_bomb),
    ("fuzz_bad_request_s", "predict_one refusing a request with 2**63 GPUs", 2.0, fuzz_bad_request),
]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", default=None, help="also write the results to this JSON file")
    a = ap.parse_args(argv)
    rows = []
    cold, warm = measured_cost_model()
    rows.append(("measured_cold_s", "load shipped regressors + predict 62 operators", 2.0, cold))
    rows.append(("measured_warm_s", "measured predict of the same 62 operators again", 5e-3, warm))
    for name, what, budget, fn in BUDGETS:
        rows.append((name, what, budget, fn()))
    missed = []
    print(f"{'piece':<24} {'time':>12} {'budget':>12}  what")
    for name, what, budget, t in rows:
        if t is None:
            print(f"{name:<24} {'skipped':>12} {budget:>11.6f}s  {what} (no shared data: set PLANNER_DATA_DIR)")
            continue
        flag = "" if t <= budget else "  MISSED"
        if flag:
            missed.append(name)
        print(f"{name:<24} {t:>11.6f}s {budget:>11.6f}s  {what}{flag}")
    res = {"machine": {"python": platform.python_version(), "cpu": platform.processor() or platform.machine(),
                       "cores": os.cpu_count()},
           "results": [{"name": n, "what": w, "budget_s": b, "time_s": t} for n, w, b, t in rows],
           "missed": missed}
    if a.json:
        from costmodel.core.fileio import atomic_write_text

        atomic_write_text(a.json, json.dumps(res, indent=2) + "\n")
    return 1 if missed else 0


if __name__ == "__main__":
    raise SystemExit(main())
