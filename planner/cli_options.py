"""Typer option declarations, each declared once and shared by every command that takes it.

The plan-request options (``--model`` .. ``--layer-split``) name the fields of
:class:`planner.requests.PlanRequest`; a command takes them with the dataclass's defaults, e.g.
``tp: O.Tp = PlanRequest.tp``, and turns them into a request with :func:`plan_request`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from costmodel.core.errors import PlannerError
from costmodel.core.fileio import atomic_write_text
from planner.models_dir import announce_models_dir, use_models_dir
from planner.requests import REQUEST_KEYS, PlanRequest, suffixed_number

DEFAULT_GPU = "a100-80gb"
"""GPU used by `planner search` and `planner explain` when --gpu is not given (the issue's reference
case: llama-13b on 128 A100-80GB)."""

SIZE_DEFAULT_GPUS = ("a100-80gb", "h100-sxm")
"""GPU types `planner size` considers without --gpu (kept short: each type costs several searches)."""

# ---------------------------------------------------------------- one plan (PlanRequest fields)
Model = Annotated[Optional[str], typer.Option("--model", "-m",
                                              help="Preset name (see `planner models`) or path to a config.json.")]
Gpu = Annotated[Optional[str], typer.Option("--gpu", help="GPU key (see `planner gpus`).")]
Gpus = Annotated[Optional[int], typer.Option("--gpus", help="Total number of GPUs.")]
GpusPerNode = Annotated[Optional[int], typer.Option("--gpus-per-node", help="GPUs per node (default: node type's).")]
Cluster = Annotated[Optional[str], typer.Option("--cluster", help="Node type / cluster (see `planner gpus`).")]
Tp = Annotated[int, typer.Option("--tp", help="Tensor-parallel degree.")]
Pp = Annotated[int, typer.Option("--pp", help="Pipeline-parallel degree.")]
Cp = Annotated[int, typer.Option("--cp", help="Context-parallel degree.")]
Vpp = Annotated[int, typer.Option("--vpp", help="Virtual pipeline chunks per stage.")]
Mbs = Annotated[int, typer.Option("--mbs", help="Micro-batch size (sequences).")]
Gbs = Annotated[Optional[int], typer.Option("--gbs", help="Global batch size (sequences); default ~4M tokens "
                                            "(search, compare, size: a range, see --tokens-per-batch).")]
TokensPerBatch = Annotated[Optional[str], typer.Option(
    "--tokens-per-batch", help="Global batch in tokens, e.g. 4M or 16e6 (instead of --gbs; default ~4M).")]
TokensPerBatchRange = Annotated[Optional[str], typer.Option(
    "--tokens-per-batch", help="Global batch in tokens: one value (16M) or a range MIN:MAX (4M:16M) each plan takes "
    "its GBS from (instead of --gbs; default: 4M to DeepSeek's compute-optimal batch, planner/batch.py).")]
SeqLen = Annotated[Optional[int], typer.Option("--seq-len", help="Sequence length (default: model's max).")]
Recompute = Annotated[str, typer.Option("--recompute", help="none | selective | full.")]
RecomputeModules = Annotated[Optional[str], typer.Option(
    "--recompute-modules", help="With selective: Megatron-Core modules, e.g. moe_act,layernorm (default core_attn).")]
SequenceParallel = Annotated[bool, typer.Option("--sequence-parallel/--no-sequence-parallel")]
Zero = Annotated[int, typer.Option("--zero", help="ZeRO stage 0-3 (1 = distributed optimizer, 3 = FSDP).")]
Dtype = Annotated[str, typer.Option("--dtype", help="bf16 | fp16 | fp8 | fp8-block (alias mxfp8) | fp32.")]
Framework = Annotated[str, typer.Option(
    "--framework",
    help="Training stack: megatron | deepspeed | fsdp | torchtitan | torchtitan-eager (attention kernel, overlap).")]
Attention = Annotated[str, typer.Option(
    "--attention", help="Attention kernel: fused | flash2 | unfused (default: the framework's).")]
Ep = Annotated[int, typer.Option("--ep", help="Expert-parallel degree (MoE models; divides the experts).")]
Etp = Annotated[Optional[int], typer.Option("--etp", help="Expert tensor-parallel degree (default: --tp).")]
MoeDispatcher = Annotated[str, typer.Option("--moe-dispatcher", help="MoE token dispatcher: alltoall | allgather "
                                            "| flex | auto (what the framework's recipes run for the EP group's "
                                            "placement; the output says which).")]
MoeImbalance = Annotated[Optional[float], typer.Option(
    "--moe-imbalance", help="Busiest expert's tokens over the mean, >= 1 (default: the cost model's).")]
MoeOverlapComm = Annotated[bool, typer.Option("--moe-overlap-comm/--no-moe-overlap-comm",
                                              help="Overlap EP dispatch/combine with compute.")]
MoeGroupedGemm = Annotated[bool, typer.Option("--moe-grouped-gemm/--no-moe-grouped-gemm",
                                              help="Local experts as one grouped GEMM (off: one GEMM per expert).")]
MainGradsDtype = Annotated[str, typer.Option("--main-grads-dtype", help="Main-gradient precision: fp32 | bf16 "
                                              "(Megatron --main-grads-dtype / --grad-reduce-in-bf16); default: fp16 "
                                              "with --dtype fp16 on megatron/deepspeed, else fp32.")]
MainParamsDtype = Annotated[str, typer.Option("--main-params-dtype", help="Optimizer copy of the parameters: fp32 | "
                                              "fp16 | bf16 | none (FSDP stacks: steps the bf16 parameters).")]
ExpAvgDtype = Annotated[str, typer.Option("--exp-avg-dtype", help="Adam first moment: fp32 | fp16 | bf16 | fp8.")]
ExpAvgSqDtype = Annotated[str, typer.Option("--exp-avg-sq-dtype", help="Adam second moment: fp32 | fp16 | bf16 | fp8.")]
Fp8ParamGather = Annotated[bool, typer.Option("--fp8-param-gather/--no-fp8-param-gather",
                                              help="fp8 primary weights, all-gathered in fp8 (fp8 dtypes).")]
OptimizerOffload = Annotated[float, typer.Option("--optimizer-offload-fraction", help="Share of the optimizer "
                                                 "states on the host (Megatron --optimizer-cpu-offload); 0 = none.")]
OffloadModules = Annotated[Optional[str], typer.Option("--offload-modules", help="Fine-grained activation offloading "
                                                       "(Megatron-Core), e.g. expert_fc1,moe_act.")]
ReshardAfterForward = Annotated[Optional[bool], typer.Option(
    "--reshard-after-forward/--no-reshard-after-forward", help="ZeRO-3: free gathered parameters after forward "
    "(default) or keep them to backward.")]
CudaGraphs = Annotated[bool, typer.Option("--cuda-graphs/--no-cuda-graphs",
                                          help="Layers replay from CUDA graphs (Megatron --cuda-graph-impl local): no "
                                               "per-kernel CPU dispatch.")]
CrossEntropyFusion = Annotated[Optional[bool], typer.Option(
    "--cross-entropy-fusion/--no-cross-entropy-fusion",
    help="Fused loss kernel (Megatron --cross-entropy-loss-fusion; default: the framework's).")]
LayerSplit = Annotated[Optional[str], typer.Option("--layer-split", help="Uneven layers per stage, e.g. 9,8,8,7.")]
PipelineLayout = Annotated[Optional[str], typer.Option(
    "--pipeline-layout", help="Layers per virtual stage (chunk a of stage b = entry a*PP+b), e.g. 2,2,1,... or "
    "Megatron's --pipeline-model-parallel-layout string 'Et|(tt|)*30L'; VPP = entries / PP.")]
HardwareFile = Annotated[list[str], typer.Option("--hardware-file", help="TOML/YAML file adding GPUs/clusters.")]


def _use_models(value: Optional[Path]) -> Optional[Path]:
    """--models: the first folder predictions read fitted models from (planner.models_dir)."""
    use_models_dir(value)
    announce_models_dir()
    return value


ModelsDir = Annotated[Optional[Path], typer.Option(
    "--models", callback=_use_models, help="Fitted models from `planner fit --out DIR` (default: "
    "$PLANNER_MODELS_DIR; shipped models for GPUs it does not cover).")]

# ---------------------------------------------------------------- allocations and spaces (search, compare, size)
# `planner search` takes --tp .. --dtype as lists of choices that replace its space's (e.g. --tp 1,2,4).
SearchGpuList = Annotated[list[str], typer.Option("--gpu",
    help=f"GPU key (repeat for several; default {DEFAULT_GPU}; see `planner gpus`).")]
CompareGpuList = Annotated[list[str], typer.Option("--gpu",
                                                   help="GPU keys to compare (repeat; at least two are useful).")]
SizeGpuList = Annotated[list[str], typer.Option("--gpu",
    help=f"GPU types to consider (repeat; default: {', '.join(SIZE_DEFAULT_GPUS)}).")]
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
ProgressBar = Annotated[bool, typer.Option("--progress/--no-progress", help="Progress bar on stderr (terminals only).")]
MinGpus = Annotated[int, typer.Option("--min-gpus", help="Smallest allocation considered (GPUs).")]
MaxGpus = Annotated[int, typer.Option("--max-gpus", help="Largest allocation considered (GPUs).")]

# ---------------------------------------------------------------- goodput (costmodel/goodput.py; defaults cited there)
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


def failure_model(flags: dict):
    """The costmodel.goodput.FailureModel named by a command's goodput flags (None with --no-goodput); a bad value
    raises PlannerError."""
    from costmodel.goodput import FailureModel  # deferred: only the sizing commands need it

    if not flags.get("goodput", True):
        return None
    given = {"failure_rate": flags.get("failure_rate"), "planned_per_day": flags.get("planned_interruptions"),
             "restart_s": None if flags.get("restart_min") is None else 60.0 * flags["restart_min"],
             "ckpt_mode": flags.get("ckpt_mode"), "storage_gbs": flags.get("ckpt_bandwidth"),
             "interval_s": None if flags.get("ckpt_interval") is None else 60.0 * flags["ckpt_interval"],
             "slowdown": flags.get("slowdown")}
    return FailureModel(**{k: v for k, v in given.items() if v is not None})


def _err(message: str) -> typer.Exit:
    typer.echo(f"error: {message}", err=True)
    return typer.Exit(code=2)


def plan_flags(flags: dict, example: str) -> dict:
    """The batch-line dict of a command's plan flags (``flags`` maps parameter names to values, e.g.
    the command's ``locals()``; names that are not PlanRequest fields are ignored). Missing
    --model/--gpu/--gpus and a malformed --layer-split exit 2 with one line (``example`` shows a
    complete command)."""
    missing = [f"--{n}" for n in ("model", "gpu", "gpus") if flags.get(n) is None]
    if missing:
        raise _err(f"missing {', '.join(missing)}; e.g. {example}")
    raw = {k: flags[k] for k in REQUEST_KEYS if k in flags}
    text = raw.get("layer_split")
    if text is not None:
        try:
            raw["layer_split"] = [int(x) for x in text.split(",")]
        except ValueError:
            raise _err(f"--layer-split {text!r} must be comma-separated integers, e.g. 9,8,8,7") from None
    tpb = raw.get("tokens_per_batch")
    if tpb is not None:
        try:
            raw["tokens_per_batch"] = parse_batch_tokens(tpb)
        except PlannerError as exc:
            raise _err(str(exc)) from None
    return raw


_SUFFIX = {"k": 1e3, "m": 1e6, "b": 1e9, "g": 1e9}


def parse_batch_tokens(text: str | int | None) -> int | None:
    """--tokens-per-batch as an integer: 4194304, 4M (4e6), 16e6; None stays None."""
    if text is None or isinstance(text, int):
        return text
    try:
        v = suffixed_number(text, _SUFFIX)
    except ValueError:
        v = float("nan")
    if not (v >= 1 and v < 2**53):
        raise PlannerError(f"--tokens-per-batch {text!r} must be a positive number of tokens, e.g. 4M or 4194304.")
    return int(round(v))


def plan_request(flags: dict, example: str) -> PlanRequest:
    """The PlanRequest named by a command's plan flags (see :func:`plan_flags`); a bad value raises
    PlannerError naming the key."""
    return PlanRequest.from_dict(plan_flags(flags, example))


def write_or_print(text: str, out) -> None:
    """A command's text output: to ``out`` (atomically, `costmodel.core.fileio`) with a note, else to stdout."""
    if out is not None:
        atomic_write_text(out, text)
        typer.echo(f"wrote {out}")
    else:
        typer.echo(text, nl=False)


# ---------------------------------------------------------------- search dimension flags (lists of choices)
def int_list(name: str, text: str | None) -> list[int] | None:
    """A search dimension flag as integers: '1,2,4' -> [1, 2, 4]; None stays None."""
    if text is None:
        return None
    try:
        vals = [int(x) for x in text.replace(" ", "").split(",") if x]
    except ValueError:
        raise PlannerError(f"{name} {text!r} must be comma-separated integers, e.g. 1,2,4,8.") from None
    if not vals:
        raise PlannerError(f"{name} needs at least one value.")
    return vals


def etp_list(text: str | None) -> list[int] | None:
    """--etp choices of a search: 'tp,1' -> [0, 1] (0 = ETP equal to TP); None stays None."""
    if text is None:
        return None
    vals = [x.strip().lower() for x in text.split(",") if x.strip()]
    if not vals or not all(v == "tp" or v.isdigit() and int(v) > 0 for v in vals):
        raise PlannerError(f"--etp {text!r} must list 'tp' and/or positive integers, e.g. tp,1.")
    return [0 if v == "tp" else int(v) for v in vals]


def str_list(text: str | None) -> list[str] | None:
    """A search dimension flag as strings: 'megatron, fsdp' -> ['megatron', 'fsdp']; None stays None."""
    return None if text is None else [x.strip() for x in text.split(",") if x.strip()]


def bool_list(text: str | None) -> list[bool] | None:
    """--sp values: 'true,false' -> [True, False]; None stays None."""
    if text is None:
        return None
    table = {"true": True, "on": True, "1": True, "yes": True, "false": False, "off": False, "0": False, "no": False}
    out = []
    for x in str_list(text):
        if x.lower() not in table:
            raise PlannerError(f"--sp {text!r} must list true/false values, e.g. true,false.")
        out.append(table[x.lower()])
    return out
