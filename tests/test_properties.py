"""Property-based tests over random valid models and plans.

Hypothesis draws small dense transformers (GPT- or Llama-style, 2..16 layers, hidden a multiple of
64 up to 2048) and valid layouts on 'a100-80gb' / 'h100-sxm' (GPUs = TP x PP x DP with each factor
in {1, 2, 4, 8}, MBS 1..4, GBS = MBS x DP x k). Every property is checked on 200 examples
(``tests.helpers.EXAMPLES``) with the default cost model (the shipped regressors, roofline where none exists).
"""

from __future__ import annotations

import json
import math
from dataclasses import replace

import numpy as np
import pytest
from hypothesis import assume, given
from hypothesis import strategies as st

from costmodel.core.specs.hf_config import from_hf_config
from costmodel.core.specs.plan import ParallelPlan
from costmodel.cost.base import CostResult, OperatorCostModel
from costmodel.cost.roofline import RooflineCostModel
from costmodel.graph.build import build_graph
from costmodel.memory.per_gpu import _embedding_params_per_gpu, _head_params_per_gpu, layer_params_per_gpu, stage_params
from costmodel.schedule.flops import model_flops_per_iteration
from planner.cli_predict import run_batch
from planner.prediction import predict
from tests.helpers import GPUS, SETTINGS, gpt, hardware, models, setups

REL = 1e-12
ROOFLINE = RooflineCostModel()


def _with(plan: ParallelPlan, **kw) -> ParallelPlan:
    """The plan with some fields changed and gpus_per_node kept consistent with the new GPU count."""
    new = replace(plan, **kw)
    gpn = max(plan.gpus_per_node, min(8, new.gpus)) if new.gpus > plan.gpus_per_node else plan.gpus_per_node
    return replace(new, gpus_per_node=min(gpn, new.gpus))


def _pred(model, plan, gpu):
    return predict(model, plan, hardware(gpu))


# ------------------------------------------------------------------------------------------ properties
@SETTINGS
@given(setups())
def test_predictions_finite_and_positive(s):
    model, plan, gpu = s
    p = _pred(model, plan, gpu)
    for name in ("iteration_time_s", "tokens_per_s", "tokens_per_s_per_gpu", "model_tflops_per_gpu",
                 "hardware_tflops_per_gpu", "mfu", "memory_gib_per_gpu"):
        v = getattr(p, name)
        assert math.isfinite(v) and v > 0, (name, v)
    assert 0.0 <= p.bubble_fraction < 1.0
    assert all(math.isfinite(v) and v >= 0 for v in p.exposed_comm_s.values())
    assert all(math.isfinite(v) and v >= 0 for k, v in p.memory.items() if k != "stage")
    assert all(math.isfinite(r["time_s"]) and r["time_s"] > 0 for r in p.breakdown)


@SETTINGS
@given(st.integers(2, 15), st.integers(1, 8), st.data())
def test_more_layers_never_faster(n, extra, data):
    # pp = 1 so that any layer count is a valid plan. Checked on the analytical cost model only: the
    # measured tree ensembles are piecewise constant and not monotone between their samples (hypothesis
    # finds deeper models predicted ~15 % faster than shallower ones on the default models), an open
    # finding (monotone constraints in the regressors would fix it).
    model, plan, gpu = data.draw(setups(models(layers=n), pp_choices=(1,)))
    bigger = replace(model, num_layers=min(16, n + extra))
    assume(bigger.num_layers > n)
    for cm in (ROOFLINE,):
        t1 = predict(model, plan, hardware(gpu), cost_model=cm).iteration_time_s
        t2 = predict(bigger, plan, hardware(gpu), cost_model=cm).iteration_time_s
        assert t2 >= t1 * (1 - REL), (cm, t1, t2)


def test_measured_optimizer_time_monotone_in_params():
    """The optimizer step is costed from the fused AdamW kernel measured on H100 (costmodel.graph.kernel_basis), not by
    the public samples' regressor (the a100-80gb one was not monotone in 'params': 131 ms at 70M, 44 ms at 100M)."""
    from dataclasses import replace as dc_replace

    from costmodel.cost.measured import FUSED_METHOD, MeasuredCostModel
    from costmodel.graph.build import build_graph

    model = gpt(layers=9, hidden=576, heads=1, vocab=4151, seq=2048, ffn_hidden_size=2304)
    graph = build_graph(model, ParallelPlan(gpus=1, gpus_per_node=1, gbs=1, seq_len=2048))
    (opt,) = [o for o in graph.stages[0].iteration_ops if o.kind == "optimizer"]
    ops = [dc_replace(opt, features=(float(n),)) for n in (1e7, 2e7, 4e7, 6e7, 8e7, 1e8, 2e8, 4e8)]
    res = MeasuredCostModel().predict(ops, hardware("a100-80gb"))
    t = res.time_s
    assert all(b >= a for a, b in zip(t, t[1:])), list(t)
    assert set(res.method) == {FUSED_METHOD}


@SETTINGS
@given(setups(), st.integers(1, 8))
def test_larger_global_batch_never_faster(s, more):
    model, plan, gpu = s
    unit = plan.mbs * plan.dp
    big = replace(plan, gbs=plan.gbs + unit * more)
    assume(not big.problems(model))
    t1 = _pred(model, plan, gpu).iteration_time_s
    t2 = _pred(model, big, gpu).iteration_time_s
    assert t2 >= t1 * (1 - REL), (t1, t2)


@SETTINGS
@given(setups(), st.sampled_from(("tp", "pp")))
def test_memory_never_grows_with_tp_or_pp(s, axis):
    # DP and GBS stay fixed (so the micro-batch count and the ZeRO shard stay fixed); GPUs grow.
    model, plan, gpu = s
    bigger = _with(plan, **{axis: getattr(plan, axis) * 2}, gpus=plan.gpus * 2)
    assume(not bigger.problems(model))
    # only for even splits: an uneven one (PP not dividing the layers) may give the first stage, which holds
    # PP micro-batches of activations, more than 1/PP of the layers (3 layers over PP=2: 2 + 1)
    assume(not bigger.needs_layer_split(model.num_layers) and not plan.needs_layer_split(model.num_layers))
    m1 = _pred(model, plan, gpu).memory_gib_per_gpu
    m2 = _pred(model, bigger, gpu).memory_gib_per_gpu
    assert m2 <= m1 * (1 + REL), (axis, m1, m2)


def _zero_units_small(model, plan) -> bool:
    """Every stage holds at least 3x its largest ZeRO working-set unit.

    costmodel/memory/per_gpu.py (stage_memory, _stage_terms) documents that ZeRO-2/3 keep one unsharded unit
    of gradients and ZeRO-3 two gathered units of parameters (FSDP prefetch), a unit being the
    largest of one layer, the embedding or the head. On a stage with very few layers (or a large
    embedding next to tiny layers) that working set can exceed what sharding saves, so a higher
    ZeRO stage legitimately needs *more* memory: P/d + 2u > P when P < 2u d/(d-1). With a shard
    group d >= 4 and P >= 3u on every stage the saving always wins, which is the regime where the
    property is claimed. (Example outside it: a 2-layer Llama, h=512, V=50000, DP=4 needs 1.798 GiB
    per GPU under ZeRO-2 and 1.815 GiB under ZeRO-3.)
    """
    unit = max(layer_params_per_gpu(model, plan.tp), _embedding_params_per_gpu(model, plan.tp),
               _head_params_per_gpu(model, plan.tp, plan.pp))
    return min(stage_params(model, plan)) >= 3 * unit


@SETTINGS
@given(setups(min_dp=4), st.integers(0, 2))
def test_memory_never_grows_with_zero_stage(s, z):
    model, plan, gpu = s
    lo, hi = replace(plan, zero=z), replace(plan, zero=z + 1)
    assume(_zero_units_small(model, plan))
    m1 = _pred(model, lo, gpu).memory_gib_per_gpu
    m2 = _pred(model, hi, gpu).memory_gib_per_gpu
    assert m2 <= m1 * (1 + REL), (z, m1, m2)


class _KnownTimes(OperatorCostModel):
    """A cost model whose times are known to the test: each operator takes 1, 2, ... 7 ms by its key (kind
    and features: what a cost model sees; the optimizer 11 ms), so the composition can be recomputed by
    hand from the operator graph."""

    name = "known-times"

    def supports(self, kind, hardware):
        return True

    @staticmethod
    def time_of(op) -> float:
        if op.phase == "optimizer":
            return 11e-3
        return 1e-3 * (1 + sum(map(ord, repr(op.key()))) % 7)

    def predict(self, ops, hardware):
        return CostResult(time_s=np.array([self.time_of(o) for o in ops]), method=[self.name] * len(ops))


@SETTINGS
@given(models(), st.integers(1, 4), st.integers(1, 8), st.sampled_from(("none", "selective", "full")),
       st.sampled_from(GPUS))
def test_single_gpu_composition_matches_a_hand_computation(model, mbs, k, recompute, gpu):
    """One GPU (no pipeline, no communication): the iteration is every micro-batch's forward and backward
    operators plus the optimizer, each at its known time; every breakdown row is its operators' summed
    time; tokens/s and the model TFLOP/s follow from that hand-computed time (not from the prediction's)."""
    plan = ParallelPlan(gpus=1, gpus_per_node=1, gbs=mbs * k, seq_len=model.max_seq_len,
                        mbs=mbs, recompute=recompute)
    assume(not plan.problems(model))
    cost = _KnownTimes()
    (stage,) = build_graph(model, plan).stages
    assert not stage.layer_overlap_ops and {o.phase for o in stage.iteration_ops} == {"optimizer"}
    rows: dict[tuple[str, str], float] = {}
    for ops, repeat in ((stage.layer_ops, stage.layers * k), (stage.stage_ops, k), (stage.iteration_ops, 1)):
        for o in ops:
            rows[(o.name, str(o.phase))] = rows.get((o.name, str(o.phase)), 0.0) + cost.time_of(o) * o.count * repeat
    iteration = sum(rows.values())

    p = predict(model, plan, hardware(gpu), cost_model=cost)
    assert p.iteration_time_s == pytest.approx(iteration, rel=1e-9)
    got = {(r["operator"], str(r["phase"])): r["time_s"] for r in p.breakdown}
    assert got.keys() == rows.keys()
    for key, t in rows.items():
        assert got[key] == pytest.approx(t, rel=1e-9), key
    tokens = mbs * k * model.max_seq_len
    assert p.tokens_per_s == pytest.approx(tokens / iteration, rel=1e-9)
    flops = model_flops_per_iteration(model, mbs * k, model.max_seq_len)
    assert p.model_tflops_per_gpu == pytest.approx(flops / iteration / 1e12, rel=1e-9)


def _hf_config(model) -> dict:
    """A Hugging Face config.json dict describing ``model`` (llama or gpt2 family)."""
    if model.activation == "swiglu":
        return {"model_type": "llama", "num_hidden_layers": model.num_layers, "hidden_size": model.hidden_size,
                "num_attention_heads": model.num_heads, "num_key_value_heads": model.num_kv_heads,
                "intermediate_size": model.ffn_hidden_size, "vocab_size": model.vocab_size,
                "max_position_embeddings": model.max_seq_len}
    return {"model_type": "gpt2", "n_layer": model.num_layers, "n_embd": model.hidden_size,
            "n_head": model.num_heads, "n_inner": model.ffn_hidden_size, "vocab_size": model.vocab_size,
            "n_positions": model.max_seq_len}


@SETTINGS
@given(setups())
def test_batch_and_single_agree_exactly(s):
    drawn, plan, gpu = s
    cfg = _hf_config(drawn)
    model = from_hf_config(cfg, name="prop")
    assume(not plan.problems(model))
    line = json.dumps({"id": "p", "model": cfg, "gpu": gpu, "gpus": plan.gpus, "tp": plan.tp, "pp": plan.pp,
                       "mbs": plan.mbs, "gbs": plan.gbs, "seq_len": plan.seq_len,
                       "recompute": plan.recompute, "zero": plan.zero, "dtype": plan.dtype})
    (rec,) = list(run_batch([line]))
    assert "error" not in rec, rec
    rec = json.loads(json.dumps(rec))  # what `planner predict --batch` writes
    single = json.loads(json.dumps(_pred(model, plan, gpu).to_dict()))
    for key, value in single.items():
        assert rec[key] == value, key


@SETTINGS
@given(setups())
def test_deterministic_across_calls(s):
    model, plan, gpu = s
    a = _pred(model, plan, gpu).to_dict()
    b = _pred(replace(model), replace(plan), gpu).to_dict()
    assert json.dumps(a, sort_keys=True) == json.dumps(b, sort_keys=True)
