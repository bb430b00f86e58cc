"""``run_plan``: measure a plan's compute samples on this machine into Datasets, resumably.

Output folder layout (``out_dir``)::

    <kind>.csv / <kind>.json      one Dataset per operator kind (costmodel/fitting/datasets/schema.py)
    journal/<kind>.jsonl          finished samples (costmodel/profiling/sampling/journal.py), the source of truth

A run skips every sample already in the journal, appends each newly finished one, and rewrites the
datasets from the journal every ``timing.checkpoint_every`` new samples and at the end (atomically).
"""

from __future__ import annotations

import contextlib
import sys
import time
from pathlib import Path

import numpy as np

from costmodel.core.errors import PlannerError
from costmodel.core.kinds import COMPUTE_KINDS
from costmodel.core.specs.catalogue import load_catalogue, normalize
from costmodel.fitting.datasets.schema import Dataset, load_dataset, save_dataset
from costmodel.profiling.sampling import require_torch
from costmodel.profiling.sampling.fingerprint import busy_warning, fingerprint, identity
from costmodel.profiling.sampling.journal import Journal
from costmodel.profiling.sampling.operators import adam_impl, measure
from costmodel.profiling.sampling.plan import FP32_KINDS, Plan, Sample, expand, load_plan, op_timing

JOURNAL_DIR = "journal"


def check_device(device: str, gpu_name: str | None) -> str:
    """The dataset's ``gpu`` field for ``device``: 'cpu', or the catalogue key given for a CUDA GPU."""
    torch = require_torch()
    if device == "cpu":
        return "cpu"
    if device != "cuda":
        raise PlannerError(f"device {device!r} must be 'cpu' or 'cuda'")
    if not torch.cuda.is_available():
        raise PlannerError("--device cuda but torch sees no CUDA GPU here; use --device cpu or run on a GPU node")
    if not gpu_name:
        raise PlannerError("--device cuda needs --gpu-name KEY (the GPU's catalogue key, e.g. h100-sxm; "
                           "see `planner gpus`)")
    load_catalogue().gpu(gpu_name)  # raises the one-line error for an unknown key
    return normalize(gpu_name)


def _dataset(kind: str, gpu: str, samples: list[Sample], journal: Journal, meta: dict) -> Dataset | None:
    rows = [(s, journal.records[s.key()]) for s in samples if s.key() in journal]
    ok = [(s, r) for s, r in rows if r.get("status", "ok") == "ok"]
    skipped = [r for _, r in rows if r.get("status") == "skipped"]
    if not ok:
        return None
    m = dict(meta)
    if skipped:
        m["notes"] = m.get("notes", "") + f" {len(skipped)} samples skipped: " + \
            "; ".join(sorted({r.get("reason", "?") for r in skipped}))
    m["sources"] = [{**src, "rows_in": len(samples), "rows_kept": len(ok)} for src in m["sources"]]
    m["sampling"] = {**m.get("sampling", {}), "variants": sorted({s.variant for s, _ in ok}),
                     "samples_planned": len(samples), "samples_skipped": len(skipped)}
    return Dataset(kind, gpu, np.array([s.features for s, _ in ok], dtype=float),
                   np.array([s.direction for s, _ in ok], dtype=object),
                   np.array([s.dtype for s, _ in ok], dtype=object),
                   np.array([r["time_s"] for _, r in ok]), np.array([r["spread_s"] for _, r in ok]),
                   np.array([r["repeats"] for _, r in ok], dtype=float),
                   np.array([s.index for s, _ in ok], dtype=int), m)


def _meta(plan: Plan, kind: str, fp: dict, device: str, journal_path: Path, adam: str | None) -> dict:
    notes = (f"Measured by costmodel.profiling.sampling (plan {plan.name}) with torch.utils.benchmark.Timer: "
             "median over "
             "timed blocks of the time per call, spread = p90 - p10 over blocks, repeats = blocks. Backward = "
             "torch.autograd.grad over a graph built once (retain_graph=True).")
    if kind == "gemm":
        notes += " bwd rows are backward GEMM shapes (M, N, K) timed in the layout named by the plan's " \
                 "bwd_layouts (dgrad: A[M,K] @ B[K,N]; wgrad: A stored [K,M] transposed @ B[K,N]), in turn."
    if kind in FP32_KINDS:
        notes += f" dtype is fp32 whatever the plan dtype: {FP32_KINDS[kind]}."
    if kind == "optimizer":
        notes += f" torch.optim.AdamW ({adam}) over params split into 4 fp32 tensors."
    if kind == "norm":
        notes += " variant rms = F.rms_norm, layer = F.layer_norm (with weight and bias)."
    return {
        "fingerprint": fp,
        "sources": [{"path": f"harness:{plan.path.name}", "sha256": plan.sha256, "rows_in": 0,
                     "rows_kept": 0, "filters": [], "journal": str(journal_path.name)}],
        "notes": notes,
        "sampling": {"plan": plan.name, "device": device, "timing": vars(op_timing(plan, kind))},
    }


def run_plan(plan_path: str | Path, out_dir: str | Path, device: str = "cpu", threads: int | None = None,
             progress: bool = True, resume: bool = True, gpu_name: str | None = None,
             ops: list[str] | None = None, dtype: str | None = None) -> list[Path]:
    """Measure the compute samples of a plan; returns the dataset CSV paths written (one per kind).

    ``plan_path``: built-in plan name or TOML path. ``threads``: torch intra-op threads (default: torch's
    current setting). ``resume``: skip samples already in ``out_dir``'s journal (False starts over).
    ``ops``: only these operator kinds. ``dtype``: override the plan's compute dtype (fp32, bf16, fp16).
    """
    torch = require_torch()
    gpu = check_device(device, gpu_name)
    plan = load_plan(plan_path)
    if ops is not None:
        bad = [k for k in ops if k not in COMPUTE_KINDS]
        if bad:
            raise PlannerError(f"unknown compute operator kind(s) {', '.join(bad)}; choose from "
                               f"{', '.join(sorted(COMPUTE_KINDS))}")
    samples = expand(plan, ops, dtype)
    if threads is not None:
        if threads < 1:
            raise PlannerError(f"--threads must be >= 1, got {threads}")
        torch.set_num_threads(threads)
    threads = torch.get_num_threads()
    fp = fingerprint(device, threads)
    ident = identity(fp)
    warning = busy_warning(fp) if device == "cpu" else None
    if warning and progress:
        print(warning, file=sys.stderr, flush=True)
    out = Path(out_dir)
    by_kind: dict[str, list[Sample]] = {}
    for s in samples:
        by_kind.setdefault(s.kind, []).append(s)
    adam = adam_impl(device) if "optimizer" in by_kind else None
    journals = {k: Journal(out / JOURNAL_DIR / f"{k}.jsonl", k, ident, resume) for k in by_kind}
    metas = {k: _meta(plan, k, fp, device, journals[k].path, adam) for k in by_kind}
    todo = [s for s in samples if s.key() not in journals[s.kind]]

    def write(kinds) -> list[Path]:
        paths = []
        for k in kinds:
            ds = _dataset(k, gpu, by_kind[k], journals[k], metas[k])
            if ds is not None:
                paths.append(save_dataset(ds, out / f"{k}.csv"))
        return paths

    bar = progress_bar(progress)
    try:
        with bar:
            task = bar.add_task("profiling", total=len(samples), completed=len(samples) - len(todo))
            dirty: set[str] = set()
            for i, s in enumerate(todo, 1):
                bar.update(task, description=f"{s.kind} {s.direction} {s.features}")
                rec = {"key": s.key(), "index": s.index, "features": list(s.features), "direction": s.direction,
                       "dtype": s.dtype, "variant": s.variant, "unix_time": round(time.time(), 3)}
                try:
                    m = measure(s, device, op_timing(plan, s.kind), threads)
                    rec.update(status="ok", time_s=m.median_s, spread_s=m.spread_s, repeats=m.repeats,
                               number=m.number)
                except getattr(torch, "OutOfMemoryError", MemoryError):  # torch >= 2.5; CUDA/host OOM
                    rec.update(status="skipped", reason="out of memory")
                journals[s.kind].append(rec)
                dirty.add(s.kind)
                bar.advance(task)
                if i % max(1, plan.timing.checkpoint_every) == 0:
                    write(sorted(dirty))
                    dirty.clear()
        return write(by_kind)
    finally:
        for j in journals.values():
            j.close()


def progress_bar(enabled: bool):
    if not enabled:
        return _NullProgress()
    # deferred: rich.progress is only needed when a bar is shown
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TextColumn,
        TimeElapsedColumn,
        TimeRemainingColumn,
    )

    return Progress(TextColumn("{task.description:<40.40}"), BarColumn(), MofNCompleteColumn(),
                    TimeElapsedColumn(), TimeRemainingColumn())


class _NullProgress(contextlib.nullcontext):
    def add_task(self, *a, **k) -> int:
        return 0

    def update(self, *a, **k) -> None:
        pass

    def advance(self, *a, **k) -> None:
        pass


def sample_counts(paths: list[Path]) -> dict[str, int]:
    """Rows per dataset file (for the CLI summary)."""
    return {Path(p).stem: len(load_dataset(p)) for p in paths}
