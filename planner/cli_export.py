"""`planner export`: one plan (same flags as `planner predict`) -> Megatron-LM / NeMo / torchtitan / Slurm text."""

from __future__ import annotations

import math
from typing import Optional

import typer

from planner import cli_options as O

from costmodel.core.errors import PlannerError


def _err(message: str) -> typer.Exit:
    typer.echo(f"error: {message}", err=True)
    return typer.Exit(code=2)


def write_atomic(path: str, text: str) -> None:
    """Write ``text`` to ``path`` atomically (costmodel.core.fileio)."""
    from costmodel.core.fileio import atomic_write_text

    atomic_write_text(path, text)


def run_export(raw: dict, to: str, iterations: int | None, tokens: float | None, margin: float, job_name: str,
               cpus_per_task: int | None, hardware_files: tuple = ()) -> tuple[str, list[str]]:
    """Build the request, predict, export. Returns (text, warnings); raises PlannerError on bad input."""
    from planner.export import FORMATS, export_plan, iterations_for_tokens
    from planner.predict import predict
    from planner.requests import build_request

    if to not in FORMATS:  # before the (slower) prediction
        raise PlannerError(f"--to {to!r} is not one of {', '.join(FORMATS)}")
    if iterations is not None and tokens is not None:
        raise PlannerError("give either --iterations or --tokens, not both")
    if iterations is not None and iterations <= 0:
        raise PlannerError(f"--iterations {iterations} must be a positive integer")
    if tokens is not None and not (math.isfinite(tokens) and tokens > 0):
        raise PlannerError(f"--tokens {tokens!r} must be a positive number, e.g. 1e12")
    req = build_request(raw, hardware_files)
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
        tp: O.Tp = 1,
        pp: O.Pp = 1,
        cp: O.Cp = 1,
        vpp: O.Vpp = 1,
        mbs: O.Mbs = 1,
        gbs: O.Gbs = None,
        seq_len: O.SeqLen = None,
        recompute: O.Recompute = "selective",
        sequence_parallel: O.SequenceParallel = True,
        zero: O.Zero = 1,
        dtype: O.Dtype = "bf16",
        layer_split: O.LayerSplit = None,
        hardware_file: O.HardwareFile = [],
        to: str = typer.Option("all", "--to", help="megatron | nemo | torchtitan | slurm | all."),
        iterations: Optional[int] = typer.Option(None, "--iterations", help="Training iterations (optimizer steps)."),
        tokens: Optional[float] = typer.Option(None, "--tokens", help="Training tokens, e.g. 1e12 (-> iterations)."),
        margin: float = typer.Option(1.25, "--margin", help="Slurm time-limit factor on the predicted run time (>= 1)."),
        job_name: str = typer.Option("planner", "--job-name", help="Slurm job name."),
        cpus_per_task: Optional[int] = typer.Option(None, "--cpus-per-task", help="Slurm CPUs per task (= per node)."),
        out: Optional[str] = typer.Option(None, "--out", help="Write to this file (atomically) instead of stdout."),
    ) -> None:
        """Write launcher settings for one plan: Megatron-LM flags, NeMo YAML, torchtitan TOML, Slurm script."""
        missing = [n for n, v in (("--model", model), ("--gpu", gpu), ("--gpus", gpus)) if v is None]
        if missing:
            raise _err(f"missing {', '.join(missing)}; e.g. planner export --model llama-13b --gpu a100-80gb "
                       "--gpus 128 --tp 2 --pp 4 --to megatron")
        split = None
        if layer_split is not None:
            try:
                split = [int(x) for x in layer_split.split(",")]
            except ValueError:
                raise _err(f"--layer-split {layer_split!r} must be comma-separated integers, e.g. 9,8,8,7")
        raw = {"layer_split": split, "model": model, "gpu": gpu, "gpus": gpus, "gpus_per_node": gpus_per_node,
               "cluster": cluster, "tp": tp, "pp": pp, "cp": cp, "vpp": vpp, "mbs": mbs, "gbs": gbs,
               "seq_len": seq_len, "recompute": recompute, "sequence_parallel": sequence_parallel, "zero": zero,
               "dtype": dtype}
        try:
            text, warnings = run_export(raw, to, iterations, tokens, margin, job_name, cpus_per_task,
                                        tuple(hardware_file))
        except PlannerError as exc:
            raise _err(str(exc))
        for w in warnings:
            typer.echo(f"warning: {w}", err=True)
        if out is None:
            typer.echo(text, nl=False)
            return
        try:
            write_atomic(out, text)
        except OSError as exc:
            raise _err(f"cannot write {out}: {exc.strerror}; pass a writable --out path")
        typer.echo(f"wrote {out}", err=True)
