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
    """HBM capacity in GB (10^9 bytes) as the vendor markets it (often rounded: an "80 GB" A100 has 80 GiB)."""
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
    price_basis: str = ""
    """What the price is (provider, instance, on-demand / capacity block), or 'none: ...' when the catalogue has
    no price; prices of different bases are not like for like."""
    measured_data: bool = False
    """True when shared/data has operator measurements for this GPU."""
    sources: dict = field(default_factory=dict, compare=False, hash=False)
    """Figure name -> source id (defined in the catalogue's source registry)."""
    notes: str = ""
    """Caveats carried from the catalogue (UNCERTAIN flags etc.)."""
    hbm_mib: float = 0.0
    """HBM capacity the driver reports (nvidia-smi ``memory.total``), MiB; 0 = no cited figure (hbm_gb is used)."""

    @property
    def hbm_bytes(self) -> float:
        """Device memory capacity in bytes: the driver-reported MiB where cited, else the vendor's GB."""
        return self.hbm_mib * 2**20 if self.hbm_mib else self.hbm_gb * 1e9

    @property
    def has_fp8(self) -> bool:
        """The GPU has fp8 tensor cores: the catalogue gives it an fp8 peak (A100, for one, has none)."""
        return "fp8" in self.peak_tflops

    def check_dtype(self, dtype: str) -> None:
        """Refuse a training precision this GPU cannot run (fp8 without fp8 tensor cores)."""
        if dtype in ("fp8", "fp8-block") and not self.has_fp8:
            raise PlannerError(f"{self.name} has no fp8 tensor cores (no fp8 peak in the catalogue); use --dtype "
                               "bf16, or a GPU with fp8 (see `planner gpus`).")

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
    """GPUs per node: the allocation unit (a server, or a 4-GPU compute tray of an NVL72 rack); a job uses
    whole nodes."""
    intra_node_bw_gbs: float
    """Per-GPU, per-direction bandwidth inside the NVLink (scale-up) domain in GB/s (NVLink/NVSwitch)."""
    intra_node_latency_us: float
    """Small-message collective latency inside the NVLink domain in microseconds."""
    inter_node_bw_gbs: float
    """Per-GPU, per-direction scale-out network bandwidth between NVLink domains in GB/s (NIC rate / 8)."""
    inter_node_latency_us: float
    """Small-message latency across NVLink domains (over the scale-out network) in microseconds."""
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
    nvlink_domain: int = 0
    """GPUs in one NVLink (scale-up) domain, a multiple of ``gpus_per_node``: 8 on a DGX/HGX node, 72 on a
    GB200/GB300 NVL72 rack (18 trays of 4), 1 where GPUs share no NVLink (Vista). Collectives of a group
    inside one domain use the intra figures, across domains the scale-out network. 0 = ``gpus_per_node``."""
    other_gpus: list = field(default_factory=list, compare=False, hash=False)
    """Other GPU keys this node type is built with besides ``gpu`` (e.g. the DGX A100 320GB's a100-40gb)."""


@dataclass(frozen=True)
class Hardware:
    """The hardware input of the cost model: one GPU type in one node type."""

    gpu: GPUSpec
    cluster: ClusterSpec

    @property
    def gpus_per_node(self) -> int:
        return self.cluster.gpus_per_node

    @property
    def nvlink_domain(self) -> int:
        """GPUs in one NVLink (scale-up) domain (the node when the catalogue gives none)."""
        return self.cluster.nvlink_domain or self.cluster.gpus_per_node

    def domain_for(self, world_size: int) -> int:
        """NVLink-domain size as a job of ``world_size`` GPUs sees it (what collective topology uses).

        A job within one domain has a domain of its own size. A job over several domains whose size does
        not divide it (128 GB200 on NVL72 racks) is spread over the fewest domains, ``ceil(N / domain)``,
        in whole nodes as evenly as they go, and every domain is taken to hold the smallest share (128 ->
        2 x 64, 200 -> 68 + 68 + 64 taken as 3 x 64): a synchronous collective runs at the pace of its
        slowest group, so it is never costed as faster than on the least-filled domain. When the domain
        equals the node (DGX/HGX, Perlmutter, Vista) this is ``min(gpus_per_node, world_size)``, as before.
        """
        d, unit = self.nvlink_domain, self.gpus_per_node
        if world_size <= d or world_size % d == 0:
            return min(d, world_size)
        domains = -(-world_size // d)
        return max(unit, (world_size // unit) // domains * unit)

    @property
    def price_usd_per_gpu_hour(self) -> float | None:
        if self.cluster.price_usd_per_gpu_hour is not None:
            return self.cluster.price_usd_per_gpu_hour
        return self.gpu.price_usd_per_gpu_hour
