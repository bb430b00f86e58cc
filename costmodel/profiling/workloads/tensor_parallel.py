"""Megatron-style tensor parallelism over torch.distributed (gloo on CPU) and the process-group layout.

Follows Shoeybi et al. 2019 (arXiv 1909.08053) §3 and Megatron-LM ``megatron/core/tensor_parallel``:
``f`` (:class:`CopyToTP`, identity forward / all-reduce backward) enters a column-parallel block,
``g`` (:class:`ReduceFromTP`, all-reduce forward / identity backward) leaves a row-parallel block
(mappings.py); the vocab-parallel embedding all-reduces its output (layers.py) and the vocab-parallel
cross-entropy does three all-reduces: max logit, target logit, sum of exp (cross_entropy.py).
These are the collectives :mod:`costmodel.graph.build` puts in the operator graph (sequence parallel off).

Weights are created full-size from a per-parameter seed and then sliced, so every layout starts from
the same model as the unsharded one (Megatron's ``_initialize_affine_weight_cpu``).
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import nn

INIT_STD = 0.02
"""Normal init std of linear and embedding weights (GPT-2 / Megatron-LM ``--init-method-std`` default)."""


# ------------------------------------------------------------------------------------------ groups
@dataclass
class ParallelState:
    """This rank's coordinates and process groups; rank = tp_rank + tp * (dp_rank + dp * pp_rank)."""

    rank: int
    """Global rank."""
    tp: int
    """Tensor-parallel degree."""
    dp: int
    """Data-parallel degree."""
    pp: int
    """Pipeline stages."""
    tp_rank: int
    """Rank inside the tensor-parallel group."""
    dp_rank: int
    """Rank inside the data-parallel group."""
    pp_rank: int
    """Pipeline stage index."""
    tp_group: object = None
    """Tensor-parallel process group (None when tp == 1)."""
    dp_group: object = None
    """Data-parallel process group (None when dp == 1)."""

    def global_rank(self, tp_rank: int, dp_rank: int, pp_rank: int) -> int:
        return tp_rank + self.tp * (dp_rank + self.dp * pp_rank)

    @property
    def prev_stage_rank(self) -> int | None:
        return None if self.pp_rank == 0 else self.global_rank(self.tp_rank, self.dp_rank, self.pp_rank - 1)

    @property
    def next_stage_rank(self) -> int | None:
        last = self.pp_rank == self.pp - 1
        return None if last else self.global_rank(self.tp_rank, self.dp_rank, self.pp_rank + 1)

    @property
    def first_stage(self) -> bool:
        return self.pp_rank == 0

    @property
    def last_stage(self) -> bool:
        return self.pp_rank == self.pp - 1


def build_parallel_state(tp: int, dp: int, pp: int) -> ParallelState:
    """Create the TP and DP groups in Megatron order (tp ranks adjacent, then dp, then pp)."""
    world, rank = dist.get_world_size(), dist.get_rank()
    if world != tp * dp * pp:
        raise ValueError(f"world size {world} != tp*dp*pp = {tp}*{dp}*{pp}")
    tp_rank, rest = rank % tp, rank // tp
    dp_rank, pp_rank = rest % dp, rest // dp
    state = ParallelState(rank, tp, dp, pp, tp_rank, dp_rank, pp_rank)
    # every rank must create every group, in the same order
    for p in range(pp):
        for d in range(dp):
            ranks = [state.global_rank(t, d, p) for t in range(tp)]
            group = dist.new_group(ranks) if tp > 1 else None
            if rank in ranks:
                state.tp_group = group
    for p in range(pp):
        for t in range(tp):
            ranks = [state.global_rank(t, d, p) for d in range(dp)]
            group = dist.new_group(ranks) if dp > 1 else None
            if rank in ranks:
                state.dp_group = group
    return state


# ------------------------------------------------------------------------------------------ f and g
class CopyToTP(torch.autograd.Function):
    """Megatron ``f``: identity forward, all-reduce of the input gradient backward."""

    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        return x

    @staticmethod
    def backward(ctx, grad):
        grad = grad.contiguous()
        dist.all_reduce(grad, group=ctx.group)
        return grad, None


class ReduceFromTP(torch.autograd.Function):
    """Megatron ``g``: all-reduce of the partial sums forward, identity backward."""

    @staticmethod
    def forward(ctx, x, group):
        x = x.contiguous()
        dist.all_reduce(x, group=group)
        return x

    @staticmethod
    def backward(ctx, grad):
        return grad, None


def copy_to_tp(x: torch.Tensor, state: ParallelState) -> torch.Tensor:
    return x if state.tp == 1 else CopyToTP.apply(x, state.tp_group)


def reduce_from_tp(x: torch.Tensor, state: ParallelState) -> torch.Tensor:
    return x if state.tp == 1 else ReduceFromTP.apply(x, state.tp_group)


# ------------------------------------------------------------------------------------------ weights
def full_weight(seed: int, name: str, shape: tuple[int, ...], std: float = INIT_STD) -> torch.Tensor:
    """Full-size N(0, std) weight drawn from a seed derived from (seed, parameter name): layout-independent."""
    gen = torch.Generator().manual_seed(seed * 1_000_003 + zlib.crc32(name.encode()))
    return torch.randn(shape, generator=gen) * std


def shard_rows(parts: list[torch.Tensor], state: ParallelState) -> torch.Tensor:
    """This rank's slice (dim 0) of each part, concatenated (fused QKV or gate+up weights)."""
    return torch.cat([p.chunk(state.tp, dim=0)[state.tp_rank] for p in parts], dim=0)


class ColumnParallelLinear(nn.Module):
    """y_local = f(x) W_local^T, W split along the output dimension (no bias, output left sharded)."""

    def __init__(self, weight_local: torch.Tensor, state: ParallelState):
        super().__init__()
        self.state = state
        self.weight = nn.Parameter(weight_local.contiguous())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.linear(copy_to_tp(x, self.state), self.weight)


class RowParallelLinear(nn.Module):
    """y = g(x_local W_local^T), W split along the input dimension (input already sharded)."""

    def __init__(self, weight_full: torch.Tensor, state: ParallelState):
        super().__init__()
        self.state = state
        self.weight = nn.Parameter(weight_full.chunk(state.tp, dim=1)[state.tp_rank].contiguous())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return reduce_from_tp(torch.nn.functional.linear(x, self.weight), self.state)


class VocabParallelEmbedding(nn.Module):
    """Each rank holds vocab rows [start, end); out-of-range tokens give 0, then all-reduce (g)."""

    def __init__(self, weight_full: torch.Tensor, state: ParallelState):
        super().__init__()
        self.state = state
        per = weight_full.shape[0] // state.tp
        self.start, self.end = state.tp_rank * per, (state.tp_rank + 1) * per
        self.weight = nn.Parameter(weight_full[self.start:self.end].contiguous())

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        if self.state.tp == 1:
            return torch.nn.functional.embedding(tokens, self.weight)
        outside = (tokens < self.start) | (tokens >= self.end)
        local = (tokens - self.start).masked_fill(outside, 0)
        out = torch.nn.functional.embedding(local, self.weight).masked_fill(outside.unsqueeze(-1), 0.0)
        return reduce_from_tp(out, self.state)


class _VocabParallelCE(torch.autograd.Function):
    """Cross-entropy over vocab-sharded logits with fused local kernels: 3 all-reduces forward, none backward.

    The math of Megatron's vocab-parallel cross-entropy (megatron/core/tensor_parallel/cross_entropy.py:
    global max, sum of exponentials and target logit, each all-reduced over the TP group), computed as
    Megatron's fused variant does (--cross-entropy-loss-fusion, megatron/core/fusions/
    fused_cross_entropy.py): one fused log-sum-exp per shard forward and one fused softmax backward,
    rather than ~10 separate element-wise passes over the [tokens, vocab/tp] logits. The unfused form
    measured ~10 ms per micro-batch of model S at tp=2 on this machine vs ~2 ms for the fused
    single-device cross-entropy planner samples (torch.profiler, issue #4).
    """

    @staticmethod
    def forward(ctx, logits, target, start, group):
        lse_local = torch.logsumexp(logits, dim=-1)               # fused: max + sum of exp + log
        lse_max = lse_local.clone()
        dist.all_reduce(lse_max, op=dist.ReduceOp.MAX, group=group)
        sum_exp = torch.exp(lse_local - lse_max)
        dist.all_reduce(sum_exp, group=group)
        lse = lse_max + sum_exp.log()                             # log of the global sum of exp(logits)
        v_local = logits.shape[-1]
        outside = (target < start) | (target >= start + v_local)
        local = (target - start).masked_fill(outside, 0)
        target_logit = logits.gather(-1, local.unsqueeze(-1)).squeeze(-1).masked_fill(outside, 0.0)
        dist.all_reduce(target_logit, group=group)
        ctx.save_for_backward(logits, lse_local - lse, local, outside)
        return lse - target_logit

    @staticmethod
    def backward(ctx, grad_loss):
        logits, log_share, local, outside = ctx.saved_tensors
        # d loss / d logits = softmax over the full vocabulary - onehot(target); the global softmax is this
        # shard's softmax times the shard's share exp(lse_local - lse) of the global sum of exponentials
        grad = torch.softmax(logits, dim=-1)
        grad.mul_((log_share.exp() * grad_loss).unsqueeze(-1))
        hit = (~outside).to(grad.dtype) * grad_loss
        grad.scatter_add_(-1, local.unsqueeze(-1), -hit.unsqueeze(-1))
        return grad, None, None, None


def vocab_parallel_cross_entropy(logits: torch.Tensor, target: torch.Tensor, vocab_start: int,
                                 state: ParallelState) -> torch.Tensor:
    """Per-token loss; plain cross-entropy when tp == 1."""
    if state.tp == 1:
        return torch.nn.functional.cross_entropy(logits.flatten(0, -2), target.flatten(),
                                                 reduction="none").view(target.shape)
    return _VocabParallelCE.apply(logits, target, vocab_start, state.tp_group)
