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
    host_link_bw_gbs: float = 0.0
    """GPU-to-host-memory bandwidth per direction in GB/s (PCIe, or NVLink-C2C on Grace superchips): what optimizer
    and activation offloading move data over; 0 = not known (offloading refused)."""
    host_mem_bw_gbs: float = 0.0
    """Bandwidth of the CPU memory the GPU's host reaches in GB/s (Grace LPDDR5X on GH200): what the CPU optimizer
    step of optimizer offloading streams its states through; 0 = not known (optimizer offloading refused)."""
    sibling: str = ""
    """A measured catalogue GPU of the same silicon, declared in a hardware file: without measurements of its own this
    GPU borrows the sibling's operator models, each operator's time scaled by the roofline ratio of the two GPUs'
    datasheet figures (costmodel/cost/basis.py), and the sibling's per-die tables (efficiencies, kernel rates).
    "" = none declared."""

    @property
    def measured_as(self) -> str:
        """The GPU whose measurement tables cost this one: the declared sibling, else the GPU itself."""
        return self.sibling or self.name

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
    """Per-direction bandwidth of the scale-out NIC a GPU's traffic leaves its NVLink domain through, GB/s (NIC rate
    / 8); with one NIC per GPU (``rails`` 0, the catalogue's nodes) each GPU's own (:meth:`scale_out_bw_gbs`)."""
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
    fraction of the compute between synchronisations (costmodel/schedule/compose.py). Measured by `planner profile`
    (costmodel/profiling/sampling/skew.py); 0 where not measured (the catalogue's GPU clusters)."""
    straggler_ranks: int = 2
    """How many ranks ``straggler_excess`` was measured on."""
    corun_slowdown: dict = field(default_factory=dict, hash=False)
    """Compute kind -> time with every rank of a node running the operator at once / time alone: ranks of
    one node that share memory bandwidth and caches slow each other down, and the predictor multiplies
    this into the kind's times when a plan puts more than one rank on a node (costmodel/schedule/compose.py).
    Measured by `planner profile` (costmodel/profiling/sampling/corun.py); empty = factor 1 (the catalogue's GPU
    clusters: each GPU has its own HBM; not measured)."""
    corun_ranks: int = 2
    """How many ranks ``corun_slowdown`` was measured on."""
    nvlink_domain: int = 0
    """GPUs in one NVLink (scale-up) domain, a multiple of ``gpus_per_node``: 8 on a DGX/HGX node, 72 on a
    GB200/GB300 NVL72 rack (18 trays of 4), 1 where GPUs share no NVLink (Vista). Collectives of a group
    inside one domain use the intra figures, across domains the scale-out network. 0 = ``gpus_per_node``."""
    other_gpus: list = field(default_factory=list, compare=False, hash=False)
    """Other GPU keys this node type is built with besides ``gpu`` (e.g. the DGX A100 320GB's a100-40gb)."""
    rails: int = 0
    """Scale-out NICs per node, each cabled to a switch plane of its own (a rail: the same-index NIC of every node of
    a scalable unit on one leaf switch; Wang et al., "Rail-only", arXiv 2307.12169, Fig. 1; NVIDIA technical blog
    "Doubling all2all Performance with NCCL 2.12", Fig. 1). The GPUs of a node share them: :meth:`scale_out_bw_gbs`.
    0 = one NIC per GPU (the catalogue's nodes)."""
    oversubscription: float = 1.0
    """Taper of the scale-out fabric above the level of ``leaf_nodes`` nodes: injection bandwidth of the NICs below
    one switch of that level / that switch's uplink bandwidth (Al-Fares, Loukissas & Vahdat, SIGCOMM 2008, §2.1:
    1:1 lets every host use its full bandwidth to any other; 2:1 leaves half of it to traffic that leaves). 1 =
    non-blocking (the catalogue's clusters). Used by :meth:`scale_out_bw_gbs`."""
    nvlink_mesh: int = 0
    """GPUs wired to each other directly by NVLink, without NVSwitch (4 on the quad-GH200 nodes: NVLink 4 at 150 GB/s
    per direction between every pair; JSC JUPITER configuration page): ``intra_node_bw_gbs`` is then a GPU's bandwidth
    over its links to all ``nvlink_mesh - 1`` peers, and a group of n of them uses the links to its n - 1 peers only
    (:meth:`intra_bw_gbs`). 0: an NVSwitch gives every group the full figure."""
    leaf_nodes: int = 0
    """Nodes below one switch of the non-blocking level (a rail's leaf switch of a DGX SuperPOD scalable unit: 32 DGX
    nodes; a JUPITER Dragonfly+ group, a non-blocking fat tree: 240 nodes). 0 = not given: with
    ``oversubscription`` > 1 every collective across nodes is taken to leave it."""
    resized: str = field(default="", compare=False)
    """What ``--gpus-per-node`` changed in this catalogue node type, and the node types that really hold that many
    of the GPU ('' = as catalogued): outputs print it beside the node type's name."""

    def intra_bw_gbs(self, ranks: int) -> float:
        """Per-GPU, per-direction NVLink bandwidth of a collective among ``ranks`` GPUs of one node, GB/s:
        ``intra_node_bw_gbs``, or on a direct-wired node (``nvlink_mesh`` m > 2) its share over the links to the
        group's other members, intra_node_bw_gbs x (n - 1) / (m - 1) with n = min(ranks, m) (a ring over a full mesh
        sends on every link to a group peer at once; 2 of 4 quad-GH200 GPUs share one 150 GB/s pair link)."""
        m = self.nvlink_mesh
        if m <= 2 or ranks >= m:
            return self.intra_node_bw_gbs
        return self.intra_node_bw_gbs * max(ranks - 1, 1) / (m - 1)

    def scale_out_bw_gbs(self, domains: int) -> float:
        """Per-GPU, per-direction scale-out bandwidth of a collective whose group spans ``domains`` NVLink domains,
        GB/s, with every GPU of a node sending at once (the data-parallel reductions of all model-parallel ranks
        run together):

        - ``rails`` NICs shared by ``gpus_per_node`` GPUs: inter_node_bw_gbs x min(rails, gpus_per_node) /
          gpus_per_node (more NICs than GPUs add nothing: a GPU's traffic is taken to leave through one NIC);
        - a group spanning more than ``leaf_nodes`` nodes crosses the tapered level: / ``oversubscription``, the
          share of its injection bandwidth a host keeps when every host below the switch sends across it
          (Al-Fares et al. 2008 §2.1); a rail-aligned ring crosses it at fewer points, so this is an upper bound
          on the slowdown.
        """
        bw = self.inter_node_bw_gbs
        if self.rails:
            bw *= min(self.rails, self.gpus_per_node) / self.gpus_per_node
        if self.oversubscription > 1.0:
            nodes = domains * max(1, (self.nvlink_domain or self.gpus_per_node) // self.gpus_per_node)
            if not self.leaf_nodes or nodes > self.leaf_nodes:
                bw /= self.oversubscription
        return bw


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

    def domain_for(self, gpus: int) -> int:
        """NVLink-domain size as a job of ``gpus`` GPUs sees it (what collective topology uses).

        A job within one domain has a domain of its own size. A job over several domains whose size does
        not divide it (128 GB200 on NVL72 racks) is spread over the fewest domains, ``ceil(N / domain)``,
        in whole nodes as evenly as they go, and every domain is taken to hold the smallest share (128 ->
        2 x 64, 200 -> 68 + 68 + 64 taken as 3 x 64): a synchronous collective runs at the pace of its
        slowest group, so it is never costed as faster than on the least-filled domain. When the domain
        equals the node (DGX/HGX, Perlmutter, Vista) this is ``min(gpus_per_node, gpus)``, as before.
        """
        d, unit = self.nvlink_domain, self.gpus_per_node
        if gpus <= d or gpus % d == 0:
            return min(d, gpus)
        domains = -(-gpus // d)
        return max(unit, (gpus // unit) // domains * unit)

    @property
    def price_usd_per_gpu_hour(self) -> float | None:
        if self.cluster.price_usd_per_gpu_hour is not None:
            return self.cluster.price_usd_per_gpu_hour
        return self.gpu.price_usd_per_gpu_hour
