"""The training framework that runs a plan (`Framework`), and the registry of known ones.

A plan's numbers depend on the software stack as much as on the layout: which attention kernel it
calls, whether it overlaps the data-parallel gradient reduction with backward, and how its ZeRO-3 /
FSDP parameter gathers cross the network. Each behaviour below names the documentation or paper it
comes from; nothing here is fitted.
"""

from __future__ import annotations

from dataclasses import dataclass

from costmodel.core.errors import PlanError

ATTENTION_KERNELS = ("fused", "flash2", "flash1", "unfused")
ZERO3_NETWORKS = ("hierarchical", "flat")


@dataclass(frozen=True)
class Framework:
    """How one training stack executes a plan."""

    name: str
    """Key used by ``--framework`` and the batch key ``framework``."""
    description: str
    """One line for help texts and reports."""
    attention_kernel: str
    """Attention kernel the stack calls by default (a plan may override it, ``ParallelPlan.attention``).
    ``fused``: the fused attention the cost model's per-GPU attention data measure (Transformer Engine /
    cuDNN fused attention on Hopper, FlashAttention-2 on Ampere); ``flash2``: FlashAttention-2 kernels
    (the flash backend of PyTorch's ``scaled_dot_product_attention``, or ``flash_attn``), costed from the
    FlashAttention-2 measurements of the same GPU die (costmodel/cost/framework_kernels.py); ``flash1``: the first
    FlashAttention kernels (the flash backend of ``scaled_dot_product_attention`` in PyTorch 2.0 and 2.1), costed as
    FlashAttention-2 at half its rate (costmodel.cost.framework_kernels.FLASH2_SPEEDUP); ``unfused``: the
    attention of stacks before FlashAttention (Megatron-LM 2019-2022): batched GEMMs for QK^T and PV over the
    full s x s matrix with a fused scale-mask-softmax and dropout kernel between them (costmodel/graph/build.py)."""
    overlap_grad_reduce: bool
    """Whether the data-parallel gradient reduction (ZeRO 0-2) overlaps backward by default."""
    zero3_network: str
    """``hierarchical``: ZeRO-3 / FSDP gathers run as NCCL collectives whose inter-node traffic per GPU is
    the group's bytes / GPUs per node (rail-optimised nodes); ``flat``: every GPU's gathered bytes cross
    the network at its own NIC rate."""
    source: str
    """Where these behaviours are documented."""
    selective_recompute: str = "attention-core"
    """What ``recompute=selective`` re-runs in backward: ``attention-core`` (Megatron, Korthikanti et al. 2022
    sec. 5: the attention core, free with flash kernels) or ``op`` (torchtitan's per-op selective AC: every
    element-wise op and every second matmul of a block, costmodel.graph.build.op_sac_recompute)."""
    grad_reduce_bytes: int = 4
    """Bytes per gradient element in the data-parallel / ZeRO-3 gradient reduction: 4 = fp32 (Megatron's
    --accumulate-allreduce-grads-in-fp32, FSDP2 reduce_dtype float32 in torchtitan), 2 = the training dtype."""
    loss_logit_bytes: float = 4.0
    """Bytes per logit live at the loss's peak: 4 = the fp32 logits of Megatron's vocab-parallel cross entropy;
    12 = torchtitan's loss_fn, cross_entropy(pred.float(), labels) outside the compiled blocks (torchtitan
    components/loss.py @b5bcd76c): its forward holds the bf16 logits, their fp32 copy and log_softmax's fp32
    output (10 bytes); the bf16 logits go before backward (trainer.py ``del pred``) and the fp32 copy with the
    loss function's frame, and backward peaks in log_softmax's backward, which holds the saved fp32 output, the
    fp32 gradient nll_loss's backward returns and the fp32 gradient it writes (aten _log_softmax_backward_data):
    12 bytes."""
    fsdp2_copy_bytes: float = 0.0
    """HBM bytes per unsharded parameter that FSDP2's collectives copy per layer and micro-batch (ZeRO-3 plans),
    beyond the collectives themselves (torch/distributed/_composable/fsdp/_fsdp_collectives.py): after each of the
    two all-gathers (forward, and again before backward with reshard_after_forward) ``foreach_all_gather_copy_out``
    splits the gathered bf16 buffer into the parameters (read 2 + write 2, twice: 8), and ``foreach_reduce`` copies
    the bf16 gradients into the fp32 reduce-scatter input (``_chunk_cat`` to reduce_dtype: read 2 + write 4 = 6):
    14. 0 for stacks that gather into views of one flat buffer (FSDP1's FlatParameter, Megatron, DeepSpeed)."""
    separate_projections: bool = False
    """Whether the stack runs the query, key and value projections, and a gated MLP's gate and up projections, as
    separate GEMMs (torchtitan models/llama3/model.py: ``wq``, ``wk``, ``wv`` and ``w1``, ``w3`` are separate
    nn.Linear) rather than one fused GEMM each (Megatron-Core ``linear_qkv`` and ``linear_fc1``): narrower GEMMs
    (a key projection of 1,024 columns, 128 at TP 8 on Llama 3 8B) run at lower efficiency."""
    compiled_loss: bool = False
    """Whether the loss (cross entropy over the logits) runs as one fused kernel by default (a plan may say otherwise,
    ``ParallelPlan.cross_entropy_fusion``); False: a chain of kernels with fp32 intermediates: Megatron-Core's
    vocab-parallel cross entropy, fused by ``jit_fuser`` or not (``vocab_parallel_loss``; TransformerConfig
    cross_entropy_fusion_impl defaults to native), torchtitan's F.cross_entropy(pred.float()) outside the compiled
    blocks, plain PyTorch (costmodel.graph.build.cross_entropy_ops)."""
    vocab_parallel_loss: bool = False
    """Whether the loss is Megatron-Core's vocab-parallel cross entropy (fp32 passes over the logits,
    costmodel.graph.kernel_basis.MEGATRON_LOSS_BYTES) when it is not a single fused kernel; False: PyTorch's
    ``F.cross_entropy(logits.float())`` (its measured eager / fused ratio)."""
    python_layers: bool = False
    """Whether each transformer layer runs as PyTorch modules under autograd (torchtitan, plain PyTorch FSDP / DDP
    models, Megatron-Core's TransformerLayer of Transformer Engine modules): without CUDA graphs a layer then takes
    at least the CPU time measured per layer of such a stack (costmodel.graph.kernel_basis.host_layer_s); False: the
    per-kernel estimate only (llm.c's C loop, DeepSpeed's own engine)."""
    compiled: bool = True
    """Whether the element-wise operators (norms, RoPE, the gated activation) run as fused kernels, as the cost
    model's element-wise measurements (Transformer Engine / Apex kernels, or torch.compile's generated ones)
    assume; False: PyTorch eager, where each is a chain of separate kernels with fp32 intermediates in HBM
    (costmodel.graph.build.eager_elementwise)."""


_REGISTRY: dict[str, Framework] = {}


def register(framework: Framework) -> Framework:
    """Add ``framework`` to the registry; a duplicate name is an error (torchtitan-style registries)."""
    if framework.name in _REGISTRY:
        raise ValueError(f"framework {framework.name!r} is already registered")
    if framework.attention_kernel not in ATTENTION_KERNELS:
        raise ValueError(f"framework {framework.name!r}: attention_kernel must be one of {ATTENTION_KERNELS}")
    if framework.zero3_network not in ZERO3_NETWORKS:
        raise ValueError(f"framework {framework.name!r}: zero3_network must be one of {ZERO3_NETWORKS}")
    _REGISTRY[framework.name] = framework
    return framework


register(Framework(
    "megatron", "Megatron-LM / Megatron-Core / NeMo (Transformer Engine)", "fused", True, "hierarchical",
    "Megatron-Core DistributedDataParallelConfig.overlap_grad_reduce (on in NeMo and Megatron-Core recipes); "
    "Transformer Engine DotProductAttention (cuDNN fused attention on Hopper); loss: "
    "megatron/core/tensor_parallel/cross_entropy.py; layers as PyTorch modules, launch-bound without CUDA graphs "
    "where GPU work per layer is small (Megatron Bridge docs, training/cuda-graphs: 'CUDA graphs mainly solve "
    "launch-bound training steps ... smaller models ... benefit most'; TransformerEngine issue #2053: TE modules' "
    "CPU overhead, Megatron's --enable-cuda-graph as the remedy)", vocab_parallel_loss=True, python_layers=True))
register(Framework(
    "deepspeed", "DeepSpeed (ZeRO) or Megatron-DeepSpeed", "flash2", False, "flat",
    "DeepSpeed config docs, zero_optimization.overlap_comm: default false for stages 1-2; ZeRO-3's per-GPU "
    "cross-node volume of a parameter all-gather is the full model (Wang et al., ZeRO++, arXiv:2306.10209, "
    "sec. 3, the motivation of hierarchical partitioning hpZ); flash-attn 2 in Megatron-DeepSpeed "
    "(--use-flash-attn-v2); gradients communicated in the training dtype (DeepSpeed config docs, "
    "communication_data_type: default the model's dtype)", grad_reduce_bytes=2))
register(Framework(
    "fsdp", "PyTorch FSDP / FSDP2 with scaled_dot_product_attention", "flash2", True, "hierarchical",
    "PyTorch FSDP reduce-scatters gradients in backward hooks (torch.distributed.fsdp docs); "
    "F.scaled_dot_product_attention's flash backend is FlashAttention-2 (PyTorch 2.2 release notes)",
    python_layers=True))
register(Framework(
    "torchtitan", "torchtitan (FSDP2, TP, PP, CP on PyTorch)", "flash2", True, "hierarchical",
    "torchtitan docs/fsdp.md (FSDP2) and models/llama3 attention (F.scaled_dot_product_attention); selective AC "
    "'op' saves all compute ops except every second mm (torchtitan parallelize_llama.py _custom_policy)",
    selective_recompute="op", loss_logit_bytes=12.0, fsdp2_copy_bytes=14.0, separate_projections=True,
    python_layers=True))
register(Framework(
    "torchtitan-eager", "torchtitan without torch.compile (training.compile = false: PyTorch eager kernels)",
    "flash2", True, "hierarchical",
    "as torchtitan; its element-wise ops run as PyTorch eager kernels: torchtitan models/norms.py RMSNorm "
    "(x.float(), pow, mean, rsqrt, mul, type_as, mul weight), models/llama/model.py apply_rotary_emb (float(), "
    "complex mul, type_as) and FeedForward (silu, mul); torch.compile is opt-in (job_config training.compile)",
    selective_recompute="op", loss_logit_bytes=12.0, fsdp2_copy_bytes=14.0, compiled=False,
    separate_projections=True, python_layers=True))

register(Framework(
    "llmc", "llm.c (GPT-2 in C/CUDA: hand-written fused kernels, cuBLASLt GEMMs, cuDNN attention)", "fused", True,
    "hierarchical",
    "karpathy/llm.c train_gpt2.cu @f1e2ace: cuDNN flash attention (scripts/run_gpt2_124M.sh and run_gpt2_1558M.sh "
    "build with USE_CUDNN=1), cuBLASLt GEMMs with the bias in the epilogue, LayerNorm and residual kernels of its own "
    "(fused_residual_forward5), fused_classifier (the loss and its gradient in one kernel), gradients kept and reduced "
    "in bf16 (param_sizeof, ncclFloatX in llmc/zero.cuh) layer by layer during backward "
    "(multi_gpu_async_reduce_gradient); a C host loop, no Python per layer", grad_reduce_bytes=2, compiled_loss=True))

FRAMEWORKS: tuple[str, ...] = tuple(_REGISTRY)
DEFAULT_FRAMEWORK = "megatron"


def attention_kernel(plan) -> str:
    """The attention kernel a plan runs: its own ``attention`` when set, else its framework's."""
    return plan.attention or get_framework(plan.framework).attention_kernel


def get_framework(name: str) -> Framework:
    """The registered framework ``name``; a PlanError naming the choices otherwise."""
    try:
        return _REGISTRY[name]
    except KeyError:
        raise PlanError(f"framework={name!r} is not known: choose one of {', '.join(FRAMEWORKS)}") from None
