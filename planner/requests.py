"""One plan request: the dataclass every way of naming a parallel plan goes through.

`planner predict` / `explain` / `export` flags (declared once in :mod:`planner.cli_options`), each line
of a `planner predict --batch` file (keys documented in README "Batch requests") and the Python API
(``planner.predict(...)``) all build a :class:`PlanRequest`; :meth:`PlanRequest.resolve` turns it into the three
cost-model inputs (model, plan, hardware). List-valued keys may be given as the CLI writes them ('9,8,8,7'),
and the batch in tokens with a suffix ('4M').
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, fields

from costmodel.core.errors import PlanError, PlannerError
from costmodel.core.specs.catalogue import load_catalogue
from costmodel.core.specs.framework import ATTENTION_KERNELS, DEFAULT_FRAMEWORK, FRAMEWORKS
from costmodel.core.specs.hardware import Hardware
from costmodel.core.specs.model import ModelSpec
from costmodel.core.specs.pipeline_layout import parse_pipeline_layout
from costmodel.core.specs.plan import (
    DTYPES,
    MOE_DISPATCHERS,
    MOE_ROUTINGS,
    RECOMPUTE_MODES,
    RECOMPUTE_MODULES,
    ParallelPlan,
)
from costmodel.core.specs.presets import default_seq_len, resolve_model
from costmodel.cost import fp8_block
from costmodel.graph.moe import AUTO_DISPATCHER, with_default_dispatcher
from costmodel.memory.zero_choice import AUTO_ZERO, DEFAULT_ZERO, with_default_zero
from planner.batch import DEFAULT_BATCH_TOKENS, batch_sequences, suffixed_number  # noqa: F401 (re-exported)

MAX_INT = 2**53
"""Integers must stay below 2**53, the range where every integer is exact as an IEEE 754 double
(53-bit significand): the cost model computes in floats, and larger values overflow or lose digits."""


@dataclass(frozen=True, kw_only=True)
class PlanRequest:
    """One parallel plan as a user names it (before the model, hardware and batch are resolved).

    Field names are the batch-file keys; the CLI flags are the same names with dashes. Constructing
    one checks every field (types, ranges, allowed values) and raises :class:`PlannerError` with one
    line naming the first bad key; :meth:`from_dict` also refuses unknown keys.
    """

    id: str | int | None = None
    """Your identifier for a batch line, echoed back on its output line."""
    model: str | dict | ModelSpec
    """Preset name (see `planner models`), path to a config.json, or an inline config.json object.
    Programmatic callers (e.g. `planner validate`) may pass a resolved ModelSpec."""
    gpu: str
    """GPU key from `planner gpus`."""
    gpus: int
    """Total number of GPUs (world size)."""
    cluster: str | None = None
    """Node type from `planner gpus`; None = the GPU's default node type."""
    gpus_per_node: int | None = None
    """GPUs per node; None = the node type's."""
    tp: int = 1
    """Tensor-parallel degree."""
    pp: int = 1
    """Pipeline-parallel degree (stages)."""
    cp: int = 1
    """Context-parallel degree."""
    vpp: int = 1
    """Virtual pipeline chunks per stage (interleaved 1F1B when > 1)."""
    mbs: int = 1
    """Micro-batch size in sequences."""
    gbs: int | None = None
    """Global batch size in sequences; None = the multiple of MBS x DP nearest ``tokens_per_batch`` tokens
    (default DEFAULT_BATCH_TOKENS). Give gbs or tokens_per_batch, not both."""
    tokens_per_batch: int | None = None
    """Global batch size in tokens (the sequences are the multiple of MBS x DP landing nearest it), an integer or
    text such as '4M' or '16e6'; None = DEFAULT_BATCH_TOKENS when gbs is not given either."""
    seq_len: int | None = None
    """Sequence length in tokens; None = the model's default (costmodel.core.specs.presets.default_seq_len: a
    preset's cited pre-training context, else min(positions, 4096))."""
    recompute: str = "selective"
    """Activation recomputation: none | selective | full."""
    recompute_modules: tuple[str, ...] = ()
    """With recompute=selective: Megatron-Core's --recompute-modules, a list or 'a,b' (costmodel.core.specs.plan
    RECOMPUTE_MODULES); empty = the framework's selective default (Megatron: core_attn)."""
    sequence_parallel: bool = True
    """Megatron sequence parallelism (only meaningful when tp > 1)."""
    zero: int | str = AUTO_ZERO
    """ZeRO stage 0-3 (1 = distributed optimizer, 2 = gradients sharded too, 3 = FSDP), or auto: ZeRO-1 when the
    plan fits in memory there, else the lowest higher stage under which it fits (costmodel.memory.zero_choice; the
    prediction's notes say which and why)."""
    dtype: str = "bf16"
    """GEMM precision: bf16 | fp16 | fp8 | fp8-block (alias mxfp8) | fp32."""
    layer_split: tuple[int, ...] | None = None
    """Layers per pipeline stage when uneven, e.g. [9, 8, 8, 7] or '9,8,8,7'; None = even split."""
    pipeline_layout: tuple[int, ...] | None = None
    """Layers per virtual pipeline stage in virtual-stage order (chunk a of stage b is entry a*PP + b), a list,
    '2,2,1,...' or Megatron's --pipeline-model-parallel-layout string ('Et|(tt|)*30L'); VPP = entries / PP when
    vpp is not given. None = Megatron's classic split (layer_split / even). Not searched."""
    framework: str = DEFAULT_FRAMEWORK
    """Training stack: megatron | deepspeed | fsdp | torchtitan (its attention kernel, DP overlap and ZeRO-3
    network behaviour, costmodel.core.specs.framework)."""
    attention: str = ""
    """Attention kernel: fused | flash2 | flash1 | unfused; "" = the framework's (unfused = pre-FlashAttention
    stacks, flash1 = PyTorch 2.0 / 2.1 scaled_dot_product_attention)."""
    ep: int = 1
    """Expert-parallel degree (MoE models; Megatron --expert-model-parallel-size): divides the experts."""
    etp: int | None = None
    """Expert tensor-parallel degree (--expert-tensor-parallel-size); None = TP (Megatron-Core's default)."""
    moe_dispatcher: str = AUTO_DISPATCHER
    """MoE token dispatcher: alltoall | allgather | flex (--moe-token-dispatcher-type), or auto: the one the
    framework's recipes run for the EP group's placement (costmodel.graph.moe.default_dispatcher; the prediction's
    warnings say which and why)."""
    moe_imbalance: float | None = None
    """Tokens of the busiest expert over the mean (>= 1; 1 = balanced); None = the cost model's documented
    default (costmodel.memory.moe_routing)."""
    moe_routing: str = "learned"
    """Which experts a token picks: learned (the router) | random (--moe-router-force-load-balancing) |
    round_robin (NeMo AutoModel fake_balanced_gate); costmodel.memory.moe_routing."""
    moe_overlap_comm: bool = False
    """Overlap EP dispatch/combine with another micro-batch's compute (--overlap-moe-expert-parallel-comm)."""
    moe_grouped_gemm: bool = True
    """Run a rank's local experts as one grouped GEMM (--moe-grouped-gemm; False = one GEMM per expert)."""
    main_grads_dtype: str = ""
    """Main-gradient precision: fp32 | bf16 (Megatron --main-grads-dtype / --grad-reduce-in-bf16, NeMo
    grad_reduce_in_fp32=False) | fp16 (fp16 training); "" = fp16 with dtype fp16 on Megatron/DeepSpeed, else fp32."""
    main_params_dtype: str = "fp32"
    """The optimizer's copy of the parameters: fp32 | fp16 (Megatron --main-params-dtype) | bf16 | none (the optimizer
    steps the bf16 parameters; PyTorch FSDP2 stacks)."""
    exp_avg_dtype: str = "fp32"
    """Adam first-moment precision: fp32 | fp16 | bf16 | fp8 (Megatron --exp-avg-dtype)."""
    exp_avg_sq_dtype: str = "fp32"
    """Adam second-moment precision: fp32 | fp16 | bf16 | fp8 (Megatron --exp-avg-sq-dtype)."""
    fp8_param_gather: bool = False
    """fp8 primary weights, all-gathered in fp8 (Megatron --fp8-param-gather; needs dtype fp8 or fp8-block)."""
    optimizer_offload_fraction: float = 0.0
    """Share of the optimizer states kept and stepped on the host (Megatron --optimizer-cpu-offload
    --optimizer-offload-fraction); 0 = none."""
    offload_modules: tuple[str, ...] = ()
    """Fine-grained activation offloading (Megatron-Core --offload-modules), a list or 'a,b' of attn_norm,
    qkv_linear, core_attn, attn_proj, mlp_norm, expert_fc1, moe_act."""
    reshard_after_forward: bool | None = None
    """ZeRO-3: free gathered parameters after each unit's forward (true) or keep them to its backward (false);
    None = true (FSDP2's default)."""
    cross_entropy_fusion: bool | None = None
    """Fused loss kernel (Megatron --cross-entropy-loss-fusion, NeMo's default); None = the framework's default."""
    cuda_graphs: bool = False
    """Layers replay from CUDA graphs (Megatron --cuda-graph-impl local; torch.compile reduce-overhead): no per-kernel
    CPU dispatch."""
    tp_comm_overlap: bool = False
    """TP all-gathers / reduce-scatters overlapped with the layer's GEMMs (Megatron --tp-comm-overlap, Transformer
    Engine userbuffers; needs sequence parallelism)."""

    def __post_init__(self) -> None:
        missing = [k for k in REQUIRED if getattr(self, k) is None]
        if missing:
            raise PlannerError(f"missing required key(s) {', '.join(missing)}")
        for f in fields(self):
            value = getattr(self, f.name)
            if value is not None and not (f.name == "model" and isinstance(value, ModelSpec)):
                object.__setattr__(self, f.name, _check_type(f.name, value))
        if self.recompute not in RECOMPUTE_MODES:
            raise PlannerError(f"recompute={self.recompute!r} must be one of {', '.join(RECOMPUTE_MODES)}")
        bad = [m for m in self.recompute_modules if m not in RECOMPUTE_MODULES]
        if bad or (self.recompute_modules and self.recompute != "selective"):
            raise PlannerError(f"recompute_modules={','.join(self.recompute_modules)}: "
                               + (f"unknown {', '.join(bad)}; choose from {', '.join(RECOMPUTE_MODULES)}" if bad
                                  else "needs recompute=selective (Megatron's --recompute-granularity selective)"))
        if self.dtype in fp8_block.ALIASES:
            object.__setattr__(self, "dtype", fp8_block.canonical(self.dtype))
        if self.dtype not in DTYPES:
            raise PlannerError(f"dtype={self.dtype!r} must be one of {', '.join(DTYPES)} (or mxfp8 = fp8-block)")
        if self.framework not in FRAMEWORKS:
            raise PlannerError(f"framework={self.framework!r} must be one of {', '.join(FRAMEWORKS)}")
        if self.attention and self.attention not in ATTENTION_KERNELS:
            raise PlannerError(f"attention={self.attention!r} must be one of {', '.join(ATTENTION_KERNELS)}")
        if self.moe_dispatcher not in (*MOE_DISPATCHERS, AUTO_DISPATCHER):
            raise PlannerError(f"moe_dispatcher={self.moe_dispatcher!r} must be one of {', '.join(MOE_DISPATCHERS)} "
                               f"or {AUTO_DISPATCHER}")
        if self.moe_routing not in MOE_ROUTINGS:
            raise PlannerError(f"moe_routing={self.moe_routing!r} must be one of {', '.join(MOE_ROUTINGS)}")
        if not (math.isfinite(self.optimizer_offload_fraction) and 0.0 <= self.optimizer_offload_fraction <= 1.0):
            raise PlannerError(f"optimizer_offload_fraction={self.optimizer_offload_fraction!r} must be a fraction in "
                               "[0, 1] (share of the optimizer states on the host; 0 = no offload)")
        if self.moe_imbalance is not None and not (math.isfinite(self.moe_imbalance) and self.moe_imbalance >= 1):
            raise PlannerError(f"moe_imbalance={self.moe_imbalance!r} must be a number >= 1 (tokens of the busiest "
                               "expert over the mean; 1 = perfectly balanced)")
        if self.gbs is not None and self.tokens_per_batch is not None:
            raise PlannerError(f"gbs={self.gbs} and tokens_per_batch={self.tokens_per_batch} both give the batch; "
                               "pass only one (gbs in sequences, tokens_per_batch in tokens)")

    @classmethod
    def from_dict(cls, raw: Mapping) -> PlanRequest:
        """A request from batch-line keys (a JSON object, a CSV row, CLI flags by name).

        Unknown keys are refused; a key whose value is None takes its default.
        """
        if not isinstance(raw, Mapping):
            raise PlannerError("each request must be a JSON object with keys model, gpu, gpus")
        unknown = sorted(set(raw) - set(REQUEST_KEYS))
        if unknown:
            raise PlannerError(f"unknown key(s) {', '.join(unknown)}; allowed: {', '.join(REQUEST_KEYS)}")
        missing = [k for k in REQUIRED if raw.get(k) is None]
        if missing:
            raise PlannerError(f"missing required key(s) {', '.join(missing)}")
        return cls(**{k: v for k, v in raw.items() if v is not None})

    def to_plan(self, model: ModelSpec, gpus_per_node: int, extra: dict | None = None,
                nvlink_domain: int = 0) -> ParallelPlan:
        """The validated ParallelPlan of this request for ``model`` with nodes of ``gpus_per_node`` GPUs and
        NVLink domains of ``nvlink_domain`` GPUs (0 = the node; filling the default sequence length and
        global batch)."""
        seq = self.seq_len or default_seq_len(model)[0]
        mp = self.tp * self.pp * self.cp
        dp = self.gpus // mp if mp and self.gpus % mp == 0 else 1
        gbs = self.gbs
        if gbs is None:
            gbs = batch_sequences(seq, self.mbs * dp, self.tokens_per_batch or DEFAULT_BATCH_TOKENS)
        vpp, layout = self.vpp, {}
        if self.pipeline_layout is not None:  # Megatron derives VPP from the layout: virtual stages / PP
            layout = {"pipeline_layout": self.pipeline_layout}
            if vpp == 1 and self.pp and len(self.pipeline_layout) % self.pp == 0:
                vpp = len(self.pipeline_layout) // self.pp
        plan = ParallelPlan(gpus=self.gpus, gpus_per_node=gpus_per_node, gbs=gbs, seq_len=seq,
                            tp=self.tp, pp=self.pp, cp=self.cp, vpp=vpp, mbs=self.mbs,
                            recompute=self.recompute, recompute_modules=self.recompute_modules,
                            sequence_parallel=self.sequence_parallel,
                            zero=DEFAULT_ZERO if self.zero == AUTO_ZERO else self.zero,
                            dtype=self.dtype, layer_split=self.layer_split, nvlink_domain=nvlink_domain,
                            framework=self.framework, attention=self.attention, cuda_graphs=self.cuda_graphs,
                            tp_comm_overlap=self.tp_comm_overlap,
                            cross_entropy_fusion=self.cross_entropy_fusion, **self.moe_fields(), **layout,
                            **{k: tuple(v) if isinstance(v, list) else v for k, v in self.memory_fields().items()},
                            extra=dict(extra or {}))
        if self.moe_dispatcher == AUTO_DISPATCHER:
            plan = with_default_dispatcher(plan)
        plan.validate(model)
        return plan

    def moe_fields(self) -> dict:
        """The MoE keyword arguments of ParallelPlan this request sets (none of them for a default request,
        so a dense plan is built exactly as before)."""
        out: dict = {}
        for key in ("ep", "etp", "moe_dispatcher", "moe_imbalance", "moe_routing", "moe_overlap_comm",
                    "moe_grouped_gemm"):
            value = getattr(self, key)
            if value != _DEFAULTS[key] and value != AUTO_DISPATCHER:
                out[key] = float(value) if key == "moe_imbalance" else value
        return out

    def memory_fields(self) -> dict:
        """The memory-feature keyword arguments of ParallelPlan this request sets (none for a default request)."""
        return {key: (list(v) if isinstance(v, tuple) else v) for key in MEMORY_KEYS
                if (v := getattr(self, key)) != _DEFAULTS[key]}

    def resolve(self, hardware_files: tuple = ()) -> ResolvedPlan:
        """Resolve the model, the hardware (catalogue plus ``hardware_files``) and the plan."""
        model = resolve_model(self.model)
        hardware = load_catalogue(hardware_files).resolve(self.gpu, self.cluster, self.gpus_per_node)
        hardware.gpu.check_dtype(self.dtype)
        if self.dtype == fp8_block.DTYPE:
            fp8_block.check_gpu(hardware.gpu.measured_as)
        plan = self.to_plan(model, min(hardware.gpus_per_node, self.gpus), nvlink_domain=hardware.domain_for(self.gpus))
        if self.zero == AUTO_ZERO:
            plan = with_default_zero(model, plan, hardware.gpu)
        return ResolvedPlan(model, plan, hardware)


REQUEST_KEYS: tuple[str, ...] = tuple(f.name for f in fields(PlanRequest))
"""The batch-line keys, in the order error messages list them."""
REQUIRED = ("model", "gpu", "gpus")
_DEFAULTS = {f.name: f.default for f in fields(PlanRequest)}
_INT_KEYS = {"gpus", "gpus_per_node", "tp", "pp", "cp", "vpp", "mbs", "gbs", "tokens_per_batch", "seq_len", "ep",
             "etp"}
_ZERO_STAGES = (0, 1, 2, 3)
_BOOL_KEYS = {"sequence_parallel", "moe_overlap_comm", "moe_grouped_gemm", "fp8_param_gather",
              "reshard_after_forward", "cuda_graphs", "cross_entropy_fusion", "tp_comm_overlap"}
_TYPES: dict[str, type | tuple] = {"id": (str, int), "model": (str, dict), "gpu": str, "cluster": str,
                                   "recompute": str, "dtype": str, "framework": str, "attention": str,
                                   "moe_dispatcher": str, "moe_routing": str, "main_grads_dtype": str,
                                   "main_params_dtype": str, "exp_avg_dtype": str, "exp_avg_sq_dtype": str}
MEMORY_KEYS = ("main_grads_dtype", "main_params_dtype", "exp_avg_dtype", "exp_avg_sq_dtype", "fp8_param_gather",
               "optimizer_offload_fraction", "offload_modules", "reshard_after_forward")
"""The memory-feature keys (costmodel/core/specs/memory_features.py), passed to the plan only when set."""


@dataclass(frozen=True)
class ResolvedPlan:
    """A resolved request: the three cost-model inputs."""

    model: ModelSpec
    plan: ParallelPlan
    hardware: Hardware


_SUFFIX = {"k": 1e3, "m": 1e6, "b": 1e9, "g": 1e9}


def parse_batch_tokens(text: str | int | None) -> int | None:
    """A global batch in tokens as an integer: 4194304, '4M' (4e6), '16e6'; None stays None."""
    if text is None or (isinstance(text, int) and not isinstance(text, bool)):
        return text
    try:
        v = suffixed_number(text, _SUFFIX)
    except ValueError:
        v = float("nan")
    if not (v >= 1 and v < 2**53):
        raise PlannerError(f"tokens_per_batch {text!r} must be a positive number of tokens, e.g. 4M or 4194304.")
    return int(round(v))


def check_value(key: str, value: object) -> object:
    """One batch-line key's value checked and normalised as :class:`PlanRequest` does (PlannerError naming the key
    when it is of the wrong type or range); plan files check their keys with it."""
    return _check_type(key, value)


def _check_type(key: str, value: object) -> object:
    if key == "tokens_per_batch" and isinstance(value, str):
        value = parse_batch_tokens(value)
    if key == "zero":
        return _zero_value(value)
    if key in _INT_KEYS:
        if isinstance(value, float) and math.isfinite(value) and value.is_integer():
            value = int(value)
        if isinstance(value, bool) or not isinstance(value, int):
            raise PlannerError(f"{key}={value!r} must be an integer")
        if value <= 0:
            raise PlannerError(f"{key}={value} must be a positive integer")
        if value >= MAX_INT:
            raise PlannerError(f"{key}={value} is too large; it must be below 2**53")
        return value
    if key == "optimizer_offload_fraction":
        if isinstance(value, bool) or not isinstance(value, (int, float)) or (isinstance(value, int)
                                                                              and abs(value) > 2**53):
            raise PlannerError(f"{key}={value!r} must be a number in [0, 1], e.g. 0.5")
        return float(value)
    if key in ("recompute_modules", "offload_modules"):
        items = value.split(",") if isinstance(value, str) else value
        if not isinstance(items, (list, tuple)) or not all(isinstance(v, str) for v in items):
            raise PlannerError(f"{key}={value!r} must be a list of module names or 'a,b', e.g. ['moe_act']")
        return tuple(v.strip() for v in items if v.strip())
    if key == "layer_split":
        if isinstance(value, str):
            try:
                value = [int(x) for x in value.split(",")]
            except ValueError:
                raise PlannerError(f"{key}={value!r} must be comma-separated integers, e.g. 9,8,8,7") from None
        if (not isinstance(value, (list, tuple)) or not value
                or any(isinstance(v, bool) or not isinstance(v, int) or v <= 0 for v in value)):
            raise PlannerError(f"{key}={value!r} must be a list of positive integers, one per pipeline stage")
        return tuple(value)
    if key == "pipeline_layout":
        return _layout_value(value)
    if key in _BOOL_KEYS:
        if not isinstance(value, bool):
            raise PlannerError(f"{key}={value!r} must be true or false")
        return value
    if key == "moe_imbalance":
        if isinstance(value, bool) or not isinstance(value, (int, float)) or (isinstance(value, int)
                                                                              and abs(value) > 2**53):
            raise PlannerError(f"{key}={value!r} must be a number >= 1, e.g. 1.2")
        return float(value)
    typ = _TYPES[key]
    if not isinstance(value, typ):
        names = " or ".join(t.__name__ for t in (typ if isinstance(typ, tuple) else (typ,)))
        raise PlannerError(f"{key}={value!r} must be a {names}")
    return value


def _zero_value(value: object) -> int | str:
    """A zero key: a stage 0-3 (an integer, or its digit as the CLI passes it) or 'auto'."""
    if isinstance(value, str):
        text = value.strip().lower()
        if text == AUTO_ZERO:
            return AUTO_ZERO
        value = int(text) if text.isdigit() else value
    if isinstance(value, float) and math.isfinite(value) and value.is_integer():
        value = int(value)
    if isinstance(value, bool) or value not in _ZERO_STAGES:
        raise PlannerError(f"zero={value!r} must be a ZeRO stage 0, 1, 2 or 3, or {AUTO_ZERO} (ZeRO-1 unless the "
                           "plan only fits with more sharding)")
    return int(value)


def _layout_value(value: object) -> tuple[int, ...]:
    """A pipeline_layout key: a list of non-negative integers, '2,2,1' or Megatron's layout string."""
    if isinstance(value, str):
        try:
            return parse_pipeline_layout(value, 1)[0]
        except PlanError as e:
            raise PlannerError(str(e)) from None
    if (not isinstance(value, (list, tuple)) or not value
            or any(isinstance(v, bool) or not isinstance(v, int) or v < 0 for v in value)):
        raise PlannerError(f"pipeline_layout={value!r} must be a list of non-negative integers (layers per virtual "
                           "stage), '2,2,1' or a Megatron layout string such as 'Et|(tt|)*30L'")
    return tuple(value)


def build_request(raw: dict, hardware_files: tuple = ()) -> ResolvedPlan:
    """Validate a request dict (batch-line keys) and resolve model, plan and hardware."""
    return PlanRequest.from_dict(raw).resolve(hardware_files)
