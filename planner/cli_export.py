"""`planner export`: one plan (same flags as `planner predict`) -> Megatron-LM / NeMo / torchtitan / Slurm text."""

from __future__ import annotations

import math
import os
import re
from typing import Optional

import typer

from costmodel.core.errors import PlannerError
from costmodel.core.fileio import atomic_write_text
from planner import cli_options as O
from planner.advice import memory_advice, plan_keys
from planner.export import (
    DEFAULT_MAX_WALLTIME_S,
    FORMATS,
    STARTUP_ALLOWANCE_S,
    TARGET_FILES,
    export_targets,
    iterations_for_tokens,
    join_targets,
    skipped_targets,
    slurm_budget,
)
from planner.predict import predict
from planner.requests import PlanRequest


def _err(message: str) -> typer.Exit:
    typer.echo(f"error: {message}", err=True)
    return typer.Exit(code=2)


def write_atomic(path: str, text: str) -> None:
    """Write ``text`` to ``path`` atomically (costmodel.core.fileio)."""
    atomic_write_text(path, text)


_UNITS = {"h": 3600.0, "d": 86400.0, "w": 7 * 86400.0}
_FILE_SUFFIXES = (".txt", ".args", ".sh", ".sbatch", ".slurm", ".yaml", ".yml", ".toml", ".json", ".cfg", ".conf")


def parse_walltime(text: str | float | None) -> float:
    """--max-walltime in seconds from '48h', '7d', '2w' (None: the default, DEFAULT_MAX_WALLTIME_S)."""
    if text is None:
        return DEFAULT_MAX_WALLTIME_S
    if isinstance(text, (int, float)) and not isinstance(text, bool):
        value = float(text)
    else:
        m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([hdw])\s*", str(text).lower())
        value = float(m.group(1)) * _UNITS[m.group(2)] if m else 0.0
    if not value > 0 or value == float("inf"):
        raise PlannerError(f"--max-walltime {text!r} is not a positive duration; write e.g. 48h, 7d or 2w "
                           "(your partition's MaxTime: scontrol show partition)")
    return value


def parse_token_budget(tokens: str | float | None) -> float | None:
    """--tokens as a number: 1e12, 2T, 300B (as planner size/compare)."""
    if tokens is None or (isinstance(tokens, (int, float)) and not isinstance(tokens, bool)):
        return tokens
    from planner.search.sizing import parse_tokens  # deferred: the search package loads only when --tokens is text

    return parse_tokens(tokens)


def out_directory(out: str) -> str:
    """``--out`` for ``--to all``: a directory (created when missing); a file path is refused."""
    if os.path.exists(out) and not os.path.isdir(out):
        raise PlannerError(f"--to all writes one file per target, but --out {out} is a file; pass a directory, "
                           "e.g. --out export/")
    if not os.path.exists(out) and os.path.splitext(out)[1].lower() in _FILE_SUFFIXES:
        raise PlannerError(f"--to all writes one file per target; --out {out} names a file: pass a directory, "
                           "e.g. --out export/")
    return out


def run_export(request: PlanRequest | dict, to: str, iterations: int | None, tokens: float | str | None,
               margin: float, job_name: str, cpus_per_task: int | None, hardware_files: tuple = (),
               max_walltime: str | float | None = None) -> tuple[dict[str, str], list[str], dict[str, str]]:
    """Check the export options, then predict and export the plan (a PlanRequest or its batch-line dict).
    Returns ({target: text}, warnings, {target left out of --to all: why}); raises PlannerError on bad input."""

    if to not in FORMATS:  # before the (slower) prediction
        raise PlannerError(f"--to {to!r} is not one of {', '.join(FORMATS)}")
    if iterations is not None and tokens is not None:
        raise PlannerError("give either --iterations or --tokens, not both")
    if iterations is not None and iterations <= 0:
        raise PlannerError(f"--iterations {iterations} must be a positive integer")
    tokens = parse_token_budget(tokens)
    if tokens is not None and not (math.isfinite(tokens) and tokens > 0):
        raise PlannerError(f"--tokens {tokens!r} must be a positive number, e.g. 1e12 or 2T")
    max_walltime_s = parse_walltime(max_walltime)
    req = (request if isinstance(request, PlanRequest) else PlanRequest.from_dict(request)).resolve(hardware_files)
    if tokens is not None:
        iterations = iterations_for_tokens(tokens, req.plan)
    pred = predict(req.model, req.plan, req.hardware)
    texts = export_targets(req.model, req.plan, req.hardware, pred, to, iterations=iterations, margin=margin,
                           job_name=job_name, cpus_per_task=cpus_per_task, max_walltime_s=max_walltime_s)
    skipped = skipped_targets(req.model, req.plan, to)
    warnings = [f"{name} not written: {why}" for name, why in skipped.items()]
    if "slurm" in texts and iterations is not None:
        warnings += slurm_budget(iterations, pred, margin, STARTUP_ALLOWANCE_S, max_walltime_s)[2]
    if not pred.fits_in_memory:
        advice = memory_advice({"fits_in_memory": False, "memory": pred.memory, "plan": plan_keys(req.plan)},
                               moe=req.model.is_moe)
        warnings.append(f"predicted memory {pred.memory_gib_per_gpu:.1f} GiB per GPU exceeds the GPU; "
                        f"the exported plan will not fit: {advice}")
    return texts, warnings, skipped


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
        recompute_modules: O.RecomputeModules = None,
        sequence_parallel: O.SequenceParallel = PlanRequest.sequence_parallel,
        zero: O.Zero = PlanRequest.zero,
        dtype: O.Dtype = PlanRequest.dtype,
        framework: O.Framework = PlanRequest.framework,
        attention: O.Attention = PlanRequest.attention,
        ep: O.Ep = PlanRequest.ep,
        etp: O.Etp = None,
        moe_dispatcher: O.MoeDispatcher = PlanRequest.moe_dispatcher,
        moe_imbalance: O.MoeImbalance = None,
        moe_overlap_comm: O.MoeOverlapComm = PlanRequest.moe_overlap_comm,
        moe_grouped_gemm: O.MoeGroupedGemm = PlanRequest.moe_grouped_gemm,
        main_grads_dtype: O.MainGradsDtype = PlanRequest.main_grads_dtype,
        main_params_dtype: O.MainParamsDtype = PlanRequest.main_params_dtype,
        exp_avg_dtype: O.ExpAvgDtype = PlanRequest.exp_avg_dtype,
        exp_avg_sq_dtype: O.ExpAvgSqDtype = PlanRequest.exp_avg_sq_dtype,
        fp8_param_gather: O.Fp8ParamGather = PlanRequest.fp8_param_gather,
        optimizer_offload_fraction: O.OptimizerOffload = PlanRequest.optimizer_offload_fraction,
        offload_modules: O.OffloadModules = None,
        reshard_after_forward: O.ReshardAfterForward = None,
        layer_split: O.LayerSplit = None,
        pipeline_layout: O.PipelineLayout = None,
        hardware_file: O.HardwareFile = [],
        to: str = typer.Option("all", "--to", help="megatron | nemo | torchtitan | slurm | all."),
        iterations: Optional[int] = typer.Option(None, "--iterations", help="Training iterations (optimizer steps)."),
        tokens: O.TokenBudget = None,
        margin: float = typer.Option(1.25, "--margin",
                                     help="Slurm time-limit factor on the predicted run time (>= 1)."),
        max_walltime: Optional[str] = typer.Option(
            None, "--max-walltime", help="Partition time limit, e.g. 48h or 7d; the Slurm export warns past it "
                                         "(default 7d)."),
        job_name: str = typer.Option("planner", "--job-name", help="Slurm job name."),
        cpus_per_task: Optional[int] = typer.Option(None, "--cpus-per-task", help="Slurm CPUs per task (= per node)."),
        out: Optional[str] = typer.Option(None, "--out", help="Write to this file (atomically) instead of stdout; "
                                          "with --to all, a directory: one file per target."),
    ) -> None:
        """Write launcher settings for one plan: Megatron-LM flags, NeMo YAML, torchtitan TOML, Slurm script."""
        raw = O.plan_flags(locals(), "planner export --model llama-13b --gpu a100-80gb --gpus 128 --tp 2 --pp 4 "
                                     "--to megatron")
        try:
            if out is not None and to == "all":
                out_directory(out)
            texts, warnings, skipped = run_export(raw, to, iterations, tokens, margin, job_name, cpus_per_task,
                                         tuple(hardware_file), max_walltime)
        except PlannerError as exc:
            raise _err(str(exc)) from None
        for w in warnings:
            typer.echo(f"warning: {w}", err=True)
        if out is None:
            text = texts[to] if to != "all" else join_targets(texts, skipped)
            typer.echo(text, nl=False)
            return
        paths = {name: os.path.join(out, TARGET_FILES[name]) for name in texts} if to == "all" else {to: out}
        try:
            if to == "all":
                os.makedirs(out, exist_ok=True)
            for name, path in paths.items():
                write_atomic(path, texts[name])
        except OSError as exc:
            raise _err(f"cannot write {exc.filename or out}: {exc.strerror}; pass a writable --out path") from None
        for path in paths.values():
            typer.echo(f"wrote {path}", err=True)
