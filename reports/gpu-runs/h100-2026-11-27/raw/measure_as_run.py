"""Measure the kernel bases and small-model training steps that planner's cost model needs, on one CUDA GPU.

What it measures (bf16 unless stated), in the order it runs them; every section writes its CSV rows as soon as
they are measured, so a run stopped at its time limit still leaves what it measured:

1. ``overheads.csv``   per-launch cost of a trivial kernel in eager PyTorch (CPU dispatch + launch), the same
                       kernels captured in one CUDA graph and replayed, graph-launch cost, synchronize round trip.
2. ``train_steps.csv`` ground truth: full training steps (forward + backward + AdamW(fused=True) step +
                       zero_grad) of Llama-architecture decoders (~125M, ~370M, TinyLlama-1.1B) at sequence
                       lengths 1024/2048/4096 and micro-batches 1/2/4/8 in eager PyTorch (OOM recorded), the
                       forward+backward alone, and the optimizer step alone; then torch.compile (per-block, as
                       torchtitan does) for a few configurations, with the compile time separately.
                       The model follows torchtitan's models/llama3 code (separate wq/wk/wv and w1/w3 linears,
                       RMSNorm x.float()-pow-mean-rsqrt-type_as-weight, complex RoPE, repeat_kv GQA,
                       F.scaled_dot_product_attention causal, untied output, cross_entropy(pred.float())).
                       Precision: fp32 parameters (= master weights) and fp32 AdamW states, forward and loss under
                       torch.autocast(bfloat16) (GEMMs in bf16, the residual stream stays fp32 because the fp32
                       embedding output starts it), which is what torchtitan runs on one GPU without FSDP.
3. ``gemm.csv``        F.linear (y = x W^T, x [m,k], W [n,k]) bf16, and fp8 e4m3 through torch._scaled_mm with
                       per-tensor scales, at shapes of aiconfigurator's H100 GEMM grid; each timed as CUDA-graph
                       replay with the weights cycled so they do not sit in L2 (aiconfigurator's method) and as
                       back-to-back eager calls.
4. ``attention.csv``   F.scaled_dot_product_attention causal forward and forward+backward for each SDPA backend
                       (flash, cuDNN, efficient; default), at shapes of aiconfigurator's H100 context-attention
                       grid, and the kernel names the default backend launches.
5. ``optimizer.csv``   AdamW step over the parameter shapes of the 125M and 1.1B models: fused, foreach, for-loop.
6. ``elementwise.csv`` element-wise operators eager vs fused at training shapes (tokens x hidden): RMSNorm
                       (estimate-train-time's GPT-NeoX implementation, torchtitan's eager one, F.rms_norm,
                       torch.compile), SwiGLU, RoPE (rotate-half, complex, compiled), residual add, cross-entropy;
                       forward and backward separately, time and achieved GB/s; plus estimate-train-time's own
                       fp16 implementations at shapes present in its A100 / GH200 sample files.
   Every element-wise row has ``gpu_ms`` (a long sleep kernel is queued first so the CPU has launched every
   kernel before the GPU reaches them: kernel span without launch gaps, comparable to estimate-train-time's
   profiler spans) and ``eager_ms`` (no such prefill: what eager code pays when the CPU is the bottleneck).
``env.json`` records the GPU, SM count, L2, memory, clocks, driver, torch/CUDA/cuDNN/Triton versions.
``log.txt`` is the printed log.

Run (one GPU, ~6 minutes with the default budget):
    PYTHONUNBUFFERED=1 python3 measure.py --out OUTDIR --budget-s 330
``--budget-s`` is the wall-clock budget of the whole script: each section starts only if its reserve is left and
stops early when the budget is spent, in priority order (training steps first). ``--smoke`` runs every section at
tiny sizes (on the CPU when there is no GPU; CUDA-only parts are skipped) to check the script itself.
"""
from __future__ import annotations

import argparse
import contextlib
import csv
import gc
import json
import math
import os
import platform
import signal
import statistics
import subprocess
import sys
import time
import traceback

import torch
import torch.nn as nn
import torch.nn.functional as F

SCRIPT_VERSION = "2026-11-27.2"
T0 = time.time()
ARGS = None
DEV = None
LOG = None


def log(*a):
    msg = " ".join(str(x) for x in a)
    line = f"[{time.time() - T0:7.1f}s] {msg}"
    print(line, flush=True)
    if LOG is not None:
        LOG.write(line + "\n")
        LOG.flush()


def left() -> float:
    return ARGS.budget_s - (time.time() - T0)


class Rows:
    """A CSV file written row by row (flushed after each) with a fixed column list."""

    def __init__(self, path, columns):
        self.columns = columns
        self.f = open(path, "w", newline="")
        self.w = csv.DictWriter(self.f, fieldnames=columns, extrasaction="raise")
        self.w.writeheader()
        self.f.flush()

    def add(self, **row):
        out = {}
        for k, v in row.items():
            if isinstance(v, float):
                v = float(f"{v:.6g}")
            out[k] = v
        self.w.writerow(out)
        self.f.flush()


class Timeout(Exception):
    pass


@contextlib.contextmanager
def time_limit(seconds):
    """Raise Timeout in the main thread after ``seconds`` (SIGALRM); a no-op where signals are unavailable."""
    if seconds is None or not hasattr(signal, "SIGALRM"):
        yield
        return

    def handler(signum, frame):
        raise Timeout(f"time limit {seconds:.0f}s reached")

    old = signal.signal(signal.SIGALRM, handler)
    signal.setitimer(signal.ITIMER_REAL, max(1.0, seconds))
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


def cuda() -> bool:
    return DEV.type == "cuda"


def sync():
    if cuda():
        torch.cuda.synchronize()


def free():
    gc.collect()
    if cuda():
        torch.cuda.empty_cache()


def med(xs):
    return statistics.median(xs) if xs else float("nan")


# ----------------------------------------------------------------------------------------------- timing helpers
SLEEP_CYCLES_PER_MS = None


def calibrate_sleep():
    """Cycles of torch.cuda._sleep per millisecond on this GPU (for the prefill that hides launch gaps)."""
    global SLEEP_CYCLES_PER_MS
    if not cuda():
        return None
    n = 2_000_000
    torch.cuda._sleep(n)
    sync()
    e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    ts = []
    for _ in range(5):
        e0.record()
        torch.cuda._sleep(n)
        e1.record()
        e1.synchronize()
        ts.append(e0.elapsed_time(e1))
    SLEEP_CYCLES_PER_MS = n / med(ts)
    return SLEEP_CYCLES_PER_MS


def time_region(region, setup=None, reps=10, warm=2, prefill_ms=0.0):
    """Milliseconds per call of ``region(state)`` (state = ``setup()``), one sample per rep.

    CUDA: events around the region after a synchronize; with ``prefill_ms`` a sleep kernel of that length is
    queued before the start event, so the CPU enqueues the region's kernels while the GPU sleeps and the events
    measure GPU time without launch gaps. CPU: perf_counter.
    """
    out = []
    for i in range(warm + reps):
        state = setup() if setup else None
        sync()
        if cuda():
            e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            if prefill_ms and SLEEP_CYCLES_PER_MS:
                torch.cuda._sleep(int(prefill_ms * SLEEP_CYCLES_PER_MS))
            e0.record()
            region(state)
            e1.record()
            e1.synchronize()
            ms = e0.elapsed_time(e1)
        else:
            t = time.perf_counter()
            region(state)
            ms = (time.perf_counter() - t) * 1e3
        del state
        if i >= warm:
            out.append(ms)
    return out


# --------------------------------------------------------------------------------------------------- environment
def env_info():
    info = dict(script_version=SCRIPT_VERSION, date_utc=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                python=sys.version.split()[0], platform=platform.platform(), torch=torch.__version__,
                cuda=torch.version.cuda, hostname=platform.node(), argv=sys.argv)
    info.update(host_cpu())
    try:
        import triton
        info["triton"] = triton.__version__
    except Exception as e:  # noqa: BLE001
        info["triton"] = f"unavailable: {e}"
    if cuda():
        p = torch.cuda.get_device_properties(0)
        info.update(gpu_name=p.name, sm_count=p.multi_processor_count, total_memory_gib=p.total_memory / 2**30,
                    capability=f"{p.major}.{p.minor}", l2_cache_mb=getattr(p, "L2_cache_size", 0) / 1e6,
                    cudnn=torch.backends.cudnn.version())
        info["nvidia_smi_start"] = nvidia_smi()
    return info


def host_cpu():
    """Host CPU model, logical CPUs and lscpu (eager PyTorch's per-kernel cost is host CPU time)."""
    out = {"cpu_count": os.cpu_count()}
    try:
        with open("/proc/cpuinfo") as f:
            lines = f.read().splitlines()
        names = [ln.split(":", 1)[1].strip() for ln in lines if ln.startswith("model name")]
        mhz = [float(ln.split(":", 1)[1]) for ln in lines if ln.startswith("cpu MHz")]
        out["cpu_model"] = names[0] if names else ""
        out["cpu_mhz_reported"] = statistics.median(mhz) if mhz else ""
    except Exception as e:  # noqa: BLE001
        out["cpu_model"] = f"unreadable: {e!r}"
    try:
        r = subprocess.run(["lscpu"], capture_output=True, text=True, timeout=10)
        out["lscpu"] = r.stdout[:3000]
    except Exception as e:  # noqa: BLE001
        out["lscpu"] = f"lscpu failed: {e!r}"
    return out


def nvidia_smi():
    q = ("name,driver_version,pstate,clocks.sm,clocks.max.sm,clocks.mem,clocks.max.mem,power.draw,power.limit,"
         "temperature.gpu,persistence_mode,compute_mode,mig.mode.current,ecc.mode.current")
    try:
        r = subprocess.run(["nvidia-smi", f"--query-gpu={q}", "--format=csv"], capture_output=True, text=True,
                           timeout=20)
        return r.stdout.strip() or r.stderr.strip()
    except Exception as e:  # noqa: BLE001
        return f"nvidia-smi failed: {e}"


def peak_checks(info):
    """The two ceilings (METHOD.md): a large device-to-device copy and a large bf16 matmul."""
    if not cuda():
        return
    n = 1 << 28  # 512 MiB bf16
    a = torch.randn(n, device=DEV, dtype=torch.bfloat16)
    b = torch.empty_like(a)
    ts = time_region(lambda s: b.copy_(a), reps=10, warm=3)
    info["d2d_copy_GBps_read_plus_write"] = 2 * n * 2 / (med(ts) / 1e3) / 1e9
    del a, b
    x = torch.randn(8192, 8192, device=DEV, dtype=torch.bfloat16)
    w = torch.randn(8192, 8192, device=DEV, dtype=torch.bfloat16)
    ts = time_region(lambda s: x @ w, reps=10, warm=3)
    info["matmul_8192_bf16_tflops"] = 2 * 8192**3 / (med(ts) / 1e3) / 1e12
    del x, w
    free()


# ------------------------------------------------------------------------------------------------- 1. overheads
def section_overheads(out):
    rows = Rows(os.path.join(out, "overheads.csv"),
                ["item", "n_kernels", "per_kernel_us", "cpu_issue_per_kernel_us", "total_ms", "reps", "notes"])
    n = 20 if ARGS.smoke else 1000
    x = torch.zeros(16, device=DEV)
    a = torch.randn(64, 64, device=DEV)
    w32 = torch.randn(64, 64, device=DEV)

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
            ev = time_region(lambda s_: g.replay(), reps=5, warm=1)
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


# --------------------------------------------------------------------------------------------------- the model
class RMSNorm(nn.Module):
    """torchtitan models/norms.py RMSNorm (eager): x.float(), pow, mean, rsqrt, mul, type_as, mul weight."""

    def __init__(self, dim, eps=1e-5):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def _norm(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)

    def forward(self, x):
        return self._norm(x.float()).type_as(x) * self.weight


def precompute_freqs_cis(dim, end, theta=10000.0):
    freqs = 1.0 / (theta ** (torch.arange(0, dim, 2)[: dim // 2].float() / dim))
    t = torch.arange(end, dtype=torch.float32)
    freqs = torch.outer(t, freqs)
    return torch.polar(torch.ones_like(freqs), freqs)


def apply_rotary_emb(xq, xk, freqs_cis):
    """torchtitan models/llama3 apply_rotary_emb: complex multiply in fp32, type_as back."""
    xq_ = torch.view_as_complex(xq.float().reshape(*xq.shape[:-1], -1, 2))
    xk_ = torch.view_as_complex(xk.float().reshape(*xk.shape[:-1], -1, 2))
    fc = freqs_cis[: xq.shape[1]].view(1, xq.shape[1], 1, xq_.shape[-1])
    xq_out = torch.view_as_real(xq_ * fc).flatten(3)
    xk_out = torch.view_as_real(xk_ * fc).flatten(3)
    return xq_out.type_as(xq), xk_out.type_as(xk)


def repeat_kv(x, n_rep):
    bs, slen, n_kv, hd = x.shape
    if n_rep == 1:
        return x
    return x[:, :, :, None, :].expand(bs, slen, n_kv, n_rep, hd).reshape(bs, slen, n_kv * n_rep, hd)


class Attention(nn.Module):
    def __init__(self, dim, n_heads, n_kv):
        super().__init__()
        self.n_heads, self.n_kv, self.hd = n_heads, n_kv, dim // n_heads
        self.wq = nn.Linear(dim, n_heads * self.hd, bias=False)
        self.wk = nn.Linear(dim, n_kv * self.hd, bias=False)
        self.wv = nn.Linear(dim, n_kv * self.hd, bias=False)
        self.wo = nn.Linear(n_heads * self.hd, dim, bias=False)

    def forward(self, x, freqs_cis):
        bs, s, _ = x.shape
        xq = self.wq(x).view(bs, s, self.n_heads, self.hd)
        xk = self.wk(x).view(bs, s, self.n_kv, self.hd)
        xv = self.wv(x).view(bs, s, self.n_kv, self.hd)
        xq, xk = apply_rotary_emb(xq, xk, freqs_cis)
        rep = self.n_heads // self.n_kv
        xk, xv = repeat_kv(xk, rep), repeat_kv(xv, rep)
        o = F.scaled_dot_product_attention(xq.transpose(1, 2), xk.transpose(1, 2), xv.transpose(1, 2),
                                           is_causal=True)
        return self.wo(o.transpose(1, 2).contiguous().view(bs, s, -1))


class FeedForward(nn.Module):
    def __init__(self, dim, ffn):
        super().__init__()
        self.w1 = nn.Linear(dim, ffn, bias=False)
        self.w2 = nn.Linear(ffn, dim, bias=False)
        self.w3 = nn.Linear(dim, ffn, bias=False)

    def forward(self, x):
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


class Block(nn.Module):
    def __init__(self, dim, n_heads, n_kv, ffn):
        super().__init__()
        self.attention = Attention(dim, n_heads, n_kv)
        self.feed_forward = FeedForward(dim, ffn)
        self.attention_norm = RMSNorm(dim)
        self.ffn_norm = RMSNorm(dim)

    def forward(self, x, freqs_cis):
        h = x + self.attention(self.attention_norm(x), freqs_cis)
        return h + self.feed_forward(self.ffn_norm(h))


class Llama(nn.Module):
    def __init__(self, L, dim, n_heads, n_kv, ffn, vocab, max_seq):
        super().__init__()
        self.tok_embeddings = nn.Embedding(vocab, dim)
        self.layers = nn.ModuleList([Block(dim, n_heads, n_kv, ffn) for _ in range(L)])
        self.norm = RMSNorm(dim)
        self.output = nn.Linear(dim, vocab, bias=False)
        self.register_buffer("freqs_cis", precompute_freqs_cis(dim // n_heads, max_seq), persistent=False)
        for p in self.parameters():
            if p.dim() > 1:
                nn.init.normal_(p, std=0.02)

    def forward(self, tokens):
        h = self.tok_embeddings(tokens)
        for layer in self.layers:
            h = layer(h, self.freqs_cis)
        return self.output(self.norm(h))


MODELS = {  # name: (layers, hidden, heads, kv_heads, ffn, vocab)
    "llama-125m": (12, 768, 12, 12, 2048, 32000),
    "llama-370m": (24, 1024, 16, 16, 2816, 32000),
    "tinyllama-1.1b": (22, 2048, 32, 4, 5632, 32000),
}
SMOKE_MODELS = {"tiny-a": (2, 64, 4, 4, 128, 512), "tiny-b": (2, 64, 4, 2, 128, 512)}


def model_flops(cfg, seq, mbs):
    """(6 x non-embedding matmul params x tokens, causal attention score/context FLOPs x 3) per step."""
    L, h, nh, nkv, ffn, V = cfg
    hd = h // nh
    per_layer = h * nh * hd + 2 * h * nkv * hd + nh * hd * h + 3 * h * ffn
    dense = 6 * (L * per_layer + h * V) * seq * mbs
    attn = 3 * L * 2 * 2 * mbs * seq * seq * nh * hd * 0.5
    return dense, attn


def n_params(model):
    return sum(p.numel() for p in model.parameters())


TRAIN_COLS = ["model", "params", "n_layers", "hidden", "n_heads", "n_kv_heads", "ffn_hidden", "vocab", "seq_len",
              "mbs", "tokens_per_step", "mode", "status", "step_ms_median", "step_ms_min", "step_ms_max",
              "step_event_ms_median", "step_cpu_ms_median",
              "fwdbwd_ms_median", "fwdbwd_cpu_ms_median", "opt_step_ms_median", "tokens_per_s", "model_tflops",
              "attn_tflops_causal", "achieved_tflops", "mfu_pct_989", "peak_mem_gib", "compile_s", "n_warmup",
              "n_timed", "step_ms_all", "notes"]


def autocast():
    return torch.autocast(DEV.type, dtype=torch.bfloat16)


def make_step(model, opt, tokens, labels, with_opt=True):
    def step(_=None):
        with autocast():
            pred = model(tokens)
            loss = F.cross_entropy(pred.flatten(0, 1).float(), labels.flatten(0, 1))
        loss.backward()
        if with_opt:
            opt.step()
        opt.zero_grad(set_to_none=True)
    return step


def time_steps(fn, warm, reps):
    """Wall ms per step (synchronize before and after each) and CUDA-event ms, after ``warm`` untimed steps."""
    wall, ev, cpu, first = [], [], [], None
    for i in range(warm + reps):
        sync()
        t = time.perf_counter()
        if cuda():
            e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            e0.record()
            fn()
            e1.record()
            tc = time.perf_counter()
            sync()
            evm = e0.elapsed_time(e1)
        else:
            fn()
            tc = time.perf_counter()
            evm = float("nan")
        ms = (time.perf_counter() - t) * 1e3
        if i == 0:
            first = ms
        if i >= warm:
            wall.append(ms)
            ev.append(evm)
            cpu.append((tc - t) * 1e3)
    return wall, ev, cpu, first


def run_config(rows, name, cfg, model, opt, seq, mbs, mode, opt_ms, compile_first=None):
    L, h, nh, nkv, ffn, V = cfg
    tokens = torch.randint(0, V, (mbs, seq), device=DEV)
    labels = torch.randint(0, V, (mbs, seq), device=DEV)
    if cuda():
        torch.cuda.reset_peak_memory_stats()
    warm, reps = (3, 5) if not ARGS.smoke else (1, 2)
    wall, ev, cpu, first = time_steps(make_step(model, opt, tokens, labels, True), warm, reps)
    fb_wall, _, fb_cpu, _ = time_steps(make_step(model, opt, tokens, labels, False), 1, reps)
    peak = torch.cuda.max_memory_allocated() / 2**30 if cuda() else float("nan")
    dense, attn = model_flops(cfg, seq, mbs)
    step_s = med(wall) / 1e3
    compile_s = ""
    if mode == "compile":
        compile_s = (compile_first if compile_first is not None else first) / 1e3 - step_s
    rows.add(model=name, params=n_params(model), n_layers=L, hidden=h, n_heads=nh, n_kv_heads=nkv, ffn_hidden=ffn,
             vocab=V, seq_len=seq, mbs=mbs, tokens_per_step=seq * mbs, mode=mode, status="ok",
             step_ms_median=med(wall), step_ms_min=min(wall), step_ms_max=max(wall), step_event_ms_median=med(ev),
             step_cpu_ms_median=med(cpu), fwdbwd_ms_median=med(fb_wall), fwdbwd_cpu_ms_median=med(fb_cpu),
             opt_step_ms_median=opt_ms, tokens_per_s=seq * mbs / step_s,
             model_tflops=dense / 1e12, attn_tflops_causal=attn / 1e12,
             achieved_tflops=(dense + attn) / step_s / 1e12, mfu_pct_989=(dense + attn) / step_s / 989e12 * 100,
             peak_mem_gib=peak, compile_s=compile_s, n_warmup=warm, n_timed=reps,
             step_ms_all=";".join(f"{x:.3f}" for x in wall),
             notes="fp32 params + fused AdamW, autocast bf16; step = fwd+bwd+opt.step+zero_grad(set_to_none)")
    log(f"train {name} {mode} s={seq} mbs={mbs}: step {med(wall):.2f} ms, fwd+bwd {med(fb_wall):.2f} ms, "
        f"{seq * mbs / step_s:,.0f} tok/s, peak {peak:.1f} GiB")


def build(cfg, max_seq):
    L, h, nh, nkv, ffn, V = cfg
    torch.manual_seed(0)
    model = Llama(L, h, nh, nkv, ffn, V, max_seq).to(DEV)
    kw = dict(fused=True) if cuda() else dict(foreach=False)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, betas=(0.9, 0.95), weight_decay=0.1, eps=1e-8, **kw)
    return model, opt


def opt_alone_ms(model, opt):
    """Optimizer step alone (gradients present, random), median of 5 after 2 warm-ups, wall with synchronize."""
    for p in model.parameters():
        p.grad = torch.randn_like(p) * 1e-3
    ts = time_region(lambda s: opt.step(), reps=5, warm=2)
    opt.zero_grad(set_to_none=True)
    return med(ts)


def oom_row(rows, name, cfg, seq, mbs, mode, status, notes):
    L, h, nh, nkv, ffn, V = cfg
    rows.add(model=name, n_layers=L, hidden=h, n_heads=nh, n_kv_heads=nkv, ffn_hidden=ffn, vocab=V, seq_len=seq,
             mbs=mbs, tokens_per_step=seq * mbs, mode=mode, status=status, notes=notes)


def section_train_eager(out, rows):
    models = SMOKE_MODELS if ARGS.smoke else MODELS
    seqs = (32, 64) if ARGS.smoke else (1024, 2048, 4096)
    mbss = (1, 2) if ARGS.smoke else (1, 2, 4, 8)
    reserve = ARGS.budget_s * 0.45  # keep time for the other sections
    for name, cfg in models.items():
        if left() < reserve:
            log(f"train eager: budget reserve reached, skipping {name}")
            for seq in seqs:
                for mbs in mbss:
                    oom_row(rows, name, cfg, seq, mbs, "eager", "skipped_budget", "")
            continue
        model, opt = build(cfg, max(seqs))
        opt_ms = opt_alone_ms(model, opt)
        log(f"train {name}: {n_params(model) / 1e6:.1f} M params, AdamW(fused) step alone {opt_ms:.2f} ms")
        failed = set()  # (seq, mbs) that ran out of memory: larger ones are skipped
        for seq in seqs:
            for mbs in mbss:
                if any(s <= seq and m <= mbs for s, m in failed):
                    oom_row(rows, name, cfg, seq, mbs, "eager", "skipped_oom",
                            "a smaller seq x mbs ran out of memory")
                    continue
                if left() < reserve:
                    oom_row(rows, name, cfg, seq, mbs, "eager", "skipped_budget", "")
                    continue
                err = None
                try:
                    run_config(rows, name, cfg, model, opt, seq, mbs, "eager", opt_ms)
                except torch.cuda.OutOfMemoryError as e:  # noqa: PERF203
                    err = "oom: " + str(e).split("\n")[0][:200]
                except Exception as e:  # noqa: BLE001
                    err = "error: " + repr(e)[:300]
                if err:
                    opt.zero_grad(set_to_none=True)
                    free()
                    failed.add((seq, mbs))
                    oom_row(rows, name, cfg, seq, mbs, "eager", "oom" if err.startswith("oom") else "error", err)
                    log(f"train {name} s={seq} mbs={mbs}: {err[:120]}")
                free()
        del model, opt
        free()


def section_train_compiled(out, rows):
    import torch._dynamo
    for attr in ("cache_size_limit", "recompile_limit", "accumulated_cache_size_limit",
                 "accumulated_recompile_limit"):
        if hasattr(torch._dynamo.config, attr):
            setattr(torch._dynamo.config, attr, 512)
    models = SMOKE_MODELS if ARGS.smoke else MODELS
    plan = [("tiny-a", 64, 2)] if ARGS.smoke else [("llama-125m", 2048, 4), ("tinyllama-1.1b", 2048, 4),
                                                   ("llama-370m", 2048, 4)]
    for name, seq, mbs in plan:
        cfg = models[name]
        need = 25 if ARGS.smoke else 75
        if left() < need:
            log(f"train compile {name}: {left():.0f}s left < {need}s, skipped")
            oom_row(rows, name, cfg, seq, mbs, "compile", "skipped_budget", "")
            continue
        err = None
        try:
            with time_limit(left() - 10):
                model, opt = build(cfg, seq)
                for i, layer in enumerate(model.layers):  # torchtitan apply_compile: each block on its own
                    model.layers.register_module(str(i), torch.compile(layer, fullgraph=True))
                opt_ms = opt_alone_ms(model, opt)
                t = time.perf_counter()
                tokens = torch.randint(0, cfg[5], (mbs, seq), device=DEV)
                make_step(model, opt, tokens, tokens, True)()
                sync()
                first = (time.perf_counter() - t) * 1e3
                run_config(rows, name, cfg, model, opt, seq, mbs, "compile", opt_ms, compile_first=first)
        except Timeout as e:
            err = "timeout: " + str(e)
        except torch.cuda.OutOfMemoryError as e:
            err = "oom: " + str(e).split("\n")[0][:200]
        except Exception as e:  # noqa: BLE001
            err = "error: " + repr(e)[:300]
            traceback.print_exc()
        if err:
            oom_row(rows, name, cfg, seq, mbs, "compile", err.split(":")[0], err)
            log(f"train compile {name}: {err[:200]}")
        model = opt = None
        free()


GRAPH_COLS = ["model", "params", "seq_len", "mbs", "tokens_per_step", "status", "eager_step_ms", "eager_step_cpu_ms",
              "graph_step_ms", "graph_capture_s", "eager_minus_graph_ms", "eager_over_graph", "peak_mem_gib",
              "n_timed", "notes"]
GRAPH_PLAN = [("llama-125m", 1024, 1), ("llama-125m", 2048, 4), ("llama-125m", 4096, 8), ("llama-370m", 1024, 1),
              ("llama-370m", 2048, 4), ("tinyllama-1.1b", 1024, 1), ("tinyllama-1.1b", 2048, 4),
              ("tinyllama-1.1b", 4096, 2)]


def graph_config(rows, name, cfg, seq, mbs):
    """The eager training step, timed as eager code and as one captured CUDA graph (same kernels, no CPU)."""
    L, h, nh, nkv, ffn, V = cfg
    model, opt = build(cfg, seq)
    tokens = torch.randint(0, V, (mbs, seq), device=DEV)
    labels = torch.randint(0, V, (mbs, seq), device=DEV)
    warm, reps = (3, 5) if not ARGS.smoke else (1, 2)
    wall, _, cpu, _ = time_steps(make_step(model, opt, tokens, labels, True), warm, reps)
    del opt
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, betas=(0.9, 0.95),
                            weight_decay=0.1, eps=1e-8, fused=True, capturable=True)

    def step():
        with torch.autocast("cuda", dtype=torch.bfloat16, cache_enabled=False):
            pred = model(tokens)
            loss = F.cross_entropy(pred.flatten(0, 1).float(), labels.flatten(0, 1))
        loss.backward()
        opt.step()
    torch.cuda.reset_peak_memory_stats()
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(3):
            opt.zero_grad(set_to_none=True)
            step()
    torch.cuda.current_stream().wait_stream(s)
    sync()
    opt.zero_grad(set_to_none=True)
    free()
    t = time.perf_counter()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        step()
    sync()
    cap = time.perf_counter() - t
    ts = time_region(lambda s_: g.replay(), reps=10 if not ARGS.smoke else 2, warm=2)
    peak = torch.cuda.max_memory_allocated() / 2**30
    rows.add(model=name, params=n_params(model), seq_len=seq, mbs=mbs, tokens_per_step=seq * mbs, status="ok",
             eager_step_ms=med(wall), eager_step_cpu_ms=med(cpu), graph_step_ms=med(ts), graph_capture_s=cap,
             eager_minus_graph_ms=med(wall) - med(ts), eager_over_graph=med(wall) / med(ts), peak_mem_gib=peak,
             n_timed=len(ts), notes="same model and kernels; graph = fwd+bwd+AdamW(fused, capturable) captured "
             "once (autocast cache off), replay timed with CUDA events; eager = wall with synchronize per step")
    log(f"graphstep {name} s={seq} mbs={mbs}: eager {med(wall):.2f} ms (CPU {med(cpu):.2f}), "
        f"graph {med(ts):.2f} ms")
    del g


def section_graphstep(out):
    rows = Rows(os.path.join(out, "graph_steps.csv"), GRAPH_COLS)
    if not cuda():
        log("graphstep: CUDA only, skipped")
        return
    models = SMOKE_MODELS if ARGS.smoke else MODELS
    plan = [("tiny-a", 64, 2)] if ARGS.smoke else GRAPH_PLAN
    for name, seq, mbs in plan:
        if left() < 40:
            rows.add(model=name, seq_len=seq, mbs=mbs, status="skipped_budget")
            continue
        err = None
        try:
            graph_config(rows, name, models[name], seq, mbs)
        except torch.cuda.OutOfMemoryError as e:
            err = "oom: " + str(e).split("\n")[0][:200]
        except Exception as e:  # noqa: BLE001
            err = "error: " + repr(e)[:300]
            traceback.print_exc()
        if err:
            rows.add(model=name, seq_len=seq, mbs=mbs, status=err.split(":")[0], notes=err)
            log(f"graphstep {name} s={seq} mbs={mbs}: {err[:150]}")
        free()


COMPILE2_PLAN = [("llama-125m", 1024, 1, "default"), ("llama-125m", 2048, 4, "reduce-overhead"),
                 ("llama-125m", 1024, 1, "reduce-overhead"), ("tinyllama-1.1b", 2048, 4, "reduce-overhead")]


def section_compile2(out, rows):
    """torch.compile beyond the per-block default: a small configuration, and whole-model mode='reduce-overhead'
    (inductor + CUDA graphs via cudagraph trees) for forward and backward; the optimizer stays eager fused AdamW."""
    import torch._dynamo
    for attr in ("cache_size_limit", "recompile_limit"):
        if hasattr(torch._dynamo.config, attr):
            setattr(torch._dynamo.config, attr, 512)
    models = SMOKE_MODELS if ARGS.smoke else MODELS
    plan = [("tiny-a", 32, 1, "default")] if ARGS.smoke else COMPILE2_PLAN
    for name, seq, mbs, cmode in plan:
        cfg = models[name]
        label = "compile" if cmode == "default" else "compile_reduce_overhead"
        if cmode != "default" and not cuda():
            continue
        if left() < (25 if ARGS.smoke else 70):
            oom_row(rows, name, cfg, seq, mbs, label, "skipped_budget", "")
            continue
        err = None
        try:
            with time_limit(left() - 10):
                torch._dynamo.reset()
                model, opt = build(cfg, seq)
                if cmode == "default":
                    for i, layer in enumerate(model.layers):
                        model.layers.register_module(str(i), torch.compile(layer, fullgraph=True))
                    fwd_model = model
                else:
                    fwd_model = torch.compile(model, mode="reduce-overhead")
                opt_ms = opt_alone_ms(model, opt)
                holder = _Wrap(fwd_model, cmode != "default")
                t = time.perf_counter()
                tokens = torch.randint(0, cfg[5], (mbs, seq), device=DEV)
                make_step(holder, opt, tokens, tokens, True)()
                sync()
                first = (time.perf_counter() - t) * 1e3
                run_config(rows, name, cfg, holder, opt, seq, mbs, label, opt_ms, compile_first=first)
        except Timeout as e:
            err = "timeout: " + str(e)
        except torch.cuda.OutOfMemoryError as e:
            err = "oom: " + str(e).split("\n")[0][:200]
        except Exception as e:  # noqa: BLE001
            err = "error: " + repr(e)[:300]
            traceback.print_exc()
        if err:
            oom_row(rows, name, cfg, seq, mbs, label, err.split(":")[0], err)
            log(f"train {label} {name}: {err[:200]}")
        model = opt = fwd_model = holder = None
        free()


class _Wrap(nn.Module):
    """Calls the (compiled) model; with CUDA graphs marks a new step first (cudagraph trees)."""

    def __init__(self, m, mark):
        super().__init__()
        self.m, self.mark = m, mark

    def forward(self, tokens):
        if self.mark:
            torch.compiler.cudagraph_mark_step_begin()
        return self.m(tokens)


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
    gr = time_region(lambda s_: g.replay(), reps=5, warm=2)
    del g
    return med(gr) / reps_per_call, eager_ms


def section_gemm(out):
    rows = Rows(os.path.join(out, "gemm.csv"),
                ["dtype", "m", "n", "k", "graph_ms", "eager_ms", "graph_tflops", "eager_tflops", "weight_copies",
                 "calls_per_sample", "notes"])
    shapes = [(8, 64, 64), (32, 128, 64)] if ARGS.smoke else GEMM_SHAPES
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
            x = torch.randn(m, k, device=DEV, dtype=torch.bfloat16)
            ws = [torch.randn(n, k, device=DEV, dtype=torch.bfloat16) for _ in range(n_w)]
            g_ms, e_ms = gemm_time(lambda i: F.linear(x, ws[i]), n_w, calls)
            rows.add(dtype="bf16", m=m, n=n, k=k, graph_ms=g_ms, eager_ms=e_ms, graph_tflops=flops / g_ms / 1e9,
                     eager_tflops=flops / e_ms / 1e9, weight_copies=n_w, calls_per_sample=calls,
                     notes="F.linear, randn inputs, no bias")
            log(f"gemm bf16 {m}x{n}x{k}: graph {g_ms * 1e3:.1f} us ({flops / g_ms / 1e9:.0f} TF/s), "
                f"eager {e_ms * 1e3:.1f} us")
            del ws
            if fp8_ok and m % 16 == 0 and n % 16 == 0 and k % 16 == 0:
                x8 = x.to(torch.float8_e4m3fn)
                w8 = [torch.randn(n, k, device=DEV, dtype=torch.bfloat16).to(torch.float8_e4m3fn)
                      for _ in range(max(1, min(16, math.ceil(200e6 / (n * k)))))]
                one = torch.ones((), device=DEV, dtype=torch.float32)
                g8, e8 = gemm_time(lambda i: torch._scaled_mm(x8, w8[i].t(), scale_a=one, scale_b=one,
                                                              out_dtype=torch.bfloat16), len(w8), max(calls, len(w8)))
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


def section_attention(out):
    from torch.nn.attention import SDPBackend, sdpa_kernel
    rows = Rows(os.path.join(out, "attention.csv"),
                ["backend", "batch", "seq", "heads", "kv_heads", "head_dim", "gqa_mode", "fwd_ms", "fwdbwd_ms",
                 "fwd_tflops_causal", "fwdbwd_tflops_causal", "status", "notes"])
    shapes = [(1, 64, 4, 2, 16), (2, 32, 4, 4, 16)] if ARGS.smoke else ATTN_SHAPES
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
        q = torch.randn(b, h, s, d, device=DEV, dtype=torch.bfloat16, requires_grad=True)
        k = torch.randn(b, kv, s, d, device=DEV, dtype=torch.bfloat16, requires_grad=True)
        v = torch.randn(b, kv, s, d, device=DEV, dtype=torch.bfloat16, requires_grad=True)
        go = torch.randn(b, h, s, d, device=DEV, dtype=torch.bfloat16)
        if first:
            kern = default_attention_kernels(q, k, v, kv != h)
            log(f"attention default-backend kernels: {kern}")
            first = False
        else:
            kern = ""
        for label, be in backends:
            ctx = (lambda: sdpa_kernel([be])) if be is not None else contextlib.nullcontext
            for gqa_mode in (("enable_gqa", "repeat_kv") if kv != h else ("mha",)):
                try:
                    if gqa_mode == "repeat_kv":
                        kk = k.repeat_interleave(h // kv, dim=1).detach().requires_grad_()
                        vv = v.repeat_interleave(h // kv, dim=1).detach().requires_grad_()
                        kw = {}
                    else:
                        kk, vv, kw = k, v, ({"enable_gqa": True} if kv != h else {})

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
    models = SMOKE_MODELS if ARGS.smoke else {k: MODELS[k] for k in ("llama-125m", "tinyllama-1.1b")}
    for name, cfg in models.items():
        if left() < 20:
            log("optimizer: budget reached")
            break
        with torch.device("meta"):
            shapes = [p.shape for p in Llama(*cfg, max_seq=16).parameters()]
        ps = [torch.randn(s, device=DEV) * 0.02 for s in shapes]
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
                ts = time_region(lambda s: opt.step(), reps=5, warm=2)
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


# ------------------------------------------------------------------------------------------------ 6. element-wise
class NeoXRMSNorm(nn.Module):
    """estimate-train-time Kernel_sampling/megatron/norms.py RMSNorm (GPT-NeoX): fp32 ``scale`` parameter (the
    sampler never casts it), x.norm(2) / sqrt(d), x / (rms + eps), scale * x_normed."""

    def __init__(self, dim, eps=1e-8):
        super().__init__()
        self.eps, self.d = eps, dim
        self.scale = nn.Parameter(torch.ones(dim))

    def forward(self, x):
        norm_x = x.norm(2, dim=-1, keepdim=True)
        rms_x = norm_x * self.d ** (-1.0 / 2)
        return self.scale * (x / (rms_x + self.eps))


def rotate_half(x):
    x1, x2 = x[..., : x.shape[-1] // 2], x[..., x.shape[-1] // 2:]
    return torch.cat((-x2, x1), dim=x1.ndim - 1)


def rope_rotate_half(q, k, cos, sin):
    """estimate-train-time RoPE.py apply_rotary_pos_emb_torch (the GPT-NeoX / HF Llama rotate-half form)."""
    return (q * cos) + (rotate_half(q) * sin), (k * cos) + (rotate_half(k) * sin)


def rope_complex(q, k, fc):
    q_ = torch.view_as_complex(q.float().reshape(*q.shape[:-1], -1, 2))
    k_ = torch.view_as_complex(k.float().reshape(*k.shape[:-1], -1, 2))
    return torch.view_as_real(q_ * fc).flatten(-2).type_as(q), torch.view_as_real(k_ * fc).flatten(-2).type_as(k)


def tt_rmsnorm(x, w, eps=1e-5):
    return (x.float() * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + eps)).type_as(x) * w


def swiglu(a, b):
    return F.silu(a) * b


def ce_tt(logits, labels):
    return F.cross_entropy(logits.float(), labels)


def ce_bf16(logits, labels):
    return F.cross_entropy(logits, labels)


EW_COLS = ["op", "impl", "dtype", "T", "h", "shape", "pass", "gpu_ms", "eager_ms", "min_bytes", "gpu_GBps",
           "compile_s", "source_shape", "notes"]


def measure_op(rows, op, impl, dtype, T, h, shape, fwd, inputs, grads_for, fb_bytes, source_shape="", notes="",
               compile_s="", do_bwd=True, reps=10):
    """Forward and backward rows for ``fwd(*inputs)``; backward = autograd.grad of the output w.r.t. ``grads_for``
    with a random output gradient (fresh forward, untimed, before each timed backward)."""
    fb, bb = fb_bytes
    tf = time_region(lambda s: fwd(*inputs), reps=reps, warm=2, prefill_ms=3)
    te = time_region(lambda s: fwd(*inputs), reps=reps, warm=2)
    rows.add(op=op, impl=impl, dtype=dtype, T=T, h=h, shape=shape, **{"pass": "fwd"}, gpu_ms=med(tf),
             eager_ms=med(te), min_bytes=fb, gpu_GBps=fb / med(tf) / 1e6, compile_s=compile_s,
             source_shape=source_shape, notes=notes)
    if do_bwd:
        out = fwd(*inputs)
        outs = out if isinstance(out, tuple) else (out,)
        go = tuple(torch.randn_like(o) for o in outs)
        del out, outs

        def setup():
            o = fwd(*inputs)
            return o if isinstance(o, tuple) else (o,)

        def bwd(o):
            torch.autograd.grad(o, grads_for, go)
        tb = time_region(bwd, setup=setup, reps=reps, warm=2, prefill_ms=3)
        tbe = time_region(bwd, setup=setup, reps=reps, warm=2)
        rows.add(op=op, impl=impl, dtype=dtype, T=T, h=h, shape=shape, **{"pass": "bwd"}, gpu_ms=med(tb),
                 eager_ms=med(tbe), min_bytes=bb, gpu_GBps=bb / med(tb) / 1e6, compile_s="",
                 source_shape=source_shape, notes=notes)
        del go
    return med(tf)


def compiled(fn):
    return torch.compile(fn, dynamic=False)


def first_call_s(fn, inputs, grads_for):
    """Wall seconds of the first forward+backward (= compile time for a torch.compile'd function)."""
    sync()
    t = time.perf_counter()
    o = fn(*inputs)
    outs = o if isinstance(o, tuple) else (o,)
    torch.autograd.grad(outs, grads_for, tuple(torch.ones_like(x) for x in outs))
    sync()
    return time.perf_counter() - t


def ew_basis_shape(rows, T, h, with_compiled, cfns):
    bf = torch.bfloat16
    dt = "bf16"
    E = T * h
    x = torch.randn(T, h, device=DEV, dtype=bf, requires_grad=True)
    w = torch.ones(h, device=DEV, dtype=bf, requires_grad=True)
    shape = f"[{T},{h}]"
    rms_bytes = (4 * E, 6 * E)
    measure_op(rows, "rmsnorm", "eager_torchtitan", dt, T, h, shape, tt_rmsnorm, (x, w), (x, w), rms_bytes,
               notes="(x.float()*rsqrt(x.float().pow(2).mean(-1)+eps)).type_as(x)*w")
    neox = NeoXRMSNorm(h).to(DEV)
    measure_op(rows, "rmsnorm", "eager_ett_neox", dt, T, h, shape, neox, (x,), (x, neox.scale), (6 * E, 8 * E),
               notes="estimate-train-time's GPT-NeoX RMSNorm, fp32 scale: fp32 output (6/8 B per element)")
    if hasattr(F, "rms_norm"):
        measure_op(rows, "rmsnorm", "F.rms_norm", dt, T, h, shape, lambda a, b: F.rms_norm(a, (h,), b, 1e-5),
                   (x, w), (x, w), rms_bytes)
    if with_compiled:
        cs = first_call_s(cfns["rms"], (x, w), (x, w))
        measure_op(rows, "rmsnorm", "compiled", dt, T, h, shape, cfns["rms"], (x, w), (x, w), rms_bytes,
                   compile_s=cs, notes="torch.compile(torchtitan eager RMSNorm), dynamic=False")
    del neox
    a = torch.randn(T, h, device=DEV, dtype=bf, requires_grad=True)
    b = torch.randn(T, h, device=DEV, dtype=bf, requires_grad=True)
    measure_op(rows, "swiglu", "eager", dt, T, h, shape, swiglu, (a, b), (a, b), (6 * E, 10 * E),
               notes="F.silu(a)*b")
    if with_compiled:
        cs = first_call_s(cfns["swiglu"], (a, b), (a, b))
        measure_op(rows, "swiglu", "compiled", dt, T, h, shape, cfns["swiglu"], (a, b), (a, b), (6 * E, 10 * E),
                   compile_s=cs)
    measure_op(rows, "residual_add", "eager", dt, T, h, shape, torch.add, (a, b), (a, b), (6 * E, 0),
               do_bwd=False, notes="a+b; its backward launches no kernel (gradient passes through)")
    del a, b
    hd = 128 if h >= 128 else h // 2
    nh = h // hd
    q = torch.randn(T, nh, hd, device=DEV, dtype=bf, requires_grad=True)
    k = torch.randn(T, nh, hd, device=DEV, dtype=bf, requires_grad=True)
    ang = torch.arange(T, device=DEV, dtype=torch.float32)[:, None] * torch.rand(hd // 2, device=DEV)[None, :]
    emb = torch.cat((ang, ang), dim=-1)
    cos, sin = emb.cos()[:, None, :].to(bf), emb.sin()[:, None, :].to(bf)
    fc = torch.polar(torch.ones_like(ang), ang)[:, None, :]
    rshape = f"q,k [{T},{nh},{hd}]"
    measure_op(rows, "rope", "eager_rotate_half", dt, T, h, rshape, rope_rotate_half, (q, k, cos, sin), (q, k),
               (8 * E, 8 * E), notes="q*cos+rotate_half(q)*sin for q and k, bf16 cos/sin")
    measure_op(rows, "rope", "eager_complex_torchtitan", dt, T, h, rshape, rope_complex, (q, k, fc), (q, k),
               (8 * E, 8 * E), notes="view_as_complex(x.float()) * freqs_cis, type_as")
    if with_compiled:
        cs = first_call_s(cfns["rope"], (q, k, cos, sin), (q, k))
        measure_op(rows, "rope", "compiled_rotate_half", dt, T, h, rshape, cfns["rope"], (q, k, cos, sin), (q, k),
                   (8 * E, 8 * E), compile_s=cs)
    del q, k, cos, sin, fc, x, w
    free()


def ew_ce(rows, T, V, with_compiled, cfns):
    logits = torch.randn(T, V, device=DEV, dtype=torch.bfloat16, requires_grad=True)
    labels = torch.randint(0, V, (T,), device=DEV)
    E = T * V
    shape = f"[{T},{V}]"
    measure_op(rows, "cross_entropy", "eager_float_torchtitan", "bf16", T, V, shape, ce_tt, (logits, labels),
               (logits,), (2 * E, 4 * E), notes="F.cross_entropy(logits.float(), labels); h column = vocab",
               reps=5)
    measure_op(rows, "cross_entropy", "eager_bf16", "bf16", T, V, shape, ce_bf16, (logits, labels), (logits,),
               (2 * E, 4 * E), notes="F.cross_entropy on bf16 logits; h column = vocab", reps=5)
    if with_compiled:
        cs = first_call_s(cfns["ce"], (logits, labels), (logits,))
        measure_op(rows, "cross_entropy", "compiled", "bf16", T, V, shape, cfns["ce"], (logits, labels),
                   (logits,), (2 * E, 4 * E), compile_s=cs, notes="torch.compile(ce_tt); h column = vocab", reps=5)
    del logits, labels
    free()


# shapes present in both estimate-train-time sample files (A100 Perlmutter and GH200 Vista), fp16
ETT_RMS = [(8, 5120, 8192), (8, 2560, 2560), (2, 5120, 5120), (2, 1024, 2048)]
ETT_ROPE = [(16, 8, 64, 5120, 8192), (4, 4, 56, 1536, 7168), (1, 4, 16, 1024, 2048)]
ETT_RESADD = [(8, 5120, 8192), (2, 5120, 5120), (2, 1024, 2048)]
ETT_GELU = [(16, 8, 5120, 8192), (1, 2, 1024, 2048)]
ETT_LN = [(8, 5120, 8192), (2, 5120, 5120)]


def section_ett(rows):
    """estimate-train-time's own fp16 operator programs at shapes in its sample files (direct H100 comparison)."""
    f16 = torch.float16
    smoke = ARGS.smoke
    for b, l, dim in ([(2, 16, 64)] if smoke else ETT_RMS):
        x = torch.rand(l, b, dim, device=DEV, dtype=f16, requires_grad=True)
        m = NeoXRMSNorm(dim).to(DEV)
        E = l * b * dim
        measure_op(rows, "ett_RMSlayernorm", "eager_ett_neox", "fp16", l * b, dim, f"[{l},{b},{dim}]", m, (x,),
                   (x, m.scale), (6 * E, 8 * E), source_shape=f"b={b},l={l},dim={dim}")
        del x, m
    try:
        jit_rope = torch.jit.script(rope_rotate_half) if cuda() else rope_rotate_half
        jit_note = "torch.jit.script (the fp16 path of estimate-train-time)"
    except Exception as e:  # noqa: BLE001
        jit_rope, jit_note = rope_rotate_half, f"torch.jit.script failed ({e!r:.80}); plain eager"
    for mp, b, h, l, dim in ([(1, 2, 4, 16, 64)] if smoke else ETT_ROPE):
        hd = dim // h
        q = torch.rand(l, b, h // mp, hd, device=DEV, dtype=f16, requires_grad=True)
        k = torch.rand(l, b, h // mp, hd, device=DEV, dtype=f16, requires_grad=True)
        inv = 1.0 / (10000 ** (torch.arange(0, hd, 2, device=DEV, dtype=f16) / hd))
        t = torch.arange(l, device=DEV).type_as(inv)
        emb = torch.cat((torch.einsum("i,j->ij", t, inv),) * 2, dim=-1)
        cos, sin = emb.cos()[:, None, None, :], emb.sin()[:, None, None, :]
        E = q.numel()
        measure_op(rows, "ett_RoPE", "eager_rotate_half_jit", "fp16", l * b, dim // mp, f"q,k [{l},{b},{h // mp},{hd}]",
                   jit_rope, (q, k, cos, sin), (q, k), (8 * E, 8 * E), source_shape=f"mp={mp},b={b},h={h},l={l},dim={dim}",
                   notes=jit_note)
        del q, k
    for b, l, dim in ([(2, 16, 64)] if smoke else ETT_RESADD):
        a = torch.rand(l, b, dim, device=DEV, dtype=f16, requires_grad=True)
        c = torch.rand(l, b, dim, device=DEV, dtype=f16, requires_grad=True)
        E = a.numel()
        measure_op(rows, "ett_res_add", "eager", "fp16", l * b, dim, f"[{l},{b},{dim}]", torch.add, (a, c), (a, c),
                   (6 * E, 0), do_bwd=False, source_shape=f"b={b},l={l},dim={dim}")
        del a, c
    for mp, b, l, dim in ([(1, 2, 16, 64)] if smoke else ETT_GELU):
        a = torch.rand(l, b, dim * 4 // mp, device=DEV, dtype=f16, requires_grad=True)
        E = a.numel()
        measure_op(rows, "ett_gelu", "eager", "fp16", l * b, dim * 4 // mp, f"[{l},{b},{dim * 4 // mp}]", F.gelu,
                   (a,), (a,), (4 * E, 6 * E), source_shape=f"mp={mp},b={b},l={l},dim={dim}")
        del a
    for b, l, dim in ([(2, 16, 64)] if smoke else ETT_LN):
        x = torch.rand(l, b, dim, device=DEV, dtype=f16, requires_grad=True)
        ln = nn.LayerNorm([dim]).to(DEV).half()
        E = x.numel()
        measure_op(rows, "ett_layernorm", "eager", "fp16", l * b, dim, f"[{l},{b},{dim}]", ln, (x,),
                   (x, ln.weight, ln.bias), (4 * E, 6 * E), source_shape=f"b={b},l={l},dim={dim}")
        del x, ln
    free()


EW_SHAPES = [(4096, 2048), (4096, 4096), (4096, 8192), (16384, 2048), (16384, 4096), (16384, 8192),
             (32768, 2048), (32768, 4096), (32768, 8192)]
EW_COMPILED = [(16384, 4096), (4096, 2048), (32768, 8192), (16384, 2048), (32768, 4096)]


def section_elementwise(out, rows, phase):
    smoke = ARGS.smoke
    shapes = [(64, 32), (128, 64)] if smoke else EW_SHAPES
    ce = [(64, 512)] if smoke else [(4096, 32000), (8192, 32000), (4096, 128256), (8192, 128256)]
    if phase == "eager":
        for T, h in shapes:
            if left() < 25:
                log("elementwise eager: budget reached")
                return
            try:
                ew_basis_shape(rows, T, h, False, None)
                log(f"elementwise eager [{T},{h}] done")
            except torch.cuda.OutOfMemoryError as e:
                log(f"elementwise [{T},{h}] OOM {e!s:.80}")
            free()
        for T, V in ce:
            if left() < 20:
                return
            ew_ce(rows, T, V, False, None)
            log(f"cross-entropy eager [{T},{V}] done")
        if left() > 20:
            section_ett(rows)
            log("estimate-train-time fp16 replicas done")
        return
    # compiled
    import torch._dynamo
    for attr in ("cache_size_limit", "recompile_limit"):
        if hasattr(torch._dynamo.config, attr):
            setattr(torch._dynamo.config, attr, 512)
    cfns = dict(rms=compiled(tt_rmsnorm), swiglu=compiled(swiglu), rope=compiled(rope_rotate_half),
                ce=compiled(ce_tt))
    cshapes = [(64, 32)] if smoke else EW_COMPILED
    for i, (T, h) in enumerate(cshapes):
        if left() < 30:
            log("elementwise compiled: budget reached")
            break
        try:
            with time_limit(left() - 12):
                ew_basis_shape(rows, T, h, True, cfns)
                log(f"elementwise compiled [{T},{h}] done")
                if i < len(ce) and left() > 30:
                    ew_ce(rows, *ce[i], True, cfns)
                    log(f"cross-entropy compiled {ce[i]} done")
        except (Timeout, Exception) as e:  # noqa: BLE001
            log(f"elementwise compiled [{T},{h}]: {e!r}"[:200])
        free()


# --------------------------------------------------------------------------------------------------------- main
def main():
    global ARGS, DEV, LOG
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", required=True, help="output folder (created)")
    ap.add_argument("--budget-s", type=float, default=330.0, help="wall-clock budget of the whole script, seconds")
    ap.add_argument("--smoke", action="store_true", help="tiny sizes (CPU check of the script)")
    ap.add_argument("--only", default="", help="comma list of sections to run (default all): "
                    "overheads,train,gemm,attention,optimizer,elementwise,compile,ewcompile,graphstep,compile2")
    ARGS = ap.parse_args()
    os.makedirs(ARGS.out, exist_ok=True)
    LOG = open(os.path.join(ARGS.out, "log.txt"), "w")
    DEV = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    torch.backends.cuda.matmul.allow_tf32 = False
    only = set(filter(None, ARGS.only.split(",")))

    def want(s):
        return not only or s in only

    info = env_info()
    log("device", DEV, info.get("gpu_name", ""), "torch", torch.__version__, "cuda", torch.version.cuda)
    if cuda():
        info["sleep_cycles_per_ms"] = calibrate_sleep()
        peak_checks(info)
        log(f"ceilings: copy {info['d2d_copy_GBps_read_plus_write']:.0f} GB/s, "
            f"bf16 matmul 8192^3 {info['matmul_8192_bf16_tflops']:.0f} TFLOP/s")
    with open(os.path.join(ARGS.out, "env.json"), "w") as f:
        json.dump(info, f, indent=1)
    train_rows = Rows(os.path.join(ARGS.out, "train_steps.csv"), TRAIN_COLS)
    ew_rows = Rows(os.path.join(ARGS.out, "elementwise.csv"), EW_COLS)
    sections = [("overheads", lambda: section_overheads(ARGS.out)),
                ("train", lambda: section_train_eager(ARGS.out, train_rows)),
                ("gemm", lambda: section_gemm(ARGS.out)),
                ("attention", lambda: section_attention(ARGS.out)),
                ("optimizer", lambda: section_optimizer(ARGS.out)),
                ("elementwise", lambda: section_elementwise(ARGS.out, ew_rows, "eager")),
                ("compile", lambda: section_train_compiled(ARGS.out, train_rows)),
                ("ewcompile", lambda: section_elementwise(ARGS.out, ew_rows, "compiled")),
                ("graphstep", lambda: section_graphstep(ARGS.out)),
                ("compile2", lambda: section_compile2(ARGS.out, train_rows))]
    status = {}
    for name, fn in sections:
        if not want(name):
            continue
        t = time.time()
        try:
            fn()
            status[name] = f"ok {time.time() - t:.1f}s"
        except Exception as e:  # noqa: BLE001
            status[name] = f"failed after {time.time() - t:.1f}s: {e!r}"[:400]
            log(f"section {name} FAILED: {e!r}")
            traceback.print_exc()
        free()
        log(f"section {name}: {status[name]} ({left():.0f}s of budget left)")
    info["sections"] = status
    if cuda():
        info["nvidia_smi_end"] = nvidia_smi()
        info["max_memory_allocated_gib"] = torch.cuda.max_memory_allocated() / 2**30
    info["wall_s"] = time.time() - T0
    with open(os.path.join(ARGS.out, "env.json"), "w") as f:
        json.dump(info, f, indent=1)
    log("done", json.dumps(status))


if __name__ == "__main__":
    main()
