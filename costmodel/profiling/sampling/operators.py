"""One benchmark per compute operator kind, built from the feature vector as costmodel/graph/build.py means it.

Forward and backward are measured separately:

* forward: the operator's call on fresh inputs (no autograd graph kept: inputs do not require grad);
* backward: the forward is run once with inputs requiring grad, then the timed statement is
  ``torch.autograd.grad(out, inputs, grad_out, retain_graph=True)`` -- only the backward kernels run in
  the timed region, over the same saved tensors each time (``autograd.grad`` returns the gradients
  instead of accumulating them, so repeats do identical work).

GEMM backward: the graph emits dgrad (m, k, n) and wgrad (n, k, m) as ordinary GEMM shapes (M, N, K);
a ``bwd`` GEMM sample is timed in its layout: ``dgrad`` = ``dy[M,K] @ W[K,N]`` (both row-major),
``wgrad`` = ``dy[K,M]^T @ x[K,N]`` (A transposed). :func:`gemm_backward_check` times dgrad + wgrad of
a forward shape through autograd, to check that the two GEMM rows add up to the real backward.

Timing: ``torch.utils.benchmark.Timer`` (it synchronizes CUDA before reading the clock) in blocks of
``number`` calls, ``number`` chosen so a block lasts about ``min_run_time_s / 10``; after ``warmup``
untimed calls, blocks are measured until ``min_run_time_s`` has passed and at least ``min_repeats``
blocks exist. The recorded time is the median over blocks of the per-call time, the spread is p90 - p10
of the same, and ``repeats`` the number of blocks. (``Timer.blocked_autorange`` is not used because it
stops after a single block when one call outlasts ``min_run_time``, leaving no spread.) With
``flush_mb`` > 0 in the plan's ``[timing]`` (CPU plans: no device synchronisation), single calls are
timed instead, each after an untimed sweep of a buffer of that size (cold caches, :func:`_time_cold`).
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import Callable

import numpy as np

from costmodel.core.errors import PlannerError
from costmodel.core.kinds import FEATURES
from costmodel.profiling.sampling.plan import Sample, Timing

SEED = 0  # inputs are N(0, 1) (ids uniform) from this seed: reproducible, and value-independent kernels


@dataclass(frozen=True)
class Measured:
    median_s: float
    """Median over blocks of the time per call, seconds."""
    spread_s: float
    """p90 - p10 over blocks of the time per call, seconds."""
    repeats: int
    """Timed blocks."""
    number: int
    """Calls per block."""


def torch_dtype(name: str):
    import torch  # deferred: torch is optional (planner[profile])

    table = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
    if name not in table:
        raise PlannerError(f"dtype {name!r} cannot be benchmarked here; use one of {', '.join(table)}")
    return table[name]


def _bwd(out, inputs: list, gen) -> Callable[[], object]:
    """Backward-only statement over a graph built once (see module docstring)."""
    import torch  # deferred: torch is optional (planner[profile])

    grad = torch.randn(out.shape, dtype=out.dtype, device=out.device, generator=gen)
    return lambda: torch.autograd.grad(out, inputs, grad, retain_graph=True)


def build(s: Sample, device: str) -> Callable[[], object]:
    """The statement to time for sample ``s`` (inputs allocated on ``device``)."""
    import torch  # deferred: torch is optional (planner[profile])
    import torch.nn.functional as F  # deferred: torch is optional (planner[profile])

    gen = torch.Generator(device=device).manual_seed(SEED)
    dt = torch_dtype(s.dtype)
    bwd = s.direction == "bwd"

    def rand(*shape, grad=False, dtype=dt):
        return torch.randn(shape, dtype=dtype, device=device, generator=gen).requires_grad_(grad)

    f = dict(zip(_names(s.kind), s.features))
    if s.kind == "gemm":
        m, n, k = f["m"], f["n"], f["k"]
        if not bwd:  # forward y = x W^T, x:[m,k], W:[n,k] (graph/build.py module docstring)
            x, w = rand(m, k), rand(n, k)
            return lambda: F.linear(x, w)
        if s.variant == "dgrad":  # dx[M,N] = dy[M,K] @ W[K,N]
            a, b = rand(m, k), rand(k, n)
            return lambda: torch.matmul(a, b)
        if s.variant == "wgrad":  # dW[M,N] = dy^T @ x with dy stored [K,M], x stored [K,N]
            a, b = rand(k, m), rand(k, n)
            return lambda: torch.matmul(a.t(), b)
        raise PlannerError(f"gemm bwd layout {s.variant!r} must be 'dgrad' or 'wgrad'")
    if s.kind in ("attention_fwd", "attention_bwd"):
        return _attention(f, rand, bwd, gen)
    if s.kind == "norm":
        t, h = f["tokens"], f["hidden"]
        x, w = rand(t, h, grad=bwd), rand(h, grad=bwd)
        if s.variant == "rms":
            fn = lambda: F.rms_norm(x, (h,), w, eps=1e-5)  # noqa: E731
        else:
            bias = rand(h, grad=bwd)
            fn = lambda: F.layer_norm(x, (h,), w, bias, eps=1e-5)  # noqa: E731
        return _bwd(fn(), [x, w], gen) if bwd else fn
    if s.kind == "activation":
        t, width = f["tokens"], f["width"]
        x = rand(t, width, grad=bwd)
        if f["gated"]:  # SwiGLU: input [gate | up] of width 2F, output F (graph/build.py: width = 2F)
            def fn():
                gate, up = x.chunk(2, dim=-1)
                return F.silu(gate) * up
        elif s.variant == "squared_relu":
            fn = lambda: torch.square(F.relu(x))  # noqa: E731
        else:
            fn = lambda: F.gelu(x)  # noqa: E731
        return _bwd(fn(), [x], gen) if bwd else fn
    if s.kind == "rope":
        t, heads, d = f["tokens"], f["heads"], f["head_dim"]
        x = rand(t, heads, d, grad=bwd)
        ang = torch.rand(t, 1, d // 2, device=device, generator=gen) * 6.283
        cos = torch.cat([ang.cos(), ang.cos()], dim=-1).to(dt)
        sin = torch.cat([ang.sin(), ang.sin()], dim=-1).to(dt)

        def fn():  # rotate-half RoPE (Su et al. 2021; the GPT-NeoX / Llama formulation)
            x1, x2 = x.chunk(2, dim=-1)
            return x * cos + torch.cat([-x2, x1], dim=-1) * sin
        return _bwd(fn(), [x], gen) if bwd else fn
    if s.kind == "residual_add":
        a, b = rand(f["elements"]), rand(f["elements"])
        return lambda: a + b
    if s.kind == "embedding":
        t, h, v = f["tokens"], f["hidden"], f["vocab"]
        ids = torch.randint(0, v, (t,), device=device, generator=gen)
        w = rand(v, h, grad=bwd)
        fn = lambda: F.embedding(ids, w)  # noqa: E731
        return _bwd(fn(), [w], gen) if bwd else fn
    if s.kind == "cross_entropy":
        t, v = f["tokens"], f["vocab"]
        logits = rand(t, v, grad=bwd, dtype=torch.float32)
        target = torch.randint(0, v, (t,), device=device, generator=gen)
        fn = lambda: F.cross_entropy(logits, target)  # noqa: E731
        return _bwd(fn(), [logits], gen) if bwd else fn
    if s.kind == "optimizer":
        return _adamw(f["params"], device, gen)
    raise PlannerError(f"no benchmark for operator kind {s.kind!r}")


def _names(kind: str) -> tuple[str, ...]:
    return FEATURES[kind]


def _attention(f: dict, rand, bwd: bool, gen) -> Callable[[], object]:
    """SDPA with q [b, heads, seq_q, d], k/v [b, kv_heads, seq_kv, d]; GQA via enable_gqa."""
    import torch.nn.functional as F  # deferred: torch is optional (planner[profile])

    b, sq, skv, h, kvh, d = (f[k] for k in ("batch", "seq_q", "seq_kv", "heads", "kv_heads", "head_dim"))
    q, k, v = rand(b, h, sq, d, grad=bwd), rand(b, kvh, skv, d, grad=bwd), rand(b, kvh, skv, d, grad=bwd)
    kw = {"enable_gqa": kvh != h}
    if f["causal"] and sq == skv:
        kw["is_causal"] = True
    elif f["causal"]:
        # queries are the last seq_q positions of seq_kv (context-parallel chunk / decoding):
        # bottom-right aligned causal mask, as FlashAttention >= 2.1 defines causal for seq_q != seq_kv
        from torch.nn.attention.bias import causal_lower_right  # deferred: torch is optional (planner[profile])

        kw["attn_mask"] = causal_lower_right(sq, skv)
    fn = lambda: F.scaled_dot_product_attention(q, k, v, **kw)  # noqa: E731
    return _bwd(fn(), [q, k, v], gen) if bwd else fn


ADAM_TENSORS = 4
"""The optimizer benchmark spreads its parameters over this many tensors (a plan choice, not a fact)."""


def _adamw(params: int, device: str, gen) -> Callable[[], object]:
    """AdamW step over ``params`` fp32 parameters with gradients (fused kernel where torch has one)."""
    import torch  # deferred: torch is optional (planner[profile])

    sizes = [params // ADAM_TENSORS + (1 if i < params % ADAM_TENSORS else 0) for i in range(ADAM_TENSORS)]
    ps = [torch.nn.Parameter(torch.randn(n, device=device, generator=gen)) for n in sizes if n > 0]
    for p in ps:
        p.grad = torch.randn(p.shape, device=device, generator=gen) * 1e-3
    try:
        opt = torch.optim.AdamW(ps, lr=1e-4, fused=True)
        opt.step()
    except (RuntimeError, TypeError):  # no fused kernel for this device / build: multi-tensor path
        opt = torch.optim.AdamW(ps, lr=1e-4, foreach=True)
    return opt.step


def adam_impl(device: str) -> str:
    """Which AdamW implementation :func:`_adamw` uses on ``device`` (recorded in the dataset notes)."""
    import torch  # deferred: torch is optional (planner[profile])

    p = torch.nn.Parameter(torch.zeros(4, device=device))
    p.grad = torch.zeros(4, device=device)
    try:
        torch.optim.AdamW([p], fused=True).step()
        return "fused"
    except (RuntimeError, TypeError):
        return "foreach"


# --------------------------------------------------------------------------------------------- timing
COLD_MAX_CALLS = 40
"""Most timed single calls per sample in cold-cache mode (each costs a buffer sweep as well)."""


def _time_cold(fn: Callable[[], object], timing: Timing, threads: int) -> Measured:
    """Cold-cache timing (``timing.flush_mb`` > 0): per call, sweep a buffer of flush_mb MiB, then time
    the call alone; median / p90 - p10 over calls. (Triton's ``do_bench`` clears the GPU L2 the same way.)

    Why: inside a training step each operator's weights and saved activations come from memory (the
    step's working set -- weights, activations of every micro-batch, gradients, optimizer state -- is
    far larger than the caches), while back-to-back calls find them in cache. On this 2-core VM
    (2 MiB L2 per core) a [256,256] x [256,1024] GEMM took 0.90-1.04 ms back to back, 1.26 ms after a
    64 MiB sweep and 1.30 ms inside the model-S training step (perf_counter around F.linear, issue #4).
    """
    import torch  # deferred: torch is optional (planner[profile])

    torch.set_num_threads(threads)
    buf = torch.empty(max(1, int(timing.flush_mb * 2**20 / 4)), dtype=torch.float32)
    times: list[float] = []
    spent = 0.0
    while len(times) < min(COLD_MAX_CALLS, timing.max_repeats) and (
            spent < timing.min_run_time_s or len(times) < timing.min_repeats):
        buf.fill_(len(times))
        t0 = time.perf_counter()
        fn()
        t = time.perf_counter() - t0
        times.append(t)
        spent += t
    arr = np.asarray(times)
    p10, p50, p90 = np.percentile(arr, [10, 50, 90])
    return Measured(float(p50), float(p90 - p10), len(times), 1)


def time_fn(fn: Callable[[], object], timing: Timing, threads: int) -> Measured:
    """Median / spread of the time per call of ``fn`` (see module docstring for the method)."""
    from torch.utils.benchmark import Timer  # deferred: torch is optional (planner[profile])

    for _ in range(max(0, timing.warmup)):
        fn()
    if timing.flush_mb > 0:
        return _time_cold(fn, timing, threads)
    timer = Timer(stmt="fn()", globals={"fn": fn}, num_threads=threads)
    probe = timer.timeit(1).mean  # also the last warm-up call
    block = timing.min_run_time_s / 10
    number = max(1, min(10_000, int(block / max(probe, 1e-9))))
    times: list[float] = []
    spent = 0.0
    while len(times) < timing.max_repeats and (spent < timing.min_run_time_s or len(times) < timing.min_repeats):
        t = timer.timeit(number).mean
        times.append(t)
        spent += t * number
    arr = np.asarray(times)
    p10, p50, p90 = np.percentile(arr, [10, 50, 90])
    if not (math.isfinite(p50) and p50 > 0):
        raise PlannerError(f"timer returned a non-positive time ({p50}); the clock is unusable")
    return Measured(float(p50), float(p90 - p10), len(times), number)


def measure(s: Sample, device: str, timing: Timing, threads: int) -> Measured:
    """Build and time one sample; inputs are freed afterwards (also when it runs out of memory)."""
    fn = None
    try:
        fn = build(s, device)
        return time_fn(fn, timing, threads)
    finally:
        del fn
        if device == "cuda":
            import torch  # deferred: torch is optional (planner[profile])

            torch.cuda.empty_cache()


def gemm_backward_check(m: int, n: int, k: int, dtype: str = "fp32", device: str = "cpu",
                        timing: Timing | None = None, threads: int = 1, rounds: int = 3) -> dict:
    """Backward of y = F.linear(x[m,k], W[n,k]) through autograd vs its dgrad + wgrad GEMM samples.

    Returns seconds: ``autograd`` (dx and dW by ``torch.autograd.grad``), ``dgrad`` (m, k, n), ``wgrad``
    (n, k, m) and ``sum`` = dgrad + wgrad, so a caller can check the graph's backward decomposition.
    The three are measured in turn ``rounds`` times and each keeps its fastest median, so a burst of
    load from other processes on a shared machine does not land on one of them only.
    """
    import torch  # deferred: torch is optional (planner[profile])
    import torch.nn.functional as F  # deferred: torch is optional (planner[profile])

    timing = timing or Timing()
    gen = torch.Generator(device=device).manual_seed(SEED)
    dt = torch_dtype(dtype)
    x = torch.randn(m, k, dtype=dt, device=device, generator=gen).requires_grad_(True)
    w = torch.randn(n, k, dtype=dt, device=device, generator=gen).requires_grad_(True)
    fns = {"autograd": _bwd(F.linear(x, w), [x, w], gen),
           "dgrad": build(Sample("gemm", "bwd", dtype, (m, k, n), "dgrad"), device),
           "wgrad": build(Sample("gemm", "bwd", dtype, (n, k, m), "wgrad"), device)}
    best = {name: math.inf for name in fns}
    for _ in range(max(1, rounds)):
        for name, fn in fns.items():
            best[name] = min(best[name], time_fn(fn, timing, threads).median_s)
    return {**best, "sum": best["dgrad"] + best["wgrad"]}
