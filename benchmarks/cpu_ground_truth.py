"""Issue #4 end to end, in one command: profile this CPU, fit its cost model, measure real training runs,
and compare planner's predictions with them.

    .venv/bin/python benchmarks/cpu_ground_truth.py [--work profiles/cpu-gt] [--reports reports]

Steps (each the command a user would type; nothing is reused from an earlier run, so a fresh checkout
reproduces the whole chain):

1. ``planner profile --device cpu --plan cpu-workload --threads 1 --nproc 2 --fresh`` (operators and gloo
   collectives; ~7 min on 2 cores);
2. ``planner fit --profile ... --no-public`` (the CPU regressors and measured hardware.toml; ~15 s);
3. ``benchmarks/cpu_validation.py --rounds 2`` (the training runs, each launched twice, interleaved;
   ~8 min);
4. ``planner validate --runs reports/cpu_runs.csv --report reports/cpu-validation.md`` with the models of 2.

Writes ``<reports>/cpu_runs.csv`` / ``.json``, ``<reports>/cpu-validation.md`` (+ scatter PNG) and
``<reports>/cpu_ground_truth.json`` (errors, spreads, step times, machine). With ``--compare RUNS.csv`` it
also states, per configuration, how far this run's measured medians are from that earlier run's and
whether that is inside the measured p10..p90 spread (the reproducibility check of issue #4).
Run it on a quiet machine: anything else running shifts the timings.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from planner.fileio import atomic_write_text  # noqa: E402


def _run(cmd: list[str], env: dict | None = None) -> float:
    print("$ " + " ".join(cmd), flush=True)
    t0 = time.time()
    r = subprocess.run(cmd, cwd=ROOT, env=env)
    if r.returncode != 0:
        raise SystemExit(f"step failed (exit {r.returncode}): {' '.join(cmd)}")
    return time.time() - t0


def _spread(notes: str) -> tuple[float, float] | None:
    import re

    m = re.search(r"p10\.\.p90 = ([0-9.e+-]+)\.\.([0-9.e+-]+) s", notes)
    return (float(m.group(1)), float(m.group(2))) if m else None


def compare(new_csv: Path, old_csv: Path) -> list[dict]:
    """Per configuration: old and new measured medians, their difference, and whether the old median lies
    inside the new run's p10..p90 range."""
    old = {r["id"]: r for r in csv.DictReader(open(old_csv, encoding="utf-8"))}
    out = []
    for r in csv.DictReader(open(new_csv, encoding="utf-8")):
        if r["id"] not in old:
            continue
        a, b = float(old[r["id"]]["measured_value"]), float(r["measured_value"])
        sp = _spread(r["notes"])
        out.append({"id": r["id"], "previous_s": a, "now_s": b, "diff_pct": 100 * (b - a) / a,
                    "p10_s": sp[0] if sp else None, "p90_s": sp[1] if sp else None,
                    "previous_inside_p10_p90": bool(sp and sp[0] <= a <= sp[1])})
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--work", default="profiles/cpu-gt", help="profile and models folder (not in git)")
    ap.add_argument("--reports", default="reports", help="where the run files and the report go")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--iters", type=int, default=10)
    ap.add_argument("--compare", default=None, help="an earlier cpu_runs.csv to check reproduction against")
    ap.add_argument("--skip-profile", action="store_true", help="reuse --work's models (re-measure runs only)")
    args = ap.parse_args(argv)
    # paths relative to the repository (the commands run there), so reports name no machine's folders
    work, reports = Path(os.path.relpath(ROOT / args.work, ROOT)), Path(os.path.relpath(ROOT / args.reports, ROOT))
    planner = [sys.executable, "-m", "planner.cli"]
    steps = {}
    if not args.skip_profile:
        steps["profile_s"] = _run(planner + ["profile", "--device", "cpu", "--plan", "cpu-workload", "--threads", "1",
                                             "--nproc", "2", "--out", str(work / "profile"), "--fresh",
                                             "--no-progress"])
        steps["fit_s"] = _run(planner + ["fit", "--profile", str(work / "profile"), "--no-public", "--out",
                                         str(work / "models")])
    runs = reports / "cpu_runs.csv"
    steps["runs_s"] = _run([sys.executable, "benchmarks/cpu_validation.py", "--rounds",
                            str(args.rounds), "--iters", str(args.iters), "--out", str(runs),
                            "--json-out", str(reports / "cpu_runs.json")])
    env = {**os.environ, "PLANNER_MODELS_DIR": str(work / "models")}
    steps["validate_s"] = _run(planner + ["validate", "--runs", str(runs), "--format", "json", "--out",
                                          str(work / "validation.json"), "--report",
                                          str(reports / "cpu-validation.md")], env=env)
    val = json.loads((ROOT / work / "validation.json").read_text(encoding="utf-8"))
    rows = [r for r in val["rows"] if r.get("error") is not None]
    errs = [abs(r["error"]) for r in rows]
    summary = {
        "machine": {"cpu": platform.processor() or platform.machine(), "cores": os.cpu_count(),
                    "python": platform.python_version()},
        "steps_s": {k: round(v, 1) for k, v in steps.items()},
        "configurations": len(rows),
        "mape_pct": 100 * sum(errs) / len(errs) if errs else None,
        "max_abs_error_pct": 100 * max(errs) if errs else None,
        "errors_pct": {r["id"]: round(100 * r["error"], 2) for r in rows},
    }
    if args.compare:
        summary["reproduction"] = compare(ROOT / runs, Path(args.compare))
    atomic_write_text(ROOT / reports / "cpu_ground_truth.json", json.dumps(summary, indent=1) + "\n")
    print(json.dumps({k: v for k, v in summary.items() if k != "reproduction"}, indent=1))
    for c in summary.get("reproduction", []):
        print(f"{c['id']}: previous {c['previous_s']:.4f} s, now {c['now_s']:.4f} s ({c['diff_pct']:+.1f} %), "
              f"previous inside now's p10..p90: {c['previous_inside_p10_p90']}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
