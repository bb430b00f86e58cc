"""Block-scaled FP8 GEMMs (costmodel/cost/fp8_block.py, dtype fp8-block, alias mxfp8): the measured fp8_block / fp8
ratio table, its use in the composition (fp8-block plans only), the request, search and export plumbing and the
validation rows it maps."""

from __future__ import annotations

import json
import shlex

import pytest

from costmodel.core.errors import PlannerError
from costmodel.core.specs.catalogue import load_catalogue
from costmodel.core.specs.plan import ParallelPlan
from costmodel.core.specs.presets import resolve_model
from costmodel.cost import fp8_block as FB
from costmodel.estimate import default_cost_model, estimate
from planner.export import megatron_args
from planner.requests import PlanRequest
from planner.validation.moe_rows import block_scaled_fp8

TABLE = json.loads(FB.TABLE_PATH.read_text())


def test_table_regenerates_from_shared_data(shared_data):
    """`python -m costmodel.cost.fp8_block` output equals the shipped table."""
    assert json.loads(json.dumps(FB.fit(shared_data), sort_keys=True)) == TABLE


def test_block_limits_of_provenance_are_filtered():
    """PROVENANCE.md: fp8_block exists only for n, k >= 128; a pair below is left out of the fit."""
    assert FB.usable(1, 128, 128) and not FB.usable(4096, 64, 4096) and not FB.usable(4096, 4096, 32)
    fit = FB.fit_system({(1024, 64, 4096): 1.0, (1024, 4096, 4096): 1.0},
                        {(1024, 64, 4096): 9.0, (1024, 4096, 4096): 2.0})
    assert fit["pairs"] == 1 and [v[0] for v in fit["cells"].values()] == [2.0]
    assert FB.cell(8, 64, 64) == FB.cell(8, 128, 128)       # n, k below the block take the 128 cell


@pytest.mark.parametrize("system", list(FB.DIES))
def test_ratio_table_describes_the_data(system):
    """Every measured pair is used; the cell medians reproduce the measured block latencies within 12 % MAPE
    in sample (7-11 % when fitted); and what the data say: small GEMMs are faster block-scaled (the per-tensor
    timing carries a separate amax pass), large ones on Hopper slower (CUTLASS block-scale kernel)."""
    s = TABLE["systems"][system]
    assert s["pairs"] == s["block_rows"] == 29268 and s["check"]["mape"] < 0.12
    assert s["cells"]["0,2,2"][0] < 0.6                    # m < 8, n, k 128-511
    if s["die"] == "GH100":                                  # m 2048-8191, n, k 2048-8191
        assert s["cells"]["4,4,4"][0] > 1.0


def _plan(dtype: str, **kw) -> ParallelPlan:
    return ParallelPlan(gpus=16, gpus_per_node=8, tp=2, pp=2, mbs=1, gbs=32,
                        seq_len=4096, dtype=dtype, **kw)


def test_fp8_block_is_fp8_times_the_ratio_on_gemms_only():
    """Every operator of an fp8-block plan costs what the fp8 plan's does, GEMMs the measured (inference) per-tensor
    fp8 GEMM times their cell's ratio (the fp8 training-basis step, costmodel/cost/fp8_training.py, is fp8's only)."""
    model = resolve_model("llama3-8b")
    hw = load_catalogue().resolve("h100-sxm", None, None)
    cm = default_cost_model()
    e8, eb = (estimate(model, _plan(d), hw, cost_model=cm) for d in ("fp8", "fp8-block"))
    g8, t8, gb, tb = e8.graph, e8.times, eb.graph, eb.times
    ops8 = {(o.name, o.phase, o.features): o for st in g8.stages for o in st.layer_ops}
    checked = 0
    for st in gb.stages:
        for o in st.layer_ops:
            o8 = ops8[(o.name, o.phase, o.features)]
            if o.kind == "gemm":
                want = float(cm.predict([o8], hw).time_s[0]) * FB.ratio("h100-sxm", *o.features[:3])
            else:
                want = t8.time_s[o8.key()]
            assert tb.time_s[o.key()] == pytest.approx(want, rel=1e-9), o.name
            checked += o.kind == "gemm"
    assert checked > 4
    assert any("fp8-block GEMMs" in w for w in tb.warnings)


def test_other_dtypes_pass_through_unchanged():
    cm = default_cost_model()
    for dtype in ("bf16", "fp8", "fp16"):
        assert FB.cost_model_for(_plan(dtype), cm) is cm


def test_request_alias_and_refusals():
    req = dict(model="llama3-8b", gpu="gb200", gpus=16, tp=2)
    assert PlanRequest(**req, dtype="mxfp8").dtype == "fp8-block"
    with pytest.raises(PlannerError, match="no block-scaled FP8 GEMM measurements for mi300x"):
        PlanRequest(**{**req, "gpu": "mi300x"}, dtype="fp8-block").resolve()
    with pytest.raises(PlannerError, match="no fp8 tensor cores"):
        PlanRequest(**{**req, "gpu": "a100-80gb"}, dtype="fp8-block").resolve()
    assert FB.system_for("gh200") == "h100_sxm"               # same-die sibling borrows the H100 ratio


def test_megatron_recipe_per_architecture():
    """arguments.py @307dcf37: --fp8-recipe blockwise (Hopper, as measured) / mxfp8 (Blackwell)."""
    model = resolve_model("llama3-8b")
    cat = load_catalogue()
    for gpu, recipe in (("h100-sxm", "blockwise"), ("gb200", "mxfp8"), ("b300", "mxfp8")):
        args, notes = megatron_args(model, _plan("fp8-block"), hardware=cat.resolve(gpu, None, None))
        text = shlex.join(args)
        assert f"--fp8-recipe {recipe}" in text and "--fp8-format e4m3" in text, gpu
    args, _ = megatron_args(model, _plan("fp8"))
    assert "--fp8-recipe" not in args and "--fp8-format" in args


@pytest.mark.parametrize("text,block", [
    ("mxfp8", True), ("mxfp8 (MXFP8 recipe e4m3, 1x32 blocks; FP8 primary weights --fp8-param-gather)", True),
    ("fp8 (blockwise e4m3, --fp8-param-gather)", True), ("fp8 (per-tensor FP8, current scaling)", False),
    ("fp8 rowwise (torchao)", False), ("bf16", False)])
def test_validation_precision_text(text, block):
    assert block_scaled_fp8(text) is block


def test_block_rows_map_to_fp8_block(shared_validation):
    import planner.validation.runs as V
    rows = {r.id: r for r in V.load_runs(shared_validation / "moe_runs.csv")}
    for run_id in ("MOE-MOEZOO-016", "MOE-MOEZOO-018", "MOE-MOEZOO-023"):
        assert not rows[run_id].skip_reason, run_id
        assert V.row_to_inputs(rows[run_id])[1].dtype == "fp8-block"
    assert V.row_to_inputs(rows["MOE-NEMO25-003"])[1].dtype == "fp8"
    assert all("MXFP8" not in r.skip_reason and "block-scaled" not in r.skip_reason for r in rows.values())


def test_search_space_keeps_or_drops_fp8_block():
    """fp8-block (or its alias) in the searched dtypes: kept on a GPU with data, dropped with a note where another
    dtype remains, refused in one line when it is all that was asked on a GPU without data."""
    from dataclasses import replace

    from planner.search.space import build_problem, load_space, make_target
    cat = load_catalogue()
    model = resolve_model("llama3-8b")
    space = load_space("default")
    h100 = build_problem(model, [make_target(cat.resolve("h100-sxm"), 16)], replace(space, dtype=("fp8-block",)))
    assert h100.space.dtype == ("fp8-block",)
    mi = build_problem(model, [make_target(cat.resolve("mi300x"), 16)], replace(space, dtype=("bf16", "fp8-block")))
    assert mi.space.dtype == ("bf16",) and any("fp8-block dropped" in n for n in mi.notes)
    with pytest.raises(PlannerError, match="no block-scaled FP8 GEMM measurements for mi300x"):
        build_problem(model, [make_target(cat.resolve("mi300x"), 16)], replace(space, dtype=("fp8-block",)))
