"""`planner export`: one plan (same flags as `planner predict`) -> Megatron-LM / NeMo / torchtitan / Slurm text."""

from __future__ import annotations

import math
from typing import Optional

import typer

from costmodel.core.errors import PlannerError
from costmodel.core.fileio import atomic_write_text
from planner import cli_options as O
from planner.export import FORMATS, export_plan, iterations_for_tokens
from planner.predict import predict
from planner.requests import PlanRequest


def _err(message: str) -> typer.Exit:
    typer.echo(f"error: {message}", err=True)
    return typer.Exit(code=2)


def write_atomic(path: str, text: str) -> None:
    """Write ``text`` to ``path`` atomically (costmodel.core.fileio)."""
    atomic_write_text(path, text)


def run_export(request: PlanRequest | dict, to: str, iterations: int | None, tokens: float | None, margin: float,
               job_name: str, cpus_per_task: int | None, hardware_files: tuple = ()) -> tuple[str, list[str]]:
    """Check the export options, then predict and export the plan (a PlanRequest or its batch-line dict).
    Returns (text, warnings); raises PlannerError on bad input."""

    if to not in FORMATS:  # before the (slower) prediction
        raise PlannerError(f"--to {to!r} is not one of {', '.join(FORMATS)}")
    if iterations is not None and tokens is not None:
        raise PlannerError("give either --iterations or --tokens, not both")
    if iterations is not None and iterations <= 0:
        raise PlannerError(f"--iterations {iterations} must be a positive integer")
    if tokens is not None and not (math.isfinite(tokens) and tokens > 0):
        raise PlannerError(f"--tokens {tokens!r} must be a positive number, e.g. 1e12")
    req = (request if isinstance(request, PlanRequest) else PlanRequest.from_dict(request)).resolve(hardware_files)
    if tokens is not None:
        iterations = iterations_for_tokens(tokens, req.plan)
    pred = predict(req.model, req.plan, req.hardware)
    text = export_plan(req.model, req.plan, req.hardware, pred, to, iterations=iterations, margin=margin,
                       job_name=job_name, cpus_per_task=cpus_per_task)
    warnings = []
    if not pred.fits_in_memory:
        warnings.append(f"predicted memory {pred.memory_gib_per_gpu:.1f} GiB per GPU exceeds the GPU; "
                        "the exported plan will not fit")
    return text, warnings


def register(app: typer.Typer) -> None:
    @app.command()
    def export(
        model: O.Model = None,
        gpu: O.Gpu = None,
        gpus: O.Gpus = None,
        gpus_per_node: O.GpusPerNode = None,
        cluster: O.Cluster = None,
        tp: O.Tp = PlanRequest.tp,
        pp: O.Pp = PlanRequest.pp,
        cp: O.Cp = PlanRequest.cp,
        vpp: O.Vpp = PlanRequest.vpp,
        mbs: O.Mbs = PlanRequest.mbs,
        gbs: O.Gbs = None,
        tokens_per_batch: O.TokensPerBatch = None,
        seq_len: O.SeqLen = None,
        recompute: O.Recompute = PlanRequest.recompute,
        sequence_parallel: O.SequenceParallel = PlanRequest.sequence_parallel,
        zero: O.Zero = PlanRequest.zero,
        dtype: O.Dtype = PlanRequest.dtype,
        layer_split: O.LayerSplit = None,
        hardware_file: O.HardwareFile = [],
        to: str = typer.Option("all", "--to", help="megatron | nemo | torchtitan | slurm | all."),
        iterations: Optional[int] = typer.Option(None, "--iterations", help="Training iterations (optimizer steps)."),
        tokens: Optional[float] = typer.Option(None, "--tokens", help="Training tokens, e.g. 1e12 (-> iterations)."),
        margin: float = typer.Option(1.25, "--margin",
                                     help="Slurm time-limit factor on the predicted run time (>= 1)."),
        job_name: str = typer.Option("planner", "--job-name", help="Slurm job name."),
        cpus_per_task: Optional[int] = typer.Option(None, "--cpus-per-task", help="Slurm CPUs per task (= per node)."),
        out: Optional[str] = typer.Option(None, "--out", help="Write to this file (atomically) instead of stdout."),
    ) -> None:
        """Write launcher settings for one plan: Megatron-LM flags, NeMo YAML, torchtitan TOML, Slurm script."""
        raw = O.plan_flags(locals(), "planner export --model llama-13b --gpu a100-80gb --gpus 128 --tp 2 --pp 4 "
                                     "--to megatron")
        try:
            text, warnings = run_export(raw, to, iterations, tokens, margin, job_name, cpus_per_task,
                                        tuple(hardware_file))
        except PlannerError as exc:
            raise _err(str(exc)) from None
        for w in warnings:
            typer.echo(f"warning: {w}", err=True)
        if out is None:
            typer.echo(text, nl=False)
            return
        try:
            write_atomic(out, text)
        except OSError as exc:
            raise _err(f"cannot write {out}: {exc.strerror}; pass a writable --out path") from None
        typer.echo(f"wrote {out}", err=True)
