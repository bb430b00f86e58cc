"""Launch workload configurations with ``python -m torch.distributed.run`` and write run files.

Torch-free: the training happens in the torchrun worker processes (:mod:`costmodel.profiling.workloads.train`);
this module builds the command, reads the JSON result and turns it into a row of the published-runs
schema (``shared/validation/published_runs.csv``, columns in :data:`RUN_COLUMNS`) so that
``planner validate --runs FILE`` reads measured CPU runs like published GPU runs.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import subprocess
import sys
import tempfile
from dataclasses import fields
from pathlib import Path

from costmodel.core.fileio import atomic_write_text, atomic_writer
from costmodel.profiling.torchrun import failure_reason
from costmodel.profiling.workloads.config import WorkloadConfig

RUN_COLUMNS = ("id", "source", "model_name", "n_layers", "hidden", "n_heads", "n_kv_heads", "ffn_hidden", "vocab",
               "seq_len", "arch_notes", "gpu", "n_gpus", "gpus_per_node", "interconnect", "tp", "pp", "dp", "cp",
               "ep", "vp", "mbs", "gbs", "recompute", "seq_parallel", "dist_optimizer_or_zero", "precision",
               "framework", "measured_metric", "measured_value", "notes")
"""Header of shared/validation/published_runs.csv, in its order."""
SOURCE = "measured on this machine by costmodel.profiling.workloads.runner"
INTERCONNECT = "single host; gloo collectives and send/recv over TCP loopback"


class WorkloadError(RuntimeError):
    """A configuration that cannot be launched, or a worker that failed."""


def torchrun_command(cfgs: list[WorkloadConfig], out: Path, python: str = sys.executable) -> list[str]:
    """The ``python -m torch.distributed.run`` command line running ``cfgs`` one after another."""
    cmd = [python, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={cfgs[0].world_size}",
           "-m", "costmodel.profiling.workloads.train", "--out", str(out)]
    for cfg in cfgs:
        cmd += ["--config", cfg.to_json()]
    return cmd


def launch_many(cfgs: list[WorkloadConfig], timeout_s: float = 600.0, allow_oversubscribe: bool = False,
                python: str = sys.executable) -> list[dict]:
    """Run configurations of equal world size in one torchrun job, one after another (never concurrently);
    returns the rank-0 result dicts (see train.run) in order."""
    if not cfgs:
        return []
    for cfg in cfgs:
        problems = cfg.problems()
        if problems:
            raise WorkloadError("invalid workload config: " + "; ".join(problems))
    if len({c.world_size for c in cfgs}) != 1:
        raise WorkloadError("configurations launched together need the same tp*pp*dp.")
    cores = os.cpu_count() or 1
    busy = max(c.world_size * c.threads for c in cfgs)
    if busy > cores and not allow_oversubscribe:
        raise WorkloadError(f"{cfgs[0].world_size} processes x {max(c.threads for c in cfgs)} threads "
                            f"oversubscribe {cores} cores; use fewer processes/threads or allow_oversubscribe=True.")
    env = dict(os.environ, OMP_NUM_THREADS=str(cfgs[0].threads), MKL_NUM_THREADS=str(cfgs[0].threads))
    with tempfile.TemporaryDirectory(prefix="workload-") as tmp:
        out = Path(tmp) / "results.json"
        try:
            proc = subprocess.run(torchrun_command(cfgs, out, python), env=env, capture_output=True, text=True,
                                  timeout=timeout_s, cwd=Path(__file__).resolve().parents[3])
        except subprocess.TimeoutExpired as exc:
            raise WorkloadError(f"workload did not finish within {timeout_s:.0f} s: {cfgs[0].to_json()}") from exc
        if proc.returncode != 0 or not out.is_file():
            tail = (proc.stdout + proc.stderr)[-3000:]
            why = failure_reason(proc.stderr) if proc.returncode != 0 else "no results file written"
            raise WorkloadError(f"workload failed (exit {proc.returncode}: {why}) for {cfgs[0].to_json()}:\n{tail}")
        return json.loads(out.read_text(encoding="utf-8"))


def launch(cfg: WorkloadConfig, timeout_s: float = 600.0, allow_oversubscribe: bool = False,
           python: str = sys.executable) -> dict:
    """Run one configuration in its own torchrun job and return the rank-0 result dict (see train.run)."""
    return launch_many([cfg], timeout_s, allow_oversubscribe, python)[0]


def model_name(cfg: WorkloadConfig) -> str:
    return f"cpu-decoder-{cfg.n_layers}L-{cfg.hidden}h-{cfg.activation}"


def arch_notes(cfg: WorkloadConfig) -> str:
    """Architecture words that planner.validation.runs reads (activation, norm, position); no bias, untied."""
    pos = "RoPE" if cfg.position == "rope" else "learned abs pos emb"
    act = "SwiGLU" if cfg.activation == "swiglu" else "GELU"
    norm = "RMSNorm" if cfg.norm == "rmsnorm" else "LayerNorm"
    return (f"decoder-only, {act}, {norm}, {pos}, {cfg.n_kv_heads} KV heads; no linear bias, untied "
            "embeddings, no dropout (costmodel/profiling/workloads/model.py)")


def result_to_row(result: dict, run_id: str, source: str = SOURCE) -> dict:
    """One row of the published-runs schema from a train.run result."""
    cfg = WorkloadConfig(**{f.name: result["config"][f.name] for f in fields(WorkloadConfig)
                            if f.name in result["config"]})
    losses = result["losses"]
    notes = (f"TIER=A; measured on {result['cpu_model']}, {result['threads']} threads/process, "
             f"{result['processes']} processes on {result['cores_available']} cores "
             f"({result['processes'] * result['threads']} cores used), median of {len(result['iteration_times_s'])} "
             f"iterations after {cfg.warmup} warm-up, p10..p90 = {result['p10_s']:.4g}..{result['p90_s']:.4g} s, "
             f"min..max = {result['min_s']:.4g}..{result['max_s']:.4g} s"
             + (f", pooled over {len(result['round_medians_s'])} rounds with medians "
                f"{', '.join(f'{m:.4g}' for m in result['round_medians_s'])} s"
                if result.get("round_medians_s") else "")
             + f"; {cfg.num_microbatches} micro-batches "
             f"per DP rank, schedule {result['schedule']}, DP gradient reduction {result['data_parallel']}; "
             f"loss {losses[0]:.4f} -> {losses[-1]:.4f}; AdamW lr={cfg.lr}, synthetic seeded tokens")
    row = {
        "id": run_id, "source": source, "model_name": model_name(cfg), "n_layers": cfg.n_layers,
        "hidden": cfg.hidden, "n_heads": cfg.n_heads, "n_kv_heads": cfg.n_kv_heads, "ffn_hidden": cfg.ffn_hidden,
        "vocab": cfg.vocab, "seq_len": cfg.seq_len, "arch_notes": arch_notes(cfg), "gpu": "cpu",
        "n_gpus": result["processes"], "gpus_per_node": result["processes"], "interconnect": INTERCONNECT,
        "tp": cfg.tp, "pp": cfg.pp, "dp": cfg.dp, "cp": 1, "ep": "", "vp": "", "mbs": cfg.mbs, "gbs": cfg.gbs,
        "recompute": "none", "seq_parallel": "n", "dist_optimizer_or_zero": "none", "precision": "fp32",
        "framework": f"costmodel.profiling.workloads (PyTorch {result['torch_version']}, {result['backend']})",
        "measured_metric": "iteration_time_s", "measured_value": f"{result['median_s']:.6g}", "notes": notes,
    }
    return row


def write_runs_csv(rows: list[dict], path: str | Path) -> Path:
    """Write rows with the published-runs header (atomic replace)."""
    path = Path(path)
    with atomic_writer(path) as fh:
        writer = csv.DictWriter(fh, fieldnames=RUN_COLUMNS)
        writer.writeheader()
        for row in rows:
            writer.writerow({c: row.get(c, "") for c in RUN_COLUMNS})
    return path


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description="Measure one workload configuration and write a run CSV.")
    for f in fields(WorkloadConfig):
        ap.add_argument("--" + f.name.replace("_", "-"), type=type(f.default), default=f.default)
    ap.add_argument("--id", default="CPU-001", help="run id of the row")
    ap.add_argument("--runs-out", required=True, help="CSV to write (published-runs schema)")
    ap.add_argument("--json-out", help="also keep the raw result JSON here")
    args = vars(ap.parse_args(argv))
    cfg = WorkloadConfig(**{f.name: args[f.name] for f in fields(WorkloadConfig)})
    try:
        result = launch(cfg)
    except WorkloadError as exc:
        raise SystemExit(str(exc)) from None
    if args["json_out"]:
        atomic_write_text(args["json_out"], json.dumps(result, indent=1))
    path = write_runs_csv([result_to_row(result, args["id"])], args["runs_out"])
    print(f"median {result['median_s']:.4g} s (p10 {result['p10_s']:.4g}, p90 {result['p90_s']:.4g}); wrote {path}")


if __name__ == "__main__":
    main()
