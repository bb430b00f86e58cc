"""Builders of operator records shared by the operator graph (:mod:`costmodel.graph.build`) and its block modules
(:mod:`costmodel.graph.moe`): GEMMs with their backward, collectives, memory-bound operators, the TP region's
boundary collectives and process-group topology. Shapes and conventions: costmodel/graph/build.py's docstring."""

from __future__ import annotations

from costmodel.core.kinds import Category, Phase
from costmodel.core.specs.plan import ParallelPlan
from costmodel.graph.ops import Op

ACT_BYTES = 2  # bf16/fp16 activations and weights (bytes per element), a definition of the dtype
FP32_BYTES = 4  # fp32 element (pure fp32 training)


def group_topology(size: int, stride: int, domain: int) -> tuple[int, int]:
    """(NVLink domains spanned, ranks per domain) of a process group of ``size`` ranks spaced ``stride``
    apart, on domains of ``domain`` GPUs (``ParallelPlan.domain``)."""
    if size <= 1:
        return 1, 1
    if stride >= domain:
        return size, 1
    per_node = max(1, min(size, domain // stride))
    return -(-size // per_node), per_node


def elem_bytes(dtype: str) -> int:
    """Bytes per activation/weight element moved between operators for a plan dtype."""
    return FP32_BYTES if dtype == "fp32" else ACT_BYTES


RESIDUAL_PASSES = 3
"""A residual add reads two tensors and writes one (costmodel.graph.build's residual_add bytes)."""
HBM_PASS = "hbm."
"""Name prefix of operators that are pure HBM passes carried as residual-add-equivalents and costed at the GPU's
achieved HBM bandwidth (costmodel.cost.framework_kernels.hbm_times)."""


def hbm_pass(name: str, phase: Phase, nbytes: float, dtype: str, count: float = 1.0,
             category: Category | None = Category.COMPUTE) -> Op:
    """A pure HBM pass of ``nbytes`` named ``HBM_PASS + name``: a residual add moving the same bytes
    (``RESIDUAL_PASSES`` passes of ``dtype``'s elements), which framework_kernels.hbm_times costs at the GPU's
    achieved HBM bandwidth (PyTorch eager's element-wise chains, FSDP2's copies, overlapped collectives' traffic)."""
    equivalent = round(nbytes / (RESIDUAL_PASSES * elem_bytes(dtype)))
    return Op("residual_add", f"{HBM_PASS}{name}", phase, (equivalent,), flops=float(equivalent), bytes=nbytes,
              dtype=dtype, count=count, category=category)


def gemm(name: str, phase: Phase, m: int, n: int, k: int, dtype: str, count: float = 1.0) -> Op:
    EB = elem_bytes(dtype)
    return Op("gemm", name, phase, (m, n, k), flops=2.0 * m * n * k,
              bytes=float(EB * (m * k + n * k + m * n)), dtype=dtype, count=count, category=Category.COMPUTE)


def recomputed(ops) -> list[Op]:
    """The forward operators of ``ops``, run again in backward (phase RECOMPUTE)."""
    return [Op(o.kind, o.name, Phase.RECOMPUTE, o.features, o.flops, o.bytes, o.dtype, o.count, o.category)
            for o in ops if o.phase is Phase.FWD]


def gemm_fwd_bwd(name: str, m: int, n: int, k: int, dtype: str) -> list[Op]:
    """Forward GEMM plus its dgrad (m, k, n) and wgrad (n, k, m) backward GEMMs."""
    return [gemm(name, Phase.FWD, m, n, k, dtype),
            gemm(name + ".dgrad", Phase.BWD, m, k, n, dtype),
            gemm(name + ".wgrad", Phase.BWD, n, k, m, dtype)]


def projection_gemms(name: str, m: int, k: int, parts: tuple[tuple[str, int], ...], separate: bool,
                     dtype: str) -> list[Op]:
    """The projections ``parts`` ((suffix, output width), ...) of one input of width ``k``: one fused GEMM
    ``name`` of their summed width (Megatron-Core's linear_qkv / linear_fc1), or with ``separate`` one GEMM each,
    named ``name.suffix`` (``Framework.separate_projections``)."""
    if not separate:
        return gemm_fwd_bwd(name, m, sum(n for _, n in parts), k, dtype)
    return [op for part, n in parts for op in gemm_fwd_bwd(f"{name}.{part}", m, n, k, dtype)]


def coll(kind: str, name: str, phase: Phase, nbytes: float, size: int, topo: tuple[int, int],
          category: Category | None = None) -> Op:
    return Op(kind, name, phase, (float(nbytes), size, topo[0], topo[1]), bytes=float(nbytes), category=category)


def mem(kind: str, name: str, phase: Phase, features: tuple, nbytes: float, flops: float = 0.0) -> Op:
    return Op(kind, name, phase, features, flops=flops, bytes=float(nbytes), category=Category.COMPUTE)


def tp_boundary(name: str, entering: bool, plan: ParallelPlan, act: float, topo: tuple[int, int]) -> list[Op]:
    """TP collectives at the edge of a Megatron tensor-parallel region (Shoeybi et al. 2019 §3, f/g
    operators; Korthikanti et al. 2022 §4.2.2 with sequence parallelism), for one [s, b, h] activation.

    Entering a column-parallel block: SP all-gathers the sequence shards (fwd) and reduce-scatters (bwd);
    without SP the forward is an identity and the backward all-reduces the input gradient. Leaving a
    row-parallel block: the mirror image (fwd all-reduce or SP reduce-scatter; bwd identity or SP all-gather).
    """
    t = plan.tp
    if t == 1:
        return []
    if plan.sp:
        first, second = ("all_gather", "reduce_scatter") if entering else ("reduce_scatter", "all_gather")
        return [coll(first, f"tp.{name}.{first.replace('_', '')}", Phase.FWD, act, t, topo, Category.TP_COMM),
                coll(second, f"tp.{name}.{second.replace('_', '')}", Phase.BWD, act, t, topo, Category.TP_COMM)]
    return [coll("all_reduce", f"tp.{name}.allreduce", Phase.BWD if entering else Phase.FWD, act, t, topo,
                  Category.TP_COMM)]
