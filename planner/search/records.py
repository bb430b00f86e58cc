"""Ranked-plan records and their output formats (table, JSON, CSV, Markdown), all from one list.

A :class:`PlanRecord` is a flat, JSON-ready summary of one feasible plan and its prediction; the
search stores it with each Optuna trial, the report writer and ``planner export`` read it back.
"""

from __future__ import annotations

import dataclasses
import json
import math
from dataclasses import dataclass, field

from costmodel.core.kinds import describe_cost_sources
from costmodel.core.specs.framework import DEFAULT_FRAMEWORK
from costmodel.core.specs.memory_features import feature_values
from costmodel.core.specs.plan import ParallelPlan, describe_split
from costmodel.graph.moe import with_default_dispatcher
from planner.formats import (
    FORMATS,  # noqa: F401 (re-exported: the formats of every result-printing command)
    PLAN_FIELDS,
    csv_text,
    model_facts,
    plan_row,
)

GIB = 1024**3


@dataclass
class PlanRecord:
    """One feasible plan with its predicted time, throughput, memory and cost."""

    model: str
    """Model name."""
    gpu: str
    """GPU key (catalogue)."""
    cluster: str
    """Node type key (catalogue)."""
    nodes: int
    """Nodes used."""
    gpus_per_node: int
    """GPUs per node used by the plan."""
    gpus: int
    """Total GPUs."""
    tp: int
    pp: int
    dp: int
    cp: int
    vpp: int
    mbs: int
    """Micro-batch size (sequences)."""
    gbs: int
    """Global batch size (sequences)."""
    seq_len: int
    num_microbatches: int
    """Micro-batches per iteration per pipeline (GBS / (MBS x DP))."""
    recompute: str
    sequence_parallel: bool
    """Sequence parallelism in effect (TP > 1 and enabled)."""
    zero: int
    dtype: str
    iteration_time_s: float
    """Predicted seconds per iteration."""
    iteration_time_low_s: float | None
    """Lower end of the prediction interval (None when the cost model gives none)."""
    iteration_time_high_s: float | None
    """Upper end of the prediction interval."""
    tokens_per_s: float
    """Training tokens per second, whole job."""
    mfu: float
    """Model FLOPs utilisation (fraction of dense bf16 peak)."""
    model_tflops_per_gpu: float
    """Model TFLOP/s per GPU (no recomputation counted)."""
    memory_gib_per_gpu: float
    """Predicted peak memory of the most loaded GPU, GiB."""
    memory_limit_gib: float
    """HBM of the GPU, GiB (the plan fits within it less the headroom)."""
    price_usd_per_gpu_hour: float | None
    """Price used (catalogue or --price); None = unknown."""
    usd_per_mtoken: float | None
    """USD per million training tokens (None without a price)."""
    time_to_train_s: float | None
    """Seconds to train the token budget (None without --tokens)."""
    cost_to_train_usd: float | None
    """USD to train the token budget (None without --tokens or price)."""
    bottleneck: str
    """Largest time category: compute, pipeline bubble, exposed TP/DP/PP/ZeRO/CP comm, optimizer."""
    bubble_fraction: float
    """Pipeline bubble as a fraction of the iteration."""
    cost_model: str
    """Operator cost model that produced the times."""
    rank: int = 0
    """1-based position in the ranking it was printed in (0 = unranked)."""
    pareto: bool = False
    """On the (time, USD/Mtoken) Pareto front of the records it was ranked with."""
    trial: int | None = None
    """Optuna trial number that found it (None for exhaustive search)."""
    cost_sources: dict = field(default_factory=dict)
    """Distinct operators per cost source (Prediction.cost_sources); {} in records written before it existed."""
    equivalent: list = field(default_factory=list)
    """Other plans folded into this row: same allocation, batch, predicted time and memory (how each differs,
    e.g. 'recompute=selective'; planner.search.engine.ranked_distinct)."""
    quick: bool = False
    """Made from the iteration time alone (planner.search.objective.quick_prediction: no breakdown, interval,
    bottleneck or cost sources); the exhaustive search completes the plans it prints."""
    layer_split: list | None = None
    """Layers per pipeline stage when uneven (Prediction.layer_split: chosen when PP x VPP does not divide
    the layers); None = even."""

    nvlink_domain: int = 0
    """GPUs per NVLink domain the plan was costed with (ParallelPlan.nvlink_domain; 0 = gpus_per_node)."""
    framework: str = DEFAULT_FRAMEWORK
    """Training stack the plan was costed for (ParallelPlan.framework)."""
    ep: int = 1
    """Expert-parallel degree (1 for dense models)."""
    etp: int | None = None
    """Expert tensor-parallel degree (ParallelPlan.etp: TP unless set; None in records written before it)."""
    goodput: float | None = None
    """Expected productive / wall-clock time on this allocation (costmodel.schedule.goodput); None = a perfect run
    assumed. time_to_train_s and cost_to_train_usd are divided by it."""
    checkpoint_interval_s: float | None = None
    """Checkpoint interval of the goodput model (Daly's optimum or the given one), seconds."""
    checkpoint_interval_iters: int | None = None
    """The same interval in optimizer steps (Megatron --save-interval, torchtitan checkpoint.interval)."""
    interruptions: float | None = None
    """Expected interruptions (unexpected + planned) while training the token budget."""
    lost_gpu_hours: float | None = None
    """Expected GPU-hours lost to restarts, re-done work, checkpoint stalls and slow-down over the budget."""
    plan_settings: dict = field(default_factory=dict)
    """The plan's memory features that are not off (costmodel.core.specs.memory_features.feature_values, e.g.
    {"main_grads_dtype": "bf16"}; the search's SearchSpace.plan_settings); {} in records written before them."""

    def to_plan(self) -> ParallelPlan:
        """The ParallelPlan this record describes."""
        return with_default_dispatcher(ParallelPlan(  # the search's dispatcher (planner.search.space)
            gpus=self.gpus, gpus_per_node=self.gpus_per_node, gbs=self.gbs,
            seq_len=self.seq_len, tp=self.tp, pp=self.pp, cp=self.cp, vpp=self.vpp, mbs=self.mbs,
            recompute=self.recompute, sequence_parallel=self.sequence_parallel, zero=self.zero, dtype=self.dtype,
            layer_split=tuple(self.layer_split) if self.layer_split else None, nvlink_domain=self.nvlink_domain,
            framework=self.framework, ep=self.ep, etp=self.etp, **self._settings()))

    def _settings(self) -> dict:
        """``plan_settings`` as ParallelPlan takes them (a JSON list back to a tuple)."""
        return {k: tuple(v) if isinstance(v, list) else v for k, v in self.plan_settings.items()}

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> "PlanRecord":
        names = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in d.items() if k in names})

    def key(self) -> tuple:
        """Identity of the plan (for de-duplication across trials and processes)."""
        return (self.gpu, self.cluster, self.gpus, self.gpus_per_node, self.tp, self.pp, self.cp, self.vpp,
                self.mbs, self.recompute, self.sequence_parallel, self.zero, self.dtype, self.gbs, self.seq_len,
                self.framework, self.ep, self.etp if self.etp is not None else self.tp,
                tuple(sorted(self._settings().items())))


def make_record(problem, target, plan: ParallelPlan, pred, price: float | None) -> PlanRecord:
    """Summarise one prediction (planner.prediction.Prediction) of a feasible plan; with ``problem.failures`` (a
    costmodel.schedule.goodput.FailureModel) time and cost to train are expected values, divided by the goodput."""
    tps = pred.tokens_per_s
    usd_per_mtoken = price * plan.gpus / 3600.0 / tps * 1e6 if price is not None else None
    rec = PlanRecord(
        model=problem.model.name, gpu=target.hardware.gpu.name, cluster=target.hardware.cluster.name,
        nodes=plan.num_nodes, gpus_per_node=plan.gpus_per_node, nvlink_domain=plan.nvlink_domain,
        gpus=plan.gpus, tp=plan.tp, pp=plan.pp,
        dp=plan.dp, cp=plan.cp, vpp=plan.vpp, mbs=plan.mbs, gbs=plan.gbs,
        seq_len=plan.seq_len, num_microbatches=plan.num_microbatches, recompute=plan.recompute,
        sequence_parallel=plan.sp, zero=plan.zero, dtype=plan.dtype, framework=plan.framework, ep=plan.ep, etp=plan.etp,
        iteration_time_s=pred.iteration_time_s, iteration_time_low_s=pred.iteration_time_low_s,
        iteration_time_high_s=pred.iteration_time_high_s, tokens_per_s=tps, mfu=pred.mfu,
        model_tflops_per_gpu=pred.model_tflops_per_gpu, memory_gib_per_gpu=pred.memory_gib_per_gpu,
        memory_limit_gib=target.hardware.gpu.hbm_bytes / GIB, price_usd_per_gpu_hour=price,
        usd_per_mtoken=usd_per_mtoken, time_to_train_s=None, cost_to_train_usd=None, bottleneck=pred.bottleneck,
        bubble_fraction=pred.bubble_fraction, cost_model=pred.cost_model, cost_sources=dict(pred.cost_sources),
        quick=getattr(pred, "quick", False),
        layer_split=pred.layer_split,
        plan_settings={k: list(v) if isinstance(v, tuple) else v for k, v in feature_values(plan).items()})
    return with_training_time(rec, problem.model, problem.tokens, problem.failures)


def with_training_time(rec: PlanRecord, model, tokens: float | None, failures) -> PlanRecord:
    """``rec`` with time and cost to train ``tokens`` and, when ``failures`` (costmodel.schedule.goodput.FailureModel)
    is given, the goodput, checkpoint interval, expected interruptions and lost GPU-hours of its allocation."""
    from costmodel.schedule.goodput import goodput  # deferred: only searches with a failure model need it

    g = None
    if failures is not None:
        g = goodput(model.total_params(), rec.gpus, failures, dtype=rec.dtype, framework=rec.framework)
    ideal = tokens / rec.tokens_per_s if tokens else None
    wall = ideal if g is None or ideal is None else g.wall_s(ideal)
    cost = wall / 3600.0 * rec.gpus * rec.price_usd_per_gpu_hour if (
        wall is not None and rec.price_usd_per_gpu_hour is not None) else None
    extra: dict = {"time_to_train_s": wall, "cost_to_train_usd": cost}
    if g is not None:
        extra.update(goodput=g.goodput, checkpoint_interval_s=g.interval_s if math.isfinite(g.interval_s) else None,
                     checkpoint_interval_iters=g.interval_iterations(rec.iteration_time_s)
                     if math.isfinite(g.interval_s) else None)
        if wall is not None:
            extra.update(interruptions=sum(g.interruptions(wall)), lost_gpu_hours=g.lost_gpu_hours(ideal))
    return dataclasses.replace(rec, **extra)


def seconds_per_token(r: PlanRecord) -> float:
    """Expected wall-clock seconds per training token: the iteration time over the tokens of its batch, divided by
    the goodput when one is known (what the time objective ranks; plans may run different batches)."""
    return r.iteration_time_s / (r.gbs * r.seq_len) / (r.goodput or 1.0) if r.goodput != 0 else float("inf")


# ----------------------------------------------------------------------------------- ranking
def expected_usd_per_mtoken(r: PlanRecord) -> float:
    """Expected USD per million tokens (the price per token over the goodput; inf without a price)."""
    if r.usd_per_mtoken is None or r.goodput == 0:
        return float("inf")
    return r.usd_per_mtoken / (r.goodput or 1.0)


def pareto_front(records: list[PlanRecord]) -> list[PlanRecord]:
    """Records not dominated in (time per token, USD per Mtoken), sorted by time. Records without a
    price only compete on time."""
    pts = sorted(records, key=lambda r: (seconds_per_token(r), expected_usd_per_mtoken(r)))
    front, best_cost = [], float("inf")
    for r in pts:
        c = expected_usd_per_mtoken(r)
        if c < best_cost or not front:
            front.append(r)
            best_cost = min(best_cost, c)
    return front


def rank(records: list[PlanRecord], objective: str = "time", top_k: int | None = 10) -> list[PlanRecord]:
    """Sort by the objective (time: time per token, i.e. the iteration time where every plan runs the same batch;
    cost: USD/Mtoken, then time; pareto: the Pareto front first, by time, then the rest by time), mark ranks and
    Pareto membership, keep top_k. Both are expected values when the records carry a goodput."""
    uniq = {r.key(): r for r in records}
    recs = list(uniq.values())
    front_keys = {r.key() for r in pareto_front(recs)}
    if objective == "cost":
        recs.sort(key=lambda r: (expected_usd_per_mtoken(r), seconds_per_token(r)))
    elif objective == "pareto":
        recs.sort(key=lambda r: (r.key() not in front_keys, seconds_per_token(r)))
    else:
        recs.sort(key=lambda r: (seconds_per_token(r), expected_usd_per_mtoken(r)))
    out = recs[:top_k] if top_k else recs
    return [dataclasses.replace(r, rank=i, pareto=r.key() in front_keys) for i, r in enumerate(out, 1)]


# ----------------------------------------------------------------------------------- formats
# CSV columns: the plan fields shared by every command's CSV (names and units defined once in
# planner.formats.PLAN_FIELDS, NeMo Auto Configurator's names where the meaning is the same).
def flat_record(r: PlanRecord, m) -> dict:
    """The flat field dict of planner.formats.PLAN_FIELDS for one record (m: its ModelSpec, or None)."""
    return {**r.to_dict(), **model_facts(m), "cost_model_text": describe_cost_sources(r.cost_sources, r.cost_model)}


CSV_COLUMNS: list[tuple[str, object]] = [(f.header, lambda r, m, f=f: f.cell(flat_record(r, m))) for f in PLAN_FIELDS]


def human_duration(seconds: float | None) -> str:
    """'3.2 h', '12.5 d' style duration."""
    if seconds is None:
        return "-"
    for unit, n in (("d", 86400.0), ("h", 3600.0), ("min", 60.0)):
        if seconds >= n:
            return f"{seconds / n:.1f} {unit}"
    return f"{seconds:.3g} s"


def batch_text(gbs: int, seq_len: int) -> str:
    """A global batch as sequences and tokens, e.g. '1024 (4.19M)'."""
    tokens = gbs * seq_len
    tok = f"{tokens / 1e9:.3g}B" if tokens >= 1e9 else f"{tokens / 1e6:.3g}M" if tokens >= 1e6 else f"{tokens:,}"
    return f"{gbs} ({tok})"


def plan_text(r: PlanRecord) -> str:
    """'TP2 PP4 DP16 CP1 VPP1 MBS1 GBS 1024 (4.19M) selective ZeRO1' (+ ' fp8' for non-bf16 GEMMs, + ' offload
    attn_norm,mlp_norm' for offloaded activations); an uneven layer split follows PP, e.g. 'PP16 (8x15,6)'."""
    s = (f"TP{r.tp} PP{_pp_cell(r)} DP{r.dp} CP{r.cp} VPP{r.vpp} MBS{r.mbs} GBS {batch_text(r.gbs, r.seq_len)} "
         f"{r.recompute} ZeRO{r.zero}")
    s = s if r.dtype == "bf16" else f"{s} {r.dtype}"
    if _moe_shown(r):
        s = f"{s} EP{r.ep} ETP{r.etp}"
    if _offload(r):
        s = f"{s} offload {_offload(r)}"
    return s if r.framework == DEFAULT_FRAMEWORK else f"{s} {r.framework}"


def _offload(r: PlanRecord) -> str:
    """The record's activation-offloading modules, 'a,b' ('' when none)."""
    return ",".join(r.plan_settings.get("offload_modules") or ())


def _moe_shown(r: PlanRecord) -> bool:
    """The plan has expert parallelism, or an expert TP other than TP."""
    return r.ep > 1 or (r.etp is not None and r.etp != r.tp)


def _time_cell(r: PlanRecord) -> str:
    t = f"{r.iteration_time_s:.3f}"
    if r.iteration_time_low_s is not None and r.iteration_time_high_s is not None:
        t += f" [{r.iteration_time_low_s:.3f}-{r.iteration_time_high_s:.3f}]"
    return t


def _pp_cell(r: PlanRecord) -> str:
    """PP, with the layers per stage when the split is uneven, e.g. '16 (8x15,6)'."""
    return f"{r.pp} ({describe_split(r.layer_split)})" if r.layer_split and len(set(r.layer_split)) > 1 else str(r.pp)


def display_rows(records: list[PlanRecord], with_train: bool = False) -> tuple[list[str], list[list[str]]]:
    """Header and string cells of the ranked table (shared by the rich table and Markdown)."""
    head = ["#", "GPU", "nodes x GPUs/node", "TP", "PP", "DP", "CP", "VPP", "MBS", "GBS (tokens)", "recompute", "ZeRO",
            "iter time [s]", "tokens/s", "MFU [%]", "mem/GPU [GiB]", "cost [$/Mtoken]", "bottleneck"]
    if with_train:
        head[-1:-1] = ["time to train", "cost to train [$]"]
    rows = []
    for r in records:
        row = [f"{r.rank}{'*' if r.pareto else ''}", r.gpu, f"{r.nodes} x {r.gpus_per_node}", str(r.tp), _pp_cell(r),
               str(r.dp), str(r.cp), str(r.vpp), str(r.mbs), batch_text(r.gbs, r.seq_len), r.recompute, str(r.zero),
               _time_cell(r),
               f"{r.tokens_per_s:,.0f}", f"{100 * r.mfu:.1f}",
               f"{r.memory_gib_per_gpu:.1f}/{r.memory_limit_gib:.0f}",
               "-" if r.usd_per_mtoken is None else f"{r.usd_per_mtoken:.3f}", r.bottleneck]
        if with_train:
            row[-1:-1] = [human_duration(r.time_to_train_s),
                          "-" if r.cost_to_train_usd is None else f"{r.cost_to_train_usd:,.0f}"]
        rows.append(row)
    if any(_moe_shown(r) for r in records):  # expert parallelism: EP and ETP after CP
        at = head.index("CP") + 1
        head[at:at] = ["EP", "ETP"]
        for row, r in zip(rows, records):
            row[at:at] = [str(r.ep), str(r.etp if r.etp is not None else r.tp)]
    if any(r.goodput is not None for r in records):  # expected times and costs: the goodput they assume
        at = head.index("cost [$/Mtoken]") + 1
        head.insert(at, "goodput")
        for row, r in zip(rows, records):
            row.insert(at, "-" if r.goodput is None else f"{r.goodput:.3f}")
    if len({_offload(r) for r in records}) > 1:  # --offload-modules auto: say which plans offload what
        at = head.index("ZeRO") + 1
        head.insert(at, "offload")
        for row, r in zip(rows, records):
            row.insert(at, _offload(r) or "-")
    if any(r.framework != DEFAULT_FRAMEWORK for r in records):  # frameworks compared: say which row is which
        at = head.index("ZeRO") + 1
        head.insert(at, "framework")
        for row, r in zip(rows, records):
            row.insert(at, r.framework)
    return head, rows


def to_json(records: list[PlanRecord], meta: dict | None = None) -> str:
    return json.dumps({**(meta or {}), "plans": [r.to_dict() for r in records]}, indent=2)


def to_csv(records: list[PlanRecord], model=None) -> str:
    return csv_text([plan_row(flat_record(r, model)) for r in records], [f.header for f in PLAN_FIELDS])


def to_markdown(records: list[PlanRecord]) -> str:
    with_train = any(r.time_to_train_s is not None for r in records)
    head, rows = display_rows(records, with_train)
    lines = ["| " + " | ".join(head) + " |", "|" + "|".join("---" for _ in head) + "|"]
    lines += ["| " + " | ".join(c.replace("|", "\\|") for c in row) + " |" for row in rows]
    return "\n".join(lines) + "\n"


SHORT_HEADERS = {"nodes x GPUs/node": "nodes x GPUs", "GBS (tokens)": "GBS (tokens)", "recompute": "recomp",
                 "iter time [s]": "time [s]", "mem/GPU [GiB]": "mem [GiB]", "cost [$/Mtoken]": "$/Mtok",
                 "time to train": "train", "cost to train [$]": "train [$]", "bottleneck": "bound by"}
"""Headers of the ranked table in a terminal (the full ones, as Markdown has them, with --wide)."""
DROP_FIRST = ("range [s]", "tokens/s", "bound by", "train [$]", "goodput", "VPP", "CP", "ZeRO", "recomp",
              "framework", "mem [GiB]", "GPU", "nodes x GPUs", "MFU [%]", "$/Mtok", "ETP", "GBS (tokens)")
"""Columns the ranked table leaves out, in this order, when the terminal is too narrow for all (--wide: none)."""
MARKERS = {"*": "on the time/cost Pareto front (no other plan is both faster and cheaper per token)"}
"""Markers of the ranked table's rank column."""


def table_rows(records: list[PlanRecord], wide: bool = False) -> tuple[list[str], list[list[str]]]:
    """Header and cells of the ranked table in a terminal: :func:`display_rows` with the band of the iteration
    time in a column of its own, and short headers unless ``wide``."""
    head, rows = display_rows(records, any(r.time_to_train_s is not None for r in records))
    at = head.index("iter time [s]")
    head.insert(at + 1, "range [s]")
    for row in rows:
        time, _, band = row[at].partition(" ")
        row[at:at + 1] = [time, band.strip("[]") or "-"]
    if not wide:
        nodes = head.index("nodes x GPUs/node")
        for row in rows:
            row[nodes] = row[nodes].replace(" x ", "x")
        head = [SHORT_HEADERS.get(h, h) for h in head]
    return head, rows


def rich_table(records: list[PlanRecord], title: str = "", wide: bool = False):
    """A rich Table of the ranked records (:func:`planner.tables.fit` fits it to the terminal)."""
    # deferred: rich loads only when a table is printed (JSON and CSV output never need it)
    from rich.markup import escape
    from rich.table import Table

    head, rows = table_rows(records, wide)
    t = Table(title=escape(title) if title else None, show_header=True)
    for h in head:
        t.add_column(escape(h), justify="left" if h in ("GPU", "recompute", "recomp", "bottleneck", "bound by",
                                                        "framework") else "right")
    for row in rows:
        t.add_row(*[escape(c) for c in row])
    return t
