"""Mixture-of-experts run rows (shared/validation/moe_runs.csv): parsing, refusals with reasons, row -> ModelSpec /
ParallelPlan, the sources' Megatron-Core FLOPs counters and the metric conversions (planner.validation.moe_rows)."""

from __future__ import annotations

import re
from types import SimpleNamespace

import pytest

import planner.validation.runs as V
from costmodel.core.specs.presets import resolve_model
from planner.validation.compare import compare
from planner.validation.moe_rows import megatron_flops, moe_model
from planner.validation.report import validate

ACCEPTED = {"MOE-MLMREADME-001", "MOE-MOEZOO-001", "MOE-MOEZOO-002", "MOE-MOEZOO-003", "MOE-MOEZOO-004",
            "MOE-MOEZOO-005", *(f"MOE-MOEZOO-{i:03d}" for i in range(7, 15)),
            "MOE-MOEZOO-015", *(f"MOE-MOEZOO-{i:03d}" for i in range(16, 20)), "MOE-MOEZOO-023",
            "MOE-MOEZOO-020", "MOE-MOEZOO-021", "MOE-MOEZOO-022", "MOE-MOEZOO-024",
            *(f"MOE-AUTOMODEL-{i:03d}" for i in range(1, 6)), "MOE-NEMO25-001", "MOE-NEMO25-002", "MOE-NEMO25-003",
            "MOE-NEMO25-004", "MOE-MLMDSV3-002"}
"""Rows of moe_runs.csv the reader maps (every other row states why it is refused)."""


@pytest.fixture
def moe_rows(shared_validation):
    return {r.id: r for r in V.load_runs(shared_validation / "moe_runs.csv")}


def test_every_moe_row_maps_or_states_a_reason(moe_rows):
    assert len(moe_rows) == 41
    assert {r.id for r in moe_rows.values() if not r.skip_reason} == ACCEPTED
    for row in moe_rows.values():
        assert row.tier in ("A", "B", "C"), row.id
        assert "\n" not in row.skip_reason
        if row.id in ACCEPTED:
            model, plan, _, _ = V.row_to_inputs(row)
            assert model.is_moe and plan.ep == (row.get("ep") or 8) and plan.problems(model) == [], row.id
    reason = {k: r.skip_reason for k, r in moe_rows.items()}
    assert "hybrid" in reason["MOE-MOEZOO-006"] and "hybrid" in reason["MOE-AUTOMODEL-007"]
    # MXFP8 / blockwise FP8 rows: dtype fp8-block (tests/test_fp8_block.py); other reasons stay
    assert "GBS not stated" in reason["MOE-TORCHTITAN-002"]
    for i in range(7, 15):  # --recompute-modules layernorm moe: the whole MoE block re-run (costmodel.graph.selective)
        plan = V.row_to_inputs(moe_rows[f"MOE-MOEZOO-{i:03d}"])[1]
        assert plan.recompute == "selective" and plan.recompute_modules == ("layernorm", "moe")
    assert "EP not stated" in reason["MOE-AUTOMODEL-006"]  # its config drifted from the table
    # 61 layers over PP4 x VPP8 / PP8 x VPP4: PyTorch pipelining's default layout, not a Megatron split
    for run_id, pp in (("MOE-AUTOMODEL-002", 4), ("MOE-AUTOMODEL-003", 8)):
        plan = V.row_to_inputs(moe_rows[run_id])[1]
        assert plan.pipeline_layout == (2,) * 29 + (1,) * 3 and plan.layer_split is None and plan.pp == pp
    assert "GBS not stated" in reason["MOE-TORCHTITAN-001"]
    dsv3 = reason["MOE-DSV3REPORT-001"]  # its MTP depth and its H800s (hgx-h800) are modelled; the schedule is not
    assert "DualPipe" in dsv3 and "H800" not in dsv3 and "MTP" not in dsv3
    assert moe_model(moe_rows["MOE-DSV3REPORT-001"], 4096, []).mtp_layers == 1
    assert "Local batch size is 10" in reason["MOE-TORCHTITAN-001"]
    # the DeepSeek-V3 GB200 write-up: its baseline is refused as host-bound (the source says so), its final row runs
    # the layout written in the notes ('Et|(tt|)*30L': embedding + 1 layer, 30 x 2 layers, loss) on PP8 x VPP4
    assert "host-bound" in reason["MOE-MLMDSV3-001"] and "FLOPs formula" not in reason["MOE-MLMDSV3-001"]
    plan = V.row_to_inputs(moe_rows["MOE-MLMDSV3-002"])[1]
    assert plan.pipeline_layout == (1,) + (2,) * 30 + (0,) and (plan.pp, plan.vpp) == (8, 4)
    assert plan.moe_dispatcher == "flex" and plan.moe_routing == "random" and plan.dtype == "fp8-block"
    # NeMo's Mixtral performance recipes drop tokens at capacity 1 (source rule moe_token_drop): balanced experts
    nemo_model, nemo_plan, _, _ = V.row_to_inputs(moe_rows["MOE-NEMO25-001"])
    assert nemo_plan.moe_imbalance == 1.0 and nemo_model.capacity_factor == 1.0
    # NeMo AutoModel's fake balanced gate: round-robin experts
    assert V.row_to_inputs(moe_rows["MOE-AUTOMODEL-002"])[1].moe_routing == "round_robin"


@pytest.mark.parametrize("run_id,preset", [
    ("MOE-MLMREADME-001", "mixtral-8x7b"), ("MOE-MOEZOO-021", "mixtral-8x22b"), ("MOE-MOEZOO-001", "qwen3-235b-a22b"),
    ("MOE-AUTOMODEL-004", "qwen3-30b-a3b"), ("MOE-MLMDSV3-001", "deepseek-v3"), ("MOE-AUTOMODEL-006", "gpt-oss-120b")])
def test_row_architecture_matches_the_preset(moe_rows, run_id, preset):
    """The columns + arch_notes (MLA ranks, head dim, first dense layers) give the published model: the same total
    and active parameters as the preset built from its config.json."""
    model, ref = moe_model(moe_rows[run_id], 4096, []), resolve_model(preset)
    assert model.total_params() == ref.total_params()
    assert model.active_params() == ref.active_params()
    assert (model.head_dim, model.kv_lora_rank, model.first_dense_layers) == \
        (ref.head_dim, ref.kv_lora_rank, ref.first_dense_layers)


def test_megatron_causal_counter_reproduces_the_moezoo_table(moe_rows):
    """MOE-MOEZOO-001..005 print step time and TFLOPS: the causal (2025+) counter turns one into the other within
    rounding, the 2024 full-attention counter is >10 % off (so the source rule tflops_mcore_causal is the right one)."""
    for i in range(1, 6):
        row = moe_rows[f"MOE-MOEZOO-{i:03d}"]
        printed = float(re.search(r"Per-GPU TFLOPS (\d+)", row.text["notes"]).group(1))
        model, plan, _, _ = V.row_to_inputs(row)
        for causal, lo, hi in ((True, -0.01, 0.01), (False, 0.10, 0.20)):
            tf = megatron_flops(model, plan.gbs, plan.seq_len, causal) / (
                row.measured_value * plan.gpus) / 1e12
            assert lo < tf / printed - 1 < hi, (row.id, causal, tf, printed)


def test_plan_fields_from_framework_and_notes(moe_rows):
    def plan(run_id):
        return V.row_to_inputs(moe_rows[run_id])[1]

    p = plan("MOE-MLMREADME-001")
    assert (p.ep, p.etp, p.moe_dispatcher, p.moe_imbalance, p.moe_overlap_comm) == (8, 1, "alltoall", None, False)
    p = plan("MOE-MOEZOO-002")  # DeepEP = flex; '+1f1b overlap'
    assert (p.ep, p.moe_dispatcher, p.moe_overlap_comm, p.layer_split) == (32, "flex", True, (11,) + (12,) * 6 + (11,))
    assert plan("MOE-MOEZOO-004").layer_split == (2,) + (3,) * 30 + (2,)  # 94 layers + embedding + loss = 96
    assert plan("MOE-MOEZOO-022").moe_imbalance == 1.0  # --moe-router-force-load-balancing
    assert plan("MOE-MOEZOO-021").moe_imbalance is None  # dropless: the default
    assert plan("MOE-AUTOMODEL-004").moe_imbalance == 1.0  # 'fake balanced gate'
    assert plan("MOE-AUTOMODEL-005").ep == 8  # '-' in the table, ep_size 8 in the config of the same commit
    # 'kernels: TE + DeepEP': TE's fused attention; '... + FlexAttn': the framework's (FlashAttention-2) kernel
    assert (plan("MOE-AUTOMODEL-004").attention, plan("MOE-AUTOMODEL-005").attention) == ("fused", "")
    p = plan("MOE-NEMO25-003")  # FSDP=0: distributed optimizer, not ZeRO-3
    assert (p.zero, p.dtype) == (1, "fp8")
    p = plan("MOE-NEMO25-002")  # ETP 1 from the recommended-config file the notes quote, TP 2
    assert (p.tp, p.etp, p.cp, p.gbs, p.mbs) == (2, 1, 8, 64, 1)
    assert (plan("MOE-AUTOMODEL-004").zero, plan("MOE-AUTOMODEL-004").framework) == (3, "fsdp")
    # 4-GPU GB200 trays in NVL72 racks: 256 GPUs over 4 racks, 64 each on NVLink (Hardware.domain_for)
    assert (plan("MOE-MOEZOO-015").gpus_per_node, plan("MOE-MOEZOO-015").domain) == (4, 64)
    assert plan("MOE-NEMO25-003").domain == 64 and plan("MOE-MOEZOO-001").domain == 8


def test_gpu_hours_metric_is_converted(moe_rows):
    row = moe_rows["MOE-DSV3REPORT-001"]
    assert row.measured_metric == "tokens_per_s_per_gpu"
    assert row.measured_value == pytest.approx(1e12 / (180000 * 3600))  # MOE_README: about 1543 tok/s/GPU
    assert round(row.measured_value) == 1543


def test_moe_tflops_row_compared_in_its_source_convention(moe_rows):
    row = moe_rows["MOE-MLMREADME-001"]  # rule tflops_mcore_full_attention
    model, plan, _, _ = V.row_to_inputs(row)
    flops = megatron_flops(model, plan.gbs, plan.seq_len, causal=False)
    t = flops / (row.measured_value * 1.1 * 1e12 * plan.gpus)
    pred = SimpleNamespace(iteration_time_s=t, model_tflops_per_gpu=float("nan"))
    value, err = compare(row, pred, model, plan)
    assert err == pytest.approx(0.1)
    assert value == pytest.approx(438 * 1.1)


def test_validate_keeps_refused_rows_with_reasons(moe_rows):
    def stub(model, plan, hardware):
        return SimpleNamespace(iteration_time_s=1.0, tokens_per_s_per_gpu=1000.0, warnings=[], fits_in_memory=True,
                               memory_gib_per_gpu=1.0)

    report = validate(list(moe_rows.values()), predict_fn=stub, hardware_fn=lambda *a: None)
    assert {r.id for r in report.predicted} == ACCEPTED
    assert all(r.skip_reason for r in report.skipped) and len(report.skipped) == 41 - len(ACCEPTED)
    only_a = validate(list(moe_rows.values()), predict_fn=stub, hardware_fn=lambda *a: None, tiers=["A"])
    assert {r.tier for r in only_a.rows} == {"A"} and only_a.excluded_by_tier > 0


def test_report_appends_the_moe_section(moe_rows, tmp_path):
    """The default report gets the MoE runs as their own section: heading, run file, figures, the EP/ETP layout
    column, every refused row with its reason, and its own scatter PNG; the dense part stays as it was."""
    from planner.reports.validate_report import ReportSection, validation_report_text

    def stub(model, plan, hardware):
        return SimpleNamespace(iteration_time_s=10.0, tokens_per_s_per_gpu=1000.0, warnings=[], fits_in_memory=True,
                               memory_gib_per_gpu=1.0)

    moe = validate(list(moe_rows.values()), predict_fn=stub, hardware_fn=lambda *a: None)
    dense = validate([], predict_fn=stub)
    md = tmp_path / "validation.md"
    plain, _ = validation_report_text(md, dense, ["published_runs.csv"], command="planner validate", cost_model="x")
    text, images = validation_report_text(md, dense, ["published_runs.csv"], command="planner validate",
                                          cost_model="x", sections=[ReportSection("Mixture-of-experts runs", "moe",
                                                                                  moe, ["moe_runs.csv"], ["intro"])])
    assert text.startswith(plain.rstrip("\n"))
    section = text[len(plain.rstrip("\n")):]
    assert "## Mixture-of-experts runs" in section and "`moe_runs.csv`" in section
    assert "TP/PP/DP/CP/VP/EP/ETP" in section and "| 2/8/16/1/4/32/1 |" in section
    assert all(f"| {r.id} |" in section for r in moe.skipped)
    assert [p.name for p, _ in images] == ["validation_moe_scatter.png"]


def test_cli_cross_validates_the_moe_file(shared_validation):
    """`planner validate --runs moe_runs.csv --cv source` predicts every accepted row with the real cost model,
    each MoE source held out in turn (the default for a --runs file is --cv none: predictions as predict makes
    them, uncalibrated)."""
    import json

    import typer
    from typer.testing import CliRunner

    from planner.cli_validate import register, resolve_cv

    app = typer.Typer()
    register(app)
    app.command("noop")(lambda: None)
    path = str(shared_validation / "moe_runs.csv")
    assert resolve_cv(None, None, [path]) == "none"
    res = CliRunner().invoke(app, ["validate", "--runs", path, "--format", "json", "--cv", "source"])
    assert res.exit_code == 0, res.output
    data = json.loads(res.output)
    assert data["cv"] == "source" and {f["held_out"][0] for f in data["folds"]} == \
        {"MOE-AUTOMODEL", "MOE-MLMDSV3", "MOE-MLMREADME", "MOE-MOEZOO", "MOE-NEMO25"}
    done = [r for r in data["rows"] if not r["skip_reason"]]
    assert {r["id"] for r in done} == ACCEPTED
    assert all(r["predicted"] > 0 and r["layout"]["ep"] > 1 for r in done)
    assert data["uncalibrated"]["n"] == len(ACCEPTED)


@pytest.mark.parametrize("text,modules", [
    ("selective: norm, act (layernorm, moe_act)", ("layernorm", "moe_act")),
    ("selective: layernorm, moe (--recompute-modules layernorm moe)", ("layernorm", "moe")),
    ("selective: dense-layer MLP + MLA up-projection (--recompute-modules mlp up_proj)", ("mlp", "mla_up_proj")),
    ("selective: --recompute-modules moe_act mlp", ("moe_act", "mlp")),
    ("selective: norm, act, shared_expert", ("layernorm", "moe_act", "shared_experts")),
    ("selective: moe_act, layernorm + fine-grained activation offloading (expert_fc1, moe_act)",
     ("moe_act", "layernorm")),
    ("selective: all RMSNorm and MLA up-projections recomputed", ("layernorm", "mla_up_proj")),
    ("selective", ()), ("full", ()), ("", ()), ("none (activation checkpointing mode none)", ())])
def test_recompute_text_maps_to_megatron_modules(text, modules):
    from planner.validation.moe_rows import recompute_modules

    assert recompute_modules(text) == modules
