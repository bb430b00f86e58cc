"""One prediction: (model, plan, hardware) -> iteration time, throughput, memory, breakdown.

Composition (the paper's step 4, Zhang et al. arXiv 2509.22832 §III-C): operator times from the
cost seam are summed into per-stage forward/backward times per micro-batch, composed by the 1F1B
pipeline timeline (:mod:`costmodel.timeline`), then the per-iteration tail is added: the exposed part
of the DP gradient reduction, the optimizer step and the exposed parameter all-gather, taken on the
stage that finishes last.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from functools import lru_cache
from typing import TYPE_CHECKING

from costmodel.cost.base import OperatorCostModel
from costmodel.flops import hardware_flops_per_iteration, model_flops_per_iteration
from costmodel.graph import GRAD_REDUCE_BYTES, OperatorGraph, build_graph
from costmodel.memory import MemoryBreakdown, fits_in_memory, memory_per_gpu
from costmodel.ops import Op
from costmodel.timeline import pipeline_time
from costmodel.core.specs.hardware import Hardware
from costmodel.core.specs.model import ModelSpec
from costmodel.core.specs.plan import ParallelPlan

if TYPE_CHECKING:
    from planner.calibrate import Calibration

GIB = 1024**3


def mfu_peak_dtype(dtype: str) -> str:
    """Which dense peak MFU divides by: bf16/fp16 for mixed-precision and fp8 runs (the convention of
    the published MFU figures, shared/validation/README.md), fp32 for pure fp32 training."""
    return "fp32" if dtype == "fp32" else "bf16"


@lru_cache(maxsize=1)
def default_cost_model() -> OperatorCostModel:
    """The cost model used when none is given: the measured regressors, roofline where none exists."""
    from costmodel.cost.measured import MeasuredCostModel
    from costmodel.cost.roofline import RooflineCostModel

    return MeasuredCostModel(fallback=RooflineCostModel())


@dataclass
class Prediction:
    """Everything planner predicts for one plan. Times in seconds, memory in GiB (2^30 bytes)."""

    iteration_time_s: float
    tokens_per_s: float
    tokens_per_s_per_gpu: float
    model_tflops_per_gpu: float
    """Model FLOPs (fwd + bwd, no recomputation; full attention matrix, SC21 eq. 3 convention) per GPU per s."""
    hardware_tflops_per_gpu: float
    """FLOPs executed including recomputation, per GPU per second."""
    mfu: float
    """Model FLOPs utilisation: model TFLOP/s per GPU / dense bf16 peak of the GPU."""
    memory_gib_per_gpu: float
    fits_in_memory: bool
    bubble_fraction: float
    """Pipeline bubble (incl. p2p waits) as a fraction of the iteration."""
    memory: dict
    """Memory parts in GiB: weights, gradients, optimizer, activations, workspace (peak stage)."""
    exposed_comm_s: dict
    """Communication on the critical path per kind: tp, pp, dp, zero, cp (seconds per iteration)."""
    breakdown: list
    """[{operator, phase, time_s, share}] on the critical stage, sorted by time, shares sum to 1."""
    warnings: list = field(default_factory=list)
    iteration_time_low_s: float | None = None
    iteration_time_high_s: float | None = None
    stage_times_s: list = field(default_factory=list)
    """Per stage: [forward, backward] seconds for one micro-batch."""
    cost_model: str = ""
    bottleneck: str = ""
    """Largest of compute, bubble, exposed tp/dp/pp/zero/cp communication, optimizer."""

    def to_dict(self) -> dict:
        return asdict(self)


def _sum_time(ops: list[Op], times: dict, phases: tuple[str, ...]) -> float:
    return sum(times[o.key()] * o.count for o in ops if o.phase in phases)


@lru_cache(maxsize=None)  # called ~50x per prediction with a few dozen distinct names (plan searches)
def _category(name: str) -> str:
    for prefix, cat in (("tp.", "exposed TP comm"), ("cp.", "exposed CP comm"), ("zero3.", "exposed ZeRO comm"),
                        ("zero.", "exposed ZeRO comm"), ("dp.", "exposed DP comm"), ("pp.", "exposed PP comm"),
                        ("pipeline", "pipeline bubble"), ("optimizer", "optimizer"),
                        ("framework", "framework overhead"), ("sync.", "rank skew wait")):
        if name.startswith(prefix):
            return cat
    return "compute"


def _bottleneck(breakdown: list) -> str:
    """The category (compute, pipeline bubble, exposed TP/CP/ZeRO/DP comm, optimizer) with the most time."""
    totals: dict[str, float] = {}
    for row in breakdown:
        cat = _category(row["operator"])
        totals[cat] = totals.get(cat, 0.0) + row["time_s"]
    return max(totals, key=totals.__getitem__) if totals else "compute"


def predict(model: ModelSpec, plan: ParallelPlan, hardware: Hardware,
            cost_model: OperatorCostModel | None = None, calibration: Calibration | None = None) -> Prediction:
    """Predict one training iteration of ``model`` under ``plan`` on ``hardware``.

    ``calibration`` (:class:`planner.calibrate.Calibration`) scales compute / collective operator times,
    limits how much DP gradient reduction hides under backward and adds a fixed per-iteration overhead;
    None leaves the prediction exactly uncalibrated.
    """
    model.require_dense()
    plan.validate(model)
    cost_model = cost_model or default_cost_model()
    graph = build_graph(model, plan)
    bounds: list = []
    times, warnings = _cost_all(graph, hardware, cost_model, bounds)
    times, bounds = _corun(plan, hardware, times, bounds, warnings)
    unread = model.extra.get("unread_keys") if isinstance(model.extra, dict) else None
    if unread:
        shown = ", ".join(map(str, unread[:8])) + (f" and {len(unread) - 8} more" if len(unread) > 8 else "")
        warnings = [f"{model.source or 'config.json'}: keys planner does not read, ignored: {shown} (check that "
                    "they do not change the architecture)"] + list(warnings)
    if calibration is not None:
        times = calibration.scale_times(times)
        bounds = [calibration.scale_times(b) for b in bounds]
        warnings = warnings + calibration.warnings_for(cost_model.name)
    pred = _compose(model, plan, hardware, graph, times, warnings, cost_model.name, calibration)
    if bounds and (bounds[0] != times or bounds[1] != times):
        # the regressors' ensemble intervals, carried through the same composition (each end
        # composes every operator at that end: a conservative band, not a joint quantile)
        pred.iteration_time_low_s = _compose(model, plan, hardware, graph, bounds[0], [], cost_model.name,
                                             calibration, iteration_only=True)
        pred.iteration_time_high_s = _compose(model, plan, hardware, graph, bounds[1], [], cost_model.name,
                                              calibration, iteration_only=True)
    return pred


def _cost_all(graph: OperatorGraph, hardware: Hardware, cost_model: OperatorCostModel,
              bounds: list | None = None):
    unique: dict[tuple, Op] = {}
    seen_lists: set[int] = set()
    for st in graph.stages:
        for lst in (st.layer_ops, st.stage_ops, st.iteration_ops, st.layer_overlap_ops):
            if id(lst) in seen_lists:
                continue
            seen_lists.add(id(lst))
            for o in lst:
                unique.setdefault(o.key(), o)
    if graph.p2p is not None:
        unique.setdefault(graph.p2p.key(), graph.p2p)
    ops = list(unique.values())
    res = cost_model.predict(ops, hardware)
    times = dict(zip(unique.keys(), (float(x) for x in res.time_s)))
    if bounds is not None and res.low_s is not None and res.high_s is not None:
        bounds.append(dict(zip(unique.keys(), (float(x) for x in res.low_s))))
        bounds.append(dict(zip(unique.keys(), (float(x) for x in res.high_s))))
    return times, list(res.warnings)


def _corun(plan: ParallelPlan, hardware: Hardware, times: dict, bounds: list, warnings: list) -> tuple[dict, list]:
    """Ranks of one node slow each other down (shared memory bandwidth and caches): compute operator times,
    sampled one process at a time, are multiplied by the cluster's measured ``corun_slowdown`` of their
    kind when the plan puts more than one rank on a node (costmodel/sampling/corun.py). Applied to every
    compute operator of the step, including those a pipeline stage runs while another stage idles in the
    bubble (an upper bound there). Times and interval ends unchanged without a measurement (GPU clusters)."""
    factors = hardware.cluster.corun_slowdown
    ranks = min(plan.world_size, plan.gpus_per_node)
    if not factors or ranks <= 1:
        return times, bounds
    if ranks != hardware.cluster.corun_ranks:
        warnings.append(f"co-run slowdown measured with {hardware.cluster.corun_ranks} ranks per node, used "
                        f"unchanged for {ranks}")

    def scale(t: dict) -> dict:
        return {k: v * factors.get(k[0], 1.0) for k, v in t.items()}  # Op.key()[0] is the kind

    return scale(times), [scale(b) for b in bounds]


def _straggler_wait(plan: ParallelPlan, hardware: Hardware, graph: OperatorGraph, times: dict, m: int,
                    optimizer_s: list, warnings: list) -> float:
    """Waiting for the slowest rank at the synchronisations of a multi-rank step (costmodel/sampling/skew.py).

    Every rank's compute between two synchronisations (TP collectives, pipeline send/recv, the DP
    gradient reduction, the next iteration's first collective after the optimizer) ends when the slowest
    rank's does: the step pays E[max over ranks] of it where single-process samples measure the mean.
    wait = straggler_excess x scale(n) x the compute of the slowest stage per iteration, where
    straggler_excess = sum(max)/sum(mean) - 1 measured on ``straggler_ranks`` ranks and
    scale(n) = E[max of n normals] / E[max of straggler_ranks normals] (Tippett 1925) for the n = world
    size ranks that synchronise at least once per iteration. 0 without a measured excess or on one rank.
    """
    excess = hardware.cluster.straggler_excess
    n = plan.world_size
    if excess <= 0 or n <= 1:
        return 0.0
    from costmodel.core.kinds import COLLECTIVE_KINDS
    from costmodel.sampling.skew import rank_scale

    def compute(ops: list[Op]) -> float:
        return sum(times[o.key()] * o.count for o in ops
                   if o.kind not in COLLECTIVE_KINDS and o.phase in ("fwd", "bwd", "recompute"))

    per_stage = [m * (st.layers * compute(st.layer_ops) + compute(st.stage_ops)) + opt
                 for st, opt in zip(graph.stages, optimizer_s)]
    measured = hardware.cluster.straggler_ranks
    if n > measured:
        warnings.append(f"rank skew measured on {measured} ranks, extrapolated to {n} ranks assuming independent, "
                        "normally distributed rank speeds (E[max of n normals], Tippett 1925)")
    return excess * rank_scale(n, measured) * max(per_stage)


def _compose(model: ModelSpec, plan: ParallelPlan, hardware: Hardware, graph: OperatorGraph,
             times: dict, warnings: list, cost_name: str, calibration: Calibration | None = None,
             iteration_only: bool = False):
    warnings = list(warnings)
    memo: dict[tuple, float] = {}

    def _sum_time(ops: list[Op], times: dict, phases: tuple[str, ...]) -> float:  # noqa: F811 (memoised)
        key = (id(ops), phases)
        v = memo.get(key)
        if v is None:
            v = memo[key] = sum(times[o.key()] * o.count for o in ops if o.phase in phases)
        return v

    m = graph.num_microbatches
    fwd, bwd = [], []
    per_layer_cache: dict[int, tuple] = {}
    for st in graph.stages:
        key = id(st.layer_ops)
        if key not in per_layer_cache:
            lf = _sum_time(st.layer_ops, times, ("fwd",))
            lb = _sum_time(st.layer_ops, times, ("bwd", "recompute"))
            of = _sum_time(st.layer_overlap_ops, times, ("fwd",))
            ob = _sum_time(st.layer_overlap_ops, times, ("bwd",))
            # overlapped comm (CP KV ring, ZeRO-3 prefetch) is exposed only beyond the layer's compute
            # (all of it where communication shares the compute cores)
            ef, eb = (max(0.0, of - lf), max(0.0, ob - lb)) if hardware.cluster.comm_overlaps_compute else (of, ob)
            per_layer_cache[key] = (lf + ef, lb + eb, ef, eb)
        lf, lb, _, _ = per_layer_cache[key]
        fwd.append(st.layers * lf + _sum_time(st.stage_ops, times, ("fwd",)))
        bwd.append(st.layers * lb + _sum_time(st.stage_ops, times, ("bwd", "recompute")))
    p2p_s = times[graph.p2p.key()] if graph.p2p is not None else 0.0
    pipe = pipeline_time(fwd, bwd, m, graph.vpp, p2p_s)

    # ---- per-iteration tail on each stage (grad reduction, optimizer, param all-gather)
    finish, tails = [], []
    slack = 0.0
    overlap_eff = 1.0 if calibration is None else calibration.overlap_efficiency
    for i, st in enumerate(graph.stages):
        t_grad = _sum_time(st.iteration_ops, times, ("dp_comm",))
        t_ag = _sum_time(st.iteration_ops, times, ("zero_comm",))
        t_opt = _sum_time(st.iteration_ops, times, ("optimizer",))
        if plan.overlap_grad_reduce and hardware.cluster.comm_overlaps_compute and t_grad > 0:
            grad_bytes = st.params / plan.tp * GRAD_REDUCE_BYTES
            last_bucket = t_grad * min(1.0, plan.dp_bucket_mb * 1e6 / max(grad_bytes, 1.0))
            # reduced while the last micro-batch runs backward; at most overlap_eff of it hides there
            # (overlap_eff = 1: max(last_bucket, t_grad - bwd[i]), the uncalibrated form, exactly)
            exp_grad = max(last_bucket, t_grad - min(bwd[i], overlap_eff * t_grad))
        else:
            exp_grad = t_grad
        exp_ag = max(0.0, t_ag - fwd[i]) if plan.overlap_param_gather and hardware.cluster.comm_overlaps_compute else t_ag
        # stage i ends its last backward before stage 0 does, by the backward of the stages before it
        finish.append(pipe.time_s - slack + exp_grad + t_opt + exp_ag)
        tails.append((exp_grad, t_opt, exp_ag))
        slack += bwd[i] / plan.vpp
    crit = max(range(len(finish)), key=finish.__getitem__)
    iteration = max(pipe.time_s, finish[crit])
    skew_wait = _straggler_wait(plan, hardware, graph, times, m, [t[1] for t in tails], warnings)
    iteration += skew_wait
    if iteration_only:
        overhead = calibration.iteration_overhead_s if calibration is not None else 0.0
        return iteration + max(overhead, 0.0)

    # ---- breakdown on the steady-state (slowest) stage
    s_idx = max(range(len(fwd)), key=lambda i: fwd[i] + bwd[i])
    st = graph.stages[s_idx]
    agg: dict[tuple[str, str], float] = {}

    def add(name: str, phase: str, value: float) -> None:
        if value > 0:
            agg[(name, phase)] = agg.get((name, phase), 0.0) + value

    exposed = {"tp": 0.0, "pp": 0.0, "dp": 0.0, "zero": 0.0, "cp": 0.0}
    for o in st.layer_ops:
        v = times[o.key()] * o.count * st.layers * m
        add(o.name, o.phase, v)
        if o.name.startswith("tp."):
            exposed["tp"] += v
    for o in st.stage_ops:
        v = times[o.key()] * o.count * m
        add(o.name, o.phase, v)
        if o.name.startswith("tp."):
            exposed["tp"] += v
    _, _, ef, eb = per_layer_cache[id(st.layer_ops)]
    if ef + eb > 0:
        kind = "cp" if plan.cp > 1 else "zero"
        add(f"{kind}.exposed_comm", "fwd+bwd", (ef + eb) * st.layers * m)
        exposed[kind] += (ef + eb) * st.layers * m
    steady = m * (fwd[s_idx] + bwd[s_idx])
    bubble = max(0.0, pipe.time_s - steady)
    add("pipeline_bubble+p2p", "pipeline", bubble)
    exposed["pp"] = min(bubble, 2 * p2p_s * (m + plan.pp - 1)) if plan.pp > 1 else 0.0
    tail = iteration - pipe.time_s
    if tail > 0:
        eg, to, ea = tails[crit]
        tot = eg + to + ea
        add("dp.grad_reduce (exposed)", "dp_comm", tail * eg / tot if tot else 0.0)
        add("optimizer.adam", "optimizer", tail * to / tot if tot else 0.0)
        add("dp.param_allgather (exposed)", "zero_comm", tail * ea / tot if tot else 0.0)
        exposed["dp"] += tail * eg / tot if tot else 0.0
        exposed["zero"] += tail * ea / tot if tot else 0.0
    add("sync.rank_skew_wait", "sync", skew_wait)
    if calibration is not None and calibration.iteration_overhead_s > 0:
        add("framework_overhead (calibrated)", "iteration", calibration.iteration_overhead_s)
        iteration += calibration.iteration_overhead_s
    total = sum(agg.values()) or 1.0
    breakdown = [{"operator": k[0], "phase": k[1], "time_s": v * iteration / total, "share": v / total}
                 for k, v in sorted(agg.items(), key=lambda kv: -kv[1])]

    # ---- throughput, FLOPs, memory
    tokens = plan.tokens_per_iteration
    mflops = model_flops_per_iteration(model, plan.global_batch_size, plan.seq_len)
    hflops = hardware_flops_per_iteration(model, plan.global_batch_size, plan.seq_len, plan.recompute)
    per_gpu = iteration * plan.world_size
    model_tflops = mflops / per_gpu / 1e12
    mem: MemoryBreakdown = memory_per_gpu(model, plan, hardware.gpu)
    fits = fits_in_memory(mem, hardware.gpu)
    warnings = list(warnings)
    if not fits:
        warnings.append(f"does not fit: {mem.total / GIB:.1f} GiB per GPU needed on stage {mem.stage}, "
                        f"{hardware.gpu.name} has {hardware.gpu.hbm_bytes / GIB:.1f} GiB")
    bottleneck = _bottleneck(breakdown)
    return Prediction(
        iteration_time_s=iteration,
        tokens_per_s=tokens / iteration,
        tokens_per_s_per_gpu=tokens / per_gpu,
        model_tflops_per_gpu=model_tflops,
        hardware_tflops_per_gpu=hflops / per_gpu / 1e12,
        mfu=model_tflops * 1e12 / hardware.gpu.peak_flops(mfu_peak_dtype(plan.dtype)),
        memory_gib_per_gpu=mem.total / GIB,
        fits_in_memory=fits,
        bubble_fraction=bubble / iteration,
        memory={"weights": mem.weights / GIB, "gradients": mem.gradients / GIB, "optimizer": mem.optimizer / GIB,
                "activations": mem.activations / GIB, "workspace": mem.workspace / GIB, "stage": mem.stage},
        exposed_comm_s=exposed,
        breakdown=breakdown,
        warnings=warnings,
        stage_times_s=[[f, b] for f, b in zip(fwd, bwd)],
        cost_model=cost_name,
        bottleneck=bottleneck,
    )
