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
* [MCORE-MOE], [MCORE-MLA]: MoE and MLA terms, costmodel/moe_memory.py.
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

from dataclasses import dataclass, replace

from costmodel.core.specs.framework import attention_kernel, get_framework
from costmodel.core.specs.hardware import GPUSpec
from costmodel.core.specs.model import ModelSpec
from costmodel.core.specs.plan import ParallelPlan
from costmodel.memory_states import stage_state_bytes, state_bytes, zero3_units
from costmodel.moe_memory import (
    layer_param_parts,
    mla_activation_bytes,
    moe_dispatch_working_bytes,
    moe_mlp_activation_bytes,
    offloaded_moe_bytes,
    selective_cuts,
)

# ----------------------------------------------------------------------------- constants
BYTES_ACT = 2.0
"""bf16/fp16 activation element [KORTHIKANTI] Sec. 4.1."""
BYTES_MASK = 1.0
"""Dropout mask element [KORTHIKANTI] Sec. 4.1."""
BYTES_LOGIT = 4.0
"""Logits are cast to fp32 for Megatron's vocab-parallel cross entropy
(megatron/core/tensor_parallel/cross_entropy.py, called on ``logits.float()``) [KORTHIKANTI] Sec. 4.3."""
BYTES_TOKEN_ID = 8.0
"""int64 token ids held by the embedding [MEGATRON-TM] ("Input to embedding", 8 * s * b)."""
BYTES_LSE = 4.0
"""fp32 log-sum-exp per (head, token) saved by flash attention [FLASH2]."""

BYTES_FP8_GEMM_INPUT = 1.0
"""fp8 copy of a GEMM input saved for the weight gradient [TE-FP8]."""


def gemm_input_bytes(plan: ParallelPlan) -> float:
    """Bytes per element of the input a linear layer saves for its weight-gradient GEMM: 1 with fp8 GEMMs on
    Transformer Engine (Megatron stacks; [TE-FP8]), else the activation bytes."""
    if plan.dtype in ("fp8", "fp8-block") and plan.framework == "megatron":
        return BYTES_FP8_GEMM_INPUT
    return _act_bytes(plan)


def _act_bytes(plan: ParallelPlan) -> float:
    """Bytes per stored activation element: 4 for fp32 training, else 2 (bf16/fp16; fp8 GEMMs
    keep bf16 activations between operators)."""
    return 4.0 if plan.dtype == "fp32" else BYTES_ACT


VOCAB_PAD_MULTIPLE = 128
"""Megatron pads the vocabulary to a multiple of ``make_vocab_size_divisible_by * TP``; the
argument's default is 128 (megatron/training/arguments.py, ``--make-vocab-size-divisible-by``)."""

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


# ----------------------------------------------------------------------------- helpers
def padded_vocab(model: ModelSpec, tp: int) -> int:
    """Vocabulary padded to a multiple of 128 * TP as Megatron does (``_vocab_size_with_padding``)."""
    mult = VOCAB_PAD_MULTIPLE * tp
    return -(-model.vocab_size // mult) * mult


def _kv_heads_per_rank(model: ModelSpec, tp: int) -> float:
    """KV heads on one TP rank: a_kv / t, or 1 when TP exceeds a_kv (heads replicated, Megatron GQA)."""
    return model.num_kv_heads / tp if model.num_kv_heads >= tp else 1.0


def layer_params_per_gpu(model: ModelSpec, tp: int, ep: int = 1, etp: int | None = None,
                         layer: int | None = None) -> float:
    """Parameters of one transformer block on one TP rank (Megatron column/row-parallel layout).

    Q/K/V and fc1 are column-parallel (weights and biases split over TP), the output projection and
    fc2 are row-parallel (weights split, bias replicated); norms are replicated. Mirrors
    ``ModelSpec.params_per_layer`` (equal at tp=1). MoE and MLA models: :func:`layer_param_parts` of
    ``layer`` (default: the block ``params_per_layer`` describes) on a GPU of expert grid ``ep`` x ``etp``.
    """
    if model.is_moe or model.is_mla:
        if layer is None:
            layer = max(i for i in range(model.num_layers) if model.is_moe_layer(i)) if model.is_moe else 0
        dense, expert = layer_param_parts(model, layer, tp, ep, etp)
        return dense + expert
    h = model.hidden_size
    q = model.q_dim / tp
    kv = _kv_heads_per_rank(model, tp) * model.head_dim
    f = model.ffn_hidden_size / tp
    experts = max(model.num_experts, 1)
    attn = h * (q + 2 * kv) + q * h
    mlp = h * f * (3 if model.gated else 2) * experts + (h * experts if experts > 1 else 0)
    norms = 2 * h * (2 if model.norm == "layernorm" else 1)
    bias = 0.0
    if model.linear_bias:
        bias = (q + 2 * kv) + h + ((2 * f if model.gated else f) + h) * experts
    return attn + mlp + norms + bias


def _embedding_params_per_gpu(model: ModelSpec, tp: int) -> float:
    """Vocab-parallel word embedding (V_pad * h / t) plus a replicated learned position table."""
    pos = model.max_seq_len * model.hidden_size if model.position_embedding == "learned" else 0
    return padded_vocab(model, tp) * model.hidden_size / tp + pos


def _head_params_per_gpu(model: ModelSpec, tp: int, pp: int) -> float:
    """Final norm (replicated) plus the vocab-parallel LM head on the last stage.

    With tied embeddings and PP > 1 Megatron keeps a copy of the word embedding on the last stage
    (``shared_embedding``, kept in sync by an all-reduce over the embedding group), so the copy
    counts here with its gradient and optimizer state; with PP = 1 the one table serves both.
    """
    final_norm = model.hidden_size * (2 if model.norm == "layernorm" else 1)
    head = padded_vocab(model, tp) * model.hidden_size / tp
    if model.tied_embeddings and pp == 1:
        head = 0.0
    return final_norm + head


def stage_params(model: ModelSpec, plan: ParallelPlan) -> list[float]:
    """Parameters held by one GPU of each pipeline stage (before any ZeRO sharding)."""
    if model.is_moe or model.is_mla:
        out = [d + e for d, e, _ in _stage_param_parts(model, plan)]
        out[0] += _embedding_params_per_gpu(model, plan.tp)
        out[-1] += _head_params_per_gpu(model, plan.tp, plan.pp)
        return out
    per_layer = layer_params_per_gpu(model, plan.tp)
    layers = plan.stage_layers(model.num_layers)
    out = [n * per_layer for n in layers]
    out[0] += _embedding_params_per_gpu(model, plan.tp)
    out[-1] += _head_params_per_gpu(model, plan.tp, plan.pp)
    return out


def _stage_param_parts(model: ModelSpec, plan: ParallelPlan) -> list[tuple[float, float, float]]:
    """(non-expert, expert, largest layer) parameters of the layers of each stage on one GPU (no embedding/head)."""
    out = []
    parts: dict[bool, tuple[float, float]] = {}
    for idx in plan.stage_layer_indices(model.num_layers):
        dense = expert = unit = 0.0
        for i in idx:
            moe = model.is_moe_layer(i)
            if moe not in parts:
                parts[moe] = layer_param_parts(model, i, plan.tp, plan.ep, plan.etp)
            d, e = parts[moe]
            dense, expert, unit = dense + d, expert + e, max(unit, d + e)
        out.append((dense, expert, unit))
    return out


def inflight_microbatches(pp: int, stage: int, num_microbatches: int, vpp: int = 1, group: int = 0) -> float:
    """Micro-batches whose activations stage ``stage`` holds at its peak, in whole-stage units.

    Plain 1F1B: ``min(p - i, m)`` ([NARAYANAN] Sec. 2.2; [KORTHIKANTI] Sec. 4.2.3).
    Interleaved (v chunks per stage): the stage runs ``2 (p - i - 1) + (v - 1) p`` warm-up chunk
    forwards and one more before its first backward ([MEGATRON-SCHED]), capped at all ``m v`` chunk
    micro-batches; each chunk holds 1/v of the stage's layers, so the count is divided by v. For
    stage 0 this is ``p (1 + (p - 1) / (p v))``, Korthikanti's interleaving factor (Sec. 4.2.3);
    for p = 1 it is 1.
    With a micro-batch group N != p (``group``; Megatron-Core's microbatch_group_size_per_vp_stage, needed
    when m is not a multiple of p) the warm-up is ``2 (p - i - 1) + (v - 1) N`` chunk forwards
    (schedules.py get_pp_rank_microbatches).
    """
    m = max(num_microbatches, 1)
    if vpp <= 1:
        return float(min(pp - stage, m))
    chunks = min(2 * (pp - stage - 1) + (vpp - 1) * (group or pp) + 1, m * vpp)
    return chunks / vpp


def layout_inflight(chunk_layers: list[int], pp: int, stage: int, num_microbatches: int, group: int = 0) -> float:
    """:func:`inflight_microbatches` for a stage whose chunks differ in size (``chunk_layers[a]``: layers of its
    chunk a; ``ParallelPlan.pipeline_layout``): the peak of the layers whose activations it holds over its
    interleaved op order (warm-up forwards as above, then one forward / one backward, backward chunks in
    reverse: Megatron-Core schedules.py, as costmodel.timeline's simulator orders them), in whole-stage units.
    Equal chunks give :func:`inflight_microbatches` exactly."""
    v, n, m = len(chunk_layers), group or pp, max(num_microbatches, 1)
    table = [c for g in range(0, m, n) for c in range(v) for _ in range(g, min(g + n, m))]
    w = min(2 * (pp - stage - 1) + (v - 1) * n, m * v - 1)
    held = sum(chunk_layers[table[k]] for k in range(w))
    peak = held
    for j in range(m * v - w):
        held += chunk_layers[table[w + j]]
        peak = max(peak, held)
        held -= chunk_layers[v - 1 - table[j]]
    return peak / max(sum(chunk_layers), 1)


# ----------------------------------------------------------------------------- activations
def activation_bytes_per_layer(model: ModelSpec, plan: ParallelPlan, flash_attention: bool = True) -> float:
    """Activation bytes one transformer layer stores for one micro-batch on one GPU.

    Term by term from [KORTHIKANTI] Sec. 4.1 (s = seq_len / CP, b = micro-batch, h = hidden,
    q = a * d_head, k = a_kv * d_head, F = ffn width, t = TP; 2 bytes per element, 1 per mask):

    Sequence-parallel region (replicated over TP, divided by t with SP; Sec. 4.2.2):
      LayerNorm-1 input 2sbh, QKV-GEMM input 2sbh, LayerNorm-2 input 2sbh, fc1 input 2sbh,
      attention-output and MLP-output dropout masks sbh each  -> 8sbh (+2sbh with dropout).
    Tensor-parallel region (divided by t):
      Q 2sbq and K 2sbk (inputs of QK^T), V 2sbk (input of softmax.V), attention output 2sbq
      (input of the output projection); activation-function input 2sbF (2 * 2sbF for a gated MLP:
      gate and up outputs, Megatron's fused ``bias_swiglu`` saves only its input) and output 2sbF
      (fc2 input).
    Attention core, recompute='none' only:
      without flash attention: softmax output 2as^2b, dropout mask as^2b, dropout output 2as^2b
      (5as^2b; 2as^2b without dropout); with flash attention only the fp32 log-sum-exp 4asb [FLASH2].
    For GPT (q = k = h, F = 4h, dropout) these add up to Korthikanti's 34 = 11 (attention) + 19 (MLP)
    + 4 (norms) and reproduce Table 2: sbh(34 + 5as/h), sbh(10 + 24/t + 5as/(ht)),
    sbh(34/t + 5as/(ht)), sbh(10 + 24/t), 34sbh/t. Selective recompute drops the attention core
    (Table 2); flash attention makes recompute='none' equal to selective plus the log-sum-exp.
    recompute='full' keeps only the layer input, 2sbh (Table 2), which Megatron stores sharded by
    SP (2sbh/t).
    With GQA and TP > a_kv each rank holds one replicated KV head. With CP the s^2 terms use
    (s/CP)^2 (a lower bound: non-flash attention is not used with CP in Megatron).
    """
    return _layer_activation_bytes(model, plan, plan.recompute, flash_attention)


def _layer_activation_bytes(model: ModelSpec, plan: ParallelPlan, recompute: str, flash_attention: bool,
                            moe: bool = False) -> float:
    """activation_bytes_per_layer with the recompute mode given explicitly; ``moe``: an MoE layer's
    (``moe_memory.moe_mlp_activation_bytes`` instead of the dense MLP). MLA: ``moe_memory.mla_activation_bytes``."""
    t = plan.tp
    sp_div = t if plan.sp else 1
    tokens = plan.seq_len / plan.cp * plan.micro_batch_size
    h = model.hidden_size
    act_b = _act_bytes(plan)
    if recompute == "full":
        return act_b * tokens * h / sp_div

    dropout = model.dropout
    gemm_b = gemm_input_bytes(plan)
    # norm inputs, and the QKV and fc1 inputs (the norms' outputs, saved by the GEMMs)
    seq_region = tokens * h * (2 * act_b + 2 * gemm_b + (2 * BYTES_MASK if dropout else 0.0))
    q = model.q_dim / t
    kv = _kv_heads_per_rank(model, t) * model.head_dim
    f = model.ffn_hidden_size / t
    # Q, K, V and the attention output O; an fp8 output projection saves its own fp8 copy of O [TE-FP8]
    attn = tokens * act_b * (q + 2 * kv + q) + (tokens * gemm_b * q if gemm_b != act_b else 0.0)
    mlp = tokens * (act_b * f * (2 if model.gated else 1) + gemm_b * f)
    if recompute == "selective" and _op_sac(plan) and not (moe or model.is_mla):
        return _op_sac_activation_bytes(model, plan, tokens, act_b, q, kv, f, sp_div)
    if model.is_mla:
        attn = mla_activation_bytes(model, plan, tokens, act_b)
    if moe:
        mlp = moe_mlp_activation_bytes(model, plan, tokens, act_b, gemm_b)
    core = 0.0
    if recompute == "none" or (recompute == "selective" and plan.recompute_modules
                               and "core_attn" not in plan.recompute_modules):
        heads = model.num_heads / t
        if flash_attention:
            core = BYTES_LSE * heads * tokens
        else:
            s = plan.seq_len / plan.cp
            per_score = act_b + ((BYTES_MASK + act_b) if dropout else 0.0)
            core = per_score * heads * plan.micro_batch_size * s * s
    if recompute == "selective" and plan.recompute_modules:  # Megatron-Core --recompute-modules
        return seq_region / sp_div + attn + mlp + core - selective_cuts(model, plan, moe, tokens, act_b, mlp, gemm_b)
    return seq_region / sp_div + attn + mlp + core


def _op_sac(plan: ParallelPlan) -> bool:
    """The plan's selective recompute is torchtitan's per-op selective AC (``Framework.selective_recompute``)."""
    return plan.recompute == "selective" and get_framework(plan.framework).selective_recompute == "op"


def _op_sac_activation_bytes(model: ModelSpec, plan: ParallelPlan, tokens: float, act_b: float, q: float, kv: float,
                             f: float, sp_div: int) -> float:
    """What torchtitan's per-op selective AC keeps of one dense layer until its backward (parallelize_llama.py
    ``_save_list`` / ``_custom_policy``: the outputs of mm except every second one, of the SDPA flash op and of the
    TP reduce-scatters; everything else is recomputed): the block input (checkpoint input, sequence-sharded with
    SP), the outputs of the 1st, 3rd, 5th and 7th mm in execution order (wq, wv, w1 and, with a gate, w2: wk, wo
    and w3 are recomputed), the attention output with its fp32 logsumexp, and with SP the two reduce-scatter
    outputs."""
    saved = h_in = model.hidden_size / sp_div
    saved += q + kv + f + (model.hidden_size if model.gated else 0.0)   # mm outputs kept (odd-numbered)
    saved += q                                                            # SDPA output
    if plan.tp > 1 and plan.sp:
        saved += 2 * h_in                                                 # reduce_scatter_tensor outputs
    return tokens * (act_b * saved + BYTES_LSE * model.num_heads / plan.tp)


OFFLOAD_KEPT_LAYERS = 2
"""Layers whose offloaded activations are on the GPU at the backward's start: the last forward layer's (Megatron-Core
keeps the last offload group on the device to avoid a reload stall, docs/user-guide/features/
fine_grained_activation_offloading.md "the last-group margin") and the one being reloaded ahead of its backward."""


def offloaded_layer_bytes(model: ModelSpec, plan: ParallelPlan, moe: bool = False) -> float:
    """Bytes of one layer and micro-batch that fine-grained activation offloading moves to the host
    (``plan.offload_modules``, [MCORE-OFFLOAD]): each module's input as the layer stores it (this module's terms of
    :func:`activation_bytes_per_layer`): ``attn_norm`` / ``mlp_norm`` the norm inputs, ``qkv_linear`` the QKV input,
    ``core_attn`` Q, K and V, ``attn_proj`` the attention output O (and its fp8 copy), ``expert_fc1`` / ``moe_act``
    in MoE layers (:func:`costmodel.moe_memory.offloaded_moe_bytes`). A module whose input the recompute policy
    does not store moves nothing (recompute='full' keeps only the layer input and is refused with offloading)."""
    mods = plan.offload_modules
    if not mods or plan.recompute == "full":
        return 0.0
    t = plan.tp
    tokens = plan.seq_len / plan.cp * plan.micro_batch_size
    seq = tokens * model.hidden_size / (t if plan.sp else 1)
    act_b, gemm_b = _act_bytes(plan), gemm_input_bytes(plan)
    q = model.q_dim / t
    out = act_b * seq * (("attn_norm" in mods) + ("mlp_norm" in mods)) + (gemm_b * seq if "qkv_linear" in mods else 0)
    if "core_attn" in mods and not model.is_mla:
        out += act_b * tokens * (q + 2 * _kv_heads_per_rank(model, t) * model.head_dim)
    if "attn_proj" in mods:
        out += tokens * q * (act_b + (gemm_b if gemm_b != act_b else 0.0))
    if moe:
        out += offloaded_moe_bytes(model, plan, tokens, act_b, gemm_b)
    return out


def first_stage_extra_bytes(model: ModelSpec, plan: ParallelPlan) -> float:
    """Per-micro-batch activations of the embedding on stage 0: int64 token ids 8sb ([MEGATRON-TM])
    and, with dropout, the embedding-dropout mask sbh (sbh/t with SP) ([KORTHIKANTI] Sec. 4.3).
    The embedding output itself is the first layer's input, already counted in the layer."""
    tokens = plan.seq_len / plan.cp * plan.micro_batch_size
    sp_div = plan.tp if plan.sp else 1
    mask = BYTES_MASK * tokens * model.hidden_size / sp_div if model.dropout else 0.0
    return BYTES_TOKEN_ID * tokens + mask


def last_stage_extra_bytes(model: ModelSpec, plan: ParallelPlan) -> float:
    """Per-micro-batch activations of the head on the last stage ([KORTHIKANTI] Sec. 4.3):
    final-norm input 2sbh and output-layer input 2sbh (each /t with SP) and fp32 logits for the
    vocab-parallel cross entropy 4sbV/t, i.e. 4sbh/t (1 + V/h) with SP."""
    tokens = plan.seq_len / plan.cp * plan.micro_batch_size
    sp_div = plan.tp if plan.sp else 1
    hidden = 2 * _act_bytes(plan) * tokens * model.hidden_size / sp_div
    logit_bytes = get_framework(plan.framework).loss_logit_bytes  # BYTES_LOGIT for Megatron
    logits = logit_bytes * tokens * padded_vocab(model, plan.tp) / plan.tp
    return hidden + logits


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
    (costmodel.memory_states.stage_state_bytes)."""
    plan = c.plan
    params, expert = n * c.per_layer_params, 0.0
    unit = c.per_layer_params if n else 0.0  # largest ZeRO-3 gather / ZeRO-2 reduce unit
    if c.parts is not None:
        params, expert, unit = c.parts[i]
    layer_params = params
    for extra in stage_extra_params(c.model, plan, i):
        params += extra
        unit = max(unit, extra)
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
        act += c.last_extra
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
    """Per stage, what the offloading features move between GPU and host (costmodel.offload costs it): (parameters of
    the optimizer shard stepped on the host, activation bytes offloaded per micro-batch); () when the plan offloads
    nothing."""
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


def memory_message(breakdown: MemoryBreakdown, gpu: GPUSpec, headroom: float = DEFAULT_HEADROOM) -> str:
    """One line, all in GiB: needed on the most loaded stage vs usable = capacity (less any headroom)."""
    gib = float(2**30)
    verdict = "fits" if fits_in_memory(breakdown, gpu, headroom) else "does not fit"
    cap = f"{gpu.hbm_bytes / gib:.1f} GiB capacity" + (f" less {headroom:.0%} headroom" if headroom else "")
    return (f"{verdict}: {breakdown.total / gib:.1f} GiB per GPU needed on stage {breakdown.stage}, "
            f"{gpu.name} has {usable_bytes(gpu, headroom) / gib:.1f} GiB usable ({cap})")
