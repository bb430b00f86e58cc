"""The parallel layout of a training run (`ParallelPlan`), validated as one object."""

from __future__ import annotations

from dataclasses import dataclass, field

from costmodel.core.errors import PlanError
from costmodel.core.specs.framework import ATTENTION_KERNELS, DEFAULT_FRAMEWORK, FRAMEWORKS, get_framework
from costmodel.core.specs.memory_features import memory_feature_problems, memory_features_text
from costmodel.core.specs.model import ModelSpec
from costmodel.core.specs.pipeline_layout import describe_split, pipeline_layout_problem

RECOMPUTE_MODES = ("none", "selective", "full")
RECOMPUTE_MODULES = ("core_attn", "moe_act", "layernorm", "mla_up_proj", "mlp", "moe", "shared_experts")
"""Megatron-Core's selective recompute modules (--recompute-granularity selective --recompute-modules ...;
NVIDIA/Megatron-LM @002526d81b81 megatron/core/transformer/transformer_config.py ``recompute_modules``, default
["core_attn"]; its later "mhc", "gdn", "gdn_norm_out" belong to layers not modelled). What each re-runs and
stops storing: costmodel.graph.selective."""
MOE_DISPATCHERS = ("alltoall", "allgather", "flex")
MOE_ROUTINGS = ("learned", "random", "round_robin")
"""How tokens pick their experts (``ParallelPlan.moe_routing``; costmodel.memory.moe_routing describes each)."""
"""Megatron-Core token dispatchers (--moe-token-dispatcher-type): alltoall (NCCL all-to-all over the EP group),
allgather (all-gather the tokens, each rank keeps its experts' share, reduce-scatter back) and flex (DeepEP /
HybridEP kernels)."""
DTYPES = ("bf16", "fp16", "fp8", "fp32", "fp8-block")
"""fp8-block: block-scaled FP8 GEMMs (1x128 activation / 128x128 weight scales; ``mxfp8`` is accepted as its
Blackwell name by the request layer, costmodel/cost/fp8_block.py says how that approximates MXFP8), bf16 elsewhere."""


@dataclass(frozen=True)
class ParallelPlan:
    """One training layout. ``dp`` is derived: gpus / (tp * pp * cp)."""

    gpus: int
    """Total number of GPUs."""
    gpus_per_node: int
    """GPUs in one node (the fast-interconnect domain)."""
    gbs: int
    """Sequences per optimizer step (GBS)."""
    seq_len: int
    """Tokens per sequence."""
    tp: int = 1
    """Tensor-parallel degree (Megatron column/row-parallel linears)."""
    pp: int = 1
    """Pipeline-parallel stages."""
    cp: int = 1
    """Context-parallel degree (sequence split across GPUs for attention)."""
    vpp: int = 1
    """Virtual pipeline chunks per stage (interleaved 1F1B when > 1)."""
    mbs: int = 1
    """Sequences per micro-batch (MBS)."""
    recompute: str = "selective"
    """Activation recomputation: none, selective (attention core), full (whole layer)."""
    recompute_modules: tuple[str, ...] = ()
    """With recompute='selective': Megatron-Core's --recompute-modules (``RECOMPUTE_MODULES``); () = the
    framework's selective default (Megatron: core_attn only; torchtitan: its per-op SAC)."""
    sequence_parallel: bool = True
    """Megatron sequence parallelism (only meaningful with tp > 1)."""
    zero: int = 1
    """ZeRO stage: 0 none, 1 optimizer states sharded (= Megatron distributed optimizer),
    2 + gradients, 3 + parameters (FSDP full shard)."""
    dtype: str = "bf16"
    """Precision: bf16 or fp16 (mixed precision), fp8 (fp8 GEMMs, bf16 elsewhere), fp8-block (block-scaled fp8
    GEMMs, bf16 elsewhere; costmodel/cost/fp8_block.py), or fp32 (pure fp32 training, e.g. on a CPU)."""
    layer_split: tuple[int, ...] | None = None
    """Layers per pipeline stage when uneven (length pp, sums to num_layers); None = even."""
    pipeline_layout: tuple[int, ...] | None = None
    """Layers per virtual pipeline stage, in virtual-stage order (virtual stage a*PP + b = chunk a of stage b),
    length PP*VPP, summing to num_layers: any number per virtual stage, as Megatron-Core's
    --pipeline-model-parallel-layout and PyTorch pipelining (torchtitan, NeMo AutoModel) allow (rules:
    :func:`pipeline_layout_problem`). None = Megatron's classic split (``layer_split`` / even)."""
    overlap_grad_reduce: bool | None = None
    """Overlap the DP gradient reduction with backward (Megatron --overlap-grad-reduce); None = the framework's
    default (``Framework.overlap_grad_reduce``), resolved when the plan is built."""
    overlap_param_gather: bool = True
    """Overlap ZeRO parameter all-gathers with compute (prefetch)."""
    dp_bucket_mb: float = 40.0
    """DP gradient bucket size: millions of parameters for Megatron (Megatron-Core DDP bucket_size, default 40M,
    raised to 1M x DP; ``costmodel.schedule.compose.bucket_fraction``), megabytes of gradients for other stacks."""
    nvlink_domain: int = 0
    """GPUs per NVLink (scale-up) domain as this job is placed (``Hardware.domain_for``): process groups
    within it use NVLink, across it the scale-out network. 0 = ``gpus_per_node`` (the node is the domain)."""
    framework: str = DEFAULT_FRAMEWORK
    """Training stack that runs the plan (``costmodel.core.specs.framework``): its attention kernel, DP overlap
    and ZeRO-3 network behaviour."""
    attention: str = ""
    """Attention kernel: fused, flash2, flash1 or unfused (``costmodel.core.specs.framework.ATTENTION_KERNELS``);
    "" = the framework's."""
    ep: int = 1
    """Expert-parallel degree (Megatron --expert-model-parallel-size): each EP rank holds num_experts / EP of
    every MoE layer's routed experts. 1 for dense models."""
    etp: int | None = None
    """Expert tensor-parallel degree (--expert-tensor-parallel-size): each expert's FFN split over ETP ranks;
    None = TP (Megatron-Core parallel_state.py: "if expert_tensor_parallel_size is None:
    expert_tensor_parallel_size = tensor_model_parallel_size"), resolved when the plan is built."""
    moe_dispatcher: str = "alltoall"
    """Token dispatcher of the MoE layers (``MOE_DISPATCHERS``; --moe-token-dispatcher-type)."""
    moe_imbalance: float | None = None
    """Routing imbalance: tokens routed to the busiest expert over the mean (1.0 = perfectly balanced, e.g.
    --moe-router-force-load-balancing); None = the documented default (``costmodel.memory.moe_routing``)."""
    moe_routing: str = "learned"
    """Which experts a token picks (``MOE_ROUTINGS``): ``learned`` (the model's router), ``random`` (Megatron-Core
    --moe-router-force-load-balancing: random logits, top-k uniformly at random) or ``round_robin`` (NeMo
    AutoModel fake_balanced_gate: token t to experts t k ... t k + k - 1 mod E). Sets how many EP ranks and
    NVLink domains a token's copies reach (the flex dispatcher's bytes, costmodel.memory.moe_routing)."""
    tp_comm_overlap: bool = False
    """Overlap the tensor-parallel all-gathers / reduce-scatters with the layer's GEMMs (Transformer Engine
    userbuffers: Megatron --tp-comm-overlap, NeMo MegatronCommOverlapCallback(tp_comm_overlap=True)); needs
    sequence parallelism. Exposed TP communication is then only what exceeds the layer's compute."""
    moe_overlap_comm: bool = False
    """Overlap the EP dispatch/combine with compute of another micro-batch (Megatron-Core
    --overlap-moe-expert-parallel-comm)."""
    moe_grouped_gemm: bool = True
    """Run a rank's local experts as one grouped GEMM (--moe-grouped-gemm) rather than one GEMM per expert."""
    main_grads_dtype: str = ""
    """Main-gradient precision (``memory_features.GRAD_DTYPES``): fp32, bf16 (Megatron --main-grads-dtype bf16 or
    --grad-reduce-in-bf16; NeMo ``grad_reduce_in_fp32=False``) or fp16 (fp16 training's gradients); "" = the
    default, fp16 when dtype is fp16 and fp32 otherwise (Megatron-LM docs/user-guide/features/dist_optimizer.md)."""
    main_params_dtype: str = "fp32"
    """The optimizer's copy of the parameters (``memory_features.MAIN_PARAM_DTYPES``): fp32, fp16 (Megatron
    --main-params-dtype) or none (the optimizer steps the bf16 parameters, no copy)."""
    exp_avg_dtype: str = "fp32"
    """Adam first-moment precision: fp32, fp16, bf16 or fp8 (Megatron --exp-avg-dtype)."""
    exp_avg_sq_dtype: str = "fp32"
    """Adam second-moment precision: fp32, fp16, bf16 or fp8 (Megatron --exp-avg-sq-dtype)."""
    fp8_param_gather: bool = False
    """fp8 primary weights (Megatron --fp8-param-gather, NeMo ``fp8_params``): the transformer layers' weights are
    kept and all-gathered in fp8, no bf16 copy."""
    optimizer_offload_fraction: float = 0.0
    """Fraction of the optimizer states (main parameters and moments) kept and stepped on the host (Megatron
    --optimizer-cpu-offload --optimizer-offload-fraction); 0 = none."""
    offload_modules: tuple[str, ...] = ()
    """Fine-grained activation offloading (Megatron-Core --fine-grained-activation-offloading --offload-modules):
    these modules' inputs move to host memory between their forward and backward
    (``memory_features.OFFLOAD_MODULES``)."""
    reshard_after_forward: bool | None = None
    """ZeRO-3 (FSDP2 ``fully_shard(reshard_after_forward=...)``): free each unit's gathered parameters after its
    forward (True) or keep them until its backward (False); None = the framework's default
    (``costmodel.memory.per_gpu.reshards_after_forward``)."""
    cross_entropy_fusion: bool | None = None
    """The loss runs as one fused kernel that reads the logits once (Megatron-Core --cross-entropy-loss-fusion
    --cross-entropy-fusion-impl te: Transformer Engine's Triton cross entropy; llm.c's fused classifier; flash-attn's
    cross-entropy kernel; torch.compile) rather than a chain with fp32 intermediates (Megatron's native loss, fused by
    jit_fuser or not: costmodel.graph.kernel_basis.MEGATRON_LOSS_BYTES; PyTorch eager); None = the framework's default
    (``Framework.compiled_loss``)."""
    cuda_graphs: bool = False
    """The layers' kernels replay from CUDA graphs (Megatron-Core --cuda-graph-impl local / transformer_engine /
    full_iteration, formerly --enable-cuda-graph; torch.compile mode="reduce-overhead"): no per-kernel CPU dispatch,
    so a step is never bound by the host issuing kernels (costmodel.graph.kernel_basis.host_dispatch_s)."""
    extra: dict = field(default_factory=dict, compare=False, hash=False)

    def __post_init__(self) -> None:
        if self.overlap_grad_reduce is None and self.framework in FRAMEWORKS:
            object.__setattr__(self, "overlap_grad_reduce", get_framework(self.framework).overlap_grad_reduce)
        if self.etp is None:
            object.__setattr__(self, "etp", self.tp)
        if not isinstance(self.recompute_modules, tuple):
            object.__setattr__(self, "recompute_modules", tuple(self.recompute_modules))
        if not isinstance(self.offload_modules, tuple):
            object.__setattr__(self, "offload_modules", tuple(self.offload_modules))
        if self.pipeline_layout is not None and not isinstance(self.pipeline_layout, tuple):
            object.__setattr__(self, "pipeline_layout", tuple(self.pipeline_layout))

    # --------------------------------------------------------------- derived
    @property
    def model_parallel(self) -> int:
        return self.tp * self.pp * self.cp

    @property
    def dp(self) -> int:
        return self.gpus // self.model_parallel if self.model_parallel else 0

    @property
    def expert_tp(self) -> int:
        """ETP as an int: ``etp`` is resolved to TP when the plan is built (``__post_init__``); typed
        ``int | None`` for that, so callers use this."""
        return self.etp if self.etp is not None else self.tp

    @property
    def expert_dp(self) -> int:
        """Expert data-parallel degree: gpus / (ETP * EP * PP) (Megatron-Core parallel_state.py
        ``expert_data_parallel_size``); the group over which expert gradients are reduced."""
        denom = self.expert_tp * self.ep * self.pp
        return self.gpus // denom if denom else 0

    @property
    def num_nodes(self) -> int:
        return -(-self.gpus // self.gpus_per_node)

    @property
    def domain(self) -> int:
        """GPUs per NVLink (scale-up) domain: what decides which process groups cross the network."""
        return self.nvlink_domain or self.gpus_per_node

    @property
    def num_microbatches(self) -> int:
        denom = self.mbs * self.dp
        return self.gbs // denom if denom else 0

    @property
    def vpp_microbatch_group(self) -> int | None:
        """Contiguous micro-batches per virtual stage of the interleaved schedule (Megatron-Core's
        ``microbatch_group_size_per_vp_stage``, flag ``--microbatch-group-size-per-virtual-pipeline-stage``;
        default PP), or None when no group size is valid.

        Megatron-Core ``pipeline_parallel/schedules.py`` (forward_backward_pipelining_with_interleaving,
        commit 00611e6e) requires PP <= N <= M and ``M % N`` either 0 or >= PP (M = micro-batches). PP itself
        when M is a multiple of PP (the default, and the only choice of older Megatron, which required
        ``M % PP == 0``); else the smallest valid N > PP.
        """
        m, pp = self.num_microbatches, self.pp
        if self.vpp <= 1:
            return pp
        if m < pp:
            return None
        if m % pp == 0:
            return pp
        return next((n for n in range(pp + 1, m + 1) if m % n == 0 or m % n >= pp), None)

    @property
    def tokens_per_iteration(self) -> int:
        return self.gbs * self.seq_len

    @property
    def sp(self) -> bool:
        """Sequence parallelism is in effect."""
        return self.sequence_parallel and self.tp > 1

    def stage_layers(self, num_layers: int) -> tuple[int, ...]:
        """Layers held by each pipeline stage (all virtual chunks together): ``layer_split`` when given,
        the even split when PP x VPP divides the layers, else :func:`default_layer_split` (planner's
        predict replaces it by the split that minimises the predicted iteration)."""
        if self.pipeline_layout is not None:
            lay, pp = self.pipeline_layout, self.pp
            return tuple(sum(lay[b::pp]) for b in range(pp))
        if self.layer_split is not None:
            return tuple(self.layer_split)
        if num_layers % (self.pp * self.vpp) == 0:
            return tuple([num_layers // self.pp] * self.pp)
        return default_layer_split(num_layers, self.pp, self.vpp) or tuple([num_layers // self.pp] * self.pp)

    def stage_layer_indices(self, num_layers: int) -> list[list[int]]:
        """0-based indices of the layers each pipeline stage holds (all virtual chunks): virtual stage a*PP + b
        (chunk a of stage b) holds the next ``chunk_layers`` layers in model order (Megatron's interleaving)."""
        chunks = self.chunk_layers(num_layers)
        out: list[list[int]] = [[] for _ in range(self.pp)]
        i = 0
        for row in chunks:
            for b, n in enumerate(row):
                out[b].extend(range(i, i + n))
                i += n
        return out

    def chunk_layers(self, num_layers: int) -> list[list[int]]:
        """Layers of each virtual chunk, [chunk a][stage b]: ``pipeline_layout`` when given, else
        :func:`chunk_layers` of the stage split."""
        if self.pipeline_layout is not None:
            lay, pp = self.pipeline_layout, self.pp
            return [list(lay[a * pp:(a + 1) * pp]) for a in range(self.vpp)]
        return chunk_layers(self.stage_layers(num_layers), self.vpp)

    def needs_layer_split(self, num_layers: int) -> bool:
        """True when no split or layout is given and PP x VPP does not divide the layers (an uneven split is
        chosen)."""
        return self.layer_split is None and self.pipeline_layout is None and num_layers % (self.pp * self.vpp) != 0

    # ------------------------------------------------------------ validation
    def factors(self) -> str:
        return (f"GPUs={self.gpus} gpus_per_node={self.gpus_per_node} TP={self.tp} PP={self.pp} "
                f"CP={self.cp} DP={self.dp} VPP={self.vpp} MBS={self.mbs} "
                f"GBS={self.gbs} seq_len={self.seq_len} recompute={self.recompute} "
                f"SP={self.sequence_parallel} ZeRO={self.zero} dtype={self.dtype} framework={self.framework}"
                + (f" attention={self.attention}" if self.attention else "")
                + (f" EP={self.ep} ETP={self.etp} EDP={self.expert_dp} dispatcher={self.moe_dispatcher}"
                   if self.ep > 1 or self.etp != self.tp else "")
                + (f" recompute_modules={','.join(self.recompute_modules)}" if self.recompute_modules else "")
                + (f" pipeline_layout={describe_split(self.pipeline_layout)}" if self.pipeline_layout else "")
                + memory_features_text(self))

    def problems(self, model: ModelSpec | None = None) -> list[str]:
        """Every reason this plan is invalid (empty list when valid): the fields' types first (nothing else is
        checked when one is wrong), then the options, the factors, and with ``model`` what the model requires."""
        p = self._integer_problems()
        if p:
            return p
        p += self._option_problems()
        p += self._factor_problems()
        p += self._batch_problems()
        if model is not None:
            p += self._model_problems(model)
            if model.is_moe:
                p += self._moe_problems(model)
            p += self._split_problems(model)
        return p

    def _integer_problems(self) -> list[str]:
        names = ("gpus", "gpus_per_node", "gbs", "seq_len", "tp", "pp", "cp", "vpp", "mbs", "ep", "etp")
        return [f"{name}={v!r} must be a positive integer" for name in names
                if not isinstance(v := getattr(self, name), int) or isinstance(v, bool) or v <= 0]

    def _option_problems(self) -> list[str]:
        """The named options: NVLink domain, recompute, dtype, ZeRO, framework, attention kernel."""
        p: list[str] = []
        if isinstance(self.nvlink_domain, bool) or not isinstance(self.nvlink_domain, int) or self.nvlink_domain < 0:
            p.append(f"nvlink_domain={self.nvlink_domain!r} must be a non-negative integer (0 = gpus_per_node)")
        if self.recompute not in RECOMPUTE_MODES:
            p.append(f"recompute={self.recompute!r} must be one of {', '.join(RECOMPUTE_MODES)}")
        if self.recompute_modules:
            bad = [m for m in self.recompute_modules if m not in RECOMPUTE_MODULES]
            if bad or self.recompute != "selective":
                unknown = f" (unknown: {', '.join(bad)})" if bad else ""
                p.append(f"recompute_modules={','.join(self.recompute_modules)} needs recompute=selective and "
                         f"names from {', '.join(RECOMPUTE_MODULES)}{unknown}")
            elif self.framework in FRAMEWORKS and get_framework(self.framework).selective_recompute == "op":
                p.append(f"recompute_modules is Megatron-Core's --recompute-modules; framework={self.framework} "
                         "recomputes per operator (selective AC): drop recompute_modules or pick a Megatron stack")
        if self.dtype not in DTYPES:
            p.append(f"dtype={self.dtype!r} must be one of {', '.join(DTYPES)}")
        p.extend(memory_feature_problems(self))
        if self.zero not in (0, 1, 2, 3):
            p.append(f"zero={self.zero!r} must be 0, 1, 2 or 3")
        if self.framework not in FRAMEWORKS:
            p.append(f"framework={self.framework!r} must be one of {', '.join(FRAMEWORKS)}")
        if self.attention and self.attention not in ATTENTION_KERNELS:
            p.append(f"attention={self.attention!r} must be one of {', '.join(ATTENTION_KERNELS)} (or empty: the "
                     "framework's)")
        return p

    def _factor_problems(self) -> list[str]:
        """How TP, PP, CP, EP and ETP divide the GPUs, and the MoE options that need no model."""
        p: list[str] = []
        if self.gpus % self.model_parallel != 0:
            p.append(f"TP*PP*CP = {self.tp}*{self.pp}*{self.cp} = {self.model_parallel} must divide "
                     f"GPUs={self.gpus} (DP = GPUs / (TP*PP*CP))")
        if self.gpus > self.gpus_per_node and self.gpus % self.gpus_per_node != 0:
            p.append(f"GPUs={self.gpus} must be a multiple of gpus_per_node={self.gpus_per_node}")
        p += [f"{name}={value!r} must be one of {', '.join(choices)}" for name, value, choices in (
            ("moe_dispatcher", self.moe_dispatcher, MOE_DISPATCHERS), ("moe_routing", self.moe_routing, MOE_ROUTINGS))
            if value not in choices]
        if self.moe_imbalance is not None and not (isinstance(self.moe_imbalance, (int, float))
                                                   and self.moe_imbalance >= 1.0):
            p.append(f"moe_imbalance={self.moe_imbalance!r} must be >= 1 (busiest expert's tokens over the mean)")
        # Megatron-Core parallel_state.py initialize_model_parallel: "world_size ... is not divisible by
        # expert_tensor_model_pipeline_parallel size" (ETP * EP * PP)
        etp = self.expert_tp
        if self.gpus % (etp * self.ep * self.pp) != 0:
            p.append(f"ETP*EP*PP = {etp}*{self.ep}*{self.pp} = {etp * self.ep * self.pp} must divide "
                     f"GPUs={self.gpus} (expert DP = GPUs / (ETP*EP*PP))")
        # Megatron-LM arguments.py: "When using expert parallelism and tensor parallelism, sequence parallelism
        # must be used"
        if self.ep > 1 and self.tp > 1 and not self.sequence_parallel:
            p.append(f"EP={self.ep} with TP={self.tp} needs sequence parallelism (Megatron-LM arguments.py)")
        if self.vpp > 1 and self.pp == 1:
            p.append(f"VPP={self.vpp} needs PP > 1")
        return p

    def _batch_problems(self) -> list[str]:
        """The pipeline layout without a model, and how the batch and the sequence split over the ranks."""
        p: list[str] = []
        if self.pipeline_layout is not None:
            why = pipeline_layout_problem(self.pipeline_layout, None, self.pp, self.vpp)
            if why:
                p.append(why)
        dp = self.dp
        if dp > 0 and self.gbs % (self.mbs * dp) != 0:
            p.append(f"GBS={self.gbs} must be a multiple of MBS*DP = "
                     f"{self.mbs}*{dp} = {self.mbs * dp}")
        if self.cp > 1 and self.seq_len % (2 * self.cp) != 0:
            p.append(f"seq_len={self.seq_len} must be a multiple of 2*CP = {2 * self.cp} (load-balanced causal CP)")
        if self.tp_comm_overlap and not self.sp:
            # Megatron-LM arguments.py validate_args: "Tensor parallel communication/GEMM overlap can happen only
            # when sequence parallelism is enabled"
            p.append(f"tp_comm_overlap needs TP > 1 with sequence parallelism (TP={self.tp}, sequence_parallel="
                     f"{self.sequence_parallel}); drop --tp-comm-overlap or use --tp 2+ --sequence-parallel")
        if self.sp and self.seq_len % self.tp != 0:
            p.append(f"seq_len={self.seq_len} must be a multiple of TP={self.tp} with sequence parallelism")
        if self.vpp > 1 and dp > 0 and self.vpp_microbatch_group is None:
            p.append(f"interleaved schedule needs micro-batches ({self.num_microbatches}) >= PP={self.pp} and a "
                     f"group size N in [PP, micro-batches] with micro-batches % N = 0 or >= PP (Megatron-Core "
                     f"schedules.py); change GBS or MBS")
        return p

    def _model_problems(self, model: ModelSpec) -> list[str]:
        """How TP shards the model's heads and FFN, and EP on a dense model."""
        p: list[str] = []
        if model.num_heads % self.tp != 0:
            p.append(f"heads={model.num_heads} must be a multiple of TP={self.tp}")
        if model.num_kv_heads % self.tp != 0 and self.tp % model.num_kv_heads != 0:
            p.append(f"KV heads={model.num_kv_heads} and TP={self.tp}: one must divide the other")
        if model.ffn_hidden_size % self.tp != 0:
            p.append(f"ffn_hidden_size={model.ffn_hidden_size} must be a multiple of TP={self.tp}")
        if self.ep > 1 and not model.is_moe:
            p.append(f"EP={self.ep} needs a mixture-of-experts model ({model.name} is dense); use EP=1")
        return p

    def _moe_problems(self, model: ModelSpec) -> list[str]:
        """How EP and ETP shard a mixture-of-experts model, and the imbalance it allows."""
        p: list[str] = []
        # Megatron-LM arguments.py: "num_experts must be divisible by expert_model_parallel_size"
        if model.num_experts % self.ep != 0:
            p.append(f"experts={model.num_experts} must be a multiple of EP={self.ep}")
        # Megatron-LM arguments.py: "When using MoE and tensor parallelism, sequence parallelism must be
        # used." (num_experts set and TP > 1, any EP)
        if self.tp > 1 and not self.sequence_parallel and self.ep == 1:
            p.append(f"an MoE model with TP={self.tp} needs sequence parallelism (Megatron-LM arguments.py)")
        bound = model.num_experts / max(model.experts_per_token, 1)
        if isinstance(self.moe_imbalance, (int, float)) and self.moe_imbalance > bound:
            p.append(f"moe_imbalance={self.moe_imbalance!r} exceeds experts / top-k = {bound:g}: the busiest "
                     "expert can receive at most every token once")
        if model.expert_ffn % self.expert_tp != 0:
            p.append(f"expert ffn width={model.expert_ffn} must be a multiple of ETP={self.etp}")
        return p

    def _split_problems(self, model: ModelSpec) -> list[str]:
        """The pipeline layout, the layer split, or the uneven split Megatron would have to build."""
        p: list[str] = []
        if self.pipeline_layout is not None:
            why = pipeline_layout_problem(self.pipeline_layout, model.num_layers, self.pp, self.vpp)
            if why:
                p.append(why)
            elif self.layer_split is not None and tuple(self.layer_split) != self.stage_layers(model.num_layers):
                p.append(f"layer_split={list(self.layer_split)} disagrees with pipeline_layout, whose stages hold "
                         f"{list(self.stage_layers(model.num_layers))} layers: give one of them")
        elif self.layer_split is not None:
            if len(self.layer_split) != self.pp or sum(self.layer_split) != model.num_layers:
                p.append(f"layer_split={list(self.layer_split)} must have PP={self.pp} entries summing to "
                         f"layers={model.num_layers}")
            elif any(x <= 0 for x in self.layer_split) or (any(x % self.vpp for x in self.layer_split)
                                                            and account_for(self.layer_split, self.vpp) is None):
                p.append(f"every entry of layer_split={list(self.layer_split)} must be a positive multiple "
                         f"of VPP={self.vpp} (Megatron's first/last-stage rule), or the split must be the one "
                         "--account-for-embedding/loss-in-pipeline-split builds")
        elif model.num_layers % (self.pp * self.vpp) != 0:
            why = uneven_split_problem(model.num_layers, self.pp, self.vpp)
            if why:
                p.append(why)
        return p

    def validate(self, model: ModelSpec | None = None) -> "ParallelPlan":
        problems = self.problems(model)
        if problems:
            raise PlanError("invalid parallel plan: " + "; ".join(problems) + f". Factors: {self.factors()}.")
        return self


# ------------------------------------------------------------------------------- uneven pipeline stages
# Megatron-Core's uneven pipeline split (NVIDIA/Megatron-LM megatron/core/transformer/transformer_config.py,
# TransformerConfig.__post_init__ "Uneven PP"; flags --decoder-first-pipeline-num-layers and
# --decoder-last-pipeline-num-layers, megatron/training/arguments.py at commit 000c4ac24f61):
#   * num_layers_in_first_pipeline_stage / ..._last_... "must be larger than 0" and, with a virtual pipeline,
#     "must be divisible by virtual pipeline parallel degree";
#   * the remaining layers "must be divisible by the middle pipeline model parallel size" (PP minus the
#     stages given), and "number of layers on each middle pipeline rank ... must be divisible by virtual
#     pipeline parallel degree".
# --account-for-embedding-in-pipeline-split / --account-for-loss-in-pipeline-split count the embedding /
# loss as one more layer: (layers + 1 + 1) % PP == 0, so the first and last stage hold one layer less than
# the middle ones (with VPP their first/last chunk is shorter); with VPP = 1 that split is one of the
# first/last splits above, so enumerating those covers it. Within a stage, planner's timeline gives every
# virtual chunk 1/VPP of the stage's layers, which is how Megatron builds first/last-stage chunks
# (their layer counts are multiples of VPP).


def layer_split_candidates(num_layers: int, pp: int, vpp: int = 1) -> list[tuple[int, ...]]:
    """Every split of ``num_layers`` over ``pp`` stages that Megatron's first/last-stage flags express with
    equal middle stages, every stage holding a positive multiple of ``vpp`` layers (rules above).

    For 3+ stages only the two first-stage sizes nearest to balance per middle size are needed by
    :func:`costmodel.schedule.layer_split.balanced_layer_split`; this function lists them all (tests, small inputs)."""
    out: list[tuple[int, ...]] = []
    if pp < 1 or vpp < 1:
        return out
    if pp == 1:
        return [(num_layers,)]
    mids = [] if num_layers % vpp else [0] if pp == 2 else range(vpp, num_layers + 1, vpp)
    for mid in mids:
        rest = num_layers - mid * (pp - 2)
        for first in range(vpp, rest - vpp + 1, vpp):
            out.append((first,) + (mid,) * (pp - 2) + (rest - first,))
    return out + [s for s in account_for_splits(num_layers, pp, vpp) if s not in out]


def account_for_splits(num_layers: int, pp: int, vpp: int = 1) -> list[tuple[int, ...]]:
    """The splits of --account-for-embedding-in-pipeline-split / --account-for-loss-in-pipeline-split (one or
    both): the embedding / loss counts as a layer, (layers + e + l) % PP == 0 and, with VPP, the layers per
    rank (counting them) % VPP == 0 (TransformerConfig.__post_init__); the first / last stage holds one
    layer less, in its first / last chunk."""
    out: list[tuple[int, ...]] = []
    if pp < 2:
        return out
    for e, loss in ((1, 1), (1, 0), (0, 1)):
        total = num_layers + e + loss
        per = total // pp
        if total % pp == 0 and per % vpp == 0 and per - max(e, loss) > 0:
            out.append((per - e,) + (per,) * (pp - 2) + (per - loss,))
    return out


def account_for(split: tuple[int, ...] | list[int], vpp: int = 1) -> tuple[int, int] | None:
    """(embedding, loss) flags (1 = set) of the --account-for-*-in-pipeline-split options that build
    ``split``, or None when none does (the flags with both unset are the even split, not reported)."""
    pp, total = len(split), sum(split)
    for e, loss in ((1, 1), (1, 0), (0, 1)):
        per = (total + e + loss) // pp
        if pp >= 2 and (total + e + loss) % pp == 0 and per % vpp == 0 and \
                tuple(split) == (per - e,) + (per,) * (pp - 2) + (per - loss,):
            return e, loss
    return None


def chunk_layers(split: tuple[int, ...] | list[int], vpp: int = 1) -> list[list[int]]:
    """Layers of each virtual chunk, [chunk a][stage b] (virtual stage a*PP + b): a stage's layers split evenly
    over its chunks, except the account-for splits, whose first chunk of the first stage / last chunk of the
    last stage holds one layer less (the embedding / loss takes its place)."""
    pp = len(split)
    flags = account_for(split, vpp) if any(n % vpp for n in split) else None
    out = []
    for a in range(vpp):
        row = []
        for b, n in enumerate(split):
            if flags is None:
                row.append(n // vpp)
            else:
                per = (n + (flags[0] if b == 0 else 0) + (flags[1] if b == pp - 1 else 0)) // vpp
                row.append(per - (flags[0] if (a, b) == (0, 0) else 0)
                           - (flags[1] if (a, b) == (vpp - 1, pp - 1) else 0))
        out.append(row)
    return out


def uneven_split_problem(num_layers: int, pp: int, vpp: int = 1) -> str | None:
    """Why no Megatron-expressible split of ``num_layers`` over PP x VPP exists (None when one does)."""
    if num_layers % vpp and not account_for_splits(num_layers, pp, vpp):
        return (f"layers={num_layers} with VPP={vpp}: Megatron's uneven pipeline split needs every stage to hold a "
                f"multiple of VPP layers (--decoder-first/last-pipeline-num-layers must be divisible by the virtual "
                "pipeline degree), so the layers must be a multiple of VPP, or, counting the embedding and/or loss "
                "as a layer (--account-for-embedding/loss-in-pipeline-split), the layers per stage; choose another VPP")
    if num_layers < pp * vpp:
        return (f"layers={num_layers} are fewer than PP*VPP = {pp}*{vpp} = {pp * vpp}: every pipeline stage needs at "
                "least VPP layers; lower PP or VPP")
    return None


def default_layer_split(num_layers: int, pp: int, vpp: int = 1) -> tuple[int, ...] | None:
    """The split by layer count alone (no timing): Megatron's account-for-embedding-and-loss rule, i.e. the
    embedding and the loss each weigh one layer, over the expressible splits; the smallest largest stage,
    then the fewest layers on the last stage, then on the first. None when no split exists. Used where no
    cost model is at hand (memory checks); prediction balances by predicted stage time instead."""
    if uneven_split_problem(num_layers, pp, vpp):
        return None
    if pp == 1:
        return (num_layers,)
    best = None
    for split in _near_even_splits(num_layers, pp, vpp):
        key = (max(split[0] + 1, split[-1] + 1, split[1] if pp > 2 else 0), split[-1], split[0])
        if best is None or key < best[0]:
            best = (key, split)
    return best[1] if best else None


def _near_even_splits(num_layers: int, pp: int, vpp: int) -> list[tuple[int, ...]]:
    """Expressible splits whose middle stages hold within one VPP step of the even share (the rest can
    only be worse for a count-based balance)."""
    if pp == 2:
        return layer_split_candidates(num_layers, pp, vpp)
    even = num_layers / pp
    out = account_for_splits(num_layers, pp, vpp)
    if num_layers % vpp:
        return out
    for mid in range(max(vpp, int(even // vpp) * vpp - vpp), int(even) + 2 * vpp, vpp):
        rest = num_layers - mid * (pp - 2)
        for first in range(vpp, rest - vpp + 1, vpp):
            if abs(first - mid) <= 2 * vpp and abs(rest - first - mid) <= 2 * vpp:
                out.append((first,) + (mid,) * (pp - 2) + (rest - first,))
    return out
