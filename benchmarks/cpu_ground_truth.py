"""Issue #4 end to end, in one command: profile this CPU, fit its cost model, measure real training runs,
and compare planner's predictions with them.

    .venv/bin/python benchmarks/cpu_ground_truth.py [--work profiles/cpu-gt] [--reports reports/cpu-runs/latest]

Steps (each the command a user would type; nothing is reused from an earlier run, so a fresh checkout
reproduces the whole chain):

1. ``planner profile --device cpu --plan cpu-workload --threads 1 --nproc N --fresh`` (operators and gloo
   collectives on groups of 2 and of N ranks, and the rank skew on N ranks; ~8 min on 2 cores); N = 4 where
   4 cores are free (then the mixed TP2xDP2 / TP2xPP2 / DP2xPP2 layouts are measured too), else 2;
2. ``planner fit --profile ... --no-public`` (the CPU regressors and measured hardware.toml; ~15 s);
3. ``benchmarks/cpu_validation.py --rounds 2`` (the training runs, each launched twice, interleaved;
   ~8 min);
4. ``planner validate --runs <reports>/cpu_runs.csv --report <reports>/cpu-validation.md`` with the models of 2.

Writes ``<reports>/cpu_runs.csv`` / ``.json``, ``<reports>/cpu-validation.md`` (+ scatter PNG) and
``<reports>/cpu_ground_truth.json`` (errors, spreads, step times, machine); ``<reports>`` is one run's folder
under ``reports/cpu-runs/`` (the checked-in runs are ``run1`` .. ``run10``). With ``--compare RUNS.csv`` it
also states, per configuration, how far this run's measured medians are from that earlier run's and
whether that is inside the measured p10..p90 spread (the reproducibility check of issue #4), and the
prediction errors of both runs side by side.
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

from costmodel.core.fileio import atomic_write_text  # noqa: E402


def _run(cmd: list[str], env: dict | None = None) -> float:
    print("$ " + " ".join(cmd), flush=True)
    t0 = time.time()
    r = subprocess.run(cmd, cwd=ROOT, env=env)
    if r.returncode != 0:
        raise SystemExit(f"step failed (exit {r.returncode}): {' '.join(cmd)}")
    return time.time() - t0


def compare(new_json: Path, old_csv: Path, new_errors: dict | None = None,
            old_errors: dict | None = None) -> list[dict]:
    """Per configuration: old and new measured medians, their difference, and whether the old median lies
    inside the new run's p10..p90 range (read from the new run's raw results, ``cpu_runs.json``).

    With both runs' prediction errors (percent, by id; each run predicted by its own profile and fit), also
    the error's change in percentage points and whether it is within half the new run's p10..p90 width
    (as a percent of its median): the whole chain reproduces when the error moves less than the timing noise.
    """
    with open(old_csv, encoding="utf-8") as f:
        old = {r["id"]: float(r["measured_value"]) for r in csv.DictReader(f)}
    out = []
    for r in json.loads(new_json.read_text(encoding="utf-8")):
        if r["id"] not in old:
            continue
        a, b, lo, hi = old[r["id"]], float(r["median_s"]), float(r["p10_s"]), float(r["p90_s"])
        row = {"id": r["id"], "previous_s": a, "now_s": b, "diff_pct": 100 * (b - a) / a,
               "p10_s": lo, "p90_s": hi, "previous_inside_p10_p90": lo <= a <= hi}
        if new_errors and old_errors and r["id"] in new_errors and r["id"] in old_errors:
            half_width = 50 * (hi - lo) / b
            shift = new_errors[r["id"]] - old_errors[r["id"]]
            row.update(previous_error_pct=old_errors[r["id"]], error_pct=new_errors[r["id"]],
                       error_shift_pp=shift, half_spread_pct=half_width,
                       error_within_half_spread=abs(shift) <= half_width)
        out.append(row)
    return out


def _errors_beside(runs_csv: Path) -> dict | None:
    """The prediction errors of the run whose ``cpu_runs.csv`` this is (its ``cpu_ground_truth.json``)."""
    summary = runs_csv.parent / "cpu_ground_truth.json"
    return json.loads(summary.read_text(encoding="utf-8")).get("errors_pct") if summary.is_file() else None


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--work", default="profiles/cpu-gt", help="profile and models folder (not in git)")
    ap.add_argument("--reports", default="reports/cpu-runs/latest",
                    help="this run's folder for its run files and report (raw runs live under reports/cpu-runs/)")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--iters", type=int, default=10)
    ap.add_argument("--compare", default=None, help="an earlier cpu_runs.csv to check reproduction against")
    ap.add_argument("--nproc", type=int, default=None,
                    help="ranks of the collective and skew sampling (default: 4 where 4 cores are free, else 2)")
    ap.add_argument("--skip-profile", action="store_true", help="reuse --work's models (re-measure runs only)")
    args = ap.parse_args(argv)
    # paths relative to the repository (the commands run there), so reports name no machine's folders
    work, reports = Path(os.path.relpath(ROOT / args.work, ROOT)), Path(os.path.relpath(ROOT / args.reports, ROOT))
    cores = os.cpu_count() or 1
    nproc = args.nproc or (4 if cores >= 4 else 2)
    if nproc < 2 or nproc > cores:
        raise SystemExit(f"--nproc {nproc}: needs 2 to {cores} (this machine's cores), one thread per process")
    planner = [sys.executable, "-m", "planner.cli"]
    steps = {}
    if not args.skip_profile:
        steps["profile_s"] = _run(planner + ["profile", "--device", "cpu", "--plan", "cpu-workload", "--threads", "1",
                                             "--nproc", str(nproc), "--out", str(work / "profile"), "--fresh",
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
        "machine": {"cpu": platform.processor() or platform.machine(), "cores": cores,
                    "python": platform.python_version()},
        "sampling_ranks": nproc,
        "steps_s": {k: round(v, 1) for k, v in steps.items()},
        "configurations": len(rows),
        "mape_pct": 100 * sum(errs) / len(errs) if errs else None,
        "max_abs_error_pct": 100 * max(errs) if errs else None,
        "errors_pct": {r["id"]: round(100 * r["error"], 2) for r in rows},
    }
    if args.compare:
        summary["reproduction"] = compare(ROOT / reports / "cpu_runs.json", Path(args.compare),
                                          summary["errors_pct"], _errors_beside(Path(args.compare)))
    atomic_write_text(ROOT / reports / "cpu_ground_truth.json", json.dumps(summary, indent=1) + "\n")
    print(json.dumps({k: v for k, v in summary.items() if k != "reproduction"}, indent=1))
    for c in summary.get("reproduction", []):
        print(f"{c['id']}: previous {c['previous_s']:.4f} s, now {c['now_s']:.4f} s ({c['diff_pct']:+.1f} %), "
              f"previous inside now's p10..p90: {c['previous_inside_p10_p90']}"
              + (f"; error {c['previous_error_pct']:+.1f} -> {c['error_pct']:+.1f} % "
                 f"(shift {c['error_shift_pp']:+.1f} pp, half spread {c['half_spread_pct']:.1f} %)"
                 if "error_pct" in c else ""))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
