"""Longer CPU validation (a benchmark, not a test): measure real distributed training runs on this machine.

Runs each configuration of :data:`CONFIGS` in its own torchrun job, one after another (never two at
once), and writes the measured median iteration times as a run file in the published-runs schema
(``reports/cpu-runs/latest/cpu_runs.csv``) plus the raw per-iteration results (``cpu_runs.json`` next to
it; raw runs live under ``reports/cpu-runs/``, one folder per run), so that

    planner validate --runs reports/cpu-runs/latest/cpu_runs.csv

compares them with planner's prediction. Two model sizes, DP / TP / PP layouts, several micro-batch
counts and sizes; each configuration takes roughly 10-40 s on a 2-core machine. Mixed layouts need
4 processes and run only where 4 cores are free (or with --allow-oversubscribe, flagged in the notes).

    .venv/bin/python benchmarks/cpu_validation.py [--only CPU-001 ...] [--iters 8]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from dataclasses import replace
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from costmodel.core.fileio import atomic_write_text  # noqa: E402
from costmodel.profiling.workloads.config import WorkloadConfig  # noqa: E402
from costmodel.profiling.workloads.runner import WorkloadError, launch, result_to_row, write_runs_csv  # noqa: E402

# Model S: GPT-style (GELU, LayerNorm, learned positions, MHA); ~7.4 M parameters.
S = WorkloadConfig(n_layers=4, hidden=256, n_heads=8, n_kv_heads=8, ffn_hidden=1024, vocab=8192, seq_len=256,
                   activation="gelu", norm="layernorm", position="learned")
# Model M: Llama-style (SwiGLU, RMSNorm, RoPE, GQA 8/4); ~19 M parameters.
M = WorkloadConfig(n_layers=8, hidden=384, n_heads=8, n_kv_heads=4, ffn_hidden=1024, vocab=8192, seq_len=256,
                   activation="swiglu", norm="rmsnorm", position="rope")

CONFIGS: list[tuple[str, WorkloadConfig]] = [
    ("CPU-001", replace(S, num_microbatches=8)),                          # single process
    ("CPU-002", replace(S, dp=2, num_microbatches=4)),                    # DP
    ("CPU-003", replace(S, dp=2, mbs=2, num_microbatches=2)),
    ("CPU-004", replace(S, tp=2, num_microbatches=8)),                    # TP
    ("CPU-005", replace(S, tp=2, mbs=2, num_microbatches=2)),
    ("CPU-006", replace(S, pp=2, num_microbatches=4)),                    # PP
    ("CPU-007", replace(S, pp=2, num_microbatches=8)),
    ("CPU-008", replace(S, pp=2, mbs=2, num_microbatches=4)),
    ("CPU-009", replace(M, num_microbatches=2)),                          # single process
    ("CPU-010", replace(M, dp=2, num_microbatches=2)),                    # DP
    ("CPU-011", replace(M, tp=2, num_microbatches=4)),                    # TP
    ("CPU-012", replace(M, tp=2, mbs=2, num_microbatches=1)),
    ("CPU-013", replace(M, pp=2, num_microbatches=2)),                    # PP
    ("CPU-014", replace(M, pp=2, num_microbatches=4)),
    ("CPU-015", replace(M, dp=2, mbs=2, num_microbatches=1)),             # DP, one micro-batch
    # mixed layouts: 4 processes
    ("CPU-016", replace(S, tp=2, dp=2, num_microbatches=4)),
    ("CPU-017", replace(M, tp=2, pp=2, num_microbatches=4)),
    ("CPU-018", replace(S, dp=2, pp=2, num_microbatches=4)),
]


def pool(results: list[dict]) -> dict:
    """One result from several launches of a configuration: iteration times pooled, statistics recomputed,
    the per-launch medians kept (``round_medians_s``)."""
    times = np.concatenate([np.asarray(r["iteration_times_s"], dtype=float) for r in results])
    out = dict(results[-1])
    out.update(iteration_times_s=times.tolist(), median_s=float(np.median(times)),
               p10_s=float(np.percentile(times, 10)), p90_s=float(np.percentile(times, 90)),
               min_s=float(times.min()), max_s=float(times.max()),
               round_medians_s=[float(r["median_s"]) for r in results])
    return out

LATEST = ROOT / "reports" / "cpu-runs" / "latest"
"""Default folder of a run's raw files (rename it, e.g. to runN, to keep it beside the earlier runs)."""


def layout(cfg: WorkloadConfig) -> str:
    return f"TP{cfg.tp} PP{cfg.pp} DP{cfg.dp} mbs{cfg.mbs} M{cfg.num_microbatches} gbs{cfg.gbs}"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=str(LATEST / "cpu_runs.csv"), help="run CSV to write")
    ap.add_argument("--json-out", default=str(LATEST / "cpu_runs.json"), help="raw results JSON")
    ap.add_argument("--only", nargs="*", help="run only these ids")
    ap.add_argument("--warmup", type=int, default=2, help="warm-up iterations per configuration")
    ap.add_argument("--iters", type=int, default=8, help="timed iterations per configuration")
    ap.add_argument("--threads", type=int, default=1, help="torch threads per process")
    ap.add_argument("--rounds", type=int, default=2, help="times each configuration is launched (interleaved)")
    ap.add_argument("--allow-oversubscribe", action="store_true",
                    help="also run layouts with more processes x threads than cores (flagged in the notes)")
    args = ap.parse_args(argv)
    cores = os.cpu_count() or 1
    rows, raw, skipped, failed = [], [], [], []
    t_start = time.time()
    todo = []
    for run_id, cfg in CONFIGS:
        if args.only and run_id not in args.only:
            continue
        cfg = replace(cfg, warmup=args.warmup, iters=args.iters, threads=args.threads)
        over = cfg.world_size * cfg.threads > cores
        if over and not args.allow_oversubscribe:
            skipped.append((run_id, layout(cfg), f"needs {cfg.world_size * cfg.threads} cores, {cores} available"))
            print(f"{run_id}  {layout(cfg):38s} skipped: needs {cfg.world_size * cfg.threads} cores", flush=True)
            continue
        todo.append((run_id, cfg, over))
    results: dict[str, list[dict]] = {}
    for rnd in range(1, args.rounds + 1):  # rounds interleave the configurations, so slow drift of the
        for run_id, cfg, over in todo:    # machine's speed spreads over all of them instead of a few
            if run_id in failed:
                continue
            t0 = time.time()
            res = None
            for attempt in (1, 2):  # one retry: a torchrun rendezvous on a busy loopback port can fail
                try:
                    res = launch(cfg, allow_oversubscribe=over)
                    break
                except WorkloadError as exc:
                    print(f"{run_id} attempt {attempt} failed: {str(exc)[-1500:]}", file=sys.stderr, flush=True)
            if res is None:
                failed.append(run_id)
                continue
            results.setdefault(run_id, []).append(res)
            spread = 100 * (res["p90_s"] - res["p10_s"]) / res["median_s"]
            print(f"round {rnd} {run_id}  {layout(cfg):38s} median {res['median_s']:7.4f} s  p10..p90 "
                  f"{res['p10_s']:.4f}..{res['p90_s']:.4f} ({spread:4.1f} %)  loss {res['losses'][0]:.3f}->"
                  f"{res['losses'][-1]:.3f}  [{time.time() - t0:.0f} s]", flush=True)
        rows, raw = [], []
        for run_id, _cfg, over in todo:
            if run_id not in results or run_id in failed:
                continue
            merged = pool(results[run_id])
            row = result_to_row(merged, run_id)
            if over:
                row["notes"] = row["notes"].replace("TIER=A;", "TIER=B; OVERSUBSCRIBED (more processes x threads "
                                                    "than cores);", 1)
            rows.append(row)
            raw.append({"id": run_id, **merged, "rounds": results[run_id]})
        write_runs_csv(rows, args.out)            # after every round, so a partial run keeps its rows
        atomic_write_text(args.json_out, json.dumps(raw, indent=1))
    print(f"\n{len(rows)} configurations measured in {time.time() - t_start:.0f} s on {cores} cores; "
          f"wrote {args.out} and {args.json_out}")
    for run_id, lay, why in skipped:
        print(f"skipped {run_id} ({lay}): {why}")
    if failed:
        print(f"FAILED twice (not in {args.out}): {', '.join(failed)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
