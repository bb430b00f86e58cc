"""torchrun entry point: train the decoder for warm-up + timed iterations and write one JSON result.

    python -m torch.distributed.run --standalone --nproc-per-node 2 -m costmodel.profiling.workloads.train \
        --config '{"tp": 2, ...}' --out result.json

Every rank times each iteration (zero_grad -> micro-batches -> gradient all-reduce -> AdamW step); the
iteration time is the maximum over ranks. Rank 0 writes the results (a JSON list, one per configuration).
"""

from __future__ import annotations

import argparse
import ctypes
import ctypes.util
import json
import os
import platform
import time

import numpy as np
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from costmodel.core.fileio import atomic_write_text
from costmodel.profiling.torchrun import exit_worker
from costmodel.profiling.workloads.config import WorkloadConfig
from costmodel.profiling.workloads.model import DecoderStage
from costmodel.profiling.workloads.pipeline import accumulate, allreduce_grads, one_f_one_b
from costmodel.profiling.workloads.tensor_parallel import build_parallel_state


def cpu_model() -> str:
    """CPU model name from /proc/cpuinfo (platform.processor() elsewhere)."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as fh:
            for line in fh:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown CPU"


def global_batch(cfg: WorkloadConfig, index: int) -> torch.Tensor:
    """Seeded random tokens [gbs, seq_len + 1] of distinct batch ``index`` (the same for every layout)."""
    gen = torch.Generator().manual_seed(cfg.seed * 7919 + index)
    return torch.randint(0, cfg.vocab, (cfg.gbs, cfg.seq_len + 1), generator=gen)


def local_microbatches(cfg: WorkloadConfig, batch: torch.Tensor, dp_rank: int) -> list:
    """(inputs, targets) of this data-parallel rank's micro-batches: rows dp_rank*M*mbs + j*mbs ..."""
    out = []
    for j in range(cfg.num_microbatches):
        start = (dp_rank * cfg.num_microbatches + j) * cfg.mbs
        rows = batch[start:start + cfg.mbs]
        out.append((rows[:, :-1].contiguous(), rows[:, 1:].contiguous()))
    return out


M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3
"""mallopt(3) parameter numbers (glibc malloc.h)."""
MMAP_THRESHOLD_MAX = 32 * 1024 * 1024
"""glibc's largest allowed M_MMAP_THRESHOLD on 64-bit (DEFAULT_MMAP_THRESHOLD_MAX = 4 MiB * sizeof(long),
mallopt(3)); larger blocks are always mmap'ed."""


def keep_freed_memory() -> bool:
    """Make glibc malloc keep freed tensor memory for reuse (a caching allocator), as frameworks do.

    By default glibc serves large blocks with mmap and returns freed heap tops to the kernel, so the
    activations of every micro-batch land on fresh pages: the model-S run took ~54 000 minor page faults
    (~0.1 s of kernel time, 11 % of a 0.9 s step) per iteration on this machine (getrusage, issue #4),
    while planner's operator benchmarks, calling each kernel repeatedly, reuse their memory. GPU
    frameworks cache device memory (PyTorch's CUDA caching allocator); on CPU the usual advice is
    jemalloc/tcmalloc. Raising the mmap threshold and disabling trimming gives the same reuse. Returns
    False where the C library has no mallopt (not glibc).
    """
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return False
    return bool(mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD_MAX)) and bool(mallopt(M_TRIM_THRESHOLD, 2**31 - 1))


def make_adamw(params: list, cfg: WorkloadConfig) -> torch.optim.Optimizer:
    """AdamW with torch's fused kernel, else the multi-tensor (foreach) path.

    Training frameworks step a fused Adam (Megatron-LM: Apex/TE FusedAdam), and planner's optimizer
    benchmark (costmodel/profiling/sampling/operators.py ``_adamw``) times exactly this choice; torch's CPU default
    is the per-parameter for-loop, which measured 39 ms vs 11 ms per step of the 7.4 M-parameter model S
    on this machine (torch.profiler, issue #4).
    """
    try:
        return torch.optim.AdamW(params, lr=cfg.lr, weight_decay=cfg.weight_decay, fused=True)
    except (RuntimeError, TypeError):
        return torch.optim.AdamW(params, lr=cfg.lr, weight_decay=cfg.weight_decay, foreach=True)


def run(cfg: WorkloadConfig) -> dict | None:
    """Train on the initialised process group; returns the result dict on rank 0 (None elsewhere)."""
    torch.set_num_threads(cfg.threads)
    cached = keep_freed_memory()
    torch.manual_seed(cfg.seed)
    state = build_parallel_state(cfg.tp, cfg.dp, cfg.pp)
    stage = DecoderStage(cfg, state)
    params = [p for p in stage.parameters()]
    model = stage
    use_ddp = cfg.pp == 1 and cfg.dp > 1
    if use_ddp:
        # gradients live in DDP's flat buckets (views), as Megatron-LM keeps them in one contiguous grad
        # buffer: planner's graph has no per-iteration gradient copies. DDP's default copies every gradient
        # into its bucket and back: +30-40 ms per step of model S on this machine (0.383 s with views vs
        # 0.414-0.425 s with copies; 2 processes, mbs 2, 2 micro-batches; issue #4).
        model = DistributedDataParallel(stage, process_group=state.dp_group, gradient_as_bucket_view=True)
    opt = make_adamw(params, cfg)
    data = [local_microbatches(cfg, global_batch(cfg, i), state.dp_rank) for i in range(cfg.data_batches)]
    act_shape = (cfg.mbs, cfg.seq_len, cfg.hidden)
    total = cfg.warmup + cfg.iters
    times, losses = torch.zeros(total, dtype=torch.float64), torch.zeros(total, dtype=torch.float64)
    dist.barrier()
    for it in range(total):
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        mbs = data[it % cfg.data_batches]
        if cfg.pp == 1:
            mb_losses = accumulate(model, mbs, use_no_sync=use_ddp)
        else:
            mb_losses = one_f_one_b(model, state, mbs, act_shape)
            allreduce_grads(params, state)
        opt.step()
        times[it] = time.perf_counter() - t0
        if mb_losses:
            losses[it] = float(torch.stack(mb_losses).mean())
    # after timing: per-iteration max time over ranks, loss averaged over the data-parallel replicas
    dist.all_reduce(times, op=dist.ReduceOp.MAX)
    if not (state.last_stage and state.tp_rank == 0):
        losses.zero_()
    dist.all_reduce(losses)
    losses /= cfg.dp
    if state.rank != 0:
        return None
    timed = times[cfg.warmup:].numpy()
    n_params = sum(p.numel() for p in params)
    return {
        "config": json.loads(cfg.to_json()),
        "world_size": cfg.world_size, "processes": cfg.world_size, "threads": cfg.threads,
        "cores_available": os.cpu_count(), "cpu_model": cpu_model(), "torch_version": torch.__version__,
        "backend": "gloo", "malloc_keeps_freed_memory": cached,
        "data_parallel": "DDP" if use_ddp else ("flat all-reduce" if cfg.dp > 1 else "none"),
        "schedule": "1F1B" if cfg.pp > 1 else "gradient accumulation",
        "params_rank0": n_params,
        "warmup_times_s": times[:cfg.warmup].tolist(), "iteration_times_s": timed.tolist(),
        "median_s": float(np.median(timed)), "p10_s": float(np.percentile(timed, 10)),
        "p90_s": float(np.percentile(timed, 90)), "min_s": float(timed.min()), "max_s": float(timed.max()),
        "losses": losses.tolist(),
    }


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", required=True, action="append",
                    help="WorkloadConfig as JSON; repeat to run several configurations one after another")
    ap.add_argument("--out", required=True, help="JSON list of results (one per --config) written by rank 0")
    args = ap.parse_args(argv)
    cfgs = [WorkloadConfig.from_json(text) for text in args.config]
    for cfg in cfgs:
        problems = cfg.problems()
        if problems:
            raise SystemExit("invalid workload config: " + "; ".join(problems))
    dist.init_process_group("gloo")
    try:
        results = []
        for cfg in cfgs:
            if dist.get_world_size() != cfg.world_size:
                raise SystemExit(f"launched {dist.get_world_size()} processes but tp*pp*dp = {cfg.world_size}")
            results.append(run(cfg))
        if dist.get_rank() == 0:
            atomic_write_text(args.out, json.dumps(results, indent=1))
        # every rank reaches teardown together: a pipeline rank that destroyed its gloo group while the
        # other was still busy died with "terminate called without an active exception" (SIGABRT) after
        # the results were written, in about 1 of 10 PP launches on the 2-core VM (issue #4); the rarer
        # abort during interpreter teardown is avoided by exit_worker (costmodel/profiling/torchrun.py)
        dist.barrier()
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
    exit_worker(0)  # results written, group destroyed: skip interpreter teardown (see exit_worker)
