"""planner.validation.runs: rows whose framework says the pipeline is interleaved but state no VP (the fewest equal
chunks, v >= 2), and the 1F1B fallback where those chunks do not fit in memory."""

from __future__ import annotations

import pytest

from planner.validation.runs import RunRow, _interleaved_stages, load_runs, row_to_inputs


def _row(framework: str, notes: str = "") -> RunRow:
    return RunRow(id="X-001", source="SYNTHETIC", model_name="x", values={}, text={"framework": framework,
                  "notes": notes}, measured_metric="tflops_per_gpu", measured_value=1.0)


@pytest.mark.parametrize("layers, pp, v", [
    (96, 16, 2),    # 6 layers per stage: 2 chunks of 3
    (60, 4, 3),     # 15 per stage: no 2 equal chunks, 3 of 5
    (105, 35, 3),   # 3 per stage
    (128, 64, 2),   # 2 per stage
    (126, 16, 2),   # 126 + embedding + loss = 128 over 16 stages (Llama 3 Sec. 3.3.2): 8 per stage
    (127, 16, 1),   # neither L nor L + 2 whole stages: no equal chunks, 1F1B
    (24, 24, 1),    # one layer per stage cannot be interleaved
])
def test_interleaved_framework_takes_the_fewest_equal_chunks(layers, pp, v):
    notes: list[str] = []
    assert _interleaved_stages(_row("Megatron-LM (PTD-P, interleaved schedule)"), layers, pp, notes) == v
    assert bool(notes) == (v > 1)


def test_only_interleaved_framework_text_or_torchtitan_notes_interleave():
    notes: list[str] = []
    assert _interleaved_stages(_row("Megatron-LM (Jan 2021, pre-interleaving)"), 96, 16, notes) == 1
    assert _interleaved_stages(_row("Megatron-LM (2022)", "non-interleaved"), 96, 16, notes) == 1
    assert _interleaved_stages(_row("Meta internal (interleaved PP)"), 96, 1, notes) == 1     # no pipeline
    assert _interleaved_stages(_row("torchtitan", "Interleaved 1F1B"), 126, 8, notes) == 2    # its default
    assert _interleaved_stages(_row("torchtitan", "1F1B"), 126, 8, notes) == 1
    assert notes == ["interleaved schedule, stages per rank not stated: 2 (torchtitan's default without split "
                     "points)"]


def test_llama3_rows_interleave_where_the_chunks_fit_and_keep_1f1b_where_they_do_not(shared_validation):
    rows = {r.id: r for r in load_runs(shared_validation / "published_runs.csv")}
    # 16,384 GPUs: 16 micro-batches per DP group, two chunks of 4 layers per stage fit
    _, plan, _, _ = row_to_inputs(rows["LLAMA3-002"])
    assert (plan.vpp, plan.recompute) == (2, "selective")
    # Llama 3 Sec. 3.3.2: the first and the last stage hold one transformer layer less (embedding, loss)
    assert plan.layer_split == (7,) + (8,) * 14 + (7,)
    # 8,192 GPUs: 32 micro-batches keep 47 chunks in flight at VPP 2 (more than 80 GB); 1F1B fits, so the
    # schedule falls back before the recompute does (the recompute stays the assumed selective)
    _, plan, _, _ = row_to_inputs(rows["LLAMA3-001"])
    assert (plan.vpp, plan.recompute, plan.layer_split) == (1, "selective", (7,) + (8,) * 14 + (7,))
    assert any("VPP=1 assumed (the run ran)" in a for a in rows["LLAMA3-001"].assumptions)
    # SC21 Table 1 rows ran interleaved without a stated VP; the 2022 paper's non-interleaved rows stay 1F1B
    assert row_to_inputs(rows["NARAY21-006"])[1].vpp == 3 and row_to_inputs(rows["NARAY21-008"])[1].vpp == 2
    assert row_to_inputs(rows["KORTHI22-007"])[1].vpp == 1
