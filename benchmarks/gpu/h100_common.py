"""Shared state, timing and environment helpers of measure_h100.py (see its docstring)."""
from __future__ import annotations

import contextlib
import csv
import gc
import io
import os
import platform
import signal
import statistics
import subprocess
import sys
import time
import types
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository root, for costmodel.core.fileio
from costmodel.core.fileio import atomic_write_text  # noqa: E402

SCRIPT_VERSION = "2026-11-27.3"
T0 = time.time()
S = types.SimpleNamespace(args=None, dev=None, log=None, log_lines=[])
"""Run-wide state: parsed arguments, torch device, log file path and its lines (set by measure_h100.main)."""


def log(*a):
    """Print a time-stamped line and rewrite the log file with it (atomically, so a run killed at its time limit
    leaves a whole file)."""
    msg = " ".join(str(x) for x in a)
    line = f"[{time.time() - T0:7.1f}s] {msg}"
    print(line, flush=True)
    if S.log is not None:
        S.log_lines.append(line)
        atomic_write_text(S.log, "\n".join(S.log_lines) + "\n")


def left() -> float:
    return S.args.budget_s - (time.time() - T0)


class Rows:
    """A CSV file with a fixed column list, rewritten atomically after each row (a run stopped at its time limit
    keeps every row measured so far)."""

    def __init__(self, path, columns):
        self.path, self.columns = path, columns
        self.buf = io.StringIO()
        self.w = csv.DictWriter(self.buf, fieldnames=columns, extrasaction="raise")
        self.w.writeheader()
        atomic_write_text(self.path, self.buf.getvalue())

    def add(self, **row):
        out = {}
        for k, v in row.items():
            if isinstance(v, float):
                v = float(f"{v:.6g}")
            out[k] = v
        self.w.writerow(out)
        atomic_write_text(self.path, self.buf.getvalue())


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
    return S.dev.type == "cuda"


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
    a = torch.randn(n, device=S.dev, dtype=torch.bfloat16)
    b = torch.empty_like(a)
    ts = time_region(lambda s, a=a, b=b: b.copy_(a), reps=10, warm=3)
    info["d2d_copy_GBps_read_plus_write"] = 2 * n * 2 / (med(ts) / 1e3) / 1e9
    del a, b
    x = torch.randn(8192, 8192, device=S.dev, dtype=torch.bfloat16)
    w = torch.randn(8192, 8192, device=S.dev, dtype=torch.bfloat16)
    ts = time_region(lambda s, x=x, w=w: x @ w, reps=10, warm=3)
    info["matmul_8192_bf16_tflops"] = 2 * 8192**3 / (med(ts) / 1e3) / 1e12
    del x, w
    free()
