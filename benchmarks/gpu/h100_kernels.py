"""Kernel-basis sections of measure_h100.py: launch overheads, GEMMs, attention, optimizer."""
from __future__ import annotations

import contextlib
import math
import os
import time

import torch
import torch.nn.functional as F
from h100_common import (
    Rows,
    S,
    cuda,
    free,
    left,
    log,
    med,
    sync,
    time_region,
)
from h100_model import (
    MODELS,
    SMOKE_MODELS,
    Llama,
)


# ------------------------------------------------------------------------------------------------- 1. overheads
def section_overheads(out):
    rows = Rows(os.path.join(out, "overheads.csv"),
                ["item", "n_kernels", "per_kernel_us", "cpu_issue_per_kernel_us", "total_ms", "reps", "notes"])
    n = 20 if S.args.smoke else 1000
    x = torch.zeros(16, device=S.dev)
    a = torch.randn(64, 64, device=S.dev)
    w32 = torch.randn(64, 64, device=S.dev)

    def eager_loop(fn, label, notes, ctx=contextlib.nullcontext):
        for _ in range(3):
            with ctx():
                for _ in range(50):
                    fn()
        sync()
        per, issue = [], []
        for _ in range(5):
            sync()
            t = time.perf_counter()
            with ctx():
                for _ in range(n):
                    fn()
            ti = time.perf_counter() - t
            sync()
            tt = time.perf_counter() - t
            per.append(tt / n * 1e6)
            issue.append(ti / n * 1e6)
        rows.add(item=label, n_kernels=n, per_kernel_us=med(per), cpu_issue_per_kernel_us=med(issue),
                 total_ms=med(per) * n / 1e3, reps=5, notes=notes)
        log(f"overhead {label}: {med(per):.2f} us/kernel (CPU issue {med(issue):.2f})")

    xc = torch.zeros(16)
    per = []
    for _ in range(5):
        t = time.perf_counter()
        for _ in range(n):
            xc.add_(1)
        per.append((time.perf_counter() - t) / n * 1e6)
    rows.add(item="cpu_tensor_add_", n_kernels=n, per_kernel_us=med(per), cpu_issue_per_kernel_us=med(per),
             total_ms=med(per) * n / 1e3, reps=5, notes="xc.add_(1) on a 16-element CPU tensor: PyTorch dispatch "
             "without CUDA (host CPU speed reference)")
    per = []
    for _ in range(5):
        t = time.perf_counter()
        acc = 0
        for i in range(100_000):
            acc += i
        per.append((time.perf_counter() - t) / 100_000 * 1e9)
    rows.add(item="python_loop_iteration_ns", n_kernels=0, per_kernel_us=med(per) / 1e3, cpu_issue_per_kernel_us="",
             total_ms="", reps=5, notes="one iteration of a pure Python for/+= loop (host CPU speed reference)")
    eager_loop(lambda: x.add_(1), "eager_add_", "x.add_(1) on 16 fp32 elements; wall/N after a synchronize")
    eager_loop(lambda: torch.mm(a, a), "eager_mm_64", "torch.mm 64x64 fp32 (cuBLAS launch)")
    if cuda():
        eager_loop(lambda: F.linear(a, w32), "eager_linear_64_autocast",
                   "F.linear 64x64 under autocast bf16: weight cast kernel + GEMM per call (2 kernels)",
                   ctx=lambda: torch.autocast("cuda", dtype=torch.bfloat16))
        # the same kernels captured once in a CUDA graph and replayed
        for label, fn in (("graph_add_", lambda: x.add_(1)), ("graph_mm_64", lambda: torch.mm(a, a))):
            s = torch.cuda.Stream()
            s.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(s):
                for _ in range(3):
                    fn()
            torch.cuda.current_stream().wait_stream(s)
            g = torch.cuda.CUDAGraph()
            with torch.cuda.graph(g):
                for _ in range(n):
                    fn()
            g.replay()
            sync()
            per = []
            for _ in range(5):
                sync()
                t = time.perf_counter()
                g.replay()
                sync()
                per.append((time.perf_counter() - t) / n * 1e6)
            ev = time_region(lambda s_, g=g: g.replay(), reps=5, warm=1)
            rows.add(item=label, n_kernels=n, per_kernel_us=med(ev) * 1e3 / n, cpu_issue_per_kernel_us="",
                     total_ms=med(ev), reps=5,
                     notes=f"one graph of {n} kernels, replay timed with CUDA events; wall incl. sync "
                           f"{med(per):.3f} us/kernel")
            log(f"overhead {label}: {med(ev) * 1e3 / n:.3f} us/kernel in graph")
            del g
        g1 = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g1):
            x.add_(1)
        g1.replay()
        sync()
        per = []
        for _ in range(200):
            t = time.perf_counter()
            g1.replay()
            sync()
            per.append((time.perf_counter() - t) * 1e6)
        rows.add(item="graph_launch_1kernel_plus_sync", n_kernels=1, per_kernel_us=med(per), cpu_issue_per_kernel_us="",
                 total_ms=med(per) / 1e3, reps=200, notes="replay of a one-kernel graph + synchronize, wall")
        del g1
    per = []
    for _ in range(200):
        t = time.perf_counter()
        sync()
        per.append((time.perf_counter() - t) * 1e6)
    rows.add(item="synchronize_idle", n_kernels=0, per_kernel_us=med(per), cpu_issue_per_kernel_us="", total_ms="",
             reps=200, notes="torch.cuda.synchronize() on an idle device, wall")
    per = []
    for _ in range(200):
        t = time.perf_counter()
        x.add_(1)
        sync()
        per.append((time.perf_counter() - t) * 1e6)
    rows.add(item="launch_plus_sync_1kernel", n_kernels=1, per_kernel_us=med(per), cpu_issue_per_kernel_us="",
             total_ms="", reps=200, notes="x.add_(1) then synchronize, wall (one eager round trip)")
    log(f"overhead launch+sync round trip {med(per):.1f} us")



# ------------------------------------------------------------------------------------------------------ 3. GEMMs
GEMM_SHAPES = [(1, 4096, 4096), (16, 4096, 4096), (128, 4096, 4096), (256, 12288, 4096), (1024, 4096, 4096),
               (2048, 2048, 2048), (4096, 4096, 4096), (4096, 12288, 4096), (4096, 4096, 12288),
               (8192, 8192, 8192), (16384, 4096, 4096), (32768, 4096, 4096), (8192, 2048, 2048),
               (8192, 256, 2048), (8192, 6144, 2048), (8192, 2048, 6144), (8192, 768, 768), (8192, 2048, 768),
               (8192, 768, 2048), (16384, 1024, 1024), (16384, 3072, 1024), (8192, 51200, 2048),
               (4096, 65536, 4096), (32768, 2048, 2048)]


def gemm_time(fn_i, n_w, reps_per_call):
    """(graph ms per call, eager ms per call): ``reps_per_call`` calls cycling over ``n_w`` weight copies."""
    def body():
        for i in range(reps_per_call):
            fn_i(i % n_w)
    eager = time_region(lambda s: body(), reps=5, warm=2)
    eager_ms = med(eager) / reps_per_call
    if not cuda():
        return float("nan"), eager_ms
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        body()
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        body()
    gr = time_region(lambda s_, g=g: g.replay(), reps=5, warm=2)
    del g
    return med(gr) / reps_per_call, eager_ms


def section_gemm(out):
    rows = Rows(os.path.join(out, "gemm.csv"),
                ["dtype", "m", "n", "k", "graph_ms", "eager_ms", "graph_tflops", "eager_tflops", "weight_copies",
                 "calls_per_sample", "notes"])
    shapes = [(8, 64, 64), (32, 128, 64)] if S.args.smoke else GEMM_SHAPES
    fp8_ok = cuda() and hasattr(torch, "_scaled_mm") and hasattr(torch, "float8_e4m3fn")
    for m, n, k in shapes:
        if left() < 20:
            log("gemm: budget reached")
            break
        flops = 2 * m * n * k
        wbytes = n * k * 2
        n_w = max(1, min(16, math.ceil(200e6 / wbytes)))  # > 4x the 50 MB L2 in weights, as aiconfigurator cycles
        calls = max(10, min(200, math.ceil(3e-3 / max(flops / 700e12, 5e-6))))
        calls = max(calls, n_w)
        try:
            x = torch.randn(m, k, device=S.dev, dtype=torch.bfloat16)
            ws = [torch.randn(n, k, device=S.dev, dtype=torch.bfloat16) for _ in range(n_w)]
            g_ms, e_ms = gemm_time(lambda i, x=x, ws=ws: F.linear(x, ws[i]), n_w, calls)
            rows.add(dtype="bf16", m=m, n=n, k=k, graph_ms=g_ms, eager_ms=e_ms, graph_tflops=flops / g_ms / 1e9,
                     eager_tflops=flops / e_ms / 1e9, weight_copies=n_w, calls_per_sample=calls,
                     notes="F.linear, randn inputs, no bias")
            log(f"gemm bf16 {m}x{n}x{k}: graph {g_ms * 1e3:.1f} us ({flops / g_ms / 1e9:.0f} TF/s), "
                f"eager {e_ms * 1e3:.1f} us")
            del ws
            if fp8_ok and m % 16 == 0 and n % 16 == 0 and k % 16 == 0:
                x8 = x.to(torch.float8_e4m3fn)
                w8 = [torch.randn(n, k, device=S.dev, dtype=torch.bfloat16).to(torch.float8_e4m3fn)
                      for _ in range(max(1, min(16, math.ceil(200e6 / (n * k)))))]
                one = torch.ones((), device=S.dev, dtype=torch.float32)
                g8, e8 = gemm_time(lambda i, x8=x8, w8=w8, one=one: torch._scaled_mm(
                    x8, w8[i].t(), scale_a=one, scale_b=one, out_dtype=torch.bfloat16), len(w8), max(calls, len(w8)))
                rows.add(dtype="fp8_e4m3_per_tensor", m=m, n=n, k=k, graph_ms=g8, eager_ms=e8,
                         graph_tflops=flops / g8 / 1e9, eager_tflops=flops / e8 / 1e9, weight_copies=len(w8),
                         calls_per_sample=max(calls, len(w8)),
                         notes="torch._scaled_mm, static per-tensor scales, bf16 out; no activation quantization "
                               "in the timed call (aiconfigurator's fp8 includes it)")
                del x8, w8
            del x
        except Exception as e:  # noqa: BLE001
            rows.add(dtype="bf16", m=m, n=n, k=k, notes="error: " + repr(e)[:300])
            log(f"gemm {m}x{n}x{k}: {e!r}"[:200])
        free()


# -------------------------------------------------------------------------------------------------- 4. attention
ATTN_SHAPES = [(1, 2048, 32, 4, 64), (4, 2048, 32, 4, 64), (1, 4096, 32, 4, 64), (2, 4096, 32, 4, 64),
               (1, 4096, 32, 8, 128), (1, 8192, 32, 8, 128), (2, 4096, 32, 8, 128), (1, 16384, 32, 8, 128),
               (1, 4096, 32, 32, 128), (4, 2048, 16, 16, 128), (8, 1024, 12, 12, 128), (1, 8192, 64, 8, 128)]


def default_attention_kernels(q, k, v, gqa):
    if not cuda():
        return ""
    try:
        from torch.profiler import ProfilerActivity, profile
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=gqa).sum().backward()
            sync()
        names = sorted({e.key for e in prof.key_averages() if e.device_type.name == "CUDA"
                        or getattr(e, "self_device_time_total", 0) > 0})
        return " | ".join(n for n in names if any(w in n.lower() for w in ("flash", "fmha", "attn", "cudnn", "mha",
                                                                           "sm90", "attention")))[:1000]
    except Exception as e:  # noqa: BLE001
        return f"profiler failed: {e!r}"[:200]


def sdpa_times(ctx, q, kk, vv, kw, go):
    """(forward ms samples, forward+backward ms samples) of causal SDPA under the backend context ``ctx``."""
    def fwd(_=None):
        with ctx():
            return F.scaled_dot_product_attention(q, kk, vv, is_causal=True, **kw)

    def fb(_=None):
        with ctx():
            o = F.scaled_dot_product_attention(q, kk, vv, is_causal=True, **kw)
        torch.autograd.grad(o, (q, kk, vv), go)
    with torch.no_grad():
        tf = time_region(fwd, reps=10, warm=3, prefill_ms=2)
    tb = time_region(fb, reps=5, warm=2, prefill_ms=4)
    return tf, tb


def section_attention(out):
    from torch.nn.attention import SDPBackend, sdpa_kernel
    rows = Rows(os.path.join(out, "attention.csv"),
                ["backend", "batch", "seq", "heads", "kv_heads", "head_dim", "gqa_mode", "fwd_ms", "fwdbwd_ms",
                 "fwd_tflops_causal", "fwdbwd_tflops_causal", "status", "notes"])
    shapes = [(1, 64, 4, 2, 16), (2, 32, 4, 4, 16)] if S.args.smoke else ATTN_SHAPES
    backends = [("default", None)]
    if cuda():
        backends += [("flash", SDPBackend.FLASH_ATTENTION), ("cudnn", SDPBackend.CUDNN_ATTENTION),
                     ("efficient", SDPBackend.EFFICIENT_ATTENTION)]
    first = True
    for b, s, h, kv, d in shapes:
        if left() < 15:
            log("attention: budget reached")
            break
        fl = 4 * b * s * s * h * d * 0.5  # causal forward FLOPs (aiconfigurator PROVENANCE's metric)
        q = torch.randn(b, h, s, d, device=S.dev, dtype=torch.bfloat16, requires_grad=True)
        k = torch.randn(b, kv, s, d, device=S.dev, dtype=torch.bfloat16, requires_grad=True)
        v = torch.randn(b, kv, s, d, device=S.dev, dtype=torch.bfloat16, requires_grad=True)
        go = torch.randn(b, h, s, d, device=S.dev, dtype=torch.bfloat16)
        if first:
            kern = default_attention_kernels(q, k, v, kv != h)
            log(f"attention default-backend kernels: {kern}")
            first = False
        else:
            kern = ""
        for label, be in backends:
            ctx = (lambda be=be: sdpa_kernel([be])) if be is not None else contextlib.nullcontext
            for gqa_mode in (("enable_gqa", "repeat_kv") if kv != h else ("mha",)):
                try:
                    if gqa_mode == "repeat_kv":
                        kk = k.repeat_interleave(h // kv, dim=1).detach().requires_grad_()
                        vv = v.repeat_interleave(h // kv, dim=1).detach().requires_grad_()
                        kw = {}
                    else:
                        kk, vv, kw = k, v, ({"enable_gqa": True} if kv != h else {})
                    tf, tb = sdpa_times(ctx, q, kk, vv, kw, go)
                    rows.add(backend=label, batch=b, seq=s, heads=h, kv_heads=kv, head_dim=d, gqa_mode=gqa_mode,
                             fwd_ms=med(tf), fwdbwd_ms=med(tb), fwd_tflops_causal=fl / med(tf) / 1e9,
                             fwdbwd_tflops_causal=3.5 * fl / med(tb) / 1e9, status="ok",
                             notes=(("default kernels: " + kern) if label == "default" and kern else
                                    "fwd under no_grad; fwd+bwd FLOPs counted as 3.5x fwd (recompute of P in bwd)"))
                    log(f"attn {label:9s} {gqa_mode:10s} b{b} s{s} h{h}/{kv} d{d}: fwd {med(tf):.3f} ms "
                        f"({fl / med(tf) / 1e9:.0f} TF/s), fwd+bwd {med(tb):.3f} ms")
                    break  # enable_gqa worked: no need for the repeat_kv fallback
                except Exception as e:  # noqa: BLE001
                    rows.add(backend=label, batch=b, seq=s, heads=h, kv_heads=kv, head_dim=d, gqa_mode=gqa_mode,
                             status="unsupported", notes=repr(e).split("\n")[0][:300])
                free()
        del q, k, v, go
        free()


# -------------------------------------------------------------------------------------------------- 5. optimizer
def section_optimizer(out):
    rows = Rows(os.path.join(out, "optimizer.csv"),
                ["model", "params", "param_tensors", "impl", "step_ms_median", "step_ms_min", "GBps_28B_per_param",
                 "reps", "notes"])
    models = SMOKE_MODELS if S.args.smoke else {k: MODELS[k] for k in ("llama-125m", "tinyllama-1.1b")}
    for name, cfg in models.items():
        if left() < 20:
            log("optimizer: budget reached")
            break
        with torch.device("meta"):
            shapes = [p.shape for p in Llama(*cfg, max_seq=16).parameters()]
        ps = [torch.randn(s, device=S.dev) * 0.02 for s in shapes]
        for p in ps:
            p.requires_grad_(True)
            p.grad = torch.randn_like(p) * 1e-3
        N = sum(p.numel() for p in ps)
        impls = [("fused", dict(fused=True)), ("foreach", dict(foreach=True)), ("for_loop", dict(foreach=False))]
        for impl, kw in impls:
            if not cuda() and impl == "fused":
                continue
            try:
                opt = torch.optim.AdamW(ps, lr=1e-4, betas=(0.9, 0.95), weight_decay=0.1, **kw)
                ts = time_region(lambda s, opt=opt: opt.step(), reps=5, warm=2)
                rows.add(model=name, params=N, param_tensors=len(ps), impl=impl, step_ms_median=med(ts),
                         step_ms_min=min(ts), GBps_28B_per_param=28 * N / (med(ts) / 1e3) / 1e9, reps=5,
                         notes="fp32 params/grads/states; events around opt.step() (CPU launch time included)")
                log(f"optimizer {name} AdamW {impl}: {med(ts):.2f} ms")
                del opt
            except Exception as e:  # noqa: BLE001
                rows.add(model=name, params=N, param_tensors=len(ps), impl=impl, notes="error: " + repr(e)[:300])
            free()
        del ps
        free()

