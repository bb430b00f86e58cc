"""The global batch as a decision (planner/batch.py): one rounding for every command, the default range from
DeepSeek's compute-optimal batch, plans refused when the batch caps DP, and ranking by time per token."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from costmodel.core.errors import PlannerError
from costmodel.core.specs.catalogue import load_catalogue
from costmodel.core.specs.presets import resolve_model
from costmodel.cost.roofline import RooflineCostModel
from planner.batch import (
    DEFAULT_BATCH_TOKENS,
    BatchRange,
    batch_sequences,
    batch_steps,
    compute_optimal_batch,
    default_batch_range,
    parse_batch_range,
)
from planner.cli import app
from planner.requests import PlanRequest
from planner.search.engine import exhaustive_search
from planner.search.records import seconds_per_token
from planner.search.space import SearchSpace, build_problem, candidate_plan, enumerate_candidates, make_target

CM = RooflineCostModel()
CAT = load_catalogue()


def test_one_rounding_for_predict_and_search():
    """Issue 25: --tokens-per-batch 16M at seq 8192 became GBS 1536 in size but 1920 in predict for the same plan;
    every command now takes the multiple of MBS x DP nearest the tokens."""
    req = PlanRequest(model="llama3-405b", gpu="h100-sxm", gpus=16384, tp=8, pp=16, tokens_per_batch=16_000_000)
    plan = req.resolve().plan
    assert plan.gbs == 1920  # DP 128: 15 steps (16e6 / 8192 = 1953 sequences)
    space = SearchSpace("t", tp=(8,), pp=(16,), cp=(1,), vpp=(1,), mbs=(1,), recompute=("selective",), zero=(1,))
    problem = build_problem(resolve_model("llama3-405b"), [make_target(CAT.resolve("h100-sxm"), 16384)], space,
                            tokens_per_batch=16_000_000)
    (cand,) = list(enumerate_candidates(problem))
    assert candidate_plan(problem, cand).gbs == plan.gbs


@pytest.mark.parametrize("seq", [2048, 4096, 8192])
def test_a_range_takes_the_largest_multiple_not_above_its_top(seq):
    batch = BatchRange(4e6, 16e6)
    for unit in (1, 3, 8, 96, 128, 1000, 1536):
        k = batch_steps(seq, unit, batch)
        if k:
            assert k * unit * seq <= 16e6 < (k + 1) * unit * seq and k * unit * seq >= 4e6
        else:
            assert unit * seq > 16e6 or (16e6 // (unit * seq)) * unit * seq < 4e6


def test_a_single_value_takes_the_nearest_multiple():
    assert batch_steps(4096, 96, BatchRange(4194304, 4194304)) == 11  # 1024 / 96 = 10.67 -> 11 (1056 sequences)
    assert batch_steps(4096, 96, BatchRange(2e6, 4194304)) == 10  # a range: 960 sequences, not above its top
    assert batch_steps(8192, 16384, BatchRange(4e6, 4e6)) == 0  # DP capped: the nearest multiple is 0
    assert batch_sequences(8192, 16384, 4e6) == 16384  # predict runs the named plan with one step


def test_default_range_follows_deepseek_rule():
    m = resolve_model("llama3-405b")
    r = default_batch_range(m, 8192, 15.6e12)
    c = 3.8e25  # Llama 3 405B (Dubey et al. 2024)
    assert r.max_tokens == pytest.approx(compute_optimal_batch(c), rel=0.1)
    assert 60e6 < r.max_tokens < 80e6 and r.min_tokens == DEFAULT_BATCH_TOKENS
    small = default_batch_range(resolve_model("llama-13b"), 4096)  # no budget: 20 tokens per parameter
    assert DEFAULT_BATCH_TOKENS < small.max_tokens < 8e6
    tiny = default_batch_range(resolve_model("llama-13b"), 4096, 1e9)  # B_opt below 4M: the range is B_opt
    assert tiny.single and tiny.max_tokens < DEFAULT_BATCH_TOKENS


def test_parse_batch_range():
    assert parse_batch_range("16M") == BatchRange(16e6, 16e6)
    assert parse_batch_range("4M:16M") == BatchRange(4e6, 16e6)
    assert parse_batch_range(None) is None
    for bad in ("16M:4M", "x", "4M:8M:16M", "-1", "0"):
        with pytest.raises(PlannerError):
            parse_batch_range(bad)


def _problem(gpus, **kw):
    space = SearchSpace("t", tp=(1, 2, 4, 8), pp=(1, 2), cp=(1,), vpp=(1,), mbs=(1, 2), recompute=("selective",),
                        zero=(1,))
    return build_problem(resolve_model("llama-13b"), [make_target(CAT.resolve("a100-80gb"), gpus)], space, **kw)


def test_the_batch_caps_dp_instead_of_growing_with_the_gpu_count():
    res = exhaustive_search(_problem(2048, tokens_per_batch=BatchRange(2e6, 4e6)), cost_model=CM)
    assert res.records
    assert all(r.gbs * r.seq_len <= 4e6 for r in res.records)
    assert any("the batch caps DP" in reason for reason, _ in res.reasons)


def test_plans_with_different_batches_rank_by_time_per_token():
    res = exhaustive_search(_problem(64, tokens_per_batch=BatchRange(1e6, 4e6)), cost_model=CM)
    assert len({r.gbs for r in res.records}) > 1
    keys = [seconds_per_token(r) for r in res.records]
    assert keys == sorted(keys)


def test_cli_reports_the_batch_and_its_rule():
    r = CliRunner().invoke(app, ["search", "--model", "llama-13b", "--gpus", "16", "--tp", "1,2", "--pp", "1",
                                 "--mbs", "1", "--zero", "1", "--recompute", "selective", "--no-progress",
                                 "--tokens-per-batch", "1M:2M"])
    assert r.exit_code == 0, r.output
    assert "batch 1M-2M tokens, GBS per plan" in r.output and "largest not above the range's top" in r.output
    r = CliRunner().invoke(app, ["search", "--model", "llama-13b", "--gpus", "16", "--no-progress", "--format",
                                 "json", "--tp", "2", "--pp", "1", "--mbs", "1", "--zero", "1"])
    data = json.loads(r.output)
    assert data["search"]["batch_range"]["source"].startswith("default")
    r = CliRunner().invoke(app, ["search", "--model", "llama-13b", "--gpus", "16", "--tokens-per-batch", "8M:1M"])
    assert r.exit_code == 2 and "MIN <= MAX" in r.output
