"""Composition: operator times -> one training iteration (the paper's step 4, Zhang et al. arXiv
2509.22832 §III-C).

Small typed steps, each a function with a frozen result:

1. :func:`cost_operators`: one time per distinct operator of the graph, with its cost source
   (:class:`OperatorTimes`); :func:`corun_slowdown` scales compute times for ranks sharing a node.
2. :func:`stage_times`: per pipeline stage, forward and backward seconds of one micro-batch
   (:class:`StageTimes`).
3. :func:`pipeline`: the 1F1B timeline over them (:class:`costmodel.schedule.timeline.PipelineResult`); its
   ``steady_stage`` (largest forward + backward) is *the* critical stage and its ``bubble_s`` the bubble.
4. :func:`iteration_tail`: after the pipeline, each stage's exposed DP gradient reduction, optimizer step
   and exposed parameter all-gather; the iteration ends with the stage whose tail ends last, plus the
   wait for the slowest rank and the framework overhead (:class:`IterationTail`).
5. :func:`breakdown`: the critical stage's time per operator row and category, and the exposed
   communication per kind (:class:`Breakdown`).
6. :func:`metrics`: throughput, FLOP rates, MFU and memory (:class:`Metrics`).

:func:`compose` runs steps 2-6, :func:`compose_iteration_time` steps 2-4. Operator times are keyed by
:meth:`costmodel.graph.ops.Op.key`. A :class:`costmodel.core.calibration.Calibration` sets the overlap efficiency of
the DP gradient reduction and the fixed overhead per iteration; None leaves the composition uncalibrated.
:func:`costmodel.estimate.estimate` runs these steps for a plan.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import NamedTuple

from costmodel.core.calibration import Calibration
from costmodel.core.kinds import COLLECTIVE_KINDS, Category, CostSource, Phase
from costmodel.core.specs.framework import attention_kernel
from costmodel.core.specs.hardware import Hardware
from costmodel.core.specs.model import ModelSpec
from costmodel.core.specs.plan import ParallelPlan
from costmodel.cost.base import OperatorCostModel
from costmodel.cost.framework_kernels import flash2_times, hbm_times
from costmodel.graph.build import GRAD_REDUCE_BYTES, OperatorGraph, StageGraph
from costmodel.graph.contention import HBM_PASS_PREFIX
from costmodel.graph.opbuild import HBM_PASS
from costmodel.graph.ops import Op
from costmodel.memory.offload import stage_offload_s
from costmodel.memory.per_gpu import MemoryBreakdown, fits_in_memory, memory_message, memory_per_gpu
from costmodel.schedule.flops import executed_model, hardware_flops_per_iteration, model_flops_per_iteration
from costmodel.schedule.straggler import rank_scale
from costmodel.schedule.timeline import PipelineResult, pipeline_time

GIB = 1024**3

Times = Mapping[tuple, float]
"""Operator times in seconds keyed by :meth:`costmodel.graph.ops.Op.key` (for ``count`` = 1)."""

_FWD = (Phase.FWD,)
_BWD = (Phase.BWD,)
_BWD_RECOMPUTE = (Phase.BWD, Phase.RECOMPUTE)
_COMPUTE_PHASES = (Phase.FWD, Phase.BWD, Phase.RECOMPUTE)


def mfu_peak_dtype(dtype: str) -> str:
    """Which dense peak MFU divides by: bf16/fp16 for mixed-precision and fp8 runs (the convention of
    the published MFU figures, shared/validation/README.md), fp32 for pure fp32 training."""
    return "fp32" if dtype == "fp32" else "bf16"


# ------------------------------------------------------------------------------------- 1. operators
@dataclass(frozen=True)
class OperatorTimes:
    """One time per distinct operator of a graph, with the cost model's interval and cost source."""

    time_s: dict[tuple, float]
    """Point times keyed by Op.key(), in the order the operators were first met in the graph."""
    low_s: dict[tuple, float] | None = None
    """Lower interval ends (None when the cost model gives no interval)."""
    high_s: dict[tuple, float] | None = None
    """Upper interval ends (None when the cost model gives no interval)."""
    source: dict[tuple, CostSource] = field(default_factory=dict)
    """Where each time came from (empty when the cost model does not say)."""
    warnings: tuple[str, ...] = ()
    """Cost-model and co-run notes, in order."""

    def scaled(self, scale: Callable[[dict], dict]) -> OperatorTimes:
        """The same operators with ``scale`` applied to the point times and to both interval ends."""
        return OperatorTimes(scale(self.time_s), None if self.low_s is None else scale(self.low_s),
                             None if self.high_s is None else scale(self.high_s), self.source, self.warnings)

    def replaced(self, new: Mapping[tuple, float]) -> OperatorTimes:
        """The same operators with the point times of ``new``'s keys replaced by its seconds, each interval end
        keeping its ratio to the point time it had (an operator whose time was 0 takes the new time at both ends)."""
        base = self.time_s

        def scale(t: dict) -> dict:
            return {**t, **{k: nv * t[k] / base[k] if base[k] > 0 else nv for k, nv in new.items() if k in t}}

        return self.scaled(scale)

    @property
    def has_interval(self) -> bool:
        """True when an interval exists and differs from the point times somewhere."""
        return self.low_s is not None and self.high_s is not None and \
            (self.low_s != self.time_s or self.high_s != self.time_s)

    def source_counts(self) -> dict[str, int]:
        """Distinct operators per cost source, largest count first (ties in CostSource order); {} when
        the cost model gave no sources. :func:`costmodel.core.kinds.describe_cost_sources` words it."""
        counts = {s: 0 for s in CostSource}
        for s in self.source.values():
            counts[s] += 1
        ranked = sorted((s for s in CostSource if counts[s]), key=lambda s: -counts[s])
        return {s.value: counts[s] for s in ranked}


def cost_operators(graph: OperatorGraph, hardware: Hardware, cost_model: OperatorCostModel) -> OperatorTimes:
    """Cost every distinct operator of ``graph`` (by Op.key()) once with ``cost_model``."""
    unique = graph.distinct_operators()
    ops = list(unique.values())
    res = cost_model.predict(ops, hardware)
    keys = list(unique)
    times = dict(zip(keys, (float(x) for x in res.time_s)))
    low = high = None
    if res.low_s is not None and res.high_s is not None:
        low = dict(zip(keys, (float(x) for x in res.low_s)))
        high = dict(zip(keys, (float(x) for x in res.high_s)))
    source = dict(zip(keys, res.source)) if len(res.source) == len(keys) else {}
    return OperatorTimes(times, low, high, source, tuple(res.warnings))


def corun_slowdown(plan: ParallelPlan, hardware: Hardware, times: OperatorTimes) -> OperatorTimes:
    """Ranks of one node slow each other down (shared memory bandwidth and caches): compute operator times,
    sampled one process at a time, are multiplied by the cluster's measured ``corun_slowdown`` of their
    kind when the plan puts more than one rank on a node (costmodel/profiling/sampling/corun.py). Applied to every
    compute operator of the step, including those a pipeline stage runs while another stage idles in the
    bubble (an upper bound there). Times and interval ends unchanged without a measurement (GPU clusters)."""
    factors = hardware.cluster.corun_slowdown
    ranks = min(plan.gpus, plan.gpus_per_node)
    if not factors or ranks <= 1:
        return times
    warnings = times.warnings
    if ranks != hardware.cluster.corun_ranks:
        warnings += (f"co-run slowdown measured with {hardware.cluster.corun_ranks} ranks per node, used "
                     f"unchanged for {ranks}",)

    def scale(t: dict) -> dict:
        return {k: v * factors.get(k[0], 1.0) for k, v in t.items()}  # Op.key()[0] is the kind

    scaled = times.scaled(scale)
    return OperatorTimes(scaled.time_s, scaled.low_s, scaled.high_s, scaled.source, warnings)


def framework_kernels(plan: ParallelPlan, hardware: Hardware, graph: OperatorGraph,
                      times: OperatorTimes) -> OperatorTimes:
    """The attention operators as the plan's framework runs them: FlashAttention-2 for stacks that call it (its
    own measurements on the GPU die, :mod:`costmodel.cost.framework_kernels`; source MEASURED), unchanged for stacks
    that call the fused kernel the cost model measures; HBM passes (opbuild.hbm_pass) at the HBM bandwidth, the
    overlapped collectives' (costmodel.graph.contention) at none where communication does not run beside compute
    (``comm_overlaps_compute`` False: exposed whole). Interval ends keep their ratio to the point time."""
    ops = [o for st in graph.distinct_stages() for o in st.layer_ops]
    passes = [o for o in ops if o.name.startswith(HBM_PASS)]
    if attention_kernel(plan) not in ("flash2", "flash1") and not passes:
        return times  # the fused kernel the cost model measures: nothing to replace
    new, warnings = flash2_times(plan, hardware, ops)
    roofline = hbm_times(hardware, passes)
    if not hardware.cluster.comm_overlaps_compute:
        others = {o.key() for o in ops if not o.name.startswith(HBM_PASS_PREFIX)}
        roofline.update({o.key(): 0.0 for o in passes if o.name.startswith(HBM_PASS_PREFIX) and o.key() not in others})
    new.update(roofline)
    if not new and not warnings:
        return times

    scaled = times.replaced(new)
    source = {**times.source, **{k: CostSource.ROOFLINE if k in roofline else CostSource.MEASURED
                                 for k in new if k in times.source}}
    return OperatorTimes(scaled.time_s, scaled.low_s, scaled.high_s, source, times.warnings + tuple(warnings))


# ------------------------------------------------------------------------------------- 2. stages
def phase_time(ops: Sequence[Op], times: Times, phases: tuple[Phase, ...]) -> float:
    """Seconds of the operators of ``ops`` in ``phases``, each time its count."""
    return sum(times[o.key()] * o.count for o in ops if o.phase in phases)


@dataclass(frozen=True)
class StageTimes:
    """Per pipeline stage, seconds of one micro-batch (what the pipeline timeline composes)."""

    fwd_s: tuple[float, ...]
    """Forward, including the exposed part of overlapped communication."""
    bwd_s: tuple[float, ...]
    """Backward and recomputation, including the exposed part of overlapped communication."""
    layer_exposed_s: tuple[tuple[float, float], ...]
    """Per stage (forward, backward) seconds of one layer's overlapped communication (CP KV ring,
    ZeRO-3 prefetch) that its compute does not hide."""
    p2p_s: float
    """One activation send between adjacent stages (0 without pipeline parallelism)."""


def _fwd_bwd_time(ops: Sequence[Op], times: Times, bwd: tuple[Phase, ...]) -> tuple[float, float]:
    """(phase_time(ops, times, (FWD,)), phase_time(ops, times, bwd)) in one pass over ``ops``, each sum
    added in the same order as phase_time adds it (so the same floats)."""
    f: float = 0
    b: float = 0
    for o in ops:
        ph = o.phase
        if ph is Phase.FWD:
            f += times[o.key()] * o.count
        elif ph in bwd:
            b += times[o.key()] * o.count
    return f, b


class LayerStageTimes(NamedTuple):
    """One stage's seconds per micro-batch (:func:`layer_and_stage_times`)."""

    layer_fwd_s: float
    """One layer's forward compute plus its exposed overlapped communication."""
    layer_bwd_s: float
    """One layer's backward (and recompute) plus its exposed overlapped communication."""
    exposed_fwd_s: float
    """The part of ``layer_fwd_s`` that is overlapped communication left exposed."""
    exposed_bwd_s: float
    """The part of ``layer_bwd_s`` that is overlapped communication left exposed."""
    stage_fwd_s: float
    """The stage's once-per-micro-batch forward operators (embedding, final norm, LM head, loss)."""
    stage_bwd_s: float
    """Their backward."""


ATTENTION_KINDS = ("attention_fwd", "attention_bwd")


def _exposed_overlap(st: StageGraph, times: Times, layer: tuple[float, float],
                     overlap: tuple[float, float]) -> tuple[float, float]:
    """(forward, backward) seconds of a layer's overlapped communication its compute leaves exposed. Ring attention
    (Megatron-Core / Transformer Engine context parallelism, ``AttnFuncWithCPAndKVP2P``) sends the next KV chunk
    while the attention kernel of the current one runs, inside the attention call: the QKV and output projections
    and the MLP run before or after it, so the ring hides only under the attention kernels (forward; backward with
    their recomputation). The other overlapped kinds hide under the rest of the layer's compute: all of it less the
    attention time the ring occupies (with no ring: the whole layer, as with no CP)."""
    cp_ops = [o for o in st.layer_overlap_ops if o.category is Category.CP_COMM]
    if not cp_ops:
        return max(0.0, overlap[0] - layer[0]), max(0.0, overlap[1] - layer[1])
    cf, cb = _fwd_bwd_time(cp_ops, times, _BWD)
    af, ab = _fwd_bwd_time([o for o in st.layer_ops if o.kind in ATTENTION_KINDS], times, _BWD_RECOMPUTE)
    return (max(0.0, cf - af) + max(0.0, overlap[0] - cf - (layer[0] - min(cf, af))),
            max(0.0, cb - ab) + max(0.0, overlap[1] - cb - (layer[1] - min(cb, ab))))


def layer_and_stage_times(st: StageGraph, times: Times, overlaps: bool) -> LayerStageTimes:
    """A layer's compute plus its exposed overlapped communication, and the stage's once-per-micro-batch ops,
    in seconds of one micro-batch."""
    lf, lb = _fwd_bwd_time(st.layer_ops, times, _BWD_RECOMPUTE)
    hf, hb, hsf, hsb = st.host_s  # no faster than the CPU issues the kernels (costmodel.graph.kernel_basis)
    lf, lb = max(lf, hf), max(lb, hb)
    of, ob = _fwd_bwd_time(st.layer_overlap_ops, times, _BWD)
    # overlapped comm is exposed only beyond the compute it runs beside (all of it where communication shares the
    # compute cores): the CP KV ring beside the attention kernels only, the rest (ZeRO-3 prefetch, TP and EP
    # overlap) beside the layer's compute
    ef, eb = _exposed_overlap(st, times, (lf, lb), (of, ob)) if overlaps else (of, ob)
    sf, sb = _fwd_bwd_time(st.stage_ops, times, _BWD_RECOMPUTE)
    return LayerStageTimes(lf + ef, lb + eb, ef, eb, max(sf, hsf), max(sb, hsb))


def stage_times(graph: OperatorGraph, times: Times, hardware: Hardware) -> StageTimes:
    """Sum operator times into per-stage forward/backward seconds per micro-batch."""
    overlaps = hardware.cluster.comm_overlaps_compute
    memo: dict[tuple, tuple[float, float, float, float]] = {}
    fwd, bwd, exposed = [], [], []
    for st in graph.stages:
        got = memo.get(st.signature) if st.signature else None
        if got is None:
            lt = layer_and_stage_times(st, times, overlaps)
            got = (st.layers * lt.layer_fwd_s + lt.stage_fwd_s, st.layers * lt.layer_bwd_s + lt.stage_bwd_s,
                   lt.exposed_fwd_s, lt.exposed_bwd_s)
            if st.signature:
                memo[st.signature] = got
        fwd.append(got[0])
        bwd.append(got[1])
        exposed.append((got[2], got[3]))
    p2p_s = times[graph.p2p.key()] if graph.p2p is not None else 0.0
    return StageTimes(tuple(fwd), tuple(bwd), tuple(exposed), p2p_s)


# ------------------------------------------------------------------------------------- 3. pipeline
def pipeline(graph: OperatorGraph, stages: StageTimes) -> PipelineResult:
    """The 1F1B (interleaved when vpp > 1) timeline of all micro-batches (:func:`pipeline_time`)."""
    return pipeline_time(stages.fwd_s, stages.bwd_s, graph.num_microbatches, graph.vpp, stages.p2p_s)


# ------------------------------------------------------------------------------------- 4. tail
@dataclass(frozen=True)
class StageTail:
    """What one stage does after its last backward, once per iteration (seconds)."""

    grad_reduce_s: float
    """Exposed DP gradient reduction."""
    optimizer_s: float
    """Optimizer step."""
    param_gather_s: float
    """Exposed distributed-optimizer parameter all-gather."""
    finish_s: float
    """When the stage's tail ends, from the start of the iteration."""
    offload_s: float = 0.0
    """Exposed host copies of activation offloading (costmodel.memory.offload); the optimizer offload's host step is in
    ``optimizer_s``."""

    @property
    def total_s(self) -> float:
        return self.grad_reduce_s + self.optimizer_s + self.param_gather_s + self.offload_s


@dataclass(frozen=True)
class IterationTail:
    """The end of the iteration after the pipeline."""

    stages: tuple[StageTail, ...]
    """Per stage."""
    ending_stage: int
    """The stage whose tail ends last (the first one on ties)."""
    rank_skew_wait_s: float
    """Waiting for the slowest rank at the synchronisations (:func:`straggler_wait`)."""
    synchronised_s: float
    """Iteration without the framework overhead: max(pipeline, last tail) + rank-skew wait."""
    overhead_s: float
    """Calibrated fixed framework overhead (0 uncalibrated)."""

    @property
    def time_s(self) -> float:
        """The iteration time."""
        return self.synchronised_s + self.overhead_s


def straggler_wait(plan: ParallelPlan, hardware: Hardware, graph: OperatorGraph, times: Times,
                   optimizer_s: Sequence[float]) -> tuple[float, list[str]]:
    """(seconds, warnings): waiting for the slowest rank at the synchronisations of a multi-rank step
    (measured by costmodel/profiling/sampling/skew.py, scaled to n ranks by costmodel.schedule.straggler).

    Every rank's compute between two synchronisations (TP collectives, pipeline send/recv, the DP
    gradient reduction, the next iteration's first collective after the optimizer) ends when the slowest
    rank's does: the step pays E[max over ranks] of it where single-process samples measure the mean.
    wait = straggler_excess x scale(n) x the compute of the slowest stage per iteration, where
    straggler_excess = sum(max)/sum(mean) - 1 measured on ``straggler_ranks`` ranks and
    scale(n) = E[max of n normals] / E[max of straggler_ranks normals] (Tippett 1925) for the n = world
    size ranks that synchronise at least once per iteration. 0 without a measured excess or on one rank.
    """
    excess = hardware.cluster.straggler_excess
    n = plan.gpus
    if excess <= 0 or n <= 1:
        return 0.0, []
    m = graph.num_microbatches

    def compute(ops: list[Op]) -> float:
        return sum(times[o.key()] * o.count for o in ops
                   if o.kind not in COLLECTIVE_KINDS and o.phase in _COMPUTE_PHASES)

    per_stage = [m * (st.layers * compute(st.layer_ops) + compute(st.stage_ops)) + opt
                 for st, opt in zip(graph.stages, optimizer_s)]
    measured = hardware.cluster.straggler_ranks
    warnings = []
    if n > measured:
        warnings.append(f"rank skew measured on {measured} ranks, extrapolated to {n} ranks assuming independent, "
                        "normally distributed rank speeds (E[max of n normals], Tippett 1925)")
    return excess * rank_scale(n, measured) * max(per_stage), warnings


def bucket_fraction(plan: ParallelPlan, st: StageGraph) -> float:
    """Share of a stage's DP gradient bytes in its last-reduced (and first-gathered) bucket.

    Megatron (``framework`` megatron): buckets of ``max(dp_bucket_mb, DP) x 1e6`` parameters, ``dp_bucket_mb`` read
    as millions of parameters: Megatron-Core DDP's default bucket_size is max(40M, 1M x DP) parameters ('If using
    very large dp_sizes, make buckets larger ... bandwidth-bound rather than latency-bound',
    megatron/core/distributed/distributed_data_parallel.py). Pipeline stages after the first run one bucket there
    ('since data-parallel communication on these stages is not on the critical path'); that is not modelled: their
    parameter gather would overlap the next iteration's pipeline fill, which the tail does not see. Other stacks:
    ``dp_bucket_mb`` megabytes of gradients."""
    params = st.params / plan.tp
    if st.expert_params:  # MoE: routed experts sharded E/EP per GPU and / ETP
        params = (st.params - st.expert_params) / plan.tp + st.expert_params / (plan.ep * plan.expert_tp)
    if plan.framework == "megatron":
        return min(1.0, max(plan.dp_bucket_mb, plan.dp) * 1e6 / max(params, 1.0))
    return min(1.0, plan.dp_bucket_mb * 1e6 / max(params * GRAD_REDUCE_BYTES, 1.0))


def dp_overlap_window(plan: ParallelPlan, num_microbatches: int, per_microbatch_s: float) -> float:
    """Seconds of a stage's compute that its DP gradient reduction (backward) or parameter gather (forward) can
    hide under, given that stage's compute for one micro-batch (``per_microbatch_s``, all of its model chunks).

    Without interleaving the gradients become ready during the last micro-batch's backward: one micro-batch.
    Megatron's interleaved schedule (VPP > 1) launches each model chunk's gradient reduction after that chunk's
    last micro-batch and, mirrored, each chunk's parameter gather a micro-batch group before its first
    (NVIDIA/Megatron-LM megatron/core/pipeline_parallel/schedules.py @d98e8a64,
    forward_backward_pipelining_with_interleaving: backward_step_helper_postprocess calls grad_sync_func[chunk]
    when is_last_microbatch_for_model_chunk, forward_step_helper_preprocess calls param_sync_func[chunk + 1]).
    The last micro-batch group runs the V chunks in turn, ``g = min(PP, micro-batches)`` micro-batches each
    (microbatch_group_size_per_vp_stage defaults to PP), so chunk c's share hides under c * g chunk-micro-batches
    plus its own last one: with equal shares per chunk, the queue of V reductions ends
    ``max(share, total - window)`` after the compute, window = (1 + (V - 1) * g) * per_microbatch_s / V."""
    v = plan.vpp
    if v <= 1 or plan.framework != "megatron":
        return per_microbatch_s
    group = min(plan.pp, num_microbatches)
    return (1 + (v - 1) * group) * per_microbatch_s / v


def iteration_tail(plan: ParallelPlan, hardware: Hardware, graph: OperatorGraph, times: Times,
                   stages: StageTimes, pipe: PipelineResult,
                   calibration: Calibration | None = None) -> tuple[IterationTail, list[str]]:
    """(tail, warnings): per stage the DP gradient reduction, optimizer step and parameter all-gather after
    its last backward, the rank-skew wait and the framework overhead (the calibration's; uncalibrated: all of
    the reduction may hide, no overhead)."""
    overlap_eff = calibration.overlap_efficiency if calibration is not None else 1.0
    overhead = max(calibration.iteration_overhead_s, 0.0) if calibration is not None else 0.0
    overlaps = hardware.cluster.comm_overlaps_compute
    tails = []
    slack = 0.0
    memo: dict[tuple, tuple[float, float, float]] = {}
    for i, st in enumerate(graph.stages):
        sums = memo.get(st.signature) if st.signature else None
        if sums is None:
            sums = (phase_time(st.iteration_ops, times, (Phase.DP_COMM,)),
                    phase_time(st.iteration_ops, times, (Phase.ZERO_COMM,)),
                    phase_time(st.iteration_ops, times, (Phase.OPTIMIZER,)))
            if st.signature:
                memo[st.signature] = sums
        t_grad, t_ag, t_opt = sums
        bucket = bucket_fraction(plan, st)
        if plan.overlap_grad_reduce and overlaps and t_grad > 0:
            # reduced while the last micro-batch runs backward; at most overlap_eff of it hides there
            # (overlap_eff = 1: max(last_bucket, t_grad - bwd[i]), the uncalibrated form, exactly)
            window = dp_overlap_window(plan, graph.num_microbatches, stages.bwd_s[i])
            exp_grad = max(t_grad * bucket, t_grad - min(window, overlap_eff * t_grad))
        else:
            exp_grad = t_grad
        # the first bucket's gather is waited for before the first layer's forward (Megatron-Core
        # distributed optimizer, overlap_param_gather: one bucket gathered per forward pre-hook)
        exp_ag = (max(t_ag * bucket, t_ag - dp_overlap_window(plan, graph.num_microbatches, stages.fwd_s[i]))
                  if plan.overlap_param_gather and overlaps else t_ag)
        host_opt, host_act = stage_offload_s(plan, hardware.gpu, graph, stages.fwd_s[i], stages.bwd_s[i], i)
        t_opt += host_opt
        # stage i ends its last backward before stage 0 does, by the backward of the stages before it
        tails.append(StageTail(exp_grad, t_opt, exp_ag, pipe.time_s - slack + exp_grad + t_opt + exp_ag + host_act,
                               host_act))
        slack += stages.bwd_s[i] / plan.vpp
    ending = max(range(len(tails)), key=lambda i: tails[i].finish_s)
    wait, warnings = straggler_wait(plan, hardware, graph, times, [t.optimizer_s for t in tails])
    synchronised = max(pipe.time_s, tails[ending].finish_s) + wait
    tail = IterationTail(tuple(tails), ending, wait, synchronised, overhead)
    return tail, warnings


def compose_iteration_time(plan: ParallelPlan, hardware: Hardware, graph: OperatorGraph, times: Times,
                           calibration: Calibration | None = None) -> float:
    """Iteration time only (steps 2-4), e.g. for the ends of a prediction interval."""
    stages = stage_times(graph, times, hardware)
    tail, _ = iteration_tail(plan, hardware, graph, times, stages, pipeline(graph, stages), calibration)
    return tail.time_s


# ------------------------------------------------------------------------------------- 5. breakdown
@dataclass(frozen=True)
class BreakdownRow:
    """Seconds of one operator (name, phase) on the critical stage over the whole iteration."""

    operator: str
    phase: str
    category: Category
    time_s: float
    """Rescaled so that the rows add up to the iteration time."""
    share: float
    """Fraction of the iteration."""

    def to_dict(self) -> dict:
        return {"operator": self.operator, "phase": self.phase, "time_s": self.time_s, "share": self.share,
                "category": self.category.value}


@dataclass(frozen=True)
class Breakdown:
    """Where the iteration's time goes, seen from the critical stage."""

    stage: int
    """The critical stage (PipelineResult.steady_stage: largest forward + backward)."""
    rows: tuple[BreakdownRow, ...]
    """Largest first; shares add up to 1."""
    exposed_comm_s: dict[str, float]
    """Communication on the critical path per kind: tp, pp, dp, zero, cp, and ep for MoE expert-parallel plans
    (seconds per iteration)."""
    bubble_s: float
    """The pipeline bubble (incl. p2p waits) of the critical stage, from the pipeline result."""

    def category_seconds(self) -> dict[str, float]:
        """Seconds per category, in order of first appearance among the rows."""
        totals: dict[str, float] = {}
        for row in self.rows:
            totals[row.category.value] = totals.get(row.category.value, 0.0) + row.time_s
        return totals

    def bottleneck(self) -> str:
        """The category with the most time (compute when there are no rows)."""
        totals = self.category_seconds()
        return max(totals, key=totals.__getitem__) if totals else Category.COMPUTE.value


def _overlap_shares(plan: ParallelPlan, st: StageGraph, times: Times,
                    has_ep: bool) -> list[tuple[str, Category, float]]:
    """(kind, category, share) of a layer's exposed overlapped communication, in proportion to each kind's
    overlapped seconds: MoE expert-parallel (``plan.moe_overlap_comm``), tensor-parallel (``plan.tp_comm_overlap``)
    and the rest, CP (CP > 1) or ZeRO-3."""
    other = ("cp", Category.CP_COMM) if plan.cp > 1 else ("zero", Category.ZERO_COMM)
    secs = {"ep": 0.0, "tp": 0.0, other[0]: 0.0}
    for o in st.layer_overlap_ops:
        kind = "ep" if o.category is Category.EP_COMM else "tp" if o.category is Category.TP_COMM else other[0]
        secs[kind] += times[o.key()] * o.count
    total = sum(secs.values())
    if total <= 0:
        return [(other[0], other[1], 1.0)]
    cat = {"ep": Category.EP_COMM, "tp": Category.TP_COMM, other[0]: other[1]}
    return [(k, cat[k], v / total) for k, v in secs.items() if v > 0]


def breakdown(plan: ParallelPlan, graph: OperatorGraph, times: Times, stages: StageTimes, pipe: PipelineResult,
              tail: IterationTail) -> Breakdown:
    """Operator rows of the critical stage over the iteration, plus the bubble, the exposed part of the
    ending stage's tail (split in proportion to its parts), the rank-skew wait and the overhead."""
    m = graph.num_microbatches
    s_idx = pipe.steady_stage
    st = graph.stages[s_idx]
    agg: dict[tuple[str, str], float] = {}
    cats: dict[tuple[str, str], Category] = {}

    def add(name: str, phase: str, category: Category, value: float) -> None:
        if value > 0:
            key = (name, phase)
            agg[key] = agg.get(key, 0.0) + value
            cats.setdefault(key, category)

    exposed = {"tp": 0.0, "pp": 0.0, "dp": 0.0, "zero": 0.0, "cp": 0.0}
    has_ep = any(o.category is Category.EP_COMM for lst in (st.layer_ops, st.layer_overlap_ops) for o in lst)
    if has_ep:
        exposed["ep"] = 0.0
    for o in st.layer_ops:
        v = times[o.key()] * o.count * st.layers * m
        add(o.name, o.phase, o.category or Category.COMPUTE, v)
        if o.category is Category.TP_COMM:
            exposed["tp"] += v
        elif o.category is Category.EP_COMM:
            exposed["ep"] += v
    for o in st.stage_ops:
        v = times[o.key()] * o.count * m
        add(o.name, o.phase, o.category or Category.COMPUTE, v)
        if o.category is Category.TP_COMM:
            exposed["tp"] += v
    ef, eb = stages.layer_exposed_s[s_idx]
    if ef + eb > 0:
        for kind, cat, share in _overlap_shares(plan, st, times, has_ep):
            add(f"{kind}.exposed_comm", "fwd+bwd", cat, (ef + eb) * st.layers * m * share)
            exposed[kind] += (ef + eb) * st.layers * m * share
    bubble = max(0.0, pipe.bubble_s)
    add("pipeline_bubble+p2p", "pipeline", Category.PIPELINE_BUBBLE, bubble)
    exposed["pp"] = min(bubble, 2 * stages.p2p_s * (m + plan.pp - 1)) if plan.pp > 1 else 0.0
    after = tail.synchronised_s - pipe.time_s
    if after > 0:
        end = tail.stages[tail.ending_stage]
        eg, to, ea = end.grad_reduce_s, end.optimizer_s, end.param_gather_s
        tot = eg + to + ea + end.offload_s
        add("offload.activation_copies (exposed)", "offload", Category.COMPUTE,
            after * end.offload_s / tot if tot else 0.0)
        add("dp.grad_reduce (exposed)", "dp_comm", Category.DP_COMM, after * eg / tot if tot else 0.0)
        add("optimizer.adam", "optimizer", Category.OPTIMIZER, after * to / tot if tot else 0.0)
        add("dp.param_allgather (exposed)", "zero_comm", Category.DP_COMM, after * ea / tot if tot else 0.0)
        exposed["dp"] += after * eg / tot if tot else 0.0
        exposed["zero"] += after * ea / tot if tot else 0.0
    add("sync.rank_skew_wait", "sync", Category.RANK_SKEW, tail.rank_skew_wait_s)
    add("framework_overhead (calibrated)", "iteration", Category.FRAMEWORK, tail.overhead_s)
    iteration = tail.time_s
    total = sum(agg.values()) or 1.0
    rows = tuple(BreakdownRow(k[0], str(k[1]), cats[k], v * iteration / total, v / total)
                 for k, v in sorted(agg.items(), key=lambda kv: -kv[1]))
    return Breakdown(s_idx, rows, exposed, bubble)


# ------------------------------------------------------------------------------------- 6. metrics
@dataclass(frozen=True)
class Metrics:
    """Throughput, FLOP rates and memory of one iteration."""

    tokens_per_s: float
    tokens_per_s_per_gpu: float
    model_tflops_per_gpu: float
    """Model FLOPs (fwd + bwd, causal attention, no recomputation: the convention of costmodel/schedule/flops.py) per
    GPU per second, in TFLOP/s."""
    hardware_tflops_per_gpu: float
    """FLOPs the operator graph executes (FlashAttention backward and full recomputation included), per GPU
    per second, in TFLOP/s."""
    mfu: float
    """Model TFLOP/s per GPU / the GPU's dense peak (:func:`mfu_peak_dtype`); never above the hardware
    FLOP utilisation (tests/test_invariants.py)."""
    memory: MemoryBreakdown
    """Bytes per GPU on the peak stage."""
    fits_in_memory: bool


def metrics(model: ModelSpec, plan: ParallelPlan, hardware: Hardware, iteration_s: float) -> Metrics:
    """Throughput, FLOP rates, MFU and memory for an iteration of ``iteration_s`` seconds."""
    tokens = plan.tokens_per_iteration
    mflops = model_flops_per_iteration(model, plan.gbs, plan.seq_len)
    hflops = hardware_flops_per_iteration(executed_model(model, plan.tp), plan.gbs, plan.seq_len,
                                          plan.recompute, plan.recompute_modules)
    per_gpu = iteration_s * plan.gpus
    model_tflops = mflops / per_gpu / 1e12
    mem = memory_per_gpu(model, plan, hardware.gpu)
    return Metrics(
        tokens_per_s=tokens / iteration_s,
        tokens_per_s_per_gpu=tokens / per_gpu,
        model_tflops_per_gpu=model_tflops,
        hardware_tflops_per_gpu=hflops / per_gpu / 1e12,
        mfu=model_tflops * 1e12 / hardware.gpu.peak_flops(mfu_peak_dtype(plan.dtype)),
        memory=mem,
        fits_in_memory=fits_in_memory(mem, hardware.gpu),
    )


# ------------------------------------------------------------------------------------- all steps
@dataclass(frozen=True)
class Composition:
    """The result of every step for one plan."""

    stages: StageTimes
    pipeline: PipelineResult
    tail: IterationTail
    breakdown: Breakdown
    metrics: Metrics
    warnings: tuple[str, ...]
    """Notes of the composition (rank-skew extrapolation, memory that does not fit), in order."""

    @property
    def iteration_time_s(self) -> float:
        return self.tail.time_s

    @property
    def bubble_fraction(self) -> float:
        """Pipeline bubble as a fraction of the iteration."""
        return self.breakdown.bubble_s / self.tail.time_s


def zero2_reduction_warning(plan: ParallelPlan, graph: OperatorGraph, times: Times) -> str | None:
    """What a ZeRO-2 plan's prediction assumes about its gradient reduce-scatter, and what the other schedule
    would add (None for other plans or one micro-batch).

    The graph reduce-scatters a ZeRO-2 stage's gradients once per iteration (:func:`iteration_tail`, as for
    ZeRO-1), which is how the only measured ZeRO-2 runs here are predicted: Llama 3 405B on 8,192 and 16,384 H100
    (published_runs.csv LLAMA3-001/002, FSDP sharding gradients with parameters kept after forward), within 10 %
    held out. The memory model holds the gradients sharded (costmodel.memory.memory_states.stage_state_bytes),
    and Megatron-FSDP's ``optim_grads`` (what planner exports for ZeRO-2 under Megatron) reduce-scatters every
    micro-batch's gradients instead: "Gradient reduce-scatter is overlapped with backward compute and accumulated
    during every backward pass" (NVIDIA/Megatron-LM docs/user-guide/features/megatron_fsdp.md @d98e8a64,
    "ZeRO-2"); in the code, ``grad_reduce_every_bprop`` for ``optim_grads`` and ``optim_grads_params``
    (megatron/core/distributed/custom_fsdp/fully_sharded_data_parallel.py @1e057005, May 2025). The bound below is
    the M - 1 further reduce-scatters of the stage with the most, none hidden."""
    m = graph.num_microbatches
    if plan.zero != 2 or m <= 1:
        return None
    per_stage = [sum(times[o.key()] * o.count for o in st.iteration_ops
                     if o.kind == "reduce_scatter" and o.phase is Phase.DP_COMM) for st in graph.stages]
    once = max(per_stage, default=0.0)
    if once <= 0.0:
        return None
    return (f"ZeRO-2: gradients costed as reduce-scattered once per iteration ({once:.3g} s on the busiest stage), "
            "as the Llama 3 405B runs that validate ZeRO-2 (published_runs.csv LLAMA3-001/002); Megatron-FSDP "
            "optim_grads and DeepSpeed ZeRO-2 reduce-scatter every micro-batch: with "
            f"{m} micro-batches up to {(m - 1) * once:.3g} s more per iteration where the backward does not hide "
            "it (costmodel.schedule.compose.zero2_reduction_warning)")


def compose(model: ModelSpec, plan: ParallelPlan, hardware: Hardware, graph: OperatorGraph, times: Times,
            calibration: Calibration | None = None) -> Composition:
    """Steps 2-6 for the operator ``times`` of ``graph``."""
    stages = stage_times(graph, times, hardware)
    pipe = pipeline(graph, stages)
    tail, warnings = iteration_tail(plan, hardware, graph, times, stages, pipe, calibration)
    zero2 = zero2_reduction_warning(plan, graph, times)
    if zero2:
        warnings.append(zero2)
    rows = breakdown(plan, graph, times, stages, pipe, tail)
    met = metrics(model, plan, hardware, tail.time_s)
    if not met.fits_in_memory:
        warnings.append(memory_message(met.memory, hardware.gpu))
    return Composition(stages, pipe, tail, rows, met, tuple(warnings))
