"""Environment fingerprint stored in every harness dataset (``meta["fingerprint"]``).

It says what was measured on: device, driver, CUDA / torch / NCCL versions, CPU model, logical cores,
threads, OS and Python. The host is identified by a SHA-256 prefix of its name, never the raw
name, so datasets can be shared without leaking cluster host names.
"""

from __future__ import annotations

import hashlib
import os
import platform
import socket
from pathlib import Path

# Fields that must match for a journal to be resumed (a run measured elsewhere must not be mixed in).
IDENTITY_FIELDS = ("device", "device_name", "cpu_model", "host_sha256", "threads", "torch")


def cpu_model(cpuinfo: Path = Path("/proc/cpuinfo")) -> str:
    """CPU model name from /proc/cpuinfo (Linux), else platform.processor(), else 'unknown'."""
    try:
        for line in cpuinfo.read_text(encoding="utf-8", errors="replace").splitlines():
            if line.lower().startswith(("model name", "hardware", "cpu model")) and ":" in line:
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def host_hash(name: str | None = None) -> str:
    """First 16 hex digits of the SHA-256 of the host name (the name itself is not stored)."""
    return hashlib.sha256((name or socket.gethostname()).encode()).hexdigest()[:16]


def fingerprint(device: str = "cpu", threads: int | None = None) -> dict:
    """Describe this machine and software; ``threads`` is the torch intra-op thread count used."""
    # deferred: torch is optional; callers have checked it imports (costmodel.profiling.sampling.require_torch)
    import torch

    fp = {
        "device": device,
        "cpu_model": cpu_model(),
        "logical_cores": os.cpu_count(),
        "threads": int(threads if threads is not None else torch.get_num_threads()),
        "host_sha256": host_hash(),
        "os": platform.platform(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "driver": None,
        "nccl": None,
        "device_name": cpu_model() if device == "cpu" else None,
        "load_avg_1m": _load_avg(),
    }
    if device == "cuda" and torch.cuda.is_available():
        idx = torch.cuda.current_device()
        props = torch.cuda.get_device_properties(idx)
        fp["device_name"] = props.name
        fp["device_memory_gb"] = round(props.total_memory / 1e9, 1)
        fp["device_count"] = torch.cuda.device_count()
        try:
            fp["nccl"] = ".".join(str(x) for x in torch.cuda.nccl.version())
        except Exception:  # NCCL not built in (e.g. ROCm builds report RCCL differently)
            fp["nccl"] = None
        fp["driver"] = _nvidia_driver()
    return fp


def _load_avg() -> float | None:
    """1-minute load average when the fingerprint is taken: above the core count, CPU timings are noisy."""
    try:
        return round(os.getloadavg()[0], 2)
    except (OSError, AttributeError):
        return None


def busy_warning(fp: dict) -> str | None:
    """A one-line warning when other processes load the CPU (measurements then carry their noise)."""
    load, cores = fp.get("load_avg_1m"), fp.get("logical_cores") or 1
    if load is not None and load > 0.5 * cores:
        return (f"warning: this machine is busy (load average {load:g} on {cores} logical cores); CPU timings "
                "will include other processes' interference -- profile on an idle machine for a clean dataset")
    return None


def _nvidia_driver() -> str | None:
    """NVIDIA kernel driver version from /proc (no subprocess, no nvidia-smi needed)."""
    try:
        text = Path("/proc/driver/nvidia/version").read_text(encoding="utf-8", errors="replace")
    except OSError:
        return None
    for tok in text.split():
        parts = tok.split(".")
        if len(parts) >= 2 and all(p.isdigit() for p in parts):
            return tok
    return None


def identity(fp: dict) -> dict:
    """The part of a fingerprint that must match for measurements to be combined."""
    return {k: fp.get(k) for k in IDENTITY_FIELDS}
