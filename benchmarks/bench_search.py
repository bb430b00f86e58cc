"""Benchmark of `planner search` (the issue's speed and quality targets).

Measures, on the machine it runs on:
  1. end to end, from process start to printed table (median of --repeat runs; targets of issue 14 on the
     2-core dev machine): `planner search --model llama-13b --gpus 128` <= 2 s and
     `planner size --model llama3-70b --tokens 2e12 --deadline 30d` <= 2 s; the MoE search
     `planner search --model mixtral-8x22b --gpus 256` (EP and ETP searched, issue 17) is timed and reported;
  2. exhaustive enumeration of the default space (llama-13b / 128 x a100-80gb and llama3-70b / 512 x
     h100-sxm): space points per second (the cartesian product of the listed values, rejected ones
     included; target >= 5,000/s), distinct valid candidates evaluated per second and full predictions
     per second, with 1 and 2 processes, warm cost-model caches (a first, cold run is reported too);
  2b. persistent studies (issue 16): the same search in memory, on a fresh sqlite:///F.db and on a fresh
     journal:FILE study (median of --repeat runs, interleaved); each persistent run must take at most
     PERSISTENT_RATIO x the in-memory run of the same command;
  2c. a long Optuna study (issue 27): `planner search --model llama-13b --gpus 128 --mode optuna --trials 3000`
     end to end, wall and CPU time, per seed: at most OPTUNA_TARGET_S on the 2-core dev machine, with the best plan
     equal to `--mode exhaustive`'s;
  3. quality: for every seed, the default search (planner.search.engine.search, mode auto: exhaustive when
     the space's valid plans are at most EXHAUSTIVE_MAX_PLANS, else Optuna) must find the exhaustive optimum
     within 0.5 % (issue 14); Optuna alone (200 trials) is reported beside it.

Exits 1 when a time target or the 0.5 % quality target is missed (--no-fail only reports).

Usage: python benchmarks/bench_search.py [--seeds 20] [--repeat 3] [--cost-model default|roofline] [--out FILE.json]
       [--persistent-only] [--optuna-only [--optuna-seeds 3]]
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

CASES = [("llama-13b", "a100-80gb", 128), ("llama3-70b", "h100-sxm", 512), ("gpt3-175b", "h100-sxm", 1024)]
"""llama-13b and llama3-70b: the issue's reference cases; gpt3-175b on 1,024 H100: the case where Optuna
alone was 8 % off the optimum (issue 14)."""
COMMANDS = [["search", "--model", "llama-13b", "--gpus", "128", "--seed", "0", "--no-progress"],
            ["size", "--model", "llama3-70b", "--tokens", "2e12", "--deadline", "30d"],
            ["compare", "--model", "llama3-70b", "--gpus", "512", "--gpu", "a100-80gb", "--gpu", "h100-sxm", "--tokens",
             "2e12"]]
"""Commands with the 2 s target (issues 14 and 25): search, `size` (the every-node-count allocation search with
goodput and the batch decision) and `compare` of the same model."""
SIZE_COMMANDS = [["size", "--model", "llama3-405b", "--tokens", "15e12", "--deadline", "90d", "--gpu", "h100-sxm"],
                 ["size", "--model", "llama3-8b", "--tokens", "15e12", "--deadline", "30d", "--gpu", "gh200", "--gpu",
                  "h100-sxm"]]
"""The other sizing commands of issue 25: timed and reported, no target of their own."""
MOE_COMMANDS = [["search", "--model", "mixtral-8x22b", "--gpus", "256", "--seed", "0", "--no-progress"]]
"""MoE search with EP and ETP as dimensions (issue 17): timed and reported, no target of its own (issue 14's 2 s
targets are the dense commands above, which EP leaves unchanged)."""
TARGET_S = 2.0
"""End-to-end target of each command on the 2-core dev machine (issue 14)."""
PERSISTENT_RATIO = 2.0
"""A search on a persistent study may take at most this multiple of the same search in memory (issue 16)."""
PERSISTENT_ARGS = ["search", "--model", "llama-13b", "--gpus", "128", "--seed", "0", "--no-progress"]
OPTUNA_ARGS = ["search", "--model", "llama-13b", "--gpus", "128", "--no-progress", "--format", "json"]
OPTUNA_TRIALS = 3000
OPTUNA_TARGET_S = 30.0
"""`--mode optuna --trials 3000` on llama-13b / 128 end to end on the 2-core dev machine (issue 27; 395 s before)."""
QUALITY_GAP = 0.005
"""The default search's best plan must be within 0.5 % of the exhaustive optimum for every seed (issue 14)."""


def end_to_end(repeat: int) -> list[dict]:
    """Wall time of each command (median of ``repeat`` runs) and the CPU seconds it used, its forked workers
    included (on a loaded machine the wall time grows, the CPU time does not)."""
    import resource

    out = []
    for args in COMMANDS + MOE_COMMANDS + SIZE_COMMANDS:
        cmd = [sys.executable, "-c", "from planner.cli import main; main()", *args]
        walls, cpus = [], []
        for _ in range(repeat):
            before = resource.getrusage(resource.RUSAGE_CHILDREN)
            t0 = time.perf_counter()
            r = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True)
            walls.append(time.perf_counter() - t0)
            after = resource.getrusage(resource.RUSAGE_CHILDREN)
            cpus.append(after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime)
            if r.returncode != 0:
                raise SystemExit(f"planner {' '.join(args)} failed: {r.stderr.strip()}")
        out.append({"command": "planner " + " ".join(args), "wall_s": walls, "median_s": statistics.median(walls),
                    "cpu_s": cpus, "median_cpu_s": statistics.median(cpus), "load_average": os.getloadavg()[0],
                    "target_s": TARGET_S if args in COMMANDS else None})
    return out


def persistent(repeat: int) -> list[dict]:
    """End-to-end time of PERSISTENT_ARGS in memory (the default mode, and Optuna as the persistent runs use)
    and on fresh SQLite and journal studies, runs interleaved so machine load hits all alike."""
    import tempfile

    cases = {"in memory (default mode)": [], "in memory (--mode optuna)": ["--mode", "optuna"],
             "sqlite:///F.db": ["--storage", "sqlite:///{d}/s.db", "--study-name", "s"],
             "journal:FILE": ["--storage", "journal:{d}/s.journal", "--study-name", "s"]}
    walls: dict[str, list[float]] = {k: [] for k in cases}
    for _ in range(repeat):
        for name, extra in cases.items():
            with tempfile.TemporaryDirectory() as d:
                cmd = [sys.executable, "-c", "from planner.cli import main; main()", *PERSISTENT_ARGS,
                       *[a.format(d=d) for a in extra]]
                t0 = time.perf_counter()
                r = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True)
                walls[name].append(time.perf_counter() - t0)
                if r.returncode != 0:
                    raise SystemExit(f"planner {' '.join(cmd[3:])} failed: {r.stderr.strip()}")
    base = statistics.median(walls["in memory (default mode)"])
    return [{"storage": k, "command": "planner " + " ".join(PERSISTENT_ARGS + cases[k]), "wall_s": v,
             "median_s": statistics.median(v), "ratio_to_in_memory": statistics.median(v) / base,
             "target_ratio": None if k.startswith("in memory") else PERSISTENT_RATIO} for k, v in walls.items()]


def _timed_json(args: list[str]) -> tuple[dict, float, float]:
    """(parsed JSON stdout, wall s, CPU s) of one `planner` run in a child process."""
    import resource

    cmd = [sys.executable, "-c", "from planner.cli import main; main()", *args]
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    r = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if r.returncode != 0:
        raise SystemExit(f"planner {' '.join(args)} failed: {r.stderr.strip()}")
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return json.loads(r.stdout), wall, cpu


def optuna_budget(seeds: int) -> dict:
    """The 3,000-trial Optuna search of OPTUNA_ARGS per seed against the exhaustive search of the same space."""
    exact, ex_wall, ex_cpu = _timed_json(OPTUNA_ARGS + ["--mode", "exhaustive"])
    best = exact["plans"][0]["iteration_time_s"]
    runs = []
    for seed in range(seeds):
        got, wall, cpu = _timed_json(OPTUNA_ARGS + ["--mode", "optuna", "--trials", str(OPTUNA_TRIALS),
                                                    "--seed", str(seed)])
        runs.append({"seed": seed, "wall_s": wall, "cpu_s": cpu, "trials": got["search"]["trials"],
                     "distinct_plans": got["search"]["evaluated"], "mode_note": got["search"]["mode_note"],
                     "best_iteration_time_s": got["plans"][0]["iteration_time_s"],
                     "same_optimum": got["plans"][0]["iteration_time_s"] == best})
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else None
    return {"command": "planner " + " ".join(OPTUNA_ARGS + ["--mode", "optuna", "--trials", str(OPTUNA_TRIALS)]),
            "exhaustive": {"wall_s": ex_wall, "cpu_s": ex_cpu, "best_iteration_time_s": best}, "runs": runs,
            "target_s": OPTUNA_TARGET_S, "load_average_1min": load}


def exhaustive(problem, cost_model, jobs: int) -> dict:
    from planner.search.engine import exhaustive_search
    from planner.search.records import seconds_per_token

    t0 = time.perf_counter()
    res = exhaustive_search(problem, cost_model=cost_model, jobs=jobs)
    dt = time.perf_counter() - t0
    return {"jobs": jobs, "seconds": dt, "space_points": res.space_size, "valid_candidates": res.evaluated,
            "predictions": res.counts.get("ok", 0), "space_points_per_s": res.space_size / dt,
            "candidates_per_s": res.evaluated / dt, "predictions_per_s": res.counts.get("ok", 0) / dt,
            "best_iteration_time_s": res.best.iteration_time_s if res.best else None,
            "best_seconds_per_mtoken": seconds_per_token(res.best) * 1e6 if res.best else None}


def quality(problem, cost_model, best: float, seeds: int, mode: str, trials: int = 200) -> dict:
    from planner.search.engine import search
    from planner.search.records import seconds_per_token

    gaps, secs, methods = [], [], set()
    for seed in range(seeds):
        t0 = time.perf_counter()
        res = search(problem, n_trials=trials, seed=seed, cost_model=cost_model, mode=mode)
        secs.append(time.perf_counter() - t0)
        methods.add(res.method)
        gaps.append(seconds_per_token(res.best) * 1e6 / best - 1.0 if res.best else float("inf"))
    return {"mode": mode, "methods": sorted(methods), "trials": trials, "seeds": seeds,
            "hit_rate_within_0.5pct": sum(g <= QUALITY_GAP for g in gaps) / seeds,
            "hit_rate_within_1pct": sum(g <= 0.01 for g in gaps) / seeds,
            "exact_optimum_rate": sum(g <= 1e-12 for g in gaps) / seeds, "max_gap": max(gaps),
            "median_gap": statistics.median(gaps), "gaps": gaps, "median_seconds": statistics.median(secs)}


def _optuna_misses(ob: dict | None) -> list[str]:
    """Print the 3,000-trial Optuna runs; the targets they miss."""
    if ob is None:
        return []
    misses = []
    for r in ob["runs"]:
        print(f"optuna {OPTUNA_TRIALS} trials, seed {r['seed']}: {r['wall_s']:.1f} s wall, {r['cpu_s']:.1f} s CPU "
              f"(target {ob['target_s']:.0f} s; 1-min load average {ob['load_average_1min']}), {r['trials']} trials, "
              f"{r['distinct_plans']} distinct plans, exhaustive optimum: {r['same_optimum']}", file=sys.stderr)
        if r["wall_s"] > ob["target_s"]:
            misses.append(f"{ob['command']} --seed {r['seed']} took {r['wall_s']:.1f} s > {ob['target_s']:.0f} s")
        if not r["same_optimum"]:
            misses.append(f"{ob['command']} --seed {r['seed']} missed the exhaustive optimum")
    return misses


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seeds", type=int, default=20)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--cost-model", choices=("default", "roofline"), default="default")
    ap.add_argument("--out", type=Path)
    ap.add_argument("--persistent-only", action="store_true", help="Only the persistent-study timings (2b).")
    ap.add_argument("--optuna-only", action="store_true", help="Only the 3,000-trial Optuna search (2c).")
    ap.add_argument("--optuna-seeds", type=int, default=3, help="Seeds of the 3,000-trial Optuna search (2c).")
    ap.add_argument("--end-to-end-only", action="store_true", help="Only the end-to-end command timings (1).")
    ap.add_argument("--no-fail", action="store_true", help="Report only; exit 0 even when a target is missed.")
    args = ap.parse_args()
    warnings.filterwarnings("ignore")

    from costmodel.core.specs.catalogue import load_catalogue
    from costmodel.core.specs.presets import resolve_model
    from costmodel.cost.roofline import RooflineCostModel
    from costmodel.estimate import default_cost_model
    from planner.search.space import build_problem, load_space, make_target

    cm = default_cost_model() if args.cost_model == "default" else RooflineCostModel()
    only = args.persistent_only or args.optuna_only
    out = {"machine": {"cpus": os.cpu_count(), "python": sys.version.split()[0]}, "cost_model": cm.name,
           "end_to_end": [] if only else end_to_end(args.repeat),
           "persistent": [] if args.optuna_only or args.end_to_end_only else persistent(args.repeat),
           "optuna_budget": None if args.persistent_only or args.end_to_end_only else optuna_budget(args.optuna_seeds),
           "cases": []}
    cat = load_catalogue()
    misses: list[str] = _optuna_misses(out["optuna_budget"])
    for model, gpu, gpus in ([] if only or args.end_to_end_only else CASES):
        problem = build_problem(resolve_model(model), [make_target(cat.resolve(gpu), gpus)], load_space("default"))
        cold = exhaustive(problem, cm, 1)
        runs = [exhaustive(problem, cm, j) for j in (1, 2, 1, 2)]
        best = {j: max((r for r in runs if r["jobs"] == j), key=lambda r: r["space_points_per_s"]) for j in (1, 2)}
        case = {"model": model, "gpu": gpu, "gpus": gpus, "batch": problem.batch_text(),
                "seq_len": problem.seq_len, "exhaustive_cold": cold, "exhaustive_warm": best,
                "default": quality(problem, cm, cold["best_seconds_per_mtoken"], args.seeds, "auto"),
                "optuna": quality(problem, cm, cold["best_seconds_per_mtoken"], args.seeds, "optuna")}
        out["cases"].append(case)
        d, o = case["default"], case["optuna"]
        print(f"{model}/{gpus}x{gpu}: exhaustive {best[1]['space_points_per_s']:,.0f} space points/s "
              f"({best[1]['predictions_per_s']:,.0f} plans/s) on 1 process, "
              f"{best[2]['space_points_per_s']:,.0f}/s on 2; default search ({', '.join(d['methods'])}) within "
              f"0.5 %: {100 * d['hit_rate_within_0.5pct']:.0f} % of {args.seeds} seeds (max gap "
              f"{100 * d['max_gap']:.2f} %); Optuna alone within 0.5 %: {100 * o['hit_rate_within_0.5pct']:.0f} %",
              file=sys.stderr)
        if d["max_gap"] > QUALITY_GAP:
            misses.append(f"{model}/{gpus}x{gpu}: the default search is {100 * d['max_gap']:.2f} % off the optimum")
    for e in out["end_to_end"]:
        print(f"end to end: {e['command']}: median {e['median_s']:.2f} s ({e['median_cpu_s']:.2f} CPU-s, load "
              f"{e['load_average']:.1f}) "
              + (f"(target {e['target_s']:.0f} s)" if e["target_s"] else "(reported, no target)"), file=sys.stderr)
        if e["target_s"] and e["median_s"] > e["target_s"]:
            misses.append(f"{e['command']} took {e['median_s']:.2f} s > {e['target_s']:.0f} s")
    for p in out["persistent"]:
        print(f"persistent study: {p['storage']}: median {p['median_s']:.2f} s = {p['ratio_to_in_memory']:.2f} x "
              "the in-memory run" + (f" (target {p['target_ratio']:.0f} x)" if p["target_ratio"] else ""),
              file=sys.stderr)
        if p["target_ratio"] and p["ratio_to_in_memory"] > p["target_ratio"]:
            misses.append(f"{p['command']} took {p['ratio_to_in_memory']:.2f} x the in-memory run")
    text = json.dumps(out, indent=2)
    if args.out:
        from costmodel.core.fileio import atomic_write_text

        atomic_write_text(args.out, text + "\n")
    print(text)
    for m in misses:
        print(f"MISS: {m}", file=sys.stderr)
    if misses and not args.no_fail:
        raise SystemExit(1)


if __name__ == "__main__":
    main()
