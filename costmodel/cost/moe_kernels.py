"""Grouped expert GEMMs on a training basis, and the SMs an overlapped flex dispatcher takes from the compute.

The operator graph costs an MoE layer's experts as one GEMM-activation-GEMM chain per local expert
(``moe.expert.up`` / ``moe.expert.act`` / ``moe.expert.down``, ``count`` = local experts, GEMM ``m`` = tokens
per expert), i.e. as Megatron's SequentialMLP runs them: one kernel per expert and GEMM, each costed by the dense
GEMM models of the GPU's die. With grouped GEMMs (``--moe-grouped-gemm``, the plan's ``moe_grouped_gemm``) one
kernel covers every local expert, and their times are multiplied by a grouped-GEMM efficiency
(:func:`training_factor`, cost source "derived"):

* from ``M_COMPUTE_BOUND`` tokens per expert the expert GEMMs are compute bound and a training grouped GEMM runs
  as the dense GEMMs of its groups' shapes (DeepGEMM's grouped vs dense tables; the DeepSeek-V3 GB200 write-up's
  multi-stream cuBLAS grouped GEMM): efficiency 1;
* with many local experts and few tokens each, the per-kernel floors of the chain (launch, tile quantisation,
  weight loads one expert at a time) are paid once instead of once per expert: faster than the chain, by the
  ratio the fused-MoE measurements below give (capped at 1; the fused kernel's extra routing / permute / finalize
  work, which makes it slower than the plain GEMMs with one or two local experts, is an inference kernel's).

The fused-MoE ratio is measured on the GPUs where the data exist: ``aiconfigurator/moe/*_bf16_moe__trtllm*.csv``
(TRT-LLM CUTLASS fused MoE, forward only, balanced routing, no router GEMM, no shared experts, no
communication; see shared/data/aiconfigurator/PROVENANCE.md). Per row the *composed* forward is built from the
same shapes with the cost model planner predicts with (the measured regressors, roofline where none):
for each local expert e with m_e routed tokens (the collector's balanced assignment, token i -> experts
(i + j * ceil(E / topk)) mod E, j < topk, counted exactly), ``gemm(m_e, up, h) + gemm(m_e, h, inter/tp)``,
one activation over all routed rows (GroupedMLP's, as costmodel/graph/moe.py builds it), plus the token permute and
the finalize (un-permute and top-k sum) that the fused kernel also does, costed as memory-bound passes
(``residual_add`` kind: permute reads and writes each routed row, finalize reads each routed row and writes
each token). The ratio measured / composed is summarised per
GPU die as the median in bins of tokens per expert (mean m = tokens * topk / experts) x local experts; rows
with fewer routed tokens than experts (m < 1, not every expert busy) are left out.

Applied by :func:`apply` (one of :data:`costmodel.estimate.ADJUSTMENTS`, after the framework's kernels)
to the times of every operator named ``moe.expert*`` (forward, backward and recomputed: the backward runs the
same grouped kernels on the same groups; no measurement exists, so the forward ratio is used) of plans with
grouped GEMMs, below ``M_COMPUTE_BOUND`` tokens per expert only where the GPU's die has data (elsewhere the dense
chain, and the prediction says so). Not used:

* A100: its table is SGLang's Triton ``fused_moe`` (an inference kernel; Megatron's grouped GEMM is CUTLASS/
  cuBLAS), 2-3x slower than the GEMMs at large m (Mixtral 8x7B shape: 77 TFLOP/s), and run gated for the
  non-gated Nemotron shapes (PROVENANCE: "the Nemotron-3 shapes were run as gated SwiGLU").
* fp8 / fp8_block rows: their latency includes activation quantisation inside the call; bf16 only.

Fitted by ``python -m costmodel.cost.moe_kernels`` into ``costmodel/data/moe_kernels.json`` (with provenance).
"""

from __future__ import annotations

import csv
import json
import math
import statistics
from collections import Counter
from dataclasses import replace
from functools import lru_cache
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from costmodel.core.fileio import fitted_table_main
from costmodel.core.kinds import Category, CostSource, Phase
from costmodel.core.specs.catalogue import load_catalogue
from costmodel.core.specs.hardware import Hardware
from costmodel.core.specs.plan import ParallelPlan
from costmodel.cost.measured import MeasuredCostModel
from costmodel.graph.build import OperatorGraph
from costmodel.graph.moe import SM_SHARE, flex_backend
from costmodel.graph.ops import Op

if TYPE_CHECKING:  # annotations only: costmodel.schedule (the composition) sits above costmodel.cost
    from costmodel.schedule.compose import OperatorTimes

TABLE_PATH = Path(__file__).resolve().parents[1] / "data" / "moe_kernels.json"
EXPERT_PREFIX = "moe.expert"
"""Operators whose times the ratio scales (names of costmodel/graph/moe.py's expert operators)."""
UP_GEMM = "moe.expert.up"
"""The forward up GEMM of the local experts: m = tokens per expert, count = local experts."""
ACT_BYTES = 2  # bf16 elements: a definition of the dtype

M_EDGES = (1, 16, 64, 256, 1024, 4096)
"""Bin edges of tokens per expert (last bin open): the fused kernel's regimes (weight-load bound below ~256,
compute bound above ~1024 on these GPUs)."""
LE_EDGES = (1, 2, 8, 32)
"""Bin edges of local experts (last bin open): one expert per GPU (EP = experts), few, many."""

# Which GPUs share the die each measured system ran on (same SM count and tensor cores; NVIDIA H100/H200/GH200
# and B200/GB200 datasheets): the grouped kernel's ratio to the plain GEMMs, a dimensionless figure of the
# kernel on that die, applies to all of them.
DIES = {
    "h100_sxm": {"die": "GH100", "measured_on": "h100-sxm", "gpus": ["h100-sxm", "gh200", "gh200-144gb",
                                                                     "h100-sxm-500w"]},
    "h200_sxm": {"die": "GH100", "measured_on": "h200", "gpus": ["h200"]},
    "b200_sxm": {"die": "GB100", "measured_on": "b200", "gpus": ["b200"]},
    "gb200": {"die": "GB100", "measured_on": "gb200", "gpus": ["gb200"]},
}
FILES = {s: f"{s}_bf16_moe__trtllm-1.3.0rc20.csv" for s in DIES}
EXCLUDED = {
    "a100_sxm_bf16_moe__sglang-0.5.10.csv": "SGLang Triton fused_moe (inference kernel, not the CUTLASS/cuBLAS "
    "grouped GEMM of a training stack; 2-3x slower than cuBLAS GEMMs at large m) and non-gated shapes run gated",
}


# ------------------------------------------------------------------------------------------- routing
def local_loads(tokens: int, topk: int, experts: int, ep: int) -> Counter:
    """{tokens routed to a local expert: how many of EP rank 0's experts get that many} under the collector's
    balanced routing (token i picks experts (i + j * ceil(E / topk)) mod E, j < topk); idle experts left out."""
    step = math.ceil(experts / topk)
    local = experts // ep
    counts = np.zeros(experts, dtype=np.int64)
    base = np.arange(tokens, dtype=np.int64)
    for j in range(topk):
        counts += np.bincount((base + j * step) % experts, minlength=experts)
    return Counter(int(c) for c in counts[:local] if c > 0)


def fused_ops(tokens: int, hidden: int, inter: int, topk: int, experts: int, tp: int, ep: int,
              gated: bool) -> list[tuple[Op, int]]:
    """(operator, count) of one fused-MoE forward on EP rank 0, as planner's operators with grouped GEMMs
    (costmodel/graph/moe.py): per local expert the up and down GEMMs at its routed token count, one activation over
    all routed rows, plus the permute and finalize passes."""
    f = inter // tp
    up = f * (2 if gated else 1)
    out: list[tuple[Op, int]] = []
    pairs = 0
    for m, n in sorted(local_loads(tokens, topk, experts, ep).items()):
        pairs += m * n
        out.append((Op("gemm", "moe.expert.up", Phase.FWD, (m, up, hidden), flops=2.0 * m * up * hidden,
                       bytes=float(ACT_BYTES * (m * hidden + up * hidden + m * up))), n))
        out.append((Op("gemm", "moe.expert.down", Phase.FWD, (m, hidden, f), flops=2.0 * m * hidden * f,
                       bytes=float(ACT_BYTES * (m * f + hidden * f + m * hidden))), n))
    if pairs:  # one activation over the concatenated rows of every local expert, as GroupedMLP runs it
        out.append((Op("activation", "moe.expert.act", Phase.FWD, (pairs, up, int(gated)), flops=8.0 * pairs * up,
                       bytes=float(ACT_BYTES * (pairs * up + pairs * f))), 1))
    for name, nbytes in (("moe.permute", 2 * pairs * hidden * ACT_BYTES),
                         ("moe.finalize", (pairs + tokens) * hidden * ACT_BYTES)):
        if nbytes:  # residual_add's convention is 3 elements moved per element: features = bytes / 6
            out.append((Op("residual_add", name, Phase.FWD, (nbytes / (3 * ACT_BYTES),), bytes=float(nbytes)), 1))
    return out


# ------------------------------------------------------------------------------------------- fitting
def _bin(edges: tuple, x: float) -> int:
    return max(0, int(np.searchsorted(edges, x, side="right")) - 1)


def _rows(path: Path) -> list[dict]:
    with path.open(newline="", encoding="utf-8") as fh:
        return list(csv.DictReader(fh))


def usable(row: dict) -> bool:
    """Rows the fit uses: every local expert busy on average (tokens * topk >= experts) and an inter size the
    expert-TP split divides."""
    t, k, e, inter, tp = (int(row[c]) for c in ("num_tokens", "topk", "num_experts", "inter_size", "moe_tp_size"))
    return t * k >= e and inter % tp == 0


def ratios(path: Path, hardware: Hardware, cost_model) -> list[tuple[float, int, float]]:
    """(mean tokens per expert, local experts, measured / composed) per usable row of one fused-MoE file."""
    recs = []
    for r in _rows(path):
        if not usable(r):
            continue
        t, h, inter, k, e, tp, ep = (int(r[c]) for c in ("num_tokens", "hidden_size", "inter_size", "topk",
                                                          "num_experts", "moe_tp_size", "moe_ep_size"))
        ops = fused_ops(t, h, inter, k, e, tp, ep, "nongated" not in r.get("kernel_source", ""))
        recs.append((t * k / e, e // ep, float(r["latency_ms"]) * 1e-3, ops))
    unique: dict[tuple, Op] = {}
    for *_, ops in recs:
        for o, _ in ops:
            unique.setdefault(o.key(), o)
    res = cost_model.predict(list(unique.values()), hardware)
    times = dict(zip(unique, (float(x) for x in res.time_s)))
    return [(m, le, meas / sum(times[o.key()] * n for o, n in ops)) for m, le, meas, ops in recs]


def summarise(recs: list[tuple[float, int, float]]) -> dict:
    """Median ratio per (tokens-per-expert bin, local-experts bin), with n and the 10th/90th percentiles."""
    cells: dict[tuple[int, int], list[tuple[float, float]]] = {}
    for m, le, q in recs:
        cells.setdefault((_bin(M_EDGES, m), _bin(LE_EDGES, le)), []).append((m, q))
    out: dict[str, dict] = {}
    for (i, j), mq in sorted(cells.items()):
        qs = [q for _, q in mq]
        p10, p90 = (float(x) for x in np.percentile(qs, [10, 90]))
        out[f"{i},{j}"] = {"ratio": round(statistics.median(qs), 3), "n": len(qs), "p10": round(p10, 3),
                           "p90": round(p90, 3), "m_median": round(statistics.median(m for m, _ in mq), 1)}
    return out


def fit(data_dir: Path, cost_model=None) -> dict:
    """The table: per measured system, the median measured/composed ratio per bin."""
    cost_model = cost_model or MeasuredCostModel()
    root = data_dir / "aiconfigurator" / "moe"
    out: dict = {"provenance": {
        "source": "shared/data/aiconfigurator/moe/{h100_sxm,h200_sxm,b200_sxm,gb200}_bf16_moe__trtllm-1.3.0rc20.csv "
                  "(TRT-LLM CUTLASS fused MoE forward, balanced routing, bf16; see its PROVENANCE.md)",
        "command": "python -m costmodel.cost.moe_kernels",
        "method": "per row: latency / (sum over EP rank 0's busy experts of planner's gemm(m_e, up, h) + "
                  "activation(m_e, up) + gemm(m_e, h, inter/tp), + permute and finalize passes), the cost model "
                  "being the shipped measured regressors (roofline where none); rows with tokens*topk < experts "
                  "dropped; median per (tokens-per-expert bin, local-experts bin)",
        "m_edges": list(M_EDGES), "local_expert_edges": list(LE_EDGES),
        "excluded": EXCLUDED}, "systems": {}}
    for system, meta in DIES.items():
        hw = load_catalogue().resolve(str(meta["measured_on"]))
        recs = ratios(root / FILES[system], hw, cost_model)
        out["systems"][system] = {**meta, "file": FILES[system], "rows": len(recs), "bins": summarise(recs)}
    return out


# ------------------------------------------------------------------------------------------- applying
@lru_cache(maxsize=2)
def load_table(path: str | None = None) -> dict:
    return json.loads(Path(path or TABLE_PATH).read_text(encoding="utf-8"))


def system_of(gpu: str, table: dict) -> dict | None:
    """The measured system whose die ``gpu`` has (its own measurement first)."""
    own = next((s for s in table["systems"].values() if s["measured_on"] == gpu), None)
    return own or next((s for s in table["systems"].values() if gpu in s["gpus"]), None)


def ratio_for(system: dict, tokens_per_expert: float, local_experts: float) -> float:
    """Measured / composed for an expert group: in its local-experts column, the bins' median ratios
    interpolated linearly in log(tokens per expert) between the bins' median tokens per expert, held beyond
    the first and last (continuous in m, so a time never drops when m grows across a bin edge)."""
    j = _bin(LE_EDGES, local_experts)
    col = sorted((v["m_median"], v["ratio"]) for k, v in system["bins"].items() if int(k.split(",")[1]) == j)
    if not col:
        return 1.0
    xs, ys = zip(*col)
    return float(np.interp(math.log(max(tokens_per_expert, 1.0)), [math.log(x) for x in xs], ys))


M_WEIGHT_BOUND = 256
"""Tokens per expert up to which a grouped kernel's advantage is the per-expert floors it pays once (launch, tile
quantisation, weight loads one expert at a time: the weight-load-bound regime of :data:`M_EDGES`), which a
training stack's grouped GEMM (Transformer Engine GroupedLinear, CUTLASS grouped_gemm) amortises as the fused
inference kernel does: the measured fused-MoE ratio, capped at 1, applies up to here."""
M_COMPUTE_BOUND = 1024
"""Tokens per expert from which every expert GEMM is compute bound (:data:`M_EDGES`) and a training grouped GEMM
runs as fast as the dense GEMM of one group's shape: grouped efficiency 1. deepseek-ai/DeepGEMM README (Feb 2025,
H800, FP8 1x128 / 128x128 blocks, the same kernel family for both tables): contiguous grouped GEMMs at 4,096
tokens per group 1,288 TFLOP/s (N 4096, K 7168) and 1,093 (N 7168, K 2048) against normal GEMMs of M 4096 with the
same N, K 1,304 and 1,025 (ratios 0.99, 1.07); NVIDIA/Megatron-LM DeepSeek-V3 GB200 write-up @eb0783b6 sec. 1:
MXFP8 grouped GEMM as multi-stream cuBLAS GEMMs "basically equivalent to a highly optimized Grouped GEMM". The
fused inference kernel's ratio below 1 there (0.75-0.96 on Blackwell) is an inference kernel's (routing,
permute and finalize fused, forward only), not a training grouped GEMM's."""


def training_factor(system: dict | None, tokens_per_expert: float, local_experts: float) -> float:
    """Grouped-GEMM efficiency on a training basis, relative to the dense GEMM chain of the same die: 1 from
    :data:`M_COMPUTE_BOUND` tokens per expert (and wherever the die has no fused-MoE measurement); up to
    :data:`M_WEIGHT_BOUND` the measured fused-MoE ratio (:func:`ratio_for`) capped at 1 (a training stack can
    always run the per-expert chain: SequentialMLP, multi-stream cuBLAS); between, linear in log(tokens per
    expert) from the capped ratio at M_WEIGHT_BOUND to 1."""
    m = tokens_per_expert
    if system is None or m >= M_COMPUTE_BOUND:
        return 1.0
    if m <= M_WEIGHT_BOUND:
        return min(1.0, ratio_for(system, m, local_experts))
    low = min(1.0, ratio_for(system, M_WEIGHT_BOUND, local_experts))
    w = math.log(m / M_WEIGHT_BOUND) / math.log(M_COMPUTE_BOUND / M_WEIGHT_BOUND)
    return low + (1.0 - low) * w


def grouped_gemm_factors(plan: ParallelPlan, hardware: Hardware, ops: list[Op],
                         table: dict | None = None) -> tuple[dict[tuple, float], list[str]]:
    """({Op.key(): factor} for the expert operators of ``ops``, warnings): the training-basis grouped-GEMM
    efficiency (:func:`training_factor`) of the plan's expert group; empty without grouped GEMMs or expert
    operators. A key shared with a non-expert operator is left unscaled (one cost per key)."""
    experts = [o for o in ops if o.name.startswith(EXPERT_PREFIX)]
    groups = {(float(o.features[0]), float(o.count)) for o in experts if o.name == UP_GEMM and o.phase is Phase.FWD}
    if not groups or not plan.moe_grouped_gemm:
        return {}, []
    table = table or load_table()
    system = system_of(hardware.gpu.measured_as, table)
    shared = {o.key() for o in ops if not o.name.startswith(EXPERT_PREFIX)}
    # one expert group per plan (every MoE layer routes the same tokens): its tokens per expert and local
    # experts, from the forward up GEMM (the grouped activation's rows are all groups' rows together)
    m, local = max(groups)
    factor = training_factor(system, m, local)
    out = {o.key(): factor for o in experts if o.key() not in shared}
    basis = (f"grouped expert GEMMs on a training basis: the dense GEMM models of {hardware.gpu.name} per expert "
             f"({m:.0f} tokens per expert, {local:.0f} local experts) x grouped efficiency {factor:.2f}")
    if m >= M_COMPUTE_BOUND:
        return out, [basis + f" (compute bound from {M_COMPUTE_BOUND} tokens per expert: DeepGEMM's grouped vs "
                     "dense GEMMs)"]
    if system is None:
        return out, [basis + f" (no fused-MoE measurement on its die for the per-expert floors below "
                     f"{M_COMPUTE_BOUND} tokens per expert)"]
    src = "" if system["measured_on"] == hardware.gpu.name else f", borrowed from {system['measured_on']} (same die)"
    return out, [basis + f" (per-expert floors from the measured fused-MoE / per-expert-GEMM ratio of "
                 f"{system['file']}, {system['die']}{src}, capped at 1; forward ratio used for backward)"]


# ------------------------------------------------------------------------------------------- overlap SMs
GPU_SMS = {"h100": 132, "h200": 132, "gh200": 132, "h800": 132, "b200": 148, "gb200": 148, "b300": 160,
           "gb300": 160}
"""Streaming multiprocessors per GPU, by catalogue-name prefix: Hopper 132 (shared/data/hardware/gpus.yaml
``sm_count`` of h200 and gh200; NVIDIA H100 SXM5 data sheet), Blackwell B200 / GB200 148 (gpus.yaml b200, device
query "Number of SMs: 148"), Blackwell Ultra B300 / GB300 160 (NVIDIA technical blog "Inside NVIDIA Blackwell
Ultra", 2025: 160 SMs)."""

FLEX_SMS = {"deepep": 20, "hybridep": 32}
"""SMs the flex dispatcher's kernels hold while they run: DeepEP 20 (deepseek-ai/DeepEP deep_ep/buffer.py
``num_sms = 20``; Megatron-Core transformer_config.py @d98e8a64 moe_deepep_num_sms, "historical default 20"),
HybridEP 32 (NVIDIA-NeMo/Megatron-Bridge @067f987d src/megatron/bridge/perf_recipes/_common.py sets
moe_hybridep_num_sms = 32 for every HybridEP recipe; the DeepSeek-V3 GB200 write-up runs "HybridEP ... 32 SMs").
HybridEP where the EP group sits inside an NVL72-class domain (costmodel.graph.moe.default_dispatcher), DeepEP
elsewhere."""


def gpu_sms(gpu: str) -> int | None:
    """SMs of a catalogue GPU (:data:`GPU_SMS`), None when not listed."""
    return next((n for prefix, n in sorted(GPU_SMS.items(), key=lambda kv: -len(kv[0])) if gpu.startswith(prefix)),
                None)


def sm_share_times(plan: ParallelPlan, hardware: Hardware, graph: OperatorGraph,
                   times: dict) -> tuple[dict[tuple, float], list[str]]:
    """({key: seconds} of the ``moe.overlap_sm_share`` placeholders, warnings): per phase, the flex kernels' share
    of the GPU's SMs (:data:`FLEX_SMS` / :func:`gpu_sms`) times the phase's overlapped EP communication per MoE
    layer. A layer whose compute c runs beside a collective of t seconds that holds a fraction f of the SMs gets
    f t of its compute done later: c + f t (while c >= t)."""
    out: dict[tuple, float] = {}
    sms = gpu_sms(hardware.gpu.measured_as)
    for st in graph.distinct_stages():
        for ph in (o for o in st.layer_ops if o.name == SM_SHARE):
            if sms is None:
                out[ph.key()] = 0.0
                continue
            backend = flex_backend(plan)
            comm = sum(times[o.key()] * o.count for o in st.layer_overlap_ops
                       if o.category is Category.EP_COMM and o.phase is ph.phase)
            out[ph.key()] = FLEX_SMS[backend] / sms * comm / ph.count
    if not out:
        return {}, []
    if sms is None:
        return out, [f"overlapped flex dispatcher on {hardware.gpu.name}: SM count not listed, the SMs its kernels "
                     "take from the overlapped compute are not charged"]
    return out, [f"overlapped EP communication: the flex dispatcher's kernels hold "
                 f"{FLEX_SMS[flex_backend(plan)]} of {sms} SMs while they run, "
                 "charged to the compute they overlap"]


def apply(plan: ParallelPlan, hardware: Hardware, graph: OperatorGraph, times: OperatorTimes) -> OperatorTimes:
    """MoE plans: the ``moe.expert*`` operator times (interval ends too) of grouped GEMMs times the ratio of
    :func:`grouped_gemm_factors`, and the overlapped flex dispatcher's SM share (:func:`sm_share_times`), with
    their notes; ``times`` itself for graphs without routed experts."""
    if not any(st.expert_params for st in graph.stages):
        return times
    factors, warnings = grouped_gemm_factors(plan, hardware, [o for st in graph.stages for o in st.layer_ops])
    scaled = times.scaled(lambda t: {k: v * factors.get(k, 1.0) for k, v in t.items()}) if factors else times
    share, notes = sm_share_times(plan, hardware, graph, scaled.time_s)
    if share:
        scaled = scaled.scaled(lambda t: {k: share.get(k, v) for k, v in t.items()})
    if not factors and not warnings and not share:
        return times
    # the grouped expert GEMMs: the dense GEMM regressors through the grouped efficiency (a recorded derivation)
    source = {**scaled.source, **{k: CostSource.DERIVED for k in factors if k in scaled.source}}
    return replace(scaled, source=source, warnings=times.warnings + tuple(warnings) + tuple(notes))


def main(argv: list[str] | None = None) -> int:
    return fitted_table_main(argv, "Fit the grouped-expert-GEMM ratio table from shared/data.", TABLE_PATH, fit)


if __name__ == "__main__":
    raise SystemExit(main())
