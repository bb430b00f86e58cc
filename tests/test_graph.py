import csv
import difflib
import io
import os
from pathlib import Path

import pytest

from costmodel.graph.build import build_graph, group_topology, layer_operators
from costmodel.schedule.flops import forward_flops_per_token_layer
from tests.helpers import gpt, llama, plan


def _by_name(ops, phase=None):
    return {o.name: o for o in ops if phase is None or o.phase == phase}


def test_tp_sharded_gemm_shapes_and_backward_layouts():
    m = llama(hidden=4096, heads=32, kv=8, ffn=14336)
    p = plan(gpus=8, gbs=8, seq=4096, tp=4, mbs=2)
    ops, _ = layer_operators(m, p)
    g = _by_name(ops)
    T = 2 * 4096
    assert g["qkv"].features == (T, (32 // 4 + 2 * 8 // 4) * 128, 4096)
    assert g["qkv.dgrad"].features == (T, 4096, (8 + 4) * 128)
    assert g["qkv.wgrad"].features == ((8 + 4) * 128, 4096, T)
    assert g["mlp_up"].features == (T, 2 * 14336 // 4, 4096)        # gated: gate + up
    assert g["mlp_down"].features == (T, 4096, 14336 // 4)
    assert g["attn_out"].features == (T, 4096, 32 * 128 // 4)


def test_forward_gemm_flops_match_closed_form():
    m = llama(hidden=4096, heads=32, kv=8, ffn=14336)
    p = plan(gpus=1, gpn=1, gbs=1, seq=2048, mbs=1)
    ops, _ = layer_operators(m, p)
    gemm_fwd = sum(o.flops for o in ops if o.kind == "gemm" and o.phase == "fwd")
    dense, _ = forward_flops_per_token_layer(m, 2048)
    assert gemm_fwd == pytest.approx(dense * 2048)
    bwd = sum(o.flops for o in ops if o.kind == "gemm" and o.phase == "bwd")
    assert bwd == pytest.approx(2 * gemm_fwd)


def test_tp_collectives_with_and_without_sequence_parallel():
    m = gpt(layers=4, hidden=4096, heads=32)
    no_sp, _ = layer_operators(m, plan(gpus=8, gbs=8, tp=8, sequence_parallel=False))
    kinds = sorted((o.kind, o.phase) for o in no_sp if o.name.startswith("tp."))
    assert kinds == [("all_reduce", "bwd"), ("all_reduce", "bwd"), ("all_reduce", "fwd"), ("all_reduce", "fwd")]
    sp, _ = layer_operators(m, plan(gpus=8, gbs=8, tp=8, sequence_parallel=True))
    kinds = sorted((o.kind, o.phase) for o in sp if o.name.startswith("tp."))
    assert kinds == [("all_gather", "bwd"), ("all_gather", "bwd"), ("all_gather", "fwd"), ("all_gather", "fwd"),
                     ("reduce_scatter", "bwd"), ("reduce_scatter", "bwd"), ("reduce_scatter", "fwd"),
                     ("reduce_scatter", "fwd")]
    # message = full [s, b, h] activation in bf16
    assert all(o.bytes == 2048 * 4096 * 2 for o in sp if o.name.startswith("tp."))
    # SP shards the norms over TP
    assert _by_name(sp)["attn_norm"].features == (2048 // 8, 4096, 0)  # gpt: LayerNorm


def test_full_recompute_repeats_forward():
    m = llama(layers=4)
    sel, _ = layer_operators(m, plan(gpus=1, gpn=1, gbs=1, recompute="selective"))
    full, _ = layer_operators(m, plan(gpus=1, gpn=1, gbs=1, recompute="full"))
    fwd = [o for o in sel if o.phase == "fwd"]
    rec = [o for o in full if o.phase == "recompute"]
    assert [o.key()[:3] for o in rec] == [o.key()[:3] for o in fwd]


def test_stages_hold_embedding_first_and_head_last():
    m = llama(layers=8)
    g = build_graph(m, plan(gpus=4, gpn=4, gbs=8, pp=4).validate(m))
    names = [{o.name for o in st.stage_ops} for st in g.stages]
    assert "embedding" in names[0] and "lm_head" not in names[0]
    assert names[1] == set() and names[2] == set()
    assert {"lm_head", "cross_entropy", "final_norm"} <= names[3]
    assert g.p2p is not None and g.p2p.bytes == 2048 * 4096 * 2
    assert [st.layers for st in g.stages] == [2, 2, 2, 2]


def test_dp_ops_by_zero_stage():
    m = llama(layers=4)
    for zero, expect in ((0, {"dp.grad_allreduce"}), (1, {"dp.grad_reducescatter", "dp.param_allgather"}),
                         (3, set())):
        g = build_graph(m, plan(gpus=8, gbs=8, zero=zero))
        names = {o.name for o in g.stages[0].iteration_ops if o.kind != "optimizer"}
        assert names == expect, zero
    g3 = build_graph(m, plan(gpus=8, gbs=8, zero=3))
    assert {o.name for o in g3.stages[0].layer_overlap_ops} == {"zero3.param_allgather", "zero3.grad_reducescatter"}
    opt0 = [o for o in build_graph(m, plan(gpus=8, gbs=8, zero=0)).stages[0].iteration_ops if o.kind == "optimizer"]
    opt1 = [o for o in build_graph(m, plan(gpus=8, gbs=8, zero=1)).stages[0].iteration_ops if o.kind == "optimizer"]
    assert opt1[0].features[0] == pytest.approx(opt0[0].features[0] / 8, abs=1)


@pytest.mark.parametrize("size,stride,gpn,expect", [
    (8, 1, 8, (1, 8)), (16, 1, 8, (2, 8)), (4, 8, 8, (4, 1)), (8, 2, 8, (2, 4)), (1, 1, 8, (1, 1)), (2, 1, 1, (2, 1))])
def test_group_topology(size, stride, gpn, expect):
    assert group_topology(size, stride, gpn) == expect


def test_context_parallel_splits_sequence_and_adds_kv_exchange():
    m = llama(layers=4)
    ops, overlap = layer_operators(m, plan(gpus=4, gpn=4, gbs=4, seq=8192, cp=4))
    att = _by_name(ops, "fwd")["attention"]
    assert att.features[1] == 8192 // 4 and att.features[2] == 8192
    assert {o.name for o in overlap} == {"cp.kv_exchange"}
    assert all(o.count == 3 for o in overlap)


def test_norm_feature_rms_follows_model_norm():
    # FEATURES["norm"] = (tokens, hidden, rms): rms = 1 for RMSNorm, 0 for LayerNorm (different kernels)
    for m, rms in ((llama(layers=2), 1), (gpt(layers=2, hidden=1024, heads=16), 0)):
        g = build_graph(m, plan(gpus=1, gpn=1, gbs=1))
        norms = [o for s in g.stages for o in s.layer_ops + s.stage_ops if o.kind == "norm"]
        assert norms and all(o.features[2] == rms for o in norms)


GOLDEN_DIR = Path(__file__).parent / "fixtures" / "graph_golden"
UPDATE_ENV = "PLANNER_UPDATE_GOLDEN"
GOLDEN_COLUMNS = ("stage", "list", "kind", "name", "phase", "features", "flops", "bytes", "dtype", "count", "category")


def _num(x) -> str:
    """Exact text of a number: integers as integers, floats by their shortest round-trip repr."""
    return str(int(x)) if isinstance(x, int) or (isinstance(x, float) and x.is_integer() and abs(x) < 2**53) \
        else repr(float(x))


def _op_row(stage, where: str, o) -> list[str]:
    return [str(stage), where, o.kind, o.name, o.phase.value, " x ".join(_num(f) for f in o.features), _num(o.flops),
            _num(o.bytes), o.dtype, _num(o.count), o.category.value if o.category else ""]


def operator_table(model, p) -> str:
    """``build_graph(model, p)`` as CSV: per stage one ``fields`` row (layers, parameters, signature) and one row per
    operator of its layer / stage / iteration / overlapped lists, in list order; then the pipeline send (p2p)."""
    g = build_graph(model, p)
    out = io.StringIO()
    w = csv.writer(out, lineterminator="\n")
    w.writerow(GOLDEN_COLUMNS)
    for st in g.stages:
        w.writerow([st.index, "fields", "", f"layers={st.layers} params={st.params} expert_params={st.expert_params} "
                    f"signature={st.signature!r}", "", "", "", "", "", "", ""])
        for where, ops in (("layer", st.layer_ops), ("stage", st.stage_ops), ("iteration", st.iteration_ops),
                           ("overlap", st.layer_overlap_ops)):
            for o in ops:
                w.writerow(_op_row(st.index, where, o))
    if g.p2p is not None:
        w.writerow(_op_row("", "p2p", g.p2p))
    return out.getvalue()


@pytest.mark.parametrize("name,model,p", [
    ("llama_tp2_pp2_cp2", llama(layers=8, kv=8, ffn=14336), plan(gpus=32, gbs=64, seq=4096, tp=2, pp=2, cp=2)),
    ("llama_tp2_pp4_zero3_full_recompute", llama(layers=10, kv=8),
     plan(gpus=16, gpn=4, gbs=32, tp=2, pp=4, zero=3, recompute="full")),
    ("gpt_tp2_pp2_no_sp_zero0", gpt(layers=12, hidden=2048, heads=16),
     plan(gpus=8, gbs=16, tp=2, pp=2, zero=0, sequence_parallel=False)),
])
def test_dense_graph_matches_its_operator_table(name, model, p):
    """Every operator of three dense graphs (GQA + CP ring; ZeRO-3 with full recompute and 4-GPU nodes; GPT without
    sequence parallelism), one CSV row each in tests/fixtures/graph_golden/NAME.csv. The MoE, MLA and
    sliding-window branches must leave dense graphs alone; a deliberate change of the dense operators is
    regenerated with

        PLANNER_UPDATE_GOLDEN=1 python -m pytest tests/test_graph.py -k operator_table

    and reviewed in ``git diff tests/fixtures/graph_golden`` (one changed row per changed operator)."""
    p.validate(model)
    path = GOLDEN_DIR / f"{name}.csv"
    table = operator_table(model, p)
    if os.environ.get(UPDATE_ENV) == "1":
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(table, encoding="utf-8")
        pytest.skip(f"{UPDATE_ENV}=1: wrote {path.relative_to(GOLDEN_DIR.parents[2])}")
    expected = path.read_text(encoding="utf-8")
    if table != expected:
        diff = difflib.unified_diff(expected.splitlines(), table.splitlines(), f"{path.name} (golden)",
                                    f"{path.name} (now)", lineterm="", n=0)
        pytest.fail("operator table differs from the golden (regenerate with "
                    f"{UPDATE_ENV}=1 if the change is deliberate):\n" + "\n".join(list(diff)[:60]))


def test_operator_table_shows_every_field():
    # the golden is only as good as the table: a change of any operator field changes its row
    m, p = llama(layers=4, kv=8), plan(gpus=4, gbs=8, tp=2, pp=2)
    rows = list(csv.DictReader(io.StringIO(operator_table(m, p))))
    qkv = next(r for r in rows if r["name"] == "qkv" and r["phase"] == "fwd")
    assert qkv["kind"] == "gemm" and qkv["features"] == "2048 x 3072 x 4096" and qkv["count"] == "1"
    assert {r["list"] for r in rows} == {"fields", "layer", "stage", "iteration", "p2p"}
