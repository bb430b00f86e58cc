"""The parallel layout of a training run (`ParallelPlan`), validated as one object."""

from __future__ import annotations

from dataclasses import dataclass, field

from costmodel.core.errors import PlanError
from costmodel.core.specs.model import ModelSpec

RECOMPUTE_MODES = ("none", "selective", "full")
DTYPES = ("bf16", "fp16", "fp8", "fp32")


@dataclass(frozen=True)
class ParallelPlan:
    """One training layout. ``dp`` is derived: world_size / (tp * pp * cp)."""

    world_size: int
    """Total number of GPUs."""
    gpus_per_node: int
    """GPUs in one node (the fast-interconnect domain)."""
    global_batch_size: int
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
    micro_batch_size: int = 1
    """Sequences per micro-batch (MBS)."""
    recompute: str = "selective"
    """Activation recomputation: none, selective (attention core), full (whole layer)."""
    sequence_parallel: bool = True
    """Megatron sequence parallelism (only meaningful with tp > 1)."""
    zero: int = 1
    """ZeRO stage: 0 none, 1 optimizer states sharded (= Megatron distributed optimizer),
    2 + gradients, 3 + parameters (FSDP full shard)."""
    dtype: str = "bf16"
    """Precision: bf16 or fp16 (mixed precision), fp8 (fp8 GEMMs, bf16 elsewhere), or fp32 (pure fp32
    training, e.g. on a CPU)."""
    layer_split: tuple[int, ...] | None = None
    """Layers per pipeline stage when uneven (length pp, sums to num_layers); None = even."""
    overlap_grad_reduce: bool = True
    """Overlap the DP gradient reduction with backward (Megatron --overlap-grad-reduce)."""
    overlap_param_gather: bool = True
    """Overlap ZeRO parameter all-gathers with compute (prefetch)."""
    dp_bucket_mb: float = 40.0
    """DP gradient bucket size in MB (Megatron DDP default bucket_size = 40M elements... see docs)."""
    extra: dict = field(default_factory=dict, compare=False, hash=False)

    # --------------------------------------------------------------- derived
    @property
    def model_parallel(self) -> int:
        return self.tp * self.pp * self.cp

    @property
    def dp(self) -> int:
        return self.world_size // self.model_parallel if self.model_parallel else 0

    @property
    def num_nodes(self) -> int:
        return -(-self.world_size // self.gpus_per_node)

    @property
    def num_microbatches(self) -> int:
        denom = self.micro_batch_size * self.dp
        return self.global_batch_size // denom if denom else 0

    @property
    def tokens_per_iteration(self) -> int:
        return self.global_batch_size * self.seq_len

    @property
    def sp(self) -> bool:
        """Sequence parallelism is in effect."""
        return self.sequence_parallel and self.tp > 1

    def stage_layers(self, num_layers: int) -> tuple[int, ...]:
        """Layers held by each pipeline stage (all virtual chunks together)."""
        if self.layer_split is not None:
            return tuple(self.layer_split)
        return tuple([num_layers // self.pp] * self.pp)

    # ------------------------------------------------------------ validation
    def factors(self) -> str:
        return (f"GPUs={self.world_size} gpus_per_node={self.gpus_per_node} TP={self.tp} PP={self.pp} "
                f"CP={self.cp} DP={self.dp} VPP={self.vpp} MBS={self.micro_batch_size} "
                f"GBS={self.global_batch_size} seq_len={self.seq_len} recompute={self.recompute} "
                f"SP={self.sequence_parallel} ZeRO={self.zero} dtype={self.dtype}")

    def problems(self, model: ModelSpec | None = None) -> list[str]:
        """Every reason this plan is invalid (empty list when valid)."""
        p: list[str] = []
        ints = ("world_size", "gpus_per_node", "global_batch_size", "seq_len", "tp", "pp", "cp", "vpp",
                "micro_batch_size")
        for name in ints:
            v = getattr(self, name)
            if not isinstance(v, int) or isinstance(v, bool) or v <= 0:
                p.append(f"{name}={v!r} must be a positive integer")
        if p:
            return p
        if self.recompute not in RECOMPUTE_MODES:
            p.append(f"recompute={self.recompute!r} must be one of {', '.join(RECOMPUTE_MODES)}")
        if self.dtype not in DTYPES:
            p.append(f"dtype={self.dtype!r} must be one of {', '.join(DTYPES)}")
        if self.zero not in (0, 1, 2, 3):
            p.append(f"zero={self.zero!r} must be 0, 1, 2 or 3")
        if self.world_size % self.model_parallel != 0:
            p.append(f"TP*PP*CP = {self.tp}*{self.pp}*{self.cp} = {self.model_parallel} must divide "
                     f"GPUs={self.world_size} (DP = GPUs / (TP*PP*CP))")
        if self.world_size > self.gpus_per_node and self.world_size % self.gpus_per_node != 0:
            p.append(f"GPUs={self.world_size} must be a multiple of gpus_per_node={self.gpus_per_node}")
        if self.vpp > 1 and self.pp == 1:
            p.append(f"VPP={self.vpp} needs PP > 1")
        dp = self.dp
        if dp > 0 and self.global_batch_size % (self.micro_batch_size * dp) != 0:
            p.append(f"GBS={self.global_batch_size} must be a multiple of MBS*DP = "
                     f"{self.micro_batch_size}*{dp} = {self.micro_batch_size * dp}")
        if self.cp > 1 and self.seq_len % (2 * self.cp) != 0:
            p.append(f"seq_len={self.seq_len} must be a multiple of 2*CP = {2 * self.cp} (load-balanced causal CP)")
        if self.sp and self.seq_len % self.tp != 0:
            p.append(f"seq_len={self.seq_len} must be a multiple of TP={self.tp} with sequence parallelism")
        if self.vpp > 1 and dp > 0 and self.num_microbatches % self.pp != 0:
            p.append(f"interleaved schedule needs micro-batches ({self.num_microbatches}) to be a multiple "
                     f"of PP={self.pp}")
        if model is not None:
            if model.num_heads % self.tp != 0:
                p.append(f"heads={model.num_heads} must be a multiple of TP={self.tp}")
            if model.num_kv_heads % self.tp != 0 and self.tp % model.num_kv_heads != 0:
                p.append(f"KV heads={model.num_kv_heads} and TP={self.tp}: one must divide the other")
            if model.ffn_hidden_size % self.tp != 0:
                p.append(f"ffn_hidden_size={model.ffn_hidden_size} must be a multiple of TP={self.tp}")
            if self.layer_split is not None:
                if len(self.layer_split) != self.pp or sum(self.layer_split) != model.num_layers:
                    p.append(f"layer_split={list(self.layer_split)} must have PP={self.pp} entries summing to "
                             f"layers={model.num_layers}")
                elif any(x <= 0 or x % self.vpp for x in self.layer_split):
                    p.append(f"every entry of layer_split={list(self.layer_split)} must be a positive multiple "
                             f"of VPP={self.vpp}")
            elif model.num_layers % (self.pp * self.vpp) != 0:
                p.append(f"layers={model.num_layers} must be a multiple of PP*VPP = {self.pp}*{self.vpp} = "
                         f"{self.pp * self.vpp} (or give an uneven layer_split)")
        return p

    def validate(self, model: ModelSpec | None = None) -> "ParallelPlan":
        problems = self.problems(model)
        if problems:
            raise PlanError("invalid parallel plan: " + "; ".join(problems) + f". Factors: {self.factors()}.")
        return self
