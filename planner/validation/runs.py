"""Run files: the published-runs CSV schema, parsing its free text, and mapping a row to planner inputs.

The run file is ``shared/validation/published_runs.csv`` (its README defines every column and metric) or a
user's own file with the same header. :func:`load_runs` parses rows (unusable rows are kept with a
``skip_reason``); :func:`row_to_inputs` turns a row into a ModelSpec and ParallelPlan and records every
assumption it had to make; :func:`default_hardware` resolves the row's GPU and node type in the hardware
catalogue. Rules specific to a published source come from :mod:`planner.validation.sources` (matched on the
row's ``source`` text, never on its id).
"""

from __future__ import annotations

import csv
import dataclasses
import math
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from costmodel.core.errors import PlannerError
from costmodel.core.specs.catalogue import load_catalogue
from costmodel.core.specs.model import ModelSpec
from costmodel.core.specs.pipeline_layout import balanced_pipeline_layout, describe_split, parse_pipeline_layout
from costmodel.core.specs.plan import ParallelPlan, account_for_splits
from costmodel.memory.per_gpu import fits_in_memory, memory_per_gpu
from planner.requests import PlanRequest
from planner.validation.memory_rows import memory_fields
from planner.validation.moe_rows import (
    GPU_HOURS_METRIC,
    MOE_INT_COLUMNS,
    block_scaled_fp8,
    check_tag_ok,
    gpu_hours_to_tokens_per_s,
    is_moe_row,
    moe_model,
    moe_plan_fields,
    moe_refusals,
    stated_pipeline_layout,
)
from planner.validation.row_text import (
    OTHER_STACKS,
    _cuda_graphs,
    _dp_overlap,
    _loss_fusion,
    _padded_vocab,
    _quad_node_type,
    _row_domain,
    _stated_bias_and_tying,
    _stated_head_dim,
    _tp_overlap,
)
from planner.validation.sources import Rule, source_rule

INT_COLUMNS = ("n_layers", "hidden", "n_heads", "n_kv_heads", "ffn_hidden", "vocab", "seq_len", "n_gpus",
               "gpus_per_node", "tp", "pp", "dp", "cp", "ep", "vp", "mbs", "gbs")
TEXT_COLUMNS = ("id", "source", "model_name", "arch_notes", "gpu", "recompute", "seq_parallel",
                "dist_optimizer_or_zero", "precision", "framework", "measured_metric", "notes")
REQUIRED_COLUMNS = TEXT_COLUMNS + INT_COLUMNS + ("measured_value",)
OPTIONAL_TEXT_COLUMNS = ("interconnect",)

# Metric -> unit shown in reports (definitions: shared/validation/README.md "Metric meanings").
METRIC_UNITS = {
    "iteration_time_s": "s",
    "tokens_per_s_per_gpu": "tokens/s/GPU",
    "tflops_per_gpu": "TFLOP/s/GPU",
    "mfu": "% of dense bf16 peak",
}
# 8-GPU node types of the hardware catalogue (costmodel.core.specs.catalogue) used for 8-GPU-per-node runs: the
# published clusters are DGX/HGX-class nodes (Selene DGX A100, DGX H100, Grand Teton, HGX H200).
NODE_TYPES_8GPU = {"a100-40gb": "dgx-a100", "a100-80gb": "dgx-a100", "h100-sxm": "dgx-h100", "h200": "hgx-h200",
                   "b200": "dgx-b200", "mi300x": "mi300x-8gpu"}
# GPT-2 BPE vocabulary size (Radford et al. 2019, GPT-2 tokenizer; Megatron-LM README "GPT-2 BPE vocab").
GPT2_BPE_VOCAB = 50257


@dataclass
class RunRow:
    """One measured run from the CSV, numbers parsed; never dropped, only marked skipped."""

    id: str
    """Row id, e.g. ``KORTHI22-004``."""
    source: str
    """Paper table / repo path the numbers come from."""
    model_name: str
    """Model name as the source gives it."""
    values: dict
    """Integer columns (n_layers, hidden, tp, ...) -> int, or None when the field is empty."""
    text: dict
    """Text columns (arch_notes, gpu, recompute, precision, notes, ...) -> str."""
    measured_metric: str
    """One of the METRIC_UNITS keys."""
    measured_value: float | None
    """The published number in the unit of ``measured_metric``."""
    tier: str = ""
    """A, B or C from the ``TIER=`` tag of the notes ('' when absent)."""
    skip_reason: str = ""
    """Why the row cannot be predicted ('' = usable)."""
    assumptions: list = field(default_factory=list)
    """Every assumption made to turn the row into planner inputs (filled by row_to_inputs)."""
    cluster: str = ""
    """Catalogue node type for the prediction ('' = the GPU's default node type; set by row_to_inputs)."""

    @property
    def prefix(self) -> str:
        """Id prefix (``NARAY21T2-003`` -> ``NARAY21T2``): a label to group rows by, never a rule's key."""
        return self.id.rsplit("-", 1)[0]

    def rule(self, name: str) -> Rule | None:
        """Rule ``name`` of the published source this row names in its ``source`` column (None otherwise)."""
        return source_rule(self.source, name)

    def get(self, name: str) -> int | None:
        return self.values.get(name)


# ------------------------------------------------------------------------------------------ loading
def _parse_int(text: str, path: Path, row_id: str, column: str) -> int | None:
    text = text.strip().replace(",", "")
    if not text:
        return None
    try:
        number = float(text)
    except ValueError:
        raise PlannerError(f"{path}: row {row_id} column {column!r} has non-numeric value {text!r}; "
                           "fix the value or leave the field empty.") from None
    if not math.isfinite(number):
        raise PlannerError(f"{path}: row {row_id} column {column!r} must be a finite whole number, got {text!r}; "
                           "fix the value.")
    if number != int(number):
        raise PlannerError(f"{path}: row {row_id} column {column!r} must be a whole number, got {text!r}; "
                           "fix the value.")
    return int(number)


def load_runs(path: str | Path) -> list[RunRow]:
    """Read a run CSV; rows that cannot be predicted carry a ``skip_reason`` instead of being dropped."""
    path = Path(path)
    if not path.is_file():
        raise PlannerError(f"run file {path} not found: pass an existing CSV with --runs FILE.")
    try:
        return _read_runs(path)
    except (UnicodeDecodeError, csv.Error) as exc:
        raise PlannerError(f"run file {path} is not a readable UTF-8 CSV ({type(exc).__name__}: {exc}); "
                           "fix or re-export the file.") from None


def _read_runs(path: Path) -> list[RunRow]:
    with path.open(newline="", encoding="utf-8") as fh:
        reader = csv.DictReader(fh)
        header = reader.fieldnames or []
        missing = [c for c in REQUIRED_COLUMNS if c not in header]
        if missing:
            raise PlannerError(f"run file {path} lacks column {missing[0]!r}"
                               + (f" (and {len(missing) - 1} more)" if len(missing) > 1 else "")
                               + "; use the header of shared/validation/published_runs.csv.")
        rows = []
        for n, raw in enumerate(reader, start=2):
            row_id = (raw.get("id") or "").strip() or f"line-{n}"
            values = {c: _parse_int(raw.get(c) or "", path, row_id, c) for c in INT_COLUMNS}
            values.update({c: _parse_int(raw.get(c) or "", path, row_id, c) for c in MOE_INT_COLUMNS if c in header})
            mv_text = (raw.get("measured_value") or "").strip()
            try:
                measured = float(mv_text) if mv_text else None
                if measured is not None and not math.isfinite(measured):
                    raise ValueError(mv_text)
            except ValueError:
                raise PlannerError(f"{path}: row {row_id} column 'measured_value' has non-numeric or non-finite value "
                                   f"{mv_text!r}; fix the value.") from None
            text = {c: (raw.get(c) or "").strip() for c in TEXT_COLUMNS + OPTIONAL_TEXT_COLUMNS}
            tier = re.search(r"TIER=([ABC])", text["notes"])
            metric = text["measured_metric"]
            if metric == GPU_HOURS_METRIC and measured:  # MOE_README.md: convert before use
                metric, measured = "tokens_per_s_per_gpu", gpu_hours_to_tokens_per_s(measured)
            row = RunRow(id=row_id, source=text["source"], model_name=text["model_name"], values=values,
                         text=text, measured_metric=metric, measured_value=measured,
                         tier=tier.group(1) if tier else "")
            row.skip_reason = _skip_reason(row)
            rows.append(row)
    return rows


def _skip_reason(row: RunRow) -> str:
    """First reason the row cannot be predicted, or '' (also tries row_to_inputs)."""
    if row.measured_metric not in METRIC_UNITS:
        return f"unknown measured_metric {row.measured_metric!r}"
    if row.measured_value is None or row.measured_value <= 0:
        return "no positive measured value"
    if is_moe_row(row):
        return _moe_skip_reason(row)
    if row.get("ep") or "CHECK:" in row.text["notes"]:
        if row.get("ep"):
            return f"mixture-of-experts run (EP={row.get('ep')}); planner models dense transformers only"
        return "CHECK tag: stated TP*PP*DP*CP does not equal the GPU count"
    if "lora" in (row.model_name + " " + row.text["arch_notes"]).lower():
        return "LoRA fine-tuning (frozen base weights, no base weight gradients) is not modelled"
    try:
        row_to_inputs(row)
    except PlannerError as exc:
        return str(exc)
    return ""


def _moe_skip_reason(row: RunRow) -> str:
    """Every reason an MoE row cannot be predicted, joined on one line ('' = usable)."""
    reasons = moe_refusals(row)
    if reasons and reasons[0].startswith("mixture-of-experts run"):
        return reasons[0]
    if "CHECK:" in row.text["notes"] and not check_tag_ok(row):
        reasons.append("CHECK tag: stated TP*PP*DP*CP does not equal the GPU count")
    try:
        row_to_inputs(row)
    except PlannerError as exc:
        if not any(str(exc) in r for r in reasons):
            reasons.append(str(exc))
    return "; ".join(reasons)


# ------------------------------------------------------------------------------------------ mapping
def map_gpu(gpu: str) -> tuple[str, str]:
    """GPU string of the CSV -> (catalogue key, note or ''); PlannerError when unknown."""
    t = gpu.lower()
    if t == "cpu":
        # runs measured on this machine's CPU by costmodel.profiling.workloads.runner (device key "cpu")
        return "cpu", ""
    if "mi300x" in t:
        return "mi300x", ""
    if "gh200" in t:
        return ("gh200-144gb" if "144" in t else "gh200"), ""
    if "h800" in t:
        return "h800", ""
    if "gb300" in t:
        return "gb300", ""
    if "b300" in t:
        return "b300", ""
    if "gb200" in t:
        return "gb200", ""
    if "b200" in t:
        return "b200", ""
    if "h200" in t:
        return "h200", ""
    if "h100" in t:
        if "pcie" in t:
            return "h100-pcie", ""
        if "96gb" in t or "hbm2e" in t or "500w" in t:
            return "h100-sxm-500w", ""
        if "sxm" in t or "dgx" in t:
            return "h100-sxm", ""
        return "h100-sxm", f"H100 form factor not stated ({gpu!r}), assumed h100-sxm"
    if "a100" in t:
        if "80gb" in t:
            return "a100-80gb", ""
        if "40gb" in t:
            note = "" if "not stated" not in t and "implied" not in t else \
                f"A100 memory not stated ({gpu!r}), used a100-40gb as the row implies"
            return "a100-40gb", note
        return "a100-80gb", f"A100 memory not stated ({gpu!r}), assumed a100-80gb"
    raise PlannerError(f"unknown GPU {gpu!r}: add a mapping in planner.validation.runs.map_gpu")


def _arch(row: RunRow, notes: list[str]) -> dict:
    """Activation, norm, position embedding, bias, tying and dropout from arch_notes / name."""
    text = (row.text["arch_notes"] + " " + row.model_name).lower()
    llama, nemotron = "llama" in text or "qwen" in text, "nemotron" in text
    gpt = "gpt" in text and not (llama or nemotron)
    if re.search(r"squared[-_ ]relu", text):
        act = "squared_relu"
    elif "swiglu" in text or "silu" in text:
        act = "swiglu"
    elif "gelu" in text:
        act = "gelu"
    elif llama:
        act = "swiglu"
        notes.append("activation not stated, assumed SwiGLU (Llama family)")
    elif gpt:
        act = "gelu"
        notes.append("activation not stated, assumed GELU (GPT family)")
    else:
        raise PlannerError(f"activation of {row.model_name!r} cannot be read from arch_notes")
    if "rmsnorm" in text:
        norm = "rmsnorm"
    elif "layernorm" in text:
        norm = "layernorm"
    else:
        norm = "rmsnorm" if llama else "layernorm"
        notes.append(f"norm not stated, assumed {norm}")
    if "rope" in text:
        pos = "rope"
    elif "learned" in text or "abs pos" in text:
        pos = "learned"
    else:
        pos = "learned" if gpt else "rope"
        notes.append(f"position embedding not stated, assumed {pos}")
    dropout_rule = row.rule("dropout")
    dropout = dropout_rule is not None
    if dropout_rule is not None:
        notes.append(dropout_rule.assumption)
    bias, tied = _stated_bias_and_tying(text, gpt, notes)
    return dict(activation=act, norm=norm, position_embedding=pos, linear_bias=bias, tied_embeddings=tied,
                dropout=dropout)


def _model(row: RunRow, seq_len: int, notes: list[str], tp: int = 1) -> ModelSpec:
    L, h, a = row.get("n_layers"), row.get("hidden"), row.get("n_heads")
    if not L or not h or not a:
        raise PlannerError("n_layers, hidden or n_heads not stated")
    arch = _arch(row, notes)
    kv = row.get("n_kv_heads")
    if not kv:
        kv = a
        notes.append("n_kv_heads not stated, assumed = heads (MHA)")
    ffn = row.get("ffn_hidden")
    if not ffn:
        if arch["activation"] == "swiglu":
            raise PlannerError("ffn_hidden not stated for a gated (SwiGLU) model")
        ffn = 4 * h
        notes.append(f"ffn_hidden not stated, assumed 4h = {ffn} (standard GPT)")
    vocab = row.get("vocab")
    if not vocab:
        if "gpt" not in (row.text["arch_notes"] + row.model_name).lower():
            raise PlannerError("vocab not stated")
        vocab = GPT2_BPE_VOCAB
        notes.append(f"vocab not stated, assumed GPT-2 BPE size {GPT2_BPE_VOCAB} (no padding)")
    return ModelSpec(name=row.model_name, num_layers=L, hidden_size=h, num_heads=a, num_kv_heads=kv,
                     ffn_hidden_size=ffn, vocab_size=_padded_vocab(row, vocab, tp, notes), max_seq_len=seq_len,
                     source=row.source, head_dim=_stated_head_dim(row, h, a, notes), extra={"run_id": row.id},
                     **arch)


def _recompute(text: str, notes: list[str], rule: Rule | None = None) -> str:
    """The row's recompute mode; unstated: none under the source rule recompute_none, else selective."""
    t = text.lower()
    for mode in ("full", "selective", "none"):
        if t.startswith(mode):
            if "implied" in t or "likely" in t or "not stated" in t:
                notes.append(f"recompute '{text}' read as {mode}")
            elif "per-op" in t:
                notes.append("per-op selective activation checkpointing (torchtitan SAC) mapped to selective")
            return mode
    if rule is not None and not t.strip():
        notes.append(rule.assumption)
        return "none"
    notes.append(f"recompute not stated ({text!r}), assumed selective")
    return "selective"


def _zero(text: str, notes: list[str]) -> int:
    t = text.lower()
    if not t:
        notes.append("distributed optimizer not stated, assumed ZeRO-1 (Megatron distributed optimizer)")
        return 1
    if t == "none" or t.startswith("none ("):  # "none (DDP)": replicated optimizer, gradients all-reduced
        return 0
    if t.startswith("fsdp=0") or re.search(r"fsdp column\s*=\s*0", t):
        # NeMo performance tables: FSDP=0 = Megatron DDP with the distributed optimizer
        notes.append(f"'{text}' mapped to ZeRO-1 (Megatron distributed optimizer)")
        return 1
    if "not resharded" in t:
        notes.append(f"'{text}' mapped to ZeRO-2 (parameters kept gathered from forward to backward)")
        return 2
    if "zero-3" in t or "fsdp" in t:
        return 3
    if "zero-2" in t:
        return 2
    if "distributed optimizer" in t or "zero-1" in t:
        return 1
    raise PlannerError(f"optimizer sharding {text!r} not understood")


def _framework(text: str, notes: list[str], row_notes: str = "") -> str:
    """The row's ``framework`` text as a planner framework key (costmodel.core.specs.framework); a torchtitan
    row whose notes say it ran eager (without torch.compile) is ``torchtitan-eager``."""
    t = text.lower()
    for key, words in (("deepspeed", ("deepspeed",)), ("torchtitan", ("torchtitan",)), ("fsdp", ("fsdp",)),
                       ("megatron", ("megatron", "nemo"))):
        if any(w in t for w in words):
            if key == "torchtitan" and "eager" in row_notes.lower():
                notes.append("ran without torch.compile (notes: eager): framework torchtitan-eager")
                return "torchtitan-eager"
            return key
    for key, words, why in OTHER_STACKS:
        if any(w in t for w in words):
            notes.append(f"framework {text!r}: {why}")
            return key
    notes.append(f"framework {text!r} not recognised, assumed megatron" if t else
                 "framework not stated, assumed megatron")
    return "megatron"


def _interleaved_stages(row: RunRow, L: int, pp: int, notes: list[str]) -> int:
    """Model chunks per PP rank of a row whose schedule is interleaved but states no VP.

    torchtitan (the notes say interleaved): 2, its default for multi-stage schedules without split points
    (pipelining_utils.py generate_split_points: "Multi-stage schedules support more than 2 stages per rank, but this
    is the default if no pipeline split is specified").
    Any other framework whose text says interleaved: the fewest chunks an interleaved schedule has (Narayanan et al.
    SC21, arXiv:2104.04473, Sec. 2.2.2: each device holds v >= 2 model chunks) that splits a stage's layers into
    equal whole chunks (Megatron-LM: layers per stage divisible by layers per virtual stage), the stage's layers
    being L / PP or, where PP does not divide L, (L + 2) / PP with the embedding and the loss counted as layers (the
    Llama 3 paper, arXiv:2407.21783, Sec. 3.3.2: the first and the last stage hold one transformer layer less;
    Megatron-Core --account-for-embedding/loss-in-pipeline-split); else 1."""
    if pp <= 1:
        return 1
    if "torchtitan" in row.text["framework"].lower():
        if "interleaved" in row.text["notes"].lower():
            notes.append("interleaved schedule, stages per rank not stated: 2 (torchtitan's default without split "
                         "points)")
            return 2
        return 1
    if "interleaved" not in row.text["framework"].lower():
        return 1
    per_stage = L // pp if L % pp == 0 else (L + 2) // pp if (L + 2) % pp == 0 else 0
    v = next((v for v in range(2, per_stage + 1) if per_stage % v == 0), 1)
    if v > 1:
        notes.append(f"interleaved schedule, chunks per stage not stated: VPP={v}, the fewest equal chunks of the "
                     f"{per_stage} layers per stage (Narayanan et al. SC21 Sec. 2.2.2)")
    return v


def _attention(row: RunRow, notes: list[str]) -> str:
    """'unfused' for rows of a published source whose stack predates FlashAttention (rule unfused_attention),
    'flash2' for a source that chose FlashAttention-2 kernels (rule flash2_attention), 'flash1' for one whose
    PyTorch ran the first FlashAttention kernels (rule flash1_attention), else "" (the framework's kernel)."""
    for name, kernel in (("unfused_attention", "unfused"), ("flash2_attention", "flash2"),
                         ("flash1_attention", "flash1")):
        rule = row.rule(name)
        if rule is not None:
            notes.append(rule.assumption)
            return kernel
    return ""


def _dtype(text: str, notes: list[str]) -> str:
    t = text.lower()
    if t == "fp32":
        return "fp32"
    if block_scaled_fp8(t):
        notes.append(f"precision '{text}' read as fp8-block (block-scaled FP8 GEMMs from aiconfigurator's fp8_block "
                     "data" + ("; MXFP8's 1x32 scales approximated by 1x128 / 128x128 blocks" if "mxfp8" in t else "")
                     + ("; FP8 primary weights (--fp8-param-gather) not modelled: memory as fp8" if "param-gather"
                        in t else "") + ")")
        return "fp8-block"
    if "fp8" in t:
        return "fp8"
    if "bf16" in t:
        return "bf16"
    if "fp16" in t:
        return "fp16"
    if "16-bit" in t:
        notes.append(f"precision '{text}' read as fp16")
        return "fp16"
    raise PlannerError(f"precision {text!r} not understood")


def _layer_split(L: int, pp: int, vpp: int, notes: list[str]) -> tuple[int, ...] | None:
    """None when even; else the first stages get one more chunk of layers (whole VPP chunks)."""
    if L % (pp * vpp) == 0:
        return None
    if L % vpp:
        raise PlannerError(f"layers={L} not divisible by VPP={vpp}")
    base, rem = divmod(L // vpp, pp)
    if base == 0:
        raise PlannerError(f"layers={L} too few for PP={pp}*VPP={vpp}")
    split = tuple((base + (1 if i < rem else 0)) * vpp for i in range(pp))
    notes.append(f"layers={L} not divisible by PP*VPP={pp * vpp}: uneven split, first {rem} stages hold "
                 f"{split[0]} layers, the rest {split[-1]}")
    return split


def row_to_inputs(row: RunRow) -> tuple[ModelSpec, ParallelPlan, str, int]:
    """(ModelSpec, ParallelPlan, gpu_key, gpus_per_node) for a row; fills ``row.assumptions``.

    Raises PlannerError naming the reason when the row cannot be mapped.
    """
    notes: list[str] = []
    row.assumptions = notes
    gpu_key, gpu_note = map_gpu(row.text["gpu"])
    if gpu_note:
        notes.append(gpu_note)
    n, seq_len, gbs = row.get("n_gpus"), row.get("seq_len"), row.get("gbs")
    if not n or not seq_len:
        raise PlannerError("n_gpus or seq_len not stated")
    if not gbs:
        raise PlannerError("GBS not stated")
    gpn = row.get("gpus_per_node") or 8
    if not row.get("gpus_per_node"):
        notes.append("gpus_per_node not stated, assumed 8")
    row.cluster = NODE_TYPES_8GPU.get(gpu_key, "") if gpn == 8 else _quad_node_type(row, gpu_key, gpn, notes)
    if row.cluster and not row.text.get("interconnect"):
        notes.append(f"interconnect not stated, used catalogue node type {row.cluster}")
    cp = row.get("cp") or 1
    tp, pp, dp = row.get("tp"), row.get("pp"), row.get("dp")
    if tp is None and pp is None:
        if not dp:
            raise PlannerError("TP, PP and DP not stated")
        mp = n // (dp * cp)
        tp = min(8, mp)
        pp = mp // tp
        notes.append(f"TP/PP split not stated: model-parallel size {mp} split as TP={tp} x PP={pp} "
                     "(TP = min(8, MP), as the row's notes say the later paper did)")
    tp, pp = tp or 1, pp or 1
    if dp is None:
        dp = n // (tp * pp * cp)
    if tp * pp * dp * cp != n:
        raise PlannerError(f"TP*PP*DP*CP = {tp}*{pp}*{dp}*{cp} = {tp * pp * dp * cp} != GPUs={n}")
    vpp = row.get("vp") or _interleaved_stages(row, row.get("n_layers") or 0, pp, notes)
    mbs = row.get("mbs")
    no_accumulation = row.rule("no_gradient_accumulation")
    if not mbs and no_accumulation is not None and gbs % dp == 0:
        mbs = gbs // dp
        notes.append(f"{no_accumulation.assumption}: MBS = GBS / DP = {mbs}")
    elif not mbs:
        mbs = 1
        notes.append("MBS not stated, assumed 1")
    if gbs % (mbs * dp):
        raise PlannerError(f"GBS={gbs} is not divisible by MBS*DP = {mbs}*{dp}")
    moe = is_moe_row(row)
    model = moe_model(row, seq_len, notes) if moe else _model(row, seq_len, notes, tp)
    sp_text = row.text["seq_parallel"].lower()
    if sp_text in ("y", "n"):
        sp = sp_text == "y"
    else:
        sp = tp > 1
        if tp > 1:
            notes.append("sequence parallelism not stated, assumed on (TP > 1)")
    # the same plan-request object the CLI flags and batch lines build (planner.requests)
    zero, dtype = _zero(row.text["dist_optimizer_or_zero"], notes), _dtype(row.text["precision"], notes)
    request = PlanRequest(
        id=row.id, model=model, gpu=gpu_key, gpus=n, gpus_per_node=gpn, cluster=row.cluster or None, tp=tp, pp=pp,
        cp=cp, vpp=vpp, mbs=mbs, gbs=gbs, seq_len=seq_len,
        recompute=_recompute(row.text["recompute"], notes, row.rule("recompute_none")),
        sequence_parallel=sp, zero=zero, dtype=dtype, **_pipeline_split(row, model.num_layers, pp, vpp, moe, notes),
        framework=_framework(row.text["framework"], notes, row.text["notes"]), attention=_attention(row, notes),
        moe_dispatcher="alltoall",  # an MoE row's dispatcher is read from its text (moe_rows.moe_plan_fields)
        cuda_graphs=_cuda_graphs(row, notes), cross_entropy_fusion=_loss_fusion(row, notes),
        **memory_fields(row, dtype, zero, notes))
    plan = request.to_plan(model, gpus_per_node=gpn, extra={"run_id": row.id},
                           nvlink_domain=_row_domain(gpu_key, row.cluster, gpn, n))
    grad_overlap, param_overlap = _dp_overlap(row, notes)
    if grad_overlap is not None:
        plan = dataclasses.replace(plan, overlap_grad_reduce=grad_overlap)
    if param_overlap is not None:
        plan = dataclasses.replace(plan, overlap_param_gather=param_overlap)
    if plan.sp and _tp_overlap(row, notes):  # Megatron: --tp-comm-overlap needs sequence parallelism
        plan = dataclasses.replace(plan, tp_comm_overlap=True)
    if moe:
        plan = _moe_plan(row, model, plan, notes)
    plan = _fit_unstated_interleaving(row, model, plan, gpu_key, moe, notes)
    return model, _fit_unstated_recompute(row, model, plan, gpu_key, notes), gpu_key, gpn


def _fit_unstated_interleaving(row: RunRow, model: ModelSpec, plan: ParallelPlan, gpu_key: str, moe: bool,
                               notes: list[str]) -> ParallelPlan:
    """The plan, without interleaving where the row states no VP, the assumed chunks (:func:`_interleaved_stages`)
    do not fit in memory and the plain 1F1B schedule does: the run ran, and 1F1B holds the fewest micro-batches in
    flight ([KORTHIKANTI] Sec. 4.2.3: interleaving multiplies stage 0's activations by 1 + (p - 1) / (p v)). Tried
    before the recompute fallback (:func:`_fit_unstated_recompute`), which changes compute as well."""
    if row.get("vp") or plan.vpp <= 1:
        return plan
    gpu = load_catalogue().gpu(gpu_key)
    need = memory_per_gpu(model, plan, gpu)
    if fits_in_memory(need, gpu):
        return plan
    split_notes: list[str] = []
    split = _pipeline_split(row, model.num_layers, plan.pp, 1, moe, split_notes)
    plain = dataclasses.replace(plan, **{"vpp": 1, "layer_split": None, "pipeline_layout": None, **split})
    if not fits_in_memory(memory_per_gpu(model, plain, gpu), gpu):
        return plan
    notes.append(f"VPP={plan.vpp} needs {need.total / 2**30:.1f} GiB per GPU, more than {gpu.name}'s "
                 f"{gpu.hbm_bytes / 2**30:.1f} GiB, and 1F1B fits: VPP=1 assumed (the run ran)")
    notes.extend(split_notes)
    return plain


def _fit_unstated_recompute(row: RunRow, model: ModelSpec, plan: ParallelPlan, gpu_key: str,
                            notes: list[str]) -> ParallelPlan:
    """The plan, with the next heavier recompute mode where the row states none and the assumed one (selective,
    or none under the source rule recompute_none) does not fit in memory: the run ran, so it held its
    activations; selective, then full recompute are the lightest modes left that hold fewer (the assumption is
    listed)."""
    if row.text["recompute"].strip() or plan.recompute not in ("none", "selective"):
        return plan
    gpu = load_catalogue().gpu(gpu_key)
    need = memory_per_gpu(model, plan, gpu)
    if fits_in_memory(need, gpu):
        return plan
    heavier = [dataclasses.replace(plan, recompute="full", recompute_modules=(), offload_modules=())]
    if plan.recompute == "none":
        heavier.insert(0, dataclasses.replace(plan, recompute="selective"))
    for cand in heavier:
        if fits_in_memory(memory_per_gpu(model, cand, gpu), gpu):
            notes.append(f"recompute not stated: {plan.recompute} needs {need.total / 2**30:.1f} GiB per GPU, more "
                         f"than {gpu.name}'s {gpu.hbm_bytes / 2**30:.1f} GiB; {cand.recompute} recompute assumed "
                         "(the run ran)")
            return cand
    return plan


def _pipeline_split(row: RunRow, L: int, pp: int, vpp: int, moe: bool, notes: list[str]) -> dict:
    """The row's layer_split (Megatron's rules, as before) or, where those refuse it and the run used PyTorch
    pipelining (NeMo AutoModel, torchtitan), the pipeline_layout that pipelining builds by default: the layers over
    the PP*VPP virtual stages as evenly as possible, the first ones one more (costmodel.core.specs.pipeline_layout
    balanced_pipeline_layout, AutoModel's generate_hf_model_fqn_per_model_part)."""
    stated = stated_pipeline_layout(row) if moe else None
    if stated:
        layout, virtual = parse_pipeline_layout(stated, pp)
        if virtual != vpp:
            raise PlannerError(f"pipeline layout '{stated}' of the notes has {virtual} virtual stages per PP rank, the "
                               f"row VPP={vpp}")
        notes.append(f"pipeline layout '{stated}' from the notes (Megatron-Core --pipeline-model-parallel-layout): "
                     f"{describe_split(layout)} layers per virtual stage")
        return {"pipeline_layout": layout}
    try:
        return {"layer_split": (_moe_layer_split if moe else _dense_layer_split(row))(L, pp, vpp, notes)}
    except PlannerError:
        if not any(w in row.text["framework"].lower() for w in ("automodel", "torchtitan")):
            raise
    layout = balanced_pipeline_layout(L, pp, vpp)
    notes.append(f"layers={L} over PP={pp} x VPP={vpp} virtual stages, split as PyTorch pipelining does by default "
                 f"(first {L % (pp * vpp)} virtual stages one layer more): {describe_split(layout)}")
    return {"pipeline_layout": layout}


def _dense_layer_split(row: RunRow):
    """A dense row's split rule: Megatron's (:func:`_layer_split`), and for a Megatron-Core / NeMo row whose layers
    no such split holds (126 layers over PP 8 x VPP 8 in NeMo's Llama 3.1 405B tables), the embedding and the loss
    counted as layers, the split Megatron-Core builds with --account-for-embedding/loss-in-pipeline-split (126 + 2 =
    128 over 64 virtual stages), as for MoE rows (:func:`_moe_layer_split`). Another framework whose text says its
    pipeline is interleaved counts the embedding and the loss as layers first: the Llama 3 paper (arXiv:2407.21783,
    Sec. 3.3.2) takes one transformer layer each from the first and the last stage of its interleaved schedule."""
    fw = row.text["framework"].lower()
    if "interleaved" in fw and not any(w in fw for w in ("megatron", "nemo", "torchtitan", "automodel")):
        return _moe_layer_split
    if not any(w in fw for w in ("megatron", "nemo")) or "automodel" in fw:
        return _layer_split

    def split(L: int, pp: int, vpp: int, notes: list[str]) -> tuple[int, ...] | None:
        try:
            return _layer_split(L, pp, vpp, notes)
        except PlannerError:
            return _moe_layer_split(L, pp, vpp, notes)
    return split


def _moe_layer_split(L: int, pp: int, vpp: int, notes: list[str]) -> tuple[int, ...] | None:
    """An MoE row's split: even, else the embedding and the loss counted as layers (Megatron
    --account-for-embedding/loss-in-pipeline-split; the MoE ModelZoo's runtime.conf sets both, moe_runs.csv
    row MOE-MOEZOO-004), else the first stages one chunk more (as for dense rows)."""
    if L % (pp * vpp) == 0:
        return None
    both = [s for s in account_for_splits(L, pp, vpp) if s[0] == s[-1] and (pp == 2 or s[0] + 1 == s[1])]
    if both:
        notes.append(f"layers={L} not divisible by PP*VPP={pp * vpp}: embedding and loss counted as layers "
                     f"(--account-for-embedding/loss-in-pipeline-split): {list(both[0])}")
        return both[0]
    if L % vpp:
        raise PlannerError(f"{L} layers over PP={pp} x VPP={vpp}: no split Megatron can build (every stage holds whole "
                           "VPP chunks, even counting embedding and loss as layers); the source's own pipeline split "
                           "is not modelled")
    return _layer_split(L, pp, vpp, notes)


def _moe_plan(row: RunRow, model: ModelSpec, plan: ParallelPlan, notes: list[str]) -> ParallelPlan:
    """The row's plan with its expert-parallel fields (planner.validation.moe_rows.moe_plan_fields)."""
    if row.text["measured_metric"] != row.measured_metric:
        notes.append(f"{row.text['measured_metric']} converted to {row.measured_metric} = "
                     f"{row.measured_value:.0f} (1e12 / (GPU-hours x 3600))")
    if "CHECK:" in row.text["notes"]:
        notes.append("CHECK tag (not a GPU-count mismatch): " + row.text["notes"].split("CHECK:", 1)[1]
                     .split(";")[0].strip())
    fields = moe_plan_fields(row, plan.tp, notes)
    # the NVLink domain as planner predict places the job (PlanRequest.resolve): a GB200/GB300 NVL72 rack spans
    # 18 4-GPU trays, so EP groups across trays stay on NVLink
    domain = load_catalogue().resolve(map_gpu(row.text["gpu"])[0], row.cluster or None,
                                      plan.gpus_per_node).domain_for(plan.gpus)
    if domain != plan.domain:
        fields["nvlink_domain"] = domain
        notes.append(f"NVLink domain {domain} GPUs (catalogue node type of {row.text['gpu']!r})")
    plan = dataclasses.replace(plan, **fields)
    plan.validate(model)
    return plan


def parallelism_kind(plan: ParallelPlan) -> str:
    """Short label of the layout: e.g. 'DP', 'TP+DP', 'TP+PP+DP', 'FSDP', 'TP+FSDP+CP'."""
    parts = [name for name, deg in (("TP", plan.tp), ("PP", plan.pp)) if deg > 1]
    if plan.dp > 1:
        parts.append("FSDP" if plan.zero == 3 else "DP")
    if plan.cp > 1:
        parts.append("CP")
    return "+".join(parts) or "single"


def default_hardware() -> Callable:
    """``hardware_fn(gpu_key, gpus_per_node, cluster)`` resolving a row's GPU (and node type, '' = the
    GPU's default) in the hardware catalogue: the Hardware that validation and calibration predict with."""
    catalogue = load_catalogue()
    return lambda gpu_key, gpus_per_node, cluster=None: catalogue.resolve(gpu_key, cluster or None, gpus_per_node)
