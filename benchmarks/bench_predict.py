"""Benchmark: single-prediction latency in-process and a 1,000-line batch through the CLI path.

Targets (issue #2): < 1 ms per prediction on the project's 2-core machine; a 1,000-request batch
in seconds. Run: `python benchmarks/bench_predict.py [--n 2000] [--json OUT]`.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from planner.cli_predict import run_batch  # noqa: E402
from planner.prediction import predict  # noqa: E402
from planner.requests import build_request  # noqa: E402

CASES = [
    {"model": "llama-13b", "gpu": "a100-80gb", "gpus": 128, "tp": 2, "pp": 4, "mbs": 1, "gbs": 1024},
    {"model": "llama3-70b", "gpu": "h100-sxm", "gpus": 512, "tp": 8, "pp": 4, "vpp": 5, "mbs": 1, "gbs": 1024},
    {"model": "gpt3-175b", "gpu": "a100-80gb", "gpus": 1024, "tp": 8, "pp": 16, "mbs": 1, "gbs": 1536,
     "recompute": "full"},
    {"model": "llama-7b", "gpu": "gh200", "gpus": 16, "tp": 1, "pp": 1, "mbs": 2, "gbs": 256, "zero": 3},
]


def bench_single(n: int) -> dict:
    reqs = [build_request(c) for c in CASES]
    for r in reqs:  # warm caches (model presets, catalogue, per-shape operator costs)
        predict(r.model, r.plan, r.hardware)
    per_case = {}
    for c, r in zip(CASES, reqs):
        samples = []
        for _ in range(5):
            t0 = time.perf_counter()
            for _ in range(n // 5):
                predict(r.model, r.plan, r.hardware)
            samples.append((time.perf_counter() - t0) / (n // 5))
        per_case[f"{c['model']}@{c['gpus']}x{c['gpu']}"] = statistics.median(samples) * 1e3
    # cold: new plans every time (different micro-batch and GBS), so operator costs are not cached
    t0 = time.perf_counter()
    count = 0
    for mbs in (1, 2, 4):
        for gbs_mult in range(1, 41):
            c = dict(CASES[0], mbs=mbs, gbs=64 * mbs * gbs_mult)
            r = build_request(c)
            predict(r.model, r.plan, r.hardware)
            count += 1
    cold = (time.perf_counter() - t0) / count * 1e3
    return {"warm_ms_per_prediction": per_case, "varied_plans_ms_per_prediction": cold}


def bench_batch(n_lines: int = 1000) -> dict:
    lines = []
    for i in range(n_lines):
        c = dict(CASES[i % len(CASES)], id=i)
        c["gbs"] = c["gbs"] * (1 + i % 4)
        lines.append(json.dumps(c))
    t0 = time.perf_counter()
    out = list(run_batch(lines))
    in_process = time.perf_counter() - t0
    errors = sum(1 for o in out if "error" in o)
    data = "\n".join(lines).encode()
    t0 = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "planner.cli", "predict", "--batch", "-", "--format", "jsonl"],
                          input=data, capture_output=True, cwd=ROOT)
    cli = time.perf_counter() - t0
    return {"lines": n_lines, "in_process_s": in_process, "cli_process_s": cli, "errors": errors,
            "cli_rc": proc.returncode, "cli_lines_out": len(proc.stdout.splitlines())}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=2000)
    ap.add_argument("--json", type=str, default=None)
    a = ap.parse_args()
    res = {"machine": {"python": platform.python_version(), "cpu": platform.processor() or platform.machine(),
                       "cores": os.cpu_count()},
           "single": bench_single(a.n), "batch": bench_batch()}
    print(json.dumps(res, indent=2))
    if a.json:
        from costmodel.core.fileio import atomic_write_text

        atomic_write_text(a.json, json.dumps(res, indent=2) + "\n")


if __name__ == "__main__":
    main()
