"""Per-GPU memory model: weights, gradients, optimizer state, activations and workspace.

Everything here is closed-form arithmetic on :class:`ModelSpec` and :class:`ParallelPlan` (no
allocation, no torch), cheap enough to be called for every candidate of a layout search.

Sources
-------
* [MEGATRON-DO] Megatron-Core developer guide, "Distributed Optimizer"
  (docs.nvidia.com/megatron-core/developer-guide/latest/distrib_optimizer.html): bytes per parameter
  for bf16/fp16 params with fp32 main grads are 18 without and ``6 + 12/d`` with the distributed
  optimizer (d = data-parallel size).
* [MEGATRON-TM] Megatron-LM ``megatron/training/theoretical_memory_usage.py`` (NVIDIA/Megatron-LM):
  the same 18 / 6+12/d rule, the most loaded shard (embedding on stage 0), the token-id and
  embedding-dropout activations on the first stage and the output-layer/loss activations.
* [KORTHIKANTI] Korthikanti et al., "Reducing Activation Recomputation in Large Transformer Models",
  arXiv 2205.05198 (2022): Sec. 4.1 per-layer activation terms, Table 2 (per-layer activations for
  each parallel/recompute mode), Sec. 4.2.3 (in-flight micro-batches with 1F1B and interleaving),
  Sec. 4.3 (embedding / output layer / loss activations), Figure 1 (activation and
  parameter+optimizer memory of the 22B/175B/530B/1T models).
* [NARAYANAN] Narayanan et al., "Efficient Large-Scale Language Model Training on GPU Clusters
  Using Megatron-LM", SC'21, arXiv 2104.04473, Sec. 2.2: 1F1B limits in-flight micro-batches to
  the pipeline depth.
* [MEGATRON-SCHED] Megatron-LM ``megatron/core/pipeline_parallel/schedules.py``: warm-up
  micro-batches of the interleaved schedule, ``2 (p - i - 1) + (v - 1) * p`` (with the default
  ``microbatch_group_size_per_vp_stage = p``), capped at ``m * v``.
* [TE-FP8] NVIDIA/TransformerEngine transformer_engine/pytorch/module/linear.py @d0067d0 (``_Linear`` forward,
  "Discard row-wise data since it is not needed in backward pass"; ``saved_inputmat = inputmat``): with fp8 GEMMs
  a linear layer saves its fp8-quantised input (1 byte per element, block scales aside) for the weight gradient,
  not the bf16 one; tensors other layers save (norm inputs, attention's Q, K, V, O, the activation function's
  input) stay bf16.
* [FLASH2] Dao, "FlashAttention-2", arXiv 2307.08691, Algorithm 1/2: the forward pass saves only
  Q, K, V, O and the fp32 row log-sum-exp; the dropout mask is regenerated from the RNG state.
* [MCORE-MOE], [MCORE-MLA]: MoE and MLA terms, costmodel/memory/moe_memory.py.
* [MCORE-OFFLOAD] Megatron-Core fine-grained activation offloading (NVIDIA/Megatron-LM @d98e8a64ddf3
  docs/user-guide/features/fine_grained_activation_offloading.md, transformer_config.py ``offload_modules``): each
  listed module's input moves to host memory after its forward and back before its backward.
* [FSDP-NOTES] PyTorch docs, "FSDP Notes / FSDP Prefetch Nuances"
  (docs.pytorch.org/docs/stable/notes/fsdp.html): with prefetching the next unit's all-gather
  output is allocated while the current unit is in use (two gathered units at once).

Conventions
-----------
* Activations are 2-byte (bf16/fp16) tensors, dropout masks 1 byte, as in [KORTHIKANTI]; with fp8 GEMMs on a
  Megatron stack the GEMM inputs are saved in fp8 (1 byte, [TE-FP8]).
* Parameters are kept in bf16/fp16 (2 bytes) with fp32 main gradients (4 bytes) and fp32 Adam
  master weights + two moments (12 bytes), Megatron's default for bf16 training ([MEGATRON-DO],
  "float16 param, fp32 grads" row). The same rule is used for every ``plan.dtype`` and for every
  ZeRO stage (FSDP may keep bf16 gradients under a bf16 reduce policy; we model the Megatron-like
  fp32 main-gradient policy consistently). fp8 training keeps bf16 parameters; Transformer Engine's
  cached fp8 weight copies are not modelled.
* Sharding group of ZeRO: data-parallel x context-parallel ranks. Parameters are replicated across
  CP and gradients are reduced over DP x CP, so Megatron's distributed optimizer shards over the
  "data-parallel group with context parallelism" (``get_data_parallel_group(with_context_parallel=
  True)``, megatron/core/parallel_state.py).
* Sizes are bytes. GPU capacity is ``GPUSpec.hbm_bytes``: the MiB the driver reports (nvidia-smi
  ``memory.total``, e.g. 81,920 MiB = 80 GiB for an "80 GB" A100) where the catalogue cites one, else
  the vendor's GB x 1e9. Messages state sizes in GiB (2^30 bytes).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, replace

from costmodel.core.specs.framework import attention_kernel
from costmodel.core.specs.hardware import GPUSpec
from costmodel.core.specs.model import ModelSpec
from costmodel.core.specs.plan import ParallelPlan
from costmodel.memory.memory_states import stage_state_bytes, state_bytes, zero3_units
from costmodel.memory.memory_terms import (  # noqa: F401  (re-exported: the public per-layer terms)
    BYTES_ACT,
    BYTES_FP8_GEMM_INPUT,
    BYTES_LOGIT,
    BYTES_LSE,
    BYTES_MASK,
    BYTES_TOKEN_ID,
    OFFLOAD_KEPT_LAYERS,
    VOCAB_PAD_MULTIPLE,
    _act_bytes,
    _embedding_params_per_gpu,
    _head_params_per_gpu,
    _kv_heads_per_rank,
    _layer_activation_bytes,
    _op_sac,
    _stage_param_parts,
    activation_bytes_per_layer,
    first_stage_extra_bytes,
    gemm_input_bytes,
    inflight_microbatches,
    last_stage_extra_bytes,
    layer_params_per_gpu,
    layout_inflight,
    offloaded_layer_bytes,
    padded_vocab,
    stage_params,
)
from costmodel.memory.moe_memory import (  # noqa: F401  (re-exported: the MoE terms costmodel.memory.per_gpu applied before)
    layer_param_parts,
    moe_dispatch_working_bytes,
    moe_mlp_activation_bytes,
)
from costmodel.memory.mtp import mtp_activation_bytes, mtp_param_parts_per_gpu

MIB = 2 ** 20

CUDA_CONTEXT_BYTES = 0.7e9
"""CUDA context + loaded kernels. Observations: 200-700 MB across machines (pytorch/pytorch#28113),
~300 MB with CUDA >= 11.7 lazy module loading and > 1000 MB before it (pytorch/pytorch#107667,
ptrblck). We take the upper end of the lazy-loading era figure, 700 MB (an assumption, not a
measurement of any specific framework)."""

CUBLAS_WORKSPACE_HOPPER_BYTES = 32 * MIB
"""cuBLAS(Lt) workspace per handle/stream recommended for Hopper and newer: 32 MiB
(cuBLAS docs, cublasSetWorkspace; adopted by PyTorch in pytorch/pytorch#120925)."""
CUBLAS_WORKSPACE_OLDER_BYTES = 4 * MIB
"""cuBLAS workspace recommended for pre-Hopper GPUs: 4 MiB (same sources)."""
CUBLAS_STREAMS = 4
"""ASSUMPTION: number of streams with their own cuBLAS workspace (compute plus overlapped TP/DP/PP
communication streams; Transformer Engine keeps several GEMM streams)."""

NCCL_BUFFSIZE_BYTES = 4 * MIB
"""NCCL_BUFFSIZE default, 4 MiB per connection buffer (NCCL user guide, Environment Variables)."""
NCCL_CHANNELS = 16
"""ASSUMPTION: channels per communicator (NCCL picks 2-32 by topology)."""
NCCL_ACTIVE_COMMUNICATORS = 4
"""ASSUMPTION: communicators with live buffers on one GPU (TP, DP, PP, CP/embedding groups)."""
NCCL_PEERS_PER_CHANNEL = 2
"""A ring channel connects each rank to its previous and next peer."""
NCCL_BUFFER_BYTES = NCCL_ACTIVE_COMMUNICATORS * NCCL_CHANNELS * NCCL_PEERS_PER_CHANNEL * NCCL_BUFFSIZE_BYTES
"""NCCL staging buffers: communicators x channels x peers x NCCL_BUFFSIZE = 512 MiB (assumption,
see the three factors above)."""


def default_workspace_bytes(gpu: GPUSpec | None = None) -> float:
    """Fixed allowance for CUDA context, cuBLAS workspaces and NCCL buffers (see module constants).

    The cuBLAS part uses the Hopper figure unless ``gpu`` is known to predate Hopper; GPUs without
    an fp8 peak in ``peak_tflops`` are treated as pre-Hopper (fp8 tensor cores arrived with Hopper).
    Without a ``gpu`` the larger Hopper figure is used (the conservative choice).
    """
    cublas = CUBLAS_WORKSPACE_HOPPER_BYTES
    if gpu is not None and "fp8" not in gpu.peak_tflops:
        cublas = CUBLAS_WORKSPACE_OLDER_BYTES
    return CUDA_CONTEXT_BYTES + CUBLAS_STREAMS * cublas + NCCL_BUFFER_BYTES


DEFAULT_WORKSPACE_BYTES = default_workspace_bytes()
"""Workspace with the Hopper cuBLAS figure: 0.7 GB + 128 MiB + 512 MiB ~= 1.37 GB."""

ALLOCATOR_FRAGMENTATION = 1.83 / 75.31
"""PyTorch caching-allocator memory reserved but not allocated, as a fraction of the allocated bytes (weights,
gradients, optimizer, activations): 1.83 GiB "reserved by PyTorch but unallocated" next to 75.31 GiB "allocated
by PyTorch" in the out-of-memory report of a 70B-model job quoted in vllm-project/compressed-tensors#587 (2.4 %).
The figure at an out-of-memory error is the one that decides whether a plan fits: below capacity the allocator
frees its cached blocks and retries before it fails, so only fragments it cannot reuse count. A Megatron-LM
memory report on MI300X ("max allocated: 136133.8 | max reserved: 137672.0" MB, the sample log line of AMD's
cluster-validation-suite tests of cvs.lib.training.megatron) shows 1.1 %; NeMo, Megatron-LM and the MoE ModelZoo
recipes set PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True, which maps pages on demand instead of splitting
fixed segments."""

DEFAULT_HEADROOM = 0.0
"""Fraction of HBM :func:`fits_in_memory` keeps free beyond the modelled terms by default: none, since the
allocator's fragmentation is a term of its own (``MemoryBreakdown.allocator``, :data:`ALLOCATOR_FRAGMENTATION`);
users who want a margin pass one (``planner search --headroom``)."""


# ----------------------------------------------------------------------------- result
@dataclass(frozen=True)
class MemoryBreakdown:
    """Memory of one GPU, in bytes, for one pipeline stage (the peak stage from memory_per_gpu)."""

    weights: float
    """Parameters held (bf16, fp8 primary weights, or the fp32 shard FSDP2 keeps; sharded under ZeRO-3, plus the
    gathered working set)."""
    gradients: float
    """Main gradients held (fp32 by default; sharded under ZeRO-2/3, plus one unsharded unit)."""
    optimizer: float
    """Main (master) parameters and Adam moments on the GPU (sharded under ZeRO >= 1; less what is offloaded)."""
    activations: float
    """Activations stored for backward at the peak of the 1F1B schedule."""
    workspace: float
    """Fixed allowance: CUDA context, cuBLAS workspaces, NCCL buffers."""
    stage: int
    """Pipeline stage (0-based) this breakdown describes."""
    inflight_microbatches: float
    """Micro-batches whose activations the stage holds at its peak (stage-equivalents; fractional
    with the interleaved schedule)."""
    host: float = 0.0
    """Bytes the offloading features keep in host memory at the peak (optimizer states, activations); not part of
    the GPU total."""
    allocator: float = 0.0
    """Caching-allocator fragmentation: reserved but unusable bytes (:data:`ALLOCATOR_FRAGMENTATION` of the
    allocated terms)."""

    @property
    def total(self) -> float:
        return self.weights + self.gradients + self.optimizer + self.activations + self.workspace + self.allocator


# ----------------------------------------------------------------------------- per stage
@dataclass(frozen=True)
class _StagePlan:
    """What every stage's terms share, computed once per plan (the stage loop runs inside layout searches)."""

    model: ModelSpec
    plan: ParallelPlan
    flash: bool
    """Flash attention in effect (the kernel is not 'unfused')."""
    layers: tuple[int, ...]
    """Layers per stage."""
    per_layer_params: float
    parts: list | None
    """MoE / MLA: (non-expert, expert, largest layer) parameters per stage (:func:`_stage_param_parts`)."""
    stage_idx: list | None
    """MoE: layer indices per stage."""
    chunk_rows: list | None
    """A pipeline_layout's layers per chunk, [chunk][stage]."""
    group: int
    """Micro-batch group of the interleaved warm-up (PP when not interleaved or no valid group)."""
    act_layer: float
    act_moe: float
    recompute_working: float
    """One layer re-materialised in its backward (full recompute, op-SAC, module recompute)."""
    moe_working: float
    """The MoE layer's module-recompute working set."""
    first_extra: float
    last_extra: float
    largest_module: float
    """Parameters of the largest single module (DeepSpeed's ZeRO-3 gathers, :func:`_largest_module_params`)."""


def _stage_plan(model: ModelSpec, plan: ParallelPlan, flash_attention: bool) -> _StagePlan:
    flash = flash_attention and attention_kernel(plan) != "unfused"
    act_layer = activation_bytes_per_layer(model, plan, flash)
    act_moe = _layer_activation_bytes(model, plan, plan.recompute, flash, moe=True) if model.is_moe else 0.0
    # Full recompute re-materialises one layer at a time in backward; that layer's activations
    # (stored as with recompute='none') exist on top of the checkpoints.
    recompute_working = moe_working = 0.0
    if plan.recompute == "full" or _op_sac(plan):  # op-SAC re-runs a layer's forward in its backward too
        recompute_working = _layer_activation_bytes(model, plan, "none", flash)
    elif plan.recompute == "selective" and plan.recompute_modules:
        # one layer's recomputed modules re-materialised in its backward: what the modules stopped storing
        base = replace(plan, recompute_modules=())
        recompute_working = _layer_activation_bytes(model, base, "selective", flash) - act_layer
        moe_working = (_layer_activation_bytes(model, base, "selective", flash, moe=True) - act_moe
                       if model.is_moe else 0.0)
    moe_or_mla = model.is_moe or model.is_mla
    return _StagePlan(
        model, plan, flash, plan.stage_layers(model.num_layers), layer_params_per_gpu(model, plan.tp),
        _stage_param_parts(model, plan) if moe_or_mla else None,
        plan.stage_layer_indices(model.num_layers) if model.is_moe else None,
        plan.chunk_layers(model.num_layers) if plan.pipeline_layout is not None else None,
        plan.vpp_microbatch_group or plan.pp, act_layer, act_moe, recompute_working, moe_working,
        first_stage_extra_bytes(model, plan), last_stage_extra_bytes(model, plan),
        _largest_module_params(model, plan.tp) if plan.framework == "deepspeed" else 0.0)


def stage_extra_params(model: ModelSpec, plan: ParallelPlan, stage: int) -> list[float]:
    """Parameters stage ``stage`` holds on one GPU outside its transformer layers, one entry per unit that ZeRO-3
    gathers whole: the embedding on the first stage, the final norm and output layer on the last. Terms of other
    modules a stage holds (e.g. multi-token-prediction layers on the last stage) belong here."""
    out = []
    if stage == 0:
        out.append(_embedding_params_per_gpu(model, plan.tp))
    if stage == plan.pp - 1:
        out.append(_head_params_per_gpu(model, plan.tp, plan.pp))
    return out


def _largest_module_params(model: ModelSpec, tp: int) -> float:
    """Parameters of the largest single module on one TP rank (Megatron's fused layout: QKV, attention output,
    fc1 with its gate, fc2; the vocab-parallel embedding): what DeepSpeed's ZeRO-3 gathers at least at once."""
    h, f = model.hidden_size, model.ffn_hidden_size or model.expert_ffn
    q, kv = model.q_dim, _kv_heads_per_rank(model, tp) * tp * model.head_dim
    return max(h * (q + 2 * kv), q * h, h * f * (2 if model.gated else 1), padded_vocab(model, tp) * h) / tp


def _stage_states(c: _StagePlan, i: int, n: int) -> tuple[float, float, float, float]:
    """(weights, gradients, optimizer on the GPU, optimizer on the host) bytes of stage ``i`` holding ``n`` layers
    (costmodel.memory.memory_states.stage_state_bytes)."""
    plan = c.plan
    params, expert = n * c.per_layer_params, 0.0
    unit = c.per_layer_params if n else 0.0  # largest ZeRO-3 gather / ZeRO-2 reduce unit
    if c.parts is not None:
        params, expert, unit = c.parts[i]
    layer_params = params
    for extra in stage_extra_params(c.model, plan, i):
        params += extra
        unit = max(unit, extra)
    if i == plan.pp - 1:
        mtp_dense, mtp_expert = mtp_param_parts_per_gpu(c.model, plan, padded_vocab(c.model, plan.tp))
        params, expert = params + mtp_dense, expert + mtp_expert  # the MTP depths (costmodel.memory.mtp)
    gather, grad_unit = zero3_units(plan, unit, c.largest_module)
    return stage_state_bytes(plan, params, layer_params, gather, grad_unit, expert, unit)


def _stage_inflight(c: _StagePlan, i: int) -> float:
    """:func:`inflight_microbatches` of stage ``i``, inlined (this runs inside layout searches)."""
    plan = c.plan
    pp, vpp, m1 = plan.pp, plan.vpp, max(plan.num_microbatches, 1)
    if vpp <= 1:
        return float(min(pp - i, m1))
    if c.chunk_rows is not None:  # a pipeline_layout's chunks of unequal size
        return layout_inflight([row[i] for row in c.chunk_rows], pp, i, m1, c.group)
    return min(2 * (pp - i - 1) + (vpp - 1) * c.group + 1, m1 * vpp) / vpp


def _stage_offload(c: _StagePlan, i: int, n: int, inflight: float) -> tuple[float, float]:
    """(bytes of one micro-batch of stage ``i``'s layers that activation offloading moves to the host, bytes on the
    host at the stage's peak): every held layer-micro-batch but :data:`OFFLOAD_KEPT_LAYERS` sits on the host."""
    if not c.plan.offload_modules or not n:
        return 0.0, 0.0
    n_moe = sum(c.model.is_moe_layer(j) for j in c.stage_idx[i]) if c.stage_idx is not None else 0
    per_mb = (n - n_moe) * offloaded_layer_bytes(c.model, c.plan) + n_moe * offloaded_layer_bytes(c.model, c.plan, True)
    return per_mb, per_mb / n * max(0.0, n * inflight - OFFLOAD_KEPT_LAYERS)


def _stage_activations(c: _StagePlan, i: int, n: int, inflight: float) -> float:
    """Activation bytes stage ``i`` (``n`` layers) holds on the GPU at its peak with ``inflight`` micro-batches
    (less what activation offloading keeps on the host, :func:`_stage_offload`)."""
    model, plan = c.model, c.plan
    act = n * c.act_layer * inflight - _stage_offload(c, i, n, inflight)[1]
    if c.stage_idx is not None:
        n_moe = sum(model.is_moe_layer(j) for j in c.stage_idx[i])
        act = ((n - n_moe) * c.act_layer + n_moe * c.act_moe) * inflight - _stage_offload(c, i, n, inflight)[1]
        if n_moe:
            # one MoE layer in flight holds its dispatcher buffers; full recompute re-materialises the
            # largest layer of the stage
            act += moe_dispatch_working_bytes(model, plan, _act_bytes(plan))
            if plan.recompute_modules:  # module recompute: the largest cut of the stage's layer kinds
                act += max(c.recompute_working if n > n_moe else 0.0, c.moe_working)
            elif c.recompute_working:
                act += max(c.recompute_working if n > n_moe else 0.0,
                           _layer_activation_bytes(model, plan, "none", c.flash, moe=True))
        elif n and c.recompute_working:
            act += c.recompute_working
    elif n and c.recompute_working:
        act += c.recompute_working
    if i == 0:
        act += c.first_extra * inflight
    if i == plan.pp - 1:
        # The loss is computed and its backward starts right after the last chunk's forward:
        # one micro-batch of head activations ([KORTHIKANTI] Sec. 4.3 counts them once).
        last_layer = c.act_moe if model.is_moe_layer(model.num_layers - 1) else c.act_layer
        act += c.last_extra + mtp_activation_bytes(model, plan, last_layer, c.last_extra, _act_bytes(plan))
    return act


def _stage_terms(model: ModelSpec, plan: ParallelPlan, flash_attention: bool) -> list[tuple]:
    """(weights, gradients, optimizer, activations, inflight, host) for every stage; plain floats (host: bytes the
    offloading features keep in host memory)."""
    c = _stage_plan(model, plan, flash_attention)
    out = []
    for i, n in enumerate(c.layers):
        inflight = _stage_inflight(c, i)
        w, g, o, host = _stage_states(c, i, n)
        host += _stage_offload(c, i, n, inflight)[1]
        out.append((w, g, o, _stage_activations(c, i, n, inflight), inflight, host))
    return out


def stage_host_offload(model: ModelSpec, plan: ParallelPlan) -> tuple[tuple[float, float], ...]:
    """Per stage, what the offloading features move between GPU and host (costmodel.memory.offload costs it):
    (parameters of the optimizer shard stepped on the host, activation bytes offloaded per micro-batch); () when the
    plan offloads nothing."""
    if not (plan.optimizer_offload_fraction or plan.offload_modules):
        return ()
    c = _stage_plan(model, plan, True)
    per_param = state_bytes(plan).optimizer
    out = []
    for i, n in enumerate(c.layers):
        host_opt = _stage_states(c, i, n)[3]
        out.append((host_opt / per_param if per_param else 0.0, _stage_offload(c, i, n, _stage_inflight(c, i))[0]))
    return tuple(out)


def _resolve_workspace(gpu: GPUSpec | None, workspace_bytes: float | None) -> float:
    if workspace_bytes is not None:
        return float(workspace_bytes)
    return DEFAULT_WORKSPACE_BYTES if gpu is None else default_workspace_bytes(gpu)


def stage_memory(model: ModelSpec, plan: ParallelPlan, gpu: GPUSpec | None = None, *,
                 flash_attention: bool = True, workspace_bytes: float | None = None) -> list[MemoryBreakdown]:
    """Memory of one GPU of every pipeline stage (index = stage).

    Stage i holds ``layers_i * activation_bytes_per_layer * inflight_i`` activations
    (:func:`inflight_microbatches`), plus the embedding terms times ``inflight_0`` on stage 0
    (as Megatron's theoretical_memory_usage multiplies them by p), plus one micro-batch of head
    terms on the last stage, plus - with recompute='full' - one layer re-materialised in backward
    (stored as with recompute='none'). Weights/gradients/optimizer follow the 2 + 4 + 12 bytes rule
    with ZeRO sharding over DP x CP; ZeRO-2/3 add one unit (the largest of a layer, the embedding
    or the head) of unsharded gradients, ZeRO-3 two gathered units of parameters (prefetch).
    The plan is assumed valid (``plan.validate(model)``); nothing is checked here so the function
    stays cheap in searches."""
    ws = _resolve_workspace(gpu, workspace_bytes)
    return [_breakdown(terms, ws, i) for i, terms in enumerate(_stage_terms(model, plan, flash_attention))]


def _breakdown(terms: tuple, workspace: float, stage: int) -> MemoryBreakdown:
    w, g, o, a, f, host = terms
    return MemoryBreakdown(w, g, o, a, workspace, stage, f, host, ALLOCATOR_FRAGMENTATION * (w + g + o + a))


def memory_per_gpu(model: ModelSpec, plan: ParallelPlan, gpu: GPUSpec | None = None, *,
                   flash_attention: bool = True, workspace_bytes: float | None = None) -> MemoryBreakdown:
    """Memory of the most loaded GPU: the pipeline stage with the highest total.

    ``gpu`` only selects the cuBLAS workspace figure (see :func:`default_workspace_bytes`);
    ``workspace_bytes`` overrides the whole fixed allowance. ``flash_attention=False`` stores the
    s^2 attention tensors with recompute='none' (Korthikanti Table 2 semantics).
    """
    ws = _resolve_workspace(gpu, workspace_bytes)
    terms = _stage_terms(model, plan, flash_attention)
    best = max(range(len(terms)), key=lambda i: terms[i][0] + terms[i][1] + terms[i][2] + terms[i][3])
    return _breakdown(terms[best], ws, best)


def usable_bytes(gpu: GPUSpec, headroom: float = DEFAULT_HEADROOM) -> float:
    """Bytes a plan may use: the driver-reported capacity (``GPUSpec.hbm_bytes``) less ``headroom``."""
    return gpu.hbm_bytes * (1.0 - headroom)


def fits_in_memory(breakdown: MemoryBreakdown, gpu: GPUSpec, headroom: float = DEFAULT_HEADROOM) -> bool:
    """True when the breakdown's total (allocator fragmentation included) fits in the GPU's capacity as the driver
    reports it (``GPUSpec.hbm_bytes``) less an optional ``headroom`` fraction (default none, DEFAULT_HEADROOM)."""
    return breakdown.total <= usable_bytes(gpu, headroom)


def first_fitting(model: ModelSpec, plans: Iterable[ParallelPlan], gpu: GPUSpec,
                  headroom: float = DEFAULT_HEADROOM) -> ParallelPlan | None:
    """The first of ``plans`` (variants of one plan, tried in order) that is valid for ``model`` and fits in
    ``gpu``'s memory less ``headroom`` (:func:`fits_in_memory`); None when none does."""
    return next((p for p in plans if not p.problems(model)
                 and fits_in_memory(memory_per_gpu(model, p, gpu), gpu, headroom)), None)


def memory_message(breakdown: MemoryBreakdown, gpu: GPUSpec, headroom: float = DEFAULT_HEADROOM) -> str:
    """One line, all in GiB: needed on the most loaded stage vs usable = capacity (less any headroom)."""
    gib = float(2**30)
    verdict = "fits" if fits_in_memory(breakdown, gpu, headroom) else "does not fit"
    cap = f"{gpu.hbm_bytes / gib:.1f} GiB capacity" + (f" less {headroom:.0%} headroom" if headroom else "")
    return (f"{verdict}: {breakdown.total / gib:.1f} GiB per GPU needed on stage {breakdown.stage}, "
            f"{gpu.name} has {usable_bytes(gpu, headroom) / gib:.1f} GiB usable ({cap})")
