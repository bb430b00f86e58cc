"""The H100 small-model runs of reports/gpu-runs/h100-2026-11-27: planner reads every row as the plan that ran,
and the file is what benchmarks/gpu/h100_report.py derives from the raw measurements beside it."""

from __future__ import annotations

import csv
import importlib.util
from pathlib import Path

import pytest

import planner.validation.runs as V

ROOT = Path(__file__).resolve().parents[1]
REPORT = ROOT / "reports" / "gpu-runs" / "h100-2026-11-27"
RUNS = REPORT / "h100_small_llama_runs.csv"


def _report_module():
    spec = importlib.util.spec_from_file_location("h100_report", ROOT / "benchmarks" / "gpu" / "h100_report.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_every_row_maps_to_the_single_gpu_plan_that_ran():
    rows = V.load_runs(RUNS)
    assert len(rows) == 49 and len({r.id for r in rows}) == 49
    frameworks = {}
    for row in rows:
        assert not row.skip_reason, (row.id, row.skip_reason)
        model, plan, gpu, _gpn = V.row_to_inputs(row)
        assert gpu == "h100-sxm"
        assert (plan.gpus, plan.tp, plan.pp, plan.cp, plan.zero) == (1, 1, 1, 1, 0)
        assert plan.recompute == "none" and not plan.sequence_parallel and plan.dtype == "bf16"
        assert plan.mbs == plan.gbs == row.get("mbs")
        assert not model.tied_embeddings and model.activation == "swiglu" and model.norm == "rmsnorm"
        frameworks[row.id] = plan.framework
        assert row.measured_metric == "iteration_time_s" and row.measured_value > 0
    with RUNS.open(newline="") as fh:
        text = {r["id"]: r for r in csv.DictReader(fh)}
    for rid, fw in frameworks.items():
        kind = text[rid]["framework"]
        expected = "torchtitan-eager" if ("eager" in kind and "compile" not in kind) else "torchtitan"
        assert fw == expected, (rid, kind, fw)
    tiers = [r.tier for r in rows]
    assert tiers.count("A") == 39 and tiers.count("C") == 10


def test_file_is_regenerated_from_the_raw_measurements():
    mod = _report_module()
    rows = mod.run_rows(REPORT / "raw")
    with RUNS.open(newline="") as fh:
        shipped = list(csv.DictReader(fh))
    assert [{k: str(v) for k, v in r.items()} for r in rows] == \
        [{k: r[k] for k in mod.RUN_COLUMNS} for r in shipped]
    step = {(r["model"], r["seq_len"], r["mbs"]): float(r["step_ms_median"])
            for r in csv.DictReader((REPORT / "raw" / "run1" / "train_steps.csv").open()) if r["mode"] == "eager"
            and r["status"] == "ok"}
    first = shipped[0]
    key = (first["model_name"], first["seq_len"], first["mbs"])
    assert float(first["measured_value"]) * 1e3 == pytest.approx(step[key])
