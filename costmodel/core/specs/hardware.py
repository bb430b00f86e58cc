"""Hardware inputs: a GPU type and the node/cluster it sits in.

The catalogue itself is data (``search_spaces/hardware/*.toml``); loading and user overrides live in
:mod:`costmodel.core.specs.catalogue`.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from costmodel.core.errors import PlannerError


@dataclass(frozen=True)
class GPUSpec:
    """Datasheet figures of one accelerator. Every figure has a source id in ``sources``."""

    name: str
    """Catalogue key, e.g. ``a100-80gb``."""
    display_name: str
    """Human name, e.g. ``NVIDIA A100 SXM4 80GB``."""
    peak_tflops: dict
    """Dense peak TFLOP/s by dtype: keys among bf16, fp16, fp8, tf32, fp32."""
    hbm_gb: float
    """HBM capacity in GB (10^9 bytes) as the vendor states it."""
    hbm_bw_gbs: float
    """HBM bandwidth in GB/s."""
    nvlink_bw_gbs: float
    """GPU-to-GPU link bandwidth per GPU per direction in GB/s (0 = none)."""
    default_cluster: str
    """Node type used when the user gives only --gpu."""
    tdp_w: float = 0.0
    """Board power in W (0 = not stated)."""
    price_usd_per_gpu_hour: float | None = None
    """Reference price per GPU-hour in USD (None = no public price found)."""
    price_date: str = ""
    """When the price was quoted."""
    price_source: str = ""
    """Source id of the price."""
    measured_data: bool = False
    """True when shared/data has operator measurements for this GPU."""
    sources: dict = field(default_factory=dict, compare=False, hash=False)
    """Figure name -> source id (defined in the catalogue's source registry)."""
    notes: str = ""
    """Caveats carried from the catalogue (UNCERTAIN flags etc.)."""

    @property
    def hbm_bytes(self) -> float:
        return self.hbm_gb * 1e9

    def peak_flops(self, dtype: str) -> float:
        """Dense peak FLOP/s for a GEMM dtype (fp16 falls back to bf16 and back)."""
        table = self.peak_tflops
        if dtype in table:
            return table[dtype] * 1e12
        if dtype in ("bf16", "fp16", "fp8"):
            for alt in ("bf16", "fp16"):
                if alt in table:
                    return table[alt] * 1e12
        raise PlannerError(f"{self.name} has no {dtype} peak in the catalogue (it has {', '.join(sorted(table))}); "
                           f"use --dtype {sorted(table)[0]} or add the figure in a --hardware-file")


@dataclass(frozen=True)
class ClusterSpec:
    """A node type / cluster: how GPUs are packed and wired."""

    name: str
    """Catalogue key, e.g. ``dgx-a100``."""
    display_name: str
    gpu: str
    """Default GPU key in this node type."""
    gpus_per_node: int
    intra_node_bw_gbs: float
    """Per-GPU, per-direction bandwidth inside a node in GB/s (NVLink/NVSwitch)."""
    intra_node_latency_us: float
    """Small-message collective latency inside a node in microseconds."""
    inter_node_bw_gbs: float
    """Per-GPU, per-direction network bandwidth between nodes in GB/s (NIC rate / 8)."""
    inter_node_latency_us: float
    """Small-message latency across nodes in microseconds."""
    network: str = ""
    """Fabric description (e.g. 'Slingshot-11', 'NDR InfiniBand')."""
    price_usd_per_gpu_hour: float | None = None
    price_date: str = ""
    price_source: str = ""
    sources: dict = field(default_factory=dict, compare=False, hash=False)
    notes: str = ""
    comm_overlaps_compute: bool = True
    """Collectives run on their own engines (GPU copy engines / NCCL kernels on spare SMs) and can hide
    under compute. False where communication and compute share the same cores (gloo on a CPU host),
    so overlapped reductions are fully exposed."""
    straggler_excess: float = 0.0
    """E[max over ranks] / E[mean] - 1 of identical compute segments run at once by ``straggler_ranks``
    ranks of one node: synchronous training waits for the slowest rank, so the timeline adds this
    fraction of the compute between synchronisations (planner/predict.py). Measured by `planner profile`
    (costmodel/sampling/skew.py); 0 where not measured (the catalogue's GPU clusters)."""
    straggler_ranks: int = 2
    """How many ranks ``straggler_excess`` was measured on."""
    corun_slowdown: dict = field(default_factory=dict, hash=False)
    """Compute kind -> time with every rank of a node running the operator at once / time alone: ranks of
    one node that share memory bandwidth and caches slow each other down, and the predictor multiplies
    this into the kind's times when a plan puts more than one rank on a node (planner/predict.py).
    Measured by `planner profile` (costmodel/sampling/corun.py); empty = factor 1 (the catalogue's GPU
    clusters: each GPU has its own HBM; not measured)."""
    corun_ranks: int = 2
    """How many ranks ``corun_slowdown`` was measured on."""


@dataclass(frozen=True)
class Hardware:
    """The hardware input of the cost model: one GPU type in one node type."""

    gpu: GPUSpec
    cluster: ClusterSpec

    @property
    def gpus_per_node(self) -> int:
        return self.cluster.gpus_per_node

    @property
    def price_usd_per_gpu_hour(self) -> float | None:
        if self.cluster.price_usd_per_gpu_hour is not None:
            return self.cluster.price_usd_per_gpu_hour
        return self.gpu.price_usd_per_gpu_hour
