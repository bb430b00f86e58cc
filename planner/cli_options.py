"""Typer option declarations, each declared once and shared by every command that takes it.

The plan options (``--model`` .. ``--pipeline-layout``) are one table, :data:`PLAN_OPTIONS`: each sets the
:class:`planner.requests.PlanRequest` field of its name (the batch-file key and the Python API keyword), with the
dataclass's default. A command that takes a plan is decorated with :func:`plan_options` and receives them as one
``plan`` dict; search, compare and size take the plan-shaped options that apply to them by name
(:func:`plan_option`, e.g. ``O.Model``).
"""

from __future__ import annotations

import copy
import functools
import inspect
from collections.abc import Callable
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Annotated, Any, Optional

import typer

from costmodel.core.errors import PlannerError
from costmodel.core.fileio import atomic_write_text
from planner.models_dir import announce_models_dir, use_models_dir
from planner.plan_file import given_flags, merge_plan_file, merge_spec_file
from planner.requests import REQUIRED, PlanRequest
from planner.search.api import DEFAULT_GPU, SIZE_DEFAULT_GPUS
from planner.tables import use_wide

_REQUEST_DEFAULTS = {f.name: f.default for f in fields(PlanRequest)}


# ---------------------------------------------------------------- one plan (PlanRequest fields)
@dataclass(frozen=True)
class PlanOption:
    """One plan flag: it sets the PlanRequest field ``name`` (flag = ``--`` + name with dashes)."""

    name: str
    """PlanRequest field, batch-file key and Python API keyword."""
    type: Any
    """Type of the flag's value on the command line (list-valued fields are given as text, e.g. 9,8,8,7)."""
    help: str
    decls: tuple[str, ...] = ()
    """Flag spellings when not just ``--name-with-dashes`` (a short form, a --no- form)."""

    @property
    def default(self) -> Any:
        """The PlanRequest default; None for a required field (checked with an example) and for list-valued ones."""
        value = _REQUEST_DEFAULTS[self.name]
        return None if self.name in REQUIRED or isinstance(value, tuple) else value

    def annotation(self, required_note: bool = False) -> Any:
        """The typer annotation of the flag (``required_note``: its help says so where the field is required and
        the command checks it itself)."""
        decls = self.decls or ("--" + self.name.replace("_", "-"),)
        note = " Required, no default." if required_note and self.name in REQUIRED else ""
        return Annotated[self.type, typer.Option(*decls, help=self.help + note)]


PLAN_OPTIONS: tuple[PlanOption, ...] = (
    PlanOption("model", Optional[str], "Preset name (see `planner models`) or path to a config.json.",
               ("--model", "-m")),
    PlanOption("gpu", Optional[str], "GPU key (see `planner gpus`)."),
    PlanOption("gpus", Optional[int], "Total number of GPUs."),
    PlanOption("gpus_per_node", Optional[int], "GPUs per node (default: node type's)."),
    PlanOption("cluster", Optional[str], "Node type / cluster (see `planner gpus`)."),
    PlanOption("tp", int, "Tensor-parallel degree."),
    PlanOption("pp", int, "Pipeline-parallel degree."),
    PlanOption("cp", int, "Context-parallel degree."),
    PlanOption("vpp", int, "Virtual pipeline chunks per stage."),
    PlanOption("mbs", int, "Micro-batch size (sequences)."),
    PlanOption("gbs", Optional[int], "Global batch size (sequences); default ~4M tokens (search, compare, size: a "
               "range, see --tokens-per-batch)."),
    PlanOption("tokens_per_batch", Optional[str], "Global batch in tokens, e.g. 4M or 16e6 (instead of --gbs; "
               "default ~4M)."),
    PlanOption("seq_len", Optional[int], "Sequence length (default: model's max)."),
    PlanOption("recompute", str, "none | selective | full."),
    PlanOption("recompute_modules", Optional[str], "With selective: Megatron-Core modules, e.g. moe_act,layernorm "
               "(default core_attn)."),
    PlanOption("sequence_parallel", bool, "Megatron sequence parallelism (with TP > 1).",
               ("--sequence-parallel/--no-sequence-parallel",)),
    PlanOption("zero", str, "ZeRO stage 0-3 (1 = distributed optimizer, 3 = FSDP) or auto: 1, or the lowest "
               "stage under which the plan fits (the output says which)."),
    PlanOption("dtype", str, "bf16 | fp16 | fp8 | fp8-block (alias mxfp8) | fp32."),
    PlanOption("framework", str, "Training stack: megatron | deepspeed | fsdp | torchtitan | torchtitan-eager "
               "| llmc (attention kernel, overlap)."),
    PlanOption("attention", str, "Attention kernel: fused | flash2 | flash1 | unfused (default: the framework's)."),
    PlanOption("ep", int, "Expert-parallel degree (MoE models; divides the experts)."),
    PlanOption("etp", Optional[int], "Expert tensor-parallel degree (default: --tp)."),
    PlanOption("moe_dispatcher", str, "MoE token dispatcher: alltoall | allgather | flex | auto (what the "
               "framework's recipes run for the EP group's placement; the output says which)."),
    PlanOption("moe_imbalance", Optional[float], "Busiest expert's tokens over the mean, >= 1 (default: the cost "
               "model's)."),
    PlanOption("moe_routing", str, "Which experts a token picks: learned (the router) | random (forced load "
               "balancing) | round_robin."),
    PlanOption("moe_overlap_comm", bool, "Overlap EP dispatch/combine with compute.",
               ("--moe-overlap-comm/--no-moe-overlap-comm",)),
    PlanOption("moe_grouped_gemm", bool, "Local experts as one grouped GEMM (off: one GEMM per expert).",
               ("--moe-grouped-gemm/--no-moe-grouped-gemm",)),
    PlanOption("main_grads_dtype", str, "Main-gradient precision: fp32 | bf16 (Megatron --main-grads-dtype / "
               "--grad-reduce-in-bf16); default: fp16 with --dtype fp16 on megatron/deepspeed, else fp32."),
    PlanOption("main_params_dtype", str, "Optimizer copy of the parameters: fp32 | fp16 | bf16 | none (FSDP stacks: "
               "steps the bf16 parameters)."),
    PlanOption("exp_avg_dtype", str, "Adam first moment: fp32 | fp16 | bf16 | fp8."),
    PlanOption("exp_avg_sq_dtype", str, "Adam second moment: fp32 | fp16 | bf16 | fp8."),
    PlanOption("fp8_param_gather", bool, "fp8 primary weights, all-gathered in fp8 (fp8 dtypes).",
               ("--fp8-param-gather/--no-fp8-param-gather",)),
    PlanOption("optimizer_offload_fraction", float, "Share of the optimizer states on the host (Megatron "
               "--optimizer-cpu-offload); 0 = none."),
    PlanOption("offload_modules", Optional[str], "Fine-grained activation offloading (Megatron-Core), e.g. "
               "expert_fc1,moe_act."),
    PlanOption("reshard_after_forward", Optional[bool], "ZeRO-3: free gathered parameters after forward (default) or "
               "keep them to backward.", ("--reshard-after-forward/--no-reshard-after-forward",)),
    PlanOption("cuda_graphs", bool, "Layers replay from CUDA graphs (Megatron --cuda-graph-impl local): no per-kernel "
               "CPU dispatch.", ("--cuda-graphs/--no-cuda-graphs",)),
    PlanOption("tp_comm_overlap", bool, "Overlap TP all-gathers / reduce-scatters with the GEMMs (Megatron "
               "--tp-comm-overlap; needs sequence parallelism).", ("--tp-comm-overlap/--no-tp-comm-overlap",)),
    PlanOption("cross_entropy_fusion", Optional[bool], "Fused loss kernel (Megatron --cross-entropy-loss-fusion; "
               "default: the framework's).", ("--cross-entropy-fusion/--no-cross-entropy-fusion",)),
    PlanOption("layer_split", Optional[str], "Uneven layers per stage, e.g. 9,8,8,7."),
    PlanOption("pipeline_layout", Optional[str], "Layers per virtual stage (chunk a of stage b = entry a*PP+b), e.g. "
               "2,2,1,... or Megatron's --pipeline-model-parallel-layout string 'Et|(tt|)*30L'; VPP = entries / PP."),
)
"""Every plan flag, in the order help lists them: the fields of PlanRequest but its ``id``."""
_PLAN = {o.name: o for o in PLAN_OPTIONS}


def plan_option(name: str) -> Any:
    """The typer annotation of one plan flag, for commands that take only some of them (search, compare, size)."""
    return _PLAN[name].annotation()


Model = plan_option("model")
Gpu = plan_option("gpu")
Gpus = plan_option("gpus")
Cp = plan_option("cp")
Vpp = plan_option("vpp")
Cluster = plan_option("cluster")
GpusPerNode = plan_option("gpus_per_node")
Gbs = plan_option("gbs")
TokensPerBatch = plan_option("tokens_per_batch")
SeqLen = plan_option("seq_len")
MainGradsDtype = plan_option("main_grads_dtype")
MainParamsDtype = plan_option("main_params_dtype")
ExpAvgDtype = plan_option("exp_avg_dtype")
ExpAvgSqDtype = plan_option("exp_avg_sq_dtype")
Fp8ParamGather = plan_option("fp8_param_gather")
OptimizerOffloadFraction = plan_option("optimizer_offload_fraction")
OffloadModules = plan_option("offload_modules")
ReshardAfterForward = plan_option("reshard_after_forward")


def plan_options(command: Callable) -> Callable:
    """Give a typer command every plan flag of :data:`PLAN_OPTIONS` (listed first in its help, with the PlanRequest
    defaults); ``command`` receives them as one ``plan`` dict (name -> value, None = not given) and declares its
    other options as usual."""
    own = [p.replace(kind=inspect.Parameter.KEYWORD_ONLY)
           for p in inspect.signature(command, eval_str=True).parameters.values() if p.name != "plan"]
    flags = [inspect.Parameter(o.name, inspect.Parameter.KEYWORD_ONLY, default=o.default,
                               annotation=o.annotation(required_note=True)) for o in PLAN_OPTIONS]

    plan_file = inspect.Parameter("plan_file", inspect.Parameter.KEYWORD_ONLY, default=None, annotation=PlanFile)
    context = inspect.Parameter("typer_ctx", inspect.Parameter.KEYWORD_ONLY, annotation=typer.Context)

    @functools.wraps(command)
    def with_plan(**values: Any) -> Any:
        plan = {o.name: values.pop(o.name) for o in PLAN_OPTIONS}
        path, ctx = values.pop("plan_file"), values.pop("typer_ctx", None)
        if path is not None and values.get("batch") is not None:
            raise _err(f"--plan {path} and --batch {values['batch']} both name the plans; pass one of them")
        if path is not None:
            try:
                plan = merge_plan_file(path, plan, given_flags(ctx, plan))
            except PlannerError as exc:
                raise _err(str(exc)) from None
        return command(plan=plan, **values)

    with_plan.__signature__ = inspect.Signature([context, plan_file, *flags, *own])  # type: ignore[attr-defined]
    return with_plan


PlanFile = Annotated[Optional[str], typer.Option(
    "--plan", help="TOML/YAML plan file: the `predict --batch` keys (e.g. examples/llama13b_a100_tp2pp2.toml); "
    "flags given override it.")]


def spec_file(command: Callable) -> Callable:
    """Give a typer command (search, compare, size) ``--spec FILE``: a TOML/YAML file of its options by name
    (planner.plan_file), flags given on the command line overriding it. Options the command requires become
    optional on the command line and are checked after the file is read (exit 2, one line)."""
    sig = inspect.signature(command, eval_str=True)
    required = [p.name for p in sig.parameters.values() if _required(p)]
    own = [p.replace(kind=inspect.Parameter.KEYWORD_ONLY, default=_optional(p.default))
           for p in sig.parameters.values()]
    spec = inspect.Parameter("spec", inspect.Parameter.KEYWORD_ONLY, default=None, annotation=SpecFile)
    context = inspect.Parameter("typer_ctx", inspect.Parameter.KEYWORD_ONLY, annotation=typer.Context)

    @functools.wraps(command)
    def with_spec(**values: Any) -> Any:
        path, ctx = values.pop("spec"), values.pop("typer_ctx")
        if path is not None:
            try:
                values = merge_spec_file(path, ctx, values, exclude=("spec",))
            except PlannerError as exc:
                raise _err(str(exc)) from None
        missing = [f"--{n.replace('_', '-')}" for n in required if values.get(n) is None]
        if missing:
            raise _err(f"missing {', '.join(missing)}: give it as a flag or a key of the --spec file, e.g. "
                       f"examples/search_llama13b_128.toml")
        return command(**values)

    with_spec.__signature__ = inspect.Signature([context, spec, *own])  # type: ignore[attr-defined]
    return with_spec


def _required(p: inspect.Parameter) -> bool:
    """A parameter click would require: no default, or ``typer.Option(...)``."""
    return p.default is inspect.Parameter.empty or getattr(p.default, "default", None) is Ellipsis


def _optional(default: Any) -> Any:
    """``default`` with "required" (none, or ``typer.Option(...)``) made None: a spec file may give the value."""
    if default is inspect.Parameter.empty:
        return None
    if getattr(default, "default", None) is Ellipsis:
        default = copy.copy(default)
        default.default = None
    return default


SpecFile = Annotated[Optional[str], typer.Option(
    "--spec", help="TOML/YAML file of this command's options by name (e.g. examples/search_llama13b_128.toml); "
    "flags given override it.")]


Wide = Annotated[bool, typer.Option(
    "--wide", callback=use_wide, help="Tables with every column and full headers, at any width (default: fit the "
    "terminal, 100 columns when piped; the output says which columns it left out).")]
HardwareFile = Annotated[list[str], typer.Option("--hardware-file", help="TOML/YAML file adding GPUs/clusters.")]


def _use_models(value: Optional[Path]) -> Optional[Path]:
    """--models: the first folder predictions read fitted models from (planner.models_dir)."""
    use_models_dir(value)
    announce_models_dir()
    return value


ModelsDir = Annotated[Optional[Path], typer.Option(
    "--models", callback=_use_models, help="Fitted models from `planner fit --out DIR` (default: "
    "$PLANNER_MODELS_DIR; shipped models for GPUs it does not cover).")]
CalibrationRef = Annotated[Optional[str], typer.Option(
    "--calibration",
    help="Calibration NAME (calibrations/NAME.json) or file from `planner calibrate`; default: the shipped default "
         "calibration (search_spaces/calibration/default.json); 'none' = uncalibrated.")]

# ---------------------------------------------------------------- allocations and spaces (search, compare, size)
# `planner search` takes --tp .. --dtype as lists of choices that replace its space's (e.g. --tp 1,2,4).
SearchGpuList = Annotated[list[str], typer.Option("--gpu",
    help=f"GPU key (repeat for several; default {DEFAULT_GPU}; see `planner gpus`).")]
CompareGpuList = Annotated[list[str], typer.Option("--gpu",
                                                   help="GPU keys to compare (repeat; at least two are useful).")]
SizeGpuList = Annotated[list[str], typer.Option("--gpu",
    help=f"GPU types to consider (repeat; default: {', '.join(SIZE_DEFAULT_GPUS)}).")]
NodeTypeList = Annotated[list[str], typer.Option("--cluster",
    help="Node type per GPU (repeat): GPU=NODE_TYPE (gh200=vista) or NODE_TYPE alone for its own GPU (see `planner "
         "gpus`); default: each GPU's default node type.")]
AllocGpus = Annotated[Optional[int], typer.Option("--gpus", help="Total GPUs (a multiple of GPUs per node).")]
Nodes = Annotated[Optional[int], typer.Option("--nodes", help="Nodes of each GPU type.")]
NodesRange = Annotated[Optional[str], typer.Option("--nodes-range",
                                                   help="Node counts: A:B doubling, A:B:STEP, or 4,8,16.")]
TpChoices = Annotated[Optional[str], typer.Option("--tp", help="TP degrees, e.g. 1,2,4,8.")]
PpChoices = Annotated[Optional[str], typer.Option("--pp", help="PP degrees.")]
CpChoices = Annotated[Optional[str], typer.Option("--cp", help="CP degrees.")]
VppChoices = Annotated[Optional[str], typer.Option("--vpp", help="Virtual pipeline chunks per stage.")]
MbsChoices = Annotated[Optional[str], typer.Option("--mbs", help="Micro-batch sizes.")]
RecomputeChoices = Annotated[Optional[str], typer.Option("--recompute", help="Recompute modes: none,selective,full.")]
EpChoices = Annotated[Optional[str], typer.Option("--ep", help="EP degrees (MoE models; default: the divisors of "
                                                "the experts).")]
EtpChoices = Annotated[Optional[str], typer.Option("--etp", help="Expert TP choices: tp and/or integers "
                                                  "(default tp,1).")]
ZeroChoices = Annotated[Optional[str], typer.Option("--zero", help="ZeRO stages, e.g. 1,3.")]
SpChoices = Annotated[Optional[str], typer.Option("--sp", help="Sequence parallelism values: true,false.")]
FrameworkChoices = Annotated[Optional[str], typer.Option(
    "--framework", help="Training stacks to compare, e.g. megatron,fsdp (default megatron).")]
DtypeChoices = Annotated[Optional[str], typer.Option("--dtype", help="GEMM precisions: bf16,fp8,fp8-block.")]
AllowTpAcrossNodes = Annotated[bool, typer.Option("--allow-tp-across-nodes", help="Let TP groups span nodes.")]
Headroom = Annotated[Optional[float], typer.Option("--headroom", help="HBM fraction kept free beyond the modelled "
                                                   "terms (default 0).")]
TokenBudget = Annotated[Optional[str], typer.Option("--tokens", help="Training token budget, e.g. 1e12 or 2T.")]
Price = Annotated[list[str], typer.Option("--price", help="GPU=USD per GPU-hour, e.g. gh200=2.1 (repeatable).")]
Space = Annotated[str, typer.Option("--space", help="Search-space preset (default, megatron, fsdp) or TOML file.")]
Report = Annotated[Optional[str], typer.Option("--report",
    help="Also write a Markdown report with PNG plots, e.g. reports/NAME.md.")]
TokensPerBatchRange = Annotated[Optional[str], typer.Option(
    "--tokens-per-batch", help="Global batch in tokens: one value (16M) or a range MIN:MAX (4M:16M) each plan takes "
    "its GBS from (instead of --gbs; default: 4M to DeepSeek's compute-optimal batch, planner/batch.py).")]
ProgressBar = Annotated[bool, typer.Option("--progress/--no-progress", help="Progress bar on stderr (terminals only).")]
MinGpus = Annotated[int, typer.Option("--min-gpus", help="Smallest allocation considered (GPUs).")]
MaxGpus = Annotated[int, typer.Option("--max-gpus", help="Largest allocation considered (GPUs).")]

# ---------------------------------------------------------------- goodput (costmodel/schedule/goodput.py; defaults
# cited there)
Goodput = Annotated[bool, typer.Option("--goodput/--no-goodput", help="Expected time and cost to train with "
                                       "failures, restarts and checkpoint stalls (default) or a perfect run.")]
FailureRate = Annotated[Optional[float], typer.Option(
    "--failure-rate", help="Unexpected interruptions per GPU-hour (default 1.97e-5, Llama 3).")]
PlannedInterruptions = Annotated[Optional[float], typer.Option(
    "--planned-interruptions", help="Planned interruptions per day for the job (default 0.87, Llama 3).")]
RestartMin = Annotated[Optional[float], typer.Option("--restart-min", help="Minutes to restart (default 10).")]
CkptMode = Annotated[Optional[str], typer.Option(
    "--ckpt-mode", help="sync (save blocks: size / bandwidth) | async (device-to-host stall only); default sync.")]
CkptBandwidth = Annotated[Optional[float], typer.Option(
    "--ckpt-bandwidth", help="Aggregate checkpoint write bandwidth, GB/s (default 0.122 per GPU of the job).")]
CkptInterval = Annotated[Optional[float], typer.Option(
    "--ckpt-interval", help="Checkpoint interval in minutes (default: Daly's optimum).")]
Slowdown = Annotated[Optional[float], typer.Option(
    "--slowdown", help="Throughput fraction lost to stragglers while running (default 0.015).")]


def _err(message: str) -> typer.Exit:
    typer.echo(f"error: {message}", err=True)
    return typer.Exit(code=2)


def plan_request(plan: dict, example: str) -> PlanRequest:
    """The PlanRequest of a command's ``plan`` flags (:func:`plan_options`): a missing --model/--gpu/--gpus exits 2
    with one line (``example`` shows a complete command); a bad value raises PlannerError naming the key."""
    missing = [f"--{n}" for n in REQUIRED if plan.get(n) is None]
    if missing:
        raise _err(f"missing {', '.join(missing)}; e.g. {example}")
    return PlanRequest.from_dict(plan)


def write_or_print(text: str, out) -> None:
    """A command's text output: to ``out`` (atomically, `costmodel.core.fileio`) with a note, else to stdout."""
    if out is not None:
        atomic_write_text(out, text)
        typer.echo(f"wrote {out}")
    else:
        typer.echo(text, nl=False)
