"""`planner profile`: measure operator times on this machine (CPU, or a CUDA GPU) into datasets.

Compute operators are timed in this process (costmodel.profiling.sampling.runner.run_plan); collectives by a
``torchrun`` subprocess (costmodel.profiling.sampling.collectives). Needs torch: ``pip install 'planner[profile]'``.
This module imports without torch; the check happens when the command runs.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Annotated, Optional

import typer

from costmodel.core.errors import PlannerError
from costmodel.core.kinds import COLLECTIVE_KINDS, COMPUTE_KINDS, FEATURES

DEFAULT_PLANS = {"cpu": "cpu-small", "cuda": "gpu-default"}


def parse_ops(text: str | None) -> tuple[list[str] | None, list[str] | None]:
    """--ops 'gemm,all_reduce' -> (compute kinds, collective kinds); (None, None) = everything."""
    if not text:
        return None, None
    names = [t.strip() for t in text.split(",") if t.strip()]
    bad = [n for n in names if n not in FEATURES]
    if bad or not names:
        raise PlannerError(f"unknown operator kind(s) {', '.join(bad) or '(none given)'} in --ops; choose from "
                           f"{', '.join(FEATURES)}")
    return [n for n in names if n in COMPUTE_KINDS], [n for n in names if n in COLLECTIVE_KINDS]


def profile(
    device: Annotated[str, typer.Option(help="cpu or cuda")] = "cpu",
    plan: Annotated[Optional[str], typer.Option(
        help="cpu-workload (the shapes of the CPU ground-truth workloads, for `planner fit --profile`), cpu-small, "
             "cpu-tiny or gpu-default (built-in plans), or a TOML path; default cpu-small on cpu, gpu-default on "
             "cuda")] = None,
    out: Annotated[Optional[Path], typer.Option(help="output folder (default profiles/<cpu or gpu-name>)")] = None,
    threads: Annotated[Optional[int], typer.Option(help="torch intra-op threads (default: torch's)")] = None,
    ops: Annotated[Optional[str], typer.Option(help="comma-separated operator kinds to measure (default all)")] = None,
    collectives: Annotated[bool, typer.Option("--collectives/--no-collectives",
                                              help="also sweep collectives via torchrun")] = True,
    nproc: Annotated[int, typer.Option(help="processes for the collective sweep")] = 2,
    gpu_name: Annotated[Optional[str], typer.Option(
        help="catalogue key of the GPU (needed with --device cuda)")] = None,
    dtype: Annotated[Optional[str], typer.Option(help="compute dtype, overriding the plan (fp32, bf16, fp16)")] = None,
    resume: Annotated[bool, typer.Option("--resume/--fresh", help="skip samples already measured in --out")] = True,
    progress: Annotated[bool, typer.Option("--progress/--no-progress")] = True,
) -> None:
    """Measure operator times on this machine into datasets (one CSV + JSON per operator kind).

    Resumable: rerun the same command after an interruption and it measures only what is missing.
    """
    try:
        _profile(device, plan, out, threads, ops, collectives, nproc, gpu_name, dtype, resume, progress)
    except PlannerError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(code=2) from None
    except KeyboardInterrupt:
        typer.echo("interrupted; finished samples are journaled: rerun the same command to resume", err=True)
        raise typer.Exit(code=130) from None


def _profile(device, plan, out, threads, ops, collectives, nproc, gpu_name, dtype, resume, progress) -> None:
    # deferred: the sampling modules load numpy and torch helpers only when profiling
    from costmodel.profiling.sampling import require_torch
    from costmodel.profiling.sampling.plan import load_plan

    if device not in DEFAULT_PLANS:
        raise PlannerError(f"--device {device!r} must be cpu or cuda")
    compute_ops, coll_ops = parse_ops(ops)
    if plan is not None and not plan.strip():
        raise PlannerError("--plan is empty; name a built-in plan (cpu-tiny, cpu-small, cpu-workload, "
                           "gpu-default) or a TOML path, or leave --plan out for the device's default.")
    the_plan = load_plan(plan if plan is not None else DEFAULT_PLANS[device])
    require_torch()
    # deferred: after require_torch(), so a missing torch is one clear error, not an ImportError
    from costmodel.profiling.sampling.collectives import launch
    from costmodel.profiling.sampling.runner import check_device, run_plan, sample_counts

    gpu = check_device(device, gpu_name)
    out_dir = out or Path("profiles") / gpu
    t0 = time.perf_counter()
    paths: list[Path] = []
    if compute_ops is None or compute_ops:
        paths += run_plan(the_plan.path, out_dir, device=device, threads=threads, progress=progress, resume=resume,
                          gpu_name=gpu_name, ops=compute_ops, dtype=dtype)
    has_coll = bool(the_plan.collectives.get("ops"))
    if coll_ops and (not has_coll or not collectives):
        raise PlannerError(f"--ops asks for {', '.join(coll_ops)} but " + ("the plan has no [collectives] table"
                           if not has_coll else "--no-collectives is set") + "; drop them from --ops")
    if collectives and has_coll and (coll_ops is None or coll_ops):
        paths += launch(the_plan.path, out_dir, nproc=nproc, device=device, gpu_name=gpu_name, resume=resume,
                        progress=progress, ops=coll_ops)
    counts = sample_counts(paths)
    for name, n in counts.items():
        typer.echo(f"{name:16s} {n:5d} samples")
    typer.echo(f"{sum(counts.values())} samples in {len(counts)} datasets written to {out_dir} "
               f"({time.perf_counter() - t0:.0f} s)")


def register(app: typer.Typer) -> None:
    app.command("profile")(profile)
