"""Benchmark of `planner search` (the issue's speed and quality targets).

Measures, on the machine it runs on:
  1. end to end: `planner search --model llama-13b --gpus 128` from process start to printed table
     (median of --repeat runs; target <= 5 s on the 2-core dev machine);
  2. exhaustive enumeration of the default space (llama-13b / 128 x a100-80gb and llama3-70b / 512 x
     h100-sxm): space points per second (the cartesian product of the listed values, rejected ones
     included; target >= 5,000/s), distinct valid candidates evaluated per second and full predictions
     per second, with 1 and 2 processes, warm cost-model caches (a first, cold run is reported too);
  3. Optuna quality: share of seeds whose best plan after 200 trials is within 1 % of the exhaustive
     optimum, for both cases.

Usage: python benchmarks/bench_search.py [--seeds 20] [--repeat 3] [--cost-model default|roofline] [--out FILE.json]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
import warnings
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

CASES = [("llama-13b", "a100-80gb", 128), ("llama3-70b", "h100-sxm", 512)]


def end_to_end(repeat: int) -> dict:
    cmd = [sys.executable, "-c", "from planner.cli import main; main()", "search", "--model", "llama-13b",
           "--gpus", "128", "--seed", "0", "--no-progress"]
    walls = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        r = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True)
        walls.append(time.perf_counter() - t0)
        if r.returncode != 0:
            raise SystemExit(f"planner search failed: {r.stderr.strip()}")
    return {"command": "planner search --model llama-13b --gpus 128 --seed 0", "wall_s": walls,
            "median_s": statistics.median(walls), "target_s": 5.0}


def exhaustive(problem, cost_model, jobs: int) -> dict:
    from planner.search.engine import exhaustive_search

    t0 = time.perf_counter()
    res = exhaustive_search(problem, cost_model=cost_model, jobs=jobs)
    dt = time.perf_counter() - t0
    return {"jobs": jobs, "seconds": dt, "space_points": res.space_size, "valid_candidates": res.evaluated,
            "predictions": res.counts.get("ok", 0), "space_points_per_s": res.space_size / dt,
            "candidates_per_s": res.evaluated / dt, "predictions_per_s": res.counts.get("ok", 0) / dt,
            "best_iteration_time_s": res.best.iteration_time_s if res.best else None}


def quality(problem, cost_model, best: float, seeds: int, trials: int = 200) -> dict:
    from planner.search.engine import optuna_search

    gaps, secs = [], []
    for seed in range(seeds):
        t0 = time.perf_counter()
        res = optuna_search(problem, n_trials=trials, seed=seed, cost_model=cost_model)
        secs.append(time.perf_counter() - t0)
        gaps.append(res.best.iteration_time_s / best - 1.0 if res.best else float("inf"))
    return {"trials": trials, "seeds": seeds, "hit_rate_within_1pct": sum(g <= 0.01 for g in gaps) / seeds,
            "exact_optimum_rate": sum(g <= 1e-12 for g in gaps) / seeds, "max_gap": max(gaps),
            "median_gap": statistics.median(gaps), "gaps": gaps, "median_seconds_per_study": statistics.median(secs)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seeds", type=int, default=20)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--cost-model", choices=("default", "roofline"), default="default")
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    warnings.filterwarnings("ignore")

    from costmodel.core.specs.catalogue import load_catalogue
    from costmodel.core.specs.presets import resolve_model
    from costmodel.cost.roofline import RooflineCostModel
    from planner.predict import default_cost_model
    from planner.search.space import build_problem, load_space, make_target

    cm = default_cost_model() if args.cost_model == "default" else RooflineCostModel()
    out = {"machine": {"cpus": os.cpu_count(), "python": sys.version.split()[0]}, "cost_model": cm.name,
           "end_to_end": end_to_end(args.repeat), "cases": []}
    cat = load_catalogue()
    for model, gpu, gpus in CASES:
        problem = build_problem(resolve_model(model), [make_target(cat.resolve(gpu), gpus)], load_space("default"))
        cold = exhaustive(problem, cm, 1)
        runs = [exhaustive(problem, cm, j) for j in (1, 2, 1, 2)]
        best = {j: max((r for r in runs if r["jobs"] == j), key=lambda r: r["space_points_per_s"]) for j in (1, 2)}
        case = {"model": model, "gpu": gpu, "gpus": gpus, "gbs": problem.global_batch_size,
                "seq_len": problem.seq_len, "exhaustive_cold": cold, "exhaustive_warm": best,
                "optuna": quality(problem, cm, cold["best_iteration_time_s"], args.seeds)}
        out["cases"].append(case)
        print(f"{model}/{gpus}x{gpu}: exhaustive {best[1]['space_points_per_s']:,.0f} space points/s "
              f"({best[1]['predictions_per_s']:,.0f} predictions/s) on 1 process, "
              f"{best[2]['space_points_per_s']:,.0f}/s on 2; Optuna 200 trials within 1 %: "
              f"{100 * case['optuna']['hit_rate_within_1pct']:.0f} % of {args.seeds} seeds", file=sys.stderr)
    print(f"end to end: median {out['end_to_end']['median_s']:.2f} s", file=sys.stderr)
    text = json.dumps(out, indent=2)
    if args.out:
        from costmodel.core.fileio import atomic_write_text

        atomic_write_text(args.out, text + "\n")
    print(text)


if __name__ == "__main__":
    main()
