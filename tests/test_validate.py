"""planner.validation and `planner validate`: loading, row mapping, source rules, metric comparison,
summaries, CLI."""

from __future__ import annotations

import csv
import dataclasses
import io
import json
from pathlib import Path
from types import SimpleNamespace

import pytest
import typer
from typer.testing import CliRunner

import planner.validation.report as Rep
import planner.validation.runs as V
from costmodel.core.errors import PlannerError
from costmodel.schedule.flops import model_flops_per_iteration, published_flops_per_iteration
from planner.cli_validate import register
from planner.validation import sources as S
from planner.validation.compare import compare
from planner.validation.report import validate

FIXTURE = Path(__file__).parent / "fixtures" / "runs_small.csv"
"""Synthetic rows in the published-runs schema (invented values). Their ids carry published prefixes but their
``source`` says SYNTHETIC, so, like a user's own file, they get none of the published sources' rules."""

# Stub predictions per run id: each targets a known signed error in the row's metric.
# Values that must NOT be used for that row are 999 / NaN, so a wrong metric choice shows up.
NAN = float("nan")
STUB = {
    "KORTHI22-002": dict(iteration_time_s=2.0 * 1.1),            # +10 %
    "TORCHTITAN-001": dict(tokens_per_s_per_gpu=5000 * 0.8),      # -20 %
    "NARAY21-005": dict(published_tflops=100 * 1.1),                # not the paper: model FLOPs, +10 %
    "MCORE-H100-002": dict(published_tflops=400 * 0.8),             # model FLOPs: -20 %
    "LLAMA3-001M": dict(published_mfu=0.40 * 1.1),                  # percent of bf16 peak: +10 %
}
EXPECTED_ERRORS = {"KORTHI22-002": 0.1, "TORCHTITAN-001": -0.2, "NARAY21-005": 0.1, "MCORE-H100-002": -0.2,
                   "LLAMA3-001M": 0.1}


def stub_prediction(**values):
    base = dict(iteration_time_s=NAN, tokens_per_s=NAN, tokens_per_s_per_gpu=NAN, model_tflops_per_gpu=NAN,
                hardware_tflops_per_gpu=NAN, mfu=NAN, memory_gib_per_gpu=10.0, fits_in_memory=True,
                bubble_fraction=0.0, warnings=[])
    base.update(values)
    return SimpleNamespace(**base)


def stub_predict(model, plan, hardware):
    values = dict(STUB[plan.extra["run_id"]])
    if "published_tflops" in values:
        values = timed_for_tflops(model, plan, values.pop("published_tflops"))
    if "published_mfu" in values:
        values = dict(mfu=values.pop("published_mfu") / convention_ratio(model, plan))
    return stub_prediction(**values)


def convention_ratio(model, plan) -> float:
    """Published (full-attention) over planner's (causal) model FLOPs: compare() scales MFU by it."""
    gbs, seq = plan.gbs, plan.seq_len
    return published_flops_per_iteration(model, gbs, seq, "none") / model_flops_per_iteration(model, gbs, seq)


def timed_for_tflops(model, plan, tflops: float, recompute: str = "none") -> dict:
    """The iteration time at which ``tflops`` per GPU in the published convention (compare() converts the
    predicted time into it); the predicted TFLOP/s fields are NaN so that using them shows up."""
    flops = published_flops_per_iteration(model, plan.gbs, plan.seq_len, recompute)
    return dict(iteration_time_s=flops / (tflops * 1e12 * plan.gpus))


def compare_row(row, prediction):
    """compare() with the row's own model and plan, as validate() passes them."""
    model, plan, _, _ = V.row_to_inputs(row)
    return compare(row, prediction, model, plan)


def tflops_pred(row, tflops: float, hfu: bool = False):
    model, plan, _, _ = V.row_to_inputs(row)
    return stub_prediction(**timed_for_tflops(model, plan, tflops, plan.recompute if hfu else "none"))


# Test-only peaks (not datasheet values): bf16 / fp8 = 0.5 makes the FP8-peak conversion visible.
STUB_HW = SimpleNamespace(gpu=SimpleNamespace(peak_tflops={"bf16": 2.0, "fp8": 4.0}))


def stub_hardware(gpu_key, gpus_per_node, cluster):
    return STUB_HW


def by_id(rows):
    return {r.id: r for r in rows}


# ------------------------------------------------------------------------------------------ real CSV
def test_every_real_row_maps_or_states_a_reason(shared_validation):
    path = shared_validation / "published_runs.csv"
    rows = V.load_runs(path)
    with path.open(newline="", encoding="utf-8") as fh:
        assert len(rows) == sum(1 for _ in csv.DictReader(fh))
    for row in rows:
        assert row.tier in ("A", "B", "C"), row.id
        if row.skip_reason:
            assert len(row.skip_reason) > 10, row.id
            continue
        model, plan, gpu_key, gpn = V.row_to_inputs(row)
        assert plan.problems(model) == [], row.id
        assert plan.gpus == row.get("n_gpus")
        assert gpu_key in ("a100-40gb", "a100-80gb", "h100-sxm", "h100-sxm-500w", "h100-pcie", "h200"), row.id
    rows = by_id(rows)
    assert "CHECK" in rows["LLAMA3-003"].skip_reason
    assert "LoRA" in rows["NEMO2407-016"].skip_reason
    # 126 layers over PP=8: uneven split with the first stages one layer heavier.
    _, plan, _, _ = V.row_to_inputs(rows["TORCHTITAN-013"])
    assert plan.layer_split == (16, 16, 16, 16, 16, 16, 15, 15)
    assert V.map_gpu(rows["TORCHTITAN-013"].text["gpu"]) == ("h100-sxm-500w", "")
    # Model-parallel size only: TP = min(8, MP).
    _, plan, _, _ = V.row_to_inputs(rows["MLM-JAN21-008"])
    assert (plan.tp, plan.pp, plan.dp) == (8, 18, 15)
    assert any("TP/PP split not stated" in a for a in rows["MLM-JAN21-008"].assumptions)


def test_real_row_mappings(shared_validation):
    rows = by_id(V.load_runs(shared_validation / "published_runs.csv"))
    model, plan, gpu, _ = V.row_to_inputs(rows["KORTHI22-004"])
    assert (gpu, plan.tp, plan.pp, plan.vpp, plan.recompute, plan.sp, plan.zero, plan.dtype) == \
        ("a100-80gb", 8, 8, 3, "selective", True, 0, "fp16")
    assert (model.activation, model.norm) == ("gelu", "layernorm")
    assert rows["KORTHI22-004"].cluster == "dgx-a100"
    model, plan, gpu, _ = V.row_to_inputs(rows["TORCHTITAN-003"])
    assert (model.activation, model.norm, model.num_kv_heads, plan.zero, plan.dtype) == \
        ("swiglu", "rmsnorm", 8, 3, "fp8")
    model, plan, _, _ = V.row_to_inputs(rows["NEMO2407-008"])
    assert model.activation == "squared_relu"
    model, plan, _, _ = V.row_to_inputs(rows["MCORE-H100-001"])
    assert model.ffn_hidden_size == 4 * model.hidden_size and model.num_kv_heads == model.num_heads
    assert "MBS not stated, assumed 1" in rows["MCORE-H100-001"].assumptions
    assert any("recompute not stated" in a for a in rows["MCORE-H100-001"].assumptions)


# ------------------------------------------------------------------------------------------ fixture
def test_fixture_exact_errors_and_summary():
    rows = V.load_runs(FIXTURE)
    report = validate(rows, predict_fn=stub_predict, hardware_fn=stub_hardware)
    got = {r.id: r.error for r in report.predicted}
    assert got == pytest.approx(EXPECTED_ERRORS, rel=1e-12, abs=1e-12)
    assert [r.id for r in report.skipped] == ["LLAMA3-003"]
    overall = report.overall()
    assert overall.n == 5
    assert overall.mape_pct == pytest.approx(14.0)
    assert overall.median_abs_pct == pytest.approx(10.0)
    assert overall.bias_pct == pytest.approx(-2.0)
    assert overall.p90_abs_pct == pytest.approx(20.0)
    kinds = {(s.group, s.value): s.n for s in report.summaries}
    assert kinds[("source", "LLAMA3")] == 1 and kinds[("gpu", "h100-sxm")] == 2
    assert kinds[("gpu", "h100-sxm-500w")] == 1  # the torchtitan row's power-capped H100
    assert kinds[("kind", "FSDP")] == 1 and kinds[("tier", "A")] == 2


def test_tier_filter_and_measured_values():
    rows = V.load_runs(FIXTURE)
    report = validate(rows, predict_fn=stub_predict, hardware_fn=stub_hardware, tiers=["A"])
    assert {r.id for r in report.rows} == {"KORTHI22-002", "TORCHTITAN-001"}
    assert report.excluded_by_tier == 4
    assert by_id(report.rows)["KORTHI22-002"].measured == 2.0


def test_fp8_peak_mfu_conversion():
    row = by_id(V.load_runs(FIXTURE))["LLAMA3-001M"]
    row = dataclasses.replace(row, text={**row.text, "notes": row.text["notes"] + " MFU uses the FP8 peak."})
    model, plan, _, _ = V.row_to_inputs(row)
    pred, err = compare(row, stub_prediction(mfu=0.40 * 2 * 1.1 / convention_ratio(model, plan)), model, plan, STUB_HW)
    assert pred == pytest.approx(40 * 1.1)
    assert err == pytest.approx(0.1)
    with pytest.raises(PlannerError):
        compare(row, stub_prediction(mfu=0.5), model, plan)


# ------------------------------------------------------------------------------------------ source rules
NARAY21_TABLE1 = ("Narayanan et al. SC21 'Efficient Large-Scale LM Training on GPU Clusters Using Megatron-LM', "
                  "arXiv:2104.04473, Table 1")
"""The ``source`` text of the published Narayanan Table 1 rows (shared/validation/published_runs.csv)."""
DROPOUT_NOTE = "dropout assumed active (Megatron-LM GPT scripts of 2020-2022)"


def test_user_row_with_a_published_id_prefix_gets_no_rule():
    """The fixture's NARAY21-005 / KORTHI22-002 name a SYNTHETIC source: model FLOPs, no dropout."""
    rows = by_id(V.load_runs(FIXTURE))
    for rid in ("NARAY21-005", "KORTHI22-002"):
        row = rows[rid]
        assert row.rule("dropout") is None and row.rule("tflops_counts_recompute") is None
        model, _, _, _ = V.row_to_inputs(row)
        assert model.dropout is False
        assert DROPOUT_NOTE not in row.assumptions
    pred = tflops_pred(rows["NARAY21-005"], 100 * 1.1)
    assert compare_row(rows["NARAY21-005"], pred)[1] == pytest.approx(0.1)


@pytest.mark.parametrize("rid", ["NARAY21-005", "USER-RUN-1"])
def test_row_naming_a_published_source_gets_its_rules(rid):
    """Rules follow the ``source`` text, whatever the id: HFU-style TFLOP/s and dropout for Narayanan Table 1."""
    row = by_id(V.load_runs(FIXTURE))["NARAY21-005"]
    row = dataclasses.replace(row, id=rid, source=NARAY21_TABLE1)
    assert row.rule("tflops_counts_recompute").citation and row.rule("dropout").citation
    model, _, _, _ = V.row_to_inputs(row)
    assert model.dropout is True
    assert DROPOUT_NOTE in row.assumptions
    pred = tflops_pred(row, 100 * 1.1, hfu=True)
    assert compare_row(row, pred)[1] == pytest.approx(0.1)


def test_published_file_rules(shared_validation):
    """Every source of the published file has a table named by its rows' id prefix; the Megatron-LM 2020-2022
    sources get their rules, the others none."""
    rows = V.load_runs(shared_validation / "published_runs.csv")
    for row in rows:
        src = S.published_source(row.source)
        assert src is not None and src.key.split(":")[0] == row.prefix, (row.id, row.source)
    rows = by_id(rows)
    model, _, _, _ = V.row_to_inputs(rows["NARAY21-001"])
    assert model.dropout is True and DROPOUT_NOTE in rows["NARAY21-001"].assumptions
    pred = tflops_pred(rows["NARAY21-001"], 137.0 * 1.1, hfu=True)
    assert compare_row(rows["NARAY21-001"], pred)[1] == pytest.approx(0.1)
    model, _, _, _ = V.row_to_inputs(rows["KORTHI22-004"])
    assert model.dropout is True
    for rid in ("TORCHTITAN-003", "MCORE-H100-001", "NEMO2407-001"):
        model, _, _, _ = V.row_to_inputs(rows[rid])
        assert model.dropout is False and rows[rid].rule("tflops_counts_recompute") is None, rid
    pred = tflops_pred(rows["MCORE-H100-001"], rows["MCORE-H100-001"].measured_value * 0.8)
    assert compare_row(rows["MCORE-H100-001"], pred)[1] == pytest.approx(-0.2)


def test_shipped_source_rules_are_checked():
    shipped = S.load_sources(S.sources_file())
    assert NARAY21_TABLE1 in shipped["NARAY21"].sources
    memory = {"grads_bf16", "fp8_param_gather", "fp8_moments_bf16", "optimizer_states_bf16", "bf16_model_states"}
    assert set(shipped["NARAY21"].rules) == set(S.RULES) - {"no_gradient_accumulation", "tflops_mcore_full_attention",
                                                            "tflops_mcore_causal", "moe_token_drop", "flash2_attention",
                                                            "cross_entropy_fusion", "dp_overlap", "recompute_none",
                                                            "tp_comm_overlap", "flash1_attention"} - memory
    assert set(shipped["MOE-MOEZOO"].rules) == {"tflops_mcore_causal", "fp8_param_gather", "fp8_moments_bf16"}
    assert set(shipped["MOE-NEMO25"].rules) == {"moe_token_drop", "recompute_none"}
    assert set(shipped["MOE-MLMDSV3"].rules) == {"tflops_mcore_causal", "cross_entropy_fusion"}
    assert set(shipped["MOE-MOEZOO:QWEN3"].rules) == {"tflops_mcore_causal", "fp8_param_gather", "fp8_moments_bf16",
                                                       "cross_entropy_fusion"}
    assert "cross_entropy_fusion" not in shipped["GH200-OELLMJS"].rules  # their native fused loss: the fp32 chain
    assert {"cross_entropy_fusion", "dp_overlap"} <= set(shipped["GH200-OELLM-SF"].rules)  # the production config's
    assert set(shipped["NEMO2407:SFT"].rules) == {"grads_bf16", "optimizer_states_bf16", "fp8_param_gather"}
    assert "no_gradient_accumulation" in shipped["MLM-SEP20"].rules
    assert shipped["TORCHTITAN"].rules == {}
    assert set(shipped["SMALL-NANOGPT"].rules) == {"flash1_attention"}
    rule = {"assumption": "a", "citation": "c"}
    with pytest.raises(PlannerError, match="not a known rule"):
        S.parse_sources({"X": {"sources": ["s"], "rules": {"hfu": rule}}})
    with pytest.raises(PlannerError, match="assumption` and `citation"):
        S.parse_sources({"X": {"sources": ["s"], "rules": {"dropout": {"assumption": "a"}}}})
    with pytest.raises(PlannerError, match="both"):
        S.parse_sources({"X": {"sources": ["s"]}, "Y": {"sources": ["s"]}})
    with pytest.raises(PlannerError, match="non-empty `sources`"):
        S.parse_sources({"X": {"rules": {}}})


# ------------------------------------------------------------------------------------------ errors
def _rewrite(tmp_path, edit_header=None, edit_row=None):
    with FIXTURE.open(newline="", encoding="utf-8") as fh:
        rows = list(csv.DictReader(fh))
    header = list(rows[0])
    if edit_header:
        header = edit_header(header)
    if edit_row:
        edit_row(rows[0])
    path = tmp_path / "runs.csv"
    with path.open("w", newline="", encoding="utf-8") as fh:
        w = csv.DictWriter(fh, fieldnames=header, extrasaction="ignore")
        w.writeheader()
        w.writerows(rows)
    return path


def test_missing_column_names_file_and_column(tmp_path):
    path = _rewrite(tmp_path, edit_header=lambda h: [c for c in h if c != "gbs"])
    with pytest.raises(PlannerError, match=r"runs\.csv.*'gbs'"):
        V.load_runs(path)


def test_non_numeric_value_is_an_error(tmp_path):
    path = _rewrite(tmp_path, edit_row=lambda r: r.update(tp="eight"))
    with pytest.raises(PlannerError, match=r"KORTHI22-002.*'tp'.*eight"):
        V.load_runs(path)
    with pytest.raises(PlannerError, match="not found"):
        V.load_runs(tmp_path / "absent.csv")


@pytest.mark.parametrize("edit, reason", [
    (dict(gpu="TPU v5p"), "unknown GPU"),
    (dict(gbs="6"), "not divisible by MBS*DP"),
    (dict(ep="8"), "mixture-of-experts"),
    (dict(n_layers=""), "n_layers"),
    (dict(tp="4"), "!= GPUs=8"),
])
def test_unusable_rows_are_kept_with_a_reason(tmp_path, edit, reason):
    rows = V.load_runs(_rewrite(tmp_path, edit_row=lambda r: r.update(edit)))
    assert reason in rows[0].skip_reason
    assert len(rows) == 6


def test_uneven_split_with_interleaving():
    notes = []
    assert V._layer_split(30, 4, 2, notes) == (8, 8, 8, 6)
    assert notes and V._layer_split(32, 4, 2, []) is None
    with pytest.raises(PlannerError):
        V._layer_split(31, 4, 2, [])


def test_gpu_mapping():
    assert V.map_gpu("A100-80GB") == ("a100-80gb", "")
    assert V.map_gpu("A100 (memory size not stated)")[0] == "a100-80gb"
    assert V.map_gpu("A100 (memory size not stated)")[1]
    assert V.map_gpu("H100-SXM (DGX-H100)") == ("h100-sxm", "")
    # the torchtitan benchmarks' power-capped H100 is its own catalogue entry (scripts/catalogue_variants.py)
    assert V.map_gpu("H100 96GB HBM2e (500W power limit)") == ("h100-sxm-500w", "")
    assert V.map_gpu("H200 (141GB)")[0] == "h200" and V.map_gpu("GH200 144GB")[0] == "gh200-144gb"


# ------------------------------------------------------------------------------------------ CLI
def _app():
    app = typer.Typer()

    @app.callback()
    def main():  # a group, so the command is called by name
        pass

    register(app)
    return app


def test_cli_with_stub_predict(monkeypatch, tmp_path):
    monkeypatch.setattr(Rep, "predict", stub_predict)
    monkeypatch.setattr(Rep, "default_hardware", lambda: stub_hardware)
    runner = CliRunner()
    res = runner.invoke(_app(), ["validate", "--runs", str(FIXTURE), "--format", "md", "--cv", "none"])
    assert res.exit_code == 0, res.output
    assert "| KORTHI22-002 |" in res.output and "+10.0" in res.output and "-20.0" in res.output
    assert "Skipped runs (1)" in res.output and "CHECK" in res.output
    assert "error [%]" in res.output and "MAPE [%]" in res.output
    res = runner.invoke(_app(), ["validate", "--runs", str(FIXTURE), "--format", "json", "--tier", "b", "--cv", "none"])
    data = json.loads(res.output)
    assert {r["id"] for r in data["rows"]} == {"NARAY21-005", "MCORE-H100-002", "LLAMA3-001M"}
    out = tmp_path / "report.txt"
    res = runner.invoke(_app(), ["validate", "--runs", str(FIXTURE), "--out", str(out), "--cv", "none"])
    assert res.exit_code == 0 and "TORCHTITAN-001" in out.read_text()
    assert "iteration_time_s [s]" in out.read_text()  # rich markup escaped
    res = runner.invoke(_app(), ["validate", "--runs", str(FIXTURE), "--format", "csv", "--cv", "none"])
    assert res.exit_code == 0, res.output
    rows = list(csv.DictReader(io.StringIO(res.output)))
    assert {r["id"] for r in rows} >= {"KORTHI22-002", "TORCHTITAN-001"} and "error [%]" in rows[0]
    res = runner.invoke(_app(), ["validate", "--runs", str(FIXTURE), "--format", "xml", "--cv", "none"])
    assert isinstance(res.exception, PlannerError)


def test_cli_without_run_file(monkeypatch):
    monkeypatch.setattr(Rep, "validation_dir", lambda: None)
    res = CliRunner().invoke(_app(), ["validate"])
    assert isinstance(res.exception, PlannerError) and "--runs FILE" in str(res.exception)


def test_cli_with_real_predict():
    res = CliRunner().invoke(_app(), ["validate", "--runs", str(FIXTURE), "--format", "json", "--cv", "none"])
    assert res.exit_code == 0, res.output
    data = json.loads(res.output)
    assert len(data["rows"]) == 6
    for r in data["rows"]:
        assert r["skip_reason"] or (r["predicted"] > 0 and r["error"] is not None), r


def test_runs_without_tier_tag_are_validated_by_default(tmp_path):
    """Users' own run files carry no TIER= tag: they must not be dropped silently."""
    rows = V.load_runs(FIXTURE)
    for r in rows:
        r.tier = ""
    rep = validate(rows, predict_fn=stub_predict, hardware_fn=stub_hardware)
    assert rep.excluded_by_tier == 0
    assert len(rep.rows) == len(rows)
