"""One iteration's forward/backward over the micro-batches: plain gradient accumulation (pp = 1) or the
non-interleaved 1F1B pipeline schedule with explicit send/recv (pp > 1).

1F1B follows Narayanan et al. 2021 (arXiv 2104.04473) §2.2 / Fig. 4 top and Megatron-LM
``forward_backward_pipelining_without_interleaving`` (megatron/core/pipeline_parallel/schedules.py):
stage i runs min(pp - i - 1, M) warm-up forwards, then alternates one forward and one backward, then
drains the remaining backwards. Paired transfers (send activation + receive gradient, send gradient +
receive activation) are posted together before waiting, as Megatron's p2p_communication does, so the
schedule cannot deadlock on rendezvous sends.
"""

from __future__ import annotations

import contextlib

import torch
import torch.distributed as dist

from costmodel.profiling.workloads.tensor_parallel import ParallelState


def _wait(ops: list) -> None:
    for op in ops:
        op.wait()


class _P2P:
    """Activation / gradient transfers between adjacent stages of one pipeline."""

    def __init__(self, state: ParallelState, shape: tuple[int, ...]):
        self.state, self.shape = state, shape

    def recv_forward(self) -> torch.Tensor | None:
        if self.state.first_stage:
            return None
        buf = torch.empty(self.shape)
        _wait([dist.irecv(buf, self.state.prev_stage_rank)])
        return buf.requires_grad_()

    def send_forward(self, out: torch.Tensor | None) -> None:
        if not self.state.last_stage:
            assert out is not None  # every stage but the last produces an activation
            _wait([dist.isend(out.detach().contiguous(), self.state.next_stage_rank)])

    def send_forward_recv_backward(self, out: torch.Tensor | None) -> torch.Tensor | None:
        if self.state.last_stage:
            return None
        assert out is not None  # every stage but the last produces an activation
        grad = torch.empty(self.shape)
        _wait([dist.isend(out.detach().contiguous(), self.state.next_stage_rank),
               dist.irecv(grad, self.state.next_stage_rank)])
        return grad

    def recv_backward(self) -> torch.Tensor | None:
        if self.state.last_stage:
            return None
        grad = torch.empty(self.shape)
        _wait([dist.irecv(grad, self.state.next_stage_rank)])
        return grad

    def send_backward(self, grad: torch.Tensor | None) -> None:
        if not self.state.first_stage:
            assert grad is not None  # every stage but the first receives a gradient to pass on
            _wait([dist.isend(grad.contiguous(), self.state.prev_stage_rank)])

    def send_backward_recv_forward(self, grad: torch.Tensor | None) -> torch.Tensor | None:
        if self.state.first_stage:
            return None
        assert grad is not None  # every stage but the first receives a gradient to pass on
        buf = torch.empty(self.shape)
        _wait([dist.isend(grad.contiguous(), self.state.prev_stage_rank),
               dist.irecv(buf, self.state.prev_stage_rank)])
        return buf.requires_grad_()


def accumulate(model, microbatches: list, use_no_sync: bool) -> list[torch.Tensor]:
    """pp = 1: forward + backward per micro-batch, loss / M; DDP syncs only on the last backward."""
    m, losses = len(microbatches), []
    for j, (tokens, targets) in enumerate(microbatches):
        ctx = model.no_sync() if use_no_sync and j < m - 1 else contextlib.nullcontext()
        with ctx:
            loss = model(tokens, targets)
            (loss / m).backward()
        losses.append(loss.detach())
    return losses


def one_f_one_b(model, state: ParallelState, microbatches: list, act_shape: tuple[int, ...]) -> list[torch.Tensor]:
    """pp > 1: the 1F1B schedule for this stage; returns the per-micro-batch losses on the last stage."""
    m = len(microbatches)
    p2p = _P2P(state, act_shape)
    warmup = min(state.pp - state.pp_rank - 1, m)
    remaining = m - warmup
    inputs, outputs, losses = [], [], []
    next_fwd = 0

    def forward(inp):
        nonlocal next_fwd
        tokens, targets = microbatches[next_fwd]
        next_fwd += 1
        out = model(tokens if state.first_stage else inp, targets if state.last_stage else None)
        if state.last_stage:
            losses.append(out.detach())
            out = out / m
        inputs.append(inp)
        outputs.append(out)
        return out

    def backward(grad_out):
        inp, out = inputs.pop(0), outputs.pop(0)
        if state.last_stage:
            out.backward()
        else:
            torch.autograd.backward(out, grad_out)
        return None if state.first_stage else inp.grad

    for _ in range(warmup):
        p2p.send_forward(forward(p2p.recv_forward()))
    inp = p2p.recv_forward() if remaining > 0 else None
    for i in range(remaining):
        grad_out = p2p.send_forward_recv_backward(forward(inp))
        grad_in = backward(grad_out)
        if i == remaining - 1:
            inp = None
            p2p.send_backward(grad_in)
        else:
            inp = p2p.send_backward_recv_forward(grad_in)
    for _ in range(warmup):
        p2p.send_backward(backward(p2p.recv_backward()))
    return losses


def allreduce_grads(params: list[torch.nn.Parameter], state: ParallelState) -> None:
    """Average the gradients over the data-parallel group in one flat buffer (used when pp > 1)."""
    if state.dp == 1:
        return
    grads = [p.grad for p in params]
    flat = torch.cat([g.reshape(-1) for g in grads])
    dist.all_reduce(flat, group=state.dp_group)
    flat /= state.dp
    offset = 0
    for g in grads:
        g.copy_(flat[offset:offset + g.numel()].view_as(g))
        offset += g.numel()
