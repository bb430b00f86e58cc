"""Hardware figures of this CPU derived from its own `planner profile` measurements.

The catalogue's GPU figures are datasheet numbers; a CPU has no datasheet row that matches how
PyTorch runs on it (threads, vector units, turbo), so its entry is *measured*: written by
`planner fit` next to the CPU models as ``hardware.toml`` and picked up by the catalogue when
``$PLANNER_MODELS_DIR`` (or ``planner predict --models``) points at that folder.

* ``peak_tflops.fp32`` = the best GEMM throughput measured (2mnk / time) - an achieved peak, so
  MFU on the CPU is relative to what this machine demonstrably reaches, not a theoretical one;
* ``hbm_bw_gbs`` = the best residual-add bandwidth measured (read 2 + write 1 tensors);
* ``hbm_gb`` = MemTotal of /proc/meminfo on the machine that ran `planner fit` (the profile's
  machine when fitted where it was measured - the sidecar fingerprints tell);
* ``gpus_per_node`` = the ranks of the collective sweep; intra-node bandwidth and latency = the
  best all-reduce bus bandwidth (nccl-tests convention, bytes/t x 2(n-1)/n) and the smallest
  all-reduce time measured. One machine has no inter-node tier: those fields repeat the intra-node
  figures and say so;
* ``straggler_excess`` = the ranks' measured speed skew (costmodel/profiling/sampling/skew.py), when the profile
  folder has a ``sync_skew.json``;
* ``corun_slowdown`` = per compute kind, how much slower it runs while every rank of the host runs it
  (costmodel/profiling/sampling/corun.py), when the profile folder has a ``corun.json``.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from costmodel.core.errors import PlannerError
from costmodel.fitting.datasets.schema import Dataset

CPU_GPU_KEY = "cpu"
CPU_CLUSTER_KEY = "cpu-host"


def _meminfo_gb() -> float | None:
    try:
        with open("/proc/meminfo", encoding="ascii") as fh:
            for line in fh:
                if line.startswith("MemTotal:"):
                    return int(line.split()[1]) * 1024 / 1e9
    except OSError:
        return None
    return None


def derive(datasets: dict, sync_skew: dict | None = None, corun: dict | None = None) -> dict | None:
    """{'gpus': {...}, 'clusters': {...}} for the 'cpu' device, or None without CPU GEMM data.

    ``sync_skew`` (costmodel/profiling/sampling/skew.load of the profile folders) adds the measured rank skew as
    the cluster's ``straggler_excess``; without it the cluster has none (0). ``corun``
    (costmodel/profiling/sampling/corun.load) adds the measured co-run slowdown per compute kind as
    ``corun_slowdown``; without it the cluster has none (factor 1).
    """
    gemm: Dataset | None = datasets.get(("gemm", CPU_GPU_KEY))
    if gemm is None or not len(gemm):
        return None
    fwd = gemm.direction == "fwd"
    f = gemm.features[fwd]
    flops = 2.0 * f[:, 0] * f[:, 1] * f[:, 2] / gemm.time_s[fwd]
    peak = float(flops.max()) / 1e12
    fp = gemm.meta.get("fingerprint", {})
    notes = [f"measured by `planner profile` on {fp.get('cpu_model', 'this CPU')} with "
             f"{fp.get('threads', '?')} thread(s) per process; peak = best GEMM throughput measured"]
    bw = None
    add = datasets.get(("residual_add", CPU_GPU_KEY))
    if add is not None and len(add):
        elem = np.where(add.dtype == "fp32", 4.0, 2.0)
        bw = float((3.0 * add.features[:, 0] * elem / add.time_s).max()) / 1e9
        notes.append("memory bandwidth = best residual-add bandwidth measured")
    else:
        raise PlannerError("the CPU profile has no residual_add samples, needed for the memory bandwidth: "
                           "re-run `planner profile --device cpu` without --ops")
    mem = _meminfo_gb() or 1.0
    gpus = {CPU_GPU_KEY: {
        "display_name": f"CPU ({fp.get('cpu_model', 'unknown model')})",
        "peak_tflops": {"fp32": round(peak, 6)},
        "hbm_gb": round(mem, 3), "hbm_bw_gbs": round(bw, 3), "nvlink_bw_gbs": 0.0,
        "default_cluster": CPU_CLUSTER_KEY, "measured_data": True,
        "notes": "; ".join(notes),
        "sources": {"peak_tflops": "planner profile (gemm)", "hbm_bw_gbs": "planner profile (residual_add)",
                    "hbm_gb": "/proc/meminfo"},
    }}
    ranks = 2
    bus: float | None = None
    lat = 0.0
    ar = datasets.get(("all_reduce", CPU_GPU_KEY))
    if ar is not None and len(ar):
        nbytes, n = ar.features[:, 0], ar.features[:, 1]
        ranks = int(n.max())
        busbw = nbytes / ar.time_s * 2.0 * (n - 1) / n
        bus = float(busbw.max()) / 1e9
        lat = float(ar.time_s.min()) * 1e6
    cl_notes = "one machine: no inter-node tier, inter-node fields repeat the intra-node (gloo loopback) figures"
    if bus is None:
        raise PlannerError("the CPU profile has no all_reduce samples, needed for the host's bandwidth and latency: "
                           "re-run `planner profile --device cpu --collectives`")
    clusters: dict[str, dict[str, Any]] = {CPU_CLUSTER_KEY: {
        "display_name": "this machine (gloo over loopback, one process per core)",
        "gpu": CPU_GPU_KEY, "gpus_per_node": ranks,
        "intra_node_bw_gbs": round(bus, 4), "intra_node_latency_us": round(max(lat, 1e-3), 3),
        "inter_node_bw_gbs": round(bus, 4), "inter_node_latency_us": round(max(lat, 1e-3), 3),
        "network": "loopback (gloo)", "notes": cl_notes,
        # gloo runs its collectives on the same CPU cores as the training ops: nothing overlaps
        "comm_overlaps_compute": False,
        "sources": {"intra_node_bw_gbs": "planner profile (all_reduce)",
                    "intra_node_latency_us": "planner profile (all_reduce)"},
    }}
    if sync_skew is not None:
        c = clusters[CPU_CLUSTER_KEY]
        c["straggler_excess"] = round(float(sync_skew["excess"]), 5)
        c["straggler_ranks"] = int(sync_skew["ranks"])
        per = ", ".join(f"{s['segment_s'] * 1e3:g} ms {100 * s['excess']:.1f} %" for s in sync_skew["segments"])
        c["sources"]["straggler_excess"] = "planner profile (sync_skew.json, costmodel/profiling/sampling/skew.py)"
        c["notes"] += (f"; straggler_excess = pooled rank skew of identical GEMM segments on {c['straggler_ranks']} "
                       f"ranks ({per})")
    if corun is not None:
        c = clusters[CPU_CLUSTER_KEY]
        c["corun_slowdown"] = {k: round(float(v), 4) for k, v in sorted(corun["slowdown"].items())}
        c["corun_ranks"] = int(corun["ranks"])
        c["sources"]["corun_slowdown"] = "planner profile (corun.json, costmodel/profiling/sampling/corun.py)"
        per = ", ".join(f"{k} {v:.2f}" for k, v in c["corun_slowdown"].items())
        c["notes"] += f"; corun_slowdown = time with all {c['corun_ranks']} ranks running an operator / alone ({per})"
    assert math.isfinite(peak) and peak > 0
    return {"gpus": gpus, "clusters": clusters}


def to_toml(entry: dict) -> str:
    """Small TOML writer for the two tables (strings, numbers, bools, flat sub-tables)."""
    def val(v):
        if isinstance(v, bool):
            return "true" if v else "false"
        if isinstance(v, (int, float)):
            return repr(v)
        return '"' + str(v).replace("\\", "\\\\").replace('"', '\\"') + '"'

    lines = ["# Written by `planner fit` from `planner profile` measurements of this CPU "
             "(costmodel/fitting/cpu_hardware.py)."]
    for section in ("gpus", "clusters"):
        for name, fields in entry[section].items():
            lines.append(f"\n[{section}.{name}]")
            subs = {k: v for k, v in fields.items() if isinstance(v, dict)}
            for k, v in fields.items():
                if not isinstance(v, dict):
                    lines.append(f"{k} = {val(v)}")
            for k, v in subs.items():
                lines.append(f"\n[{section}.{name}.{k}]")
                lines += [f"{kk} = {val(vv)}" for kk, vv in v.items()]
    return "\n".join(lines) + "\n"
