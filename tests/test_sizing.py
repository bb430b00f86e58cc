"""`planner size`: the allocation search (planner/search/allocation.py) proved against a brute-force scan of every
node count, the recompute dominance its exhaustive searches rely on, goodput in the answer, every GPU type left
out with a reason, and Ctrl-C keeping the best answer found."""

from __future__ import annotations

import json
import os
import signal

import pytest
from typer.testing import CliRunner

from costmodel.core.errors import PlannerError
from costmodel.core.specs.catalogue import load_catalogue
from costmodel.core.specs.presets import resolve_model
from costmodel.cost.roofline import RooflineCostModel
from costmodel.schedule.goodput import FailureModel
from planner.batch import BatchRange
from planner.cli import app
from planner.search.allocation import _slower_or_equal, best_plan_search
from planner.search.engine import exhaustive_search
from planner.search.objective import Evaluator
from planner.search.records import seconds_per_token
from planner.search.sizing import size
from planner.search.space import SearchSpace, build_problem, enumerate_candidates, load_space, make_target

CM = RooflineCostModel()
CAT = load_catalogue()
SPACE = SearchSpace("t", tp=(1, 2, 4), pp=(1, 2), cp=(1,), vpp=(1,), mbs=(1, 2), recompute=("selective", "full"),
                    zero=(1,))
BATCH = BatchRange(1e6, 4e6)


def _best_days(model, hw, nodes, tokens, failures=None, space=SPACE):
    p = build_problem(model, [make_target(hw, nodes * hw.gpus_per_node)], space, tokens=tokens,
                      tokens_per_batch=BATCH, failures=failures)
    res = exhaustive_search(p, cost_model=CM, detail=1)
    return min((r.time_to_train_s for r in res.records), default=None)


@pytest.mark.parametrize("deadline_d", [4.0, 12.0, 30.0])
def test_smallest_allocation_matches_a_brute_force_scan(deadline_d):
    """Every node count from 1 to 48 searched exhaustively: `size` returns the smallest that meets the deadline,
    and one node fewer misses it with every plan of the space."""
    model, hw, tokens = resolve_model("llama-7b"), CAT.resolve("a100-80gb"), 2e11
    fm = FailureModel()
    scan = {n: _best_days(model, hw, n, tokens, fm) for n in range(1, 49)}
    want = min(n for n, t in scan.items() if t is not None and t <= deadline_d * 86400)
    res = size(model, tokens, deadline_d * 86400, [hw], SPACE, max_gpus=48 * 8, cost_model=CM,
               tokens_per_batch=BATCH, failures=fm)
    t = res.types[0]
    assert res.smallest.record.nodes == want
    assert res.smallest.record.time_to_train_s == pytest.approx(scan[want])  # the best plan there (exhaustive)
    if want > 1:
        assert t.below.nodes == want - 1 and t.below.exhaustive and not t.below.meets(deadline_d * 86400)
    assert res.searched > 4 and t.frontier[-1].nodes == 48  # costed up to the largest allocation allowed


def test_min_gpus_is_the_lower_limit():
    model, hw = resolve_model("llama-7b"), CAT.resolve("a100-80gb")
    res = size(model, 2e11, 30 * 86400, [hw], SPACE, min_gpus=64, max_gpus=384, cost_model=CM, tokens_per_batch=BATCH)
    assert res.smallest.record.gpus == 64 and res.types[0].below is None
    assert any("lower limit (--min-gpus 64)" in n for n in res.notes)


def test_more_recomputation_or_sharding_never_trains_faster():
    """best_plan_search skips plans with more recomputation or a higher ZeRO stage than a fitting plan of the same
    layout: valid because the cost model never predicts them faster."""
    from costmodel.estimate import default_cost_model

    cm = default_cost_model()
    cases = [("llama3-70b", "h100-sxm", 512, cm), ("llama-13b", "a100-80gb", 64, CM), ("llama3-8b", "gh200", 256, CM),
             ("mixtral-8x7b", "h100-sxm", 64, CM)]
    for name, gpu, gpus, cm in cases:
        p = build_problem(resolve_model(name), [make_target(CAT.resolve(gpu), gpus)], load_space("default"),
                          tokens=1e12)
        ev = Evaluator(p, cm, light=True)
        groups: dict = {}
        for c in enumerate_candidates(p):
            rec = ev.evaluate(c).record
            if rec is not None:
                groups.setdefault(c._replace(recompute="", zero=-1), []).append((c, rec.iteration_time_s))
        pairs = 0
        for plans in groups.values():
            for a, ta in plans:
                for b, tb in plans:
                    if a != b and _slower_or_equal(a, b):
                        pairs += 1
                        assert ta >= tb * (1 - 1e-12), (name, a, ta, b, tb)
        assert pairs > 100
        best = best_plan_search(Evaluator(p, cm, light=True))[0]
        full = exhaustive_search(p, cost_model=cm, detail=1).best
        assert seconds_per_token(best) == pytest.approx(seconds_per_token(full))


def test_goodput_makes_time_to_train_an_expected_value():
    model, hw = resolve_model("llama-7b"), CAT.resolve("a100-80gb")
    perfect = size(model, 2e11, 12 * 86400, [hw], SPACE, max_gpus=384, cost_model=CM, tokens_per_batch=BATCH)
    real = size(model, 2e11, 12 * 86400, [hw], SPACE, max_gpus=384, cost_model=CM, tokens_per_batch=BATCH,
                failures=FailureModel())
    r = real.smallest.record
    assert perfect.smallest.record.goodput is None and 0.9 < r.goodput < 1.0
    assert real.smallest.record.gpus >= perfect.smallest.record.gpus
    assert r.checkpoint_interval_s > 0 and r.checkpoint_interval_iters >= 1 and r.interruptions > 0
    assert r.lost_gpu_hours == pytest.approx(r.time_to_train_s * (1 - r.goodput) * r.gpus / 3600, rel=1e-6)


def test_a_missed_deadline_names_the_batch_that_would_scale():
    """The batch, not the GPU count, limits: a 1M-token batch caps DP; the error says which batch would meet it."""
    model, hw = resolve_model("llama-7b"), CAT.resolve("a100-80gb")
    with pytest.raises(PlannerError) as exc:
        size(model, 1e12, 3 * 86400, [hw], SPACE, max_gpus=128 * 8, cost_model=CM,
             tokens_per_batch=BatchRange(1e6, 1e6))  # 3.5 d at 1,024 GPUs with TP4 DP256; 2M tokens: 2.6 d
    msg = str(exc.value)
    assert "the batch limits scaling" in msg and "--tokens-per-batch" in msg and "Raise the batch" in msg


def test_every_gpu_type_left_out_says_why():
    model = resolve_model("llama-7b")
    hws = [CAT.resolve("a100-80gb"), CAT.resolve("b200")]
    res = size(model, 2e11, 12 * 86400, hws, SPACE, max_gpus=384, cost_model=CM, tokens_per_batch=BATCH)
    assert not res.left_out  # b200 has no price but an answer
    assert any(n.startswith("b200: no price in the catalogue") and "--price b200=" in n for n in res.notes)
    res = size(model, 2e11, 12 * 86400, hws, SPACE, max_gpus=384, cost_model=CM, tokens_per_batch=BATCH,
               budget_usd=1e9)
    assert dict(res.left_out)["b200"].startswith("no price: pass --price b200=")
    with pytest.raises(PlannerError, match="over budget"):
        size(model, 2e11, 12 * 86400, hws[:1], SPACE, max_gpus=384, cost_model=CM, tokens_per_batch=BATCH,
             budget_usd=1.0)


def test_prices_from_different_sources_are_flagged():
    model = resolve_model("llama-7b")
    res = size(model, 2e11, 12 * 86400, [CAT.resolve("a100-80gb"), CAT.resolve("h200")], SPACE, max_gpus=384,
               cost_model=CM, tokens_per_batch=BATCH)
    warn = [n for n in res.notes if n.startswith("warning: the prices come from different sources")]
    assert warn and "dstack_pr_4110" in warn[0] and "skypilot_lambda_catalog" in warn[0]
    same = size(model, 2e11, 12 * 86400, [CAT.resolve("a100-80gb")], SPACE, max_gpus=384, cost_model=CM,
                tokens_per_batch=BATCH, prices={"a100-80gb": 2.0})
    assert any("a100-80gb 2.00 (--price)" in n for n in same.notes)


def test_ctrl_c_returns_the_best_found_so_far():
    model, hw = resolve_model("llama-7b"), CAT.resolve("a100-80gb")
    calls = []

    def progress(done, total, predictions, best):
        calls.append(best)
        if best and len(calls) > 1 and calls[-2]:
            os.kill(os.getpid(), signal.SIGINT)  # the user presses Ctrl-C once an answer is known

    res = size(model, 2e11, 12 * 86400, [hw], SPACE, max_gpus=384, cost_model=CM, tokens_per_batch=BATCH,
               progress=progress)
    assert res.interrupted and res.smallest is not None
    assert any("not proved minimal" in n for n in res.notes)


def test_cli_size_reports_batch_goodput_interval_and_frontier():
    r = CliRunner().invoke(app, ["size", "--model", "llama-7b", "--tokens", "2e11", "--deadline", "12d", "--gpu",
                                 "a100-80gb", "--max-gpus", "256", "--space", "fsdp", "--tokens-per-batch", "1M:4M",
                                 "--format", "json"])
    assert r.exit_code == 0, r.output
    d = json.loads(r.output)
    plan = d["smallest"]["plan"]
    assert 1e6 <= plan["gbs"] * plan["seq_len"] <= 4e6
    assert plan["goodput"] > 0.9 and plan["checkpoint_interval_iters"] >= 1 and plan["interruptions"] > 0
    assert d["batch"]["max_tokens"] == 4e6 and d["failure_model"]["failure_rate"] == pytest.approx(1.97e-5)
    t = d["types"][0]
    assert t["one_node_fewer"]["nodes"] == d["smallest"]["nodes"] - 1 and len(t["frontier"]) > 2
    assert d["allocations_searched"] > 4
    r = CliRunner().invoke(app, ["size", "--model", "llama-7b", "--tokens", "2e11", "--deadline", "12d", "--gpu",
                                 "a100-80gb", "--max-gpus", "256", "--space", "fsdp", "--no-goodput"])
    assert r.exit_code == 0 and "a perfect run" in r.output and "Frontier" in r.output
    r = CliRunner().invoke(app, ["size", "--model", "llama-7b", "--tokens", "2e11", "--deadline", "12d",
                                 "--min-gpus", "64", "--max-gpus", "32"])
    assert r.exit_code == 2 and "--min-gpus <= --max-gpus" in r.output
    r = CliRunner().invoke(app, ["size", "--model", "llama-7b", "--tokens", "2e11", "--deadline", "12d",
                                 "--ckpt-mode", "lazy"])
    assert r.exit_code == 2 and "--ckpt-mode" in r.output


def test_export_sets_the_save_interval():
    """`planner export` writes Daly's interval for the plan: Megatron --save-interval, torchtitan
    [checkpoint] interval, NeMo trainer.val_check_interval (the launcher saves at each validation)."""
    import tomllib

    import yaml

    from costmodel.schedule.goodput import goodput
    from planner.checkpointing import save_interval
    from planner.export import export_plan
    from planner.prediction import predict
    from planner.requests import PlanRequest

    req = PlanRequest(model="llama3-70b", gpu="h100-sxm", gpus=512, tp=4, pp=2).resolve()
    pred = predict(req.model, req.plan, req.hardware)
    steps, why = save_interval(req.model, req.plan, pred)
    g = goodput(req.model.total_params(), 512)
    assert steps == round(g.interval_s / pred.iteration_time_s) and "Daly" in why
    meg = export_plan(req.model, req.plan, req.hardware, pred, "megatron")
    assert f"--save-interval {steps}\n" in meg
    titan = export_plan(req.model, req.plan, req.hardware, pred, "torchtitan")
    assert tomllib.loads(titan)["checkpoint"] == {"enable": True, "interval": steps}
    nemo = yaml.safe_load(export_plan(req.model, req.plan, req.hardware, pred, "nemo"))
    assert nemo["trainer"]["val_check_interval"] == steps
    assert save_interval(req.model, req.plan, None) is None  # no prediction: nothing written


def test_every_catalogue_gpu_has_a_price_or_says_it_has_none(tmp_path):
    for g in CAT.gpus.values():
        if g.price_usd_per_gpu_hour is None:
            assert g.price_basis.startswith("none:") and "--price" in g.price_basis, g.name
        else:
            assert g.price_date and g.price_source and g.price_basis and not g.price_basis.startswith("none"), g.name
    f = tmp_path / "hw.toml"
    f.write_text("[gpus.b200]\nprice_usd_per_gpu_hour = 5.0\n")
    assert load_catalogue([f]).gpu("b200").price_basis == f"given in {f}"


def test_compare_and_search_show_goodput_and_price_sources():
    r = CliRunner().invoke(app, ["compare", "--model", "llama-7b", "--gpu", "a100-80gb", "--gpu", "h200", "--gpus",
                                 "16", "--space", "megatron", "--tokens", "1e11", "--wide"])
    assert r.exit_code == 0, r.output
    assert "goodput" in r.output and "ckpt every" in r.output and "not modelled:" in r.output
    assert "warning: the prices come from different sources" in r.output
    r = CliRunner().invoke(app, ["compare", "--model", "llama-7b", "--gpu", "a100-80gb", "--gpus", "16", "--space",
                                 "megatron", "--tokens", "1e11", "--format", "json", "--no-goodput"])
    assert json.loads(r.output)["rows"][0]["best"]["goodput"] is None
    r = CliRunner().invoke(app, ["search", "--model", "llama-7b", "--gpus", "16", "--tp", "1,2", "--pp", "1", "--mbs",
                                 "1", "--zero", "1", "--objective", "cost", "--no-progress", "--format", "json"])
    assert r.exit_code == 0, r.output
    plans = json.loads(r.output)["plans"]
    assert all(0.9 < p["goodput"] < 1 and p["checkpoint_interval_iters"] >= 1 for p in plans)


def test_llama3_405b_at_its_own_layout_days_follow_from_tflops_and_goodput():
    """Llama 3 405B's layout (Dubey et al. 2024, Table 4: 16,384 H100, TP8 PP16, 16M-token batch = 2,048 sequences
    of 8,192): goodput above 0.85, and the expected days are the model FLOPs over the predicted TFLOP/s of the
    allocation, divided by the goodput."""
    from costmodel.schedule.flops import model_flops_per_iteration
    from planner.prediction import predict
    from planner.requests import PlanRequest
    from planner.search.records import make_record

    req = PlanRequest(model="llama3-405b", gpu="h100-sxm", gpus=16384, tp=8, pp=16, vpp=2, gbs=2048).resolve()
    pred = predict(req.model, req.plan, req.hardware)
    tokens = 15.6e12
    problem = build_problem(req.model, [make_target(req.hardware, 16384)], SPACE, gbs=2048, tokens=tokens,
                            failures=FailureModel())
    rec = make_record(problem, problem.targets[0], req.plan, pred, None)
    assert rec.goodput > 0.85
    flops = model_flops_per_iteration(req.model, 1, 8192) / 8192 * tokens
    assert flops == pytest.approx(3.8e25, rel=0.05)  # the paper's 3.8e25 FLOPs
    ideal = flops / (16384 * pred.model_tflops_per_gpu * 1e12)
    assert rec.time_to_train_s == pytest.approx(ideal / rec.goodput, rel=1e-6)


def test_gh200_allocation_within_1_5x_h100_for_llama3_8b():
    """Issue 25: llama3-8b, 15T tokens in 30 days gave 8,192 GH200 against 768 H100 (a 512-sequence batch forced
    PP16 on one-GPU nodes); with the batch a decision GH200 needs at most 1.5x H100's GPUs."""
    r = CliRunner().invoke(app, ["size", "--model", "llama3-8b", "--tokens", "15e12", "--deadline", "30d", "--gpu",
                                 "gh200", "--gpu", "h100-sxm", "--format", "json"])
    assert r.exit_code == 0, r.output
    out = json.loads(r.output)
    gpus = {a["gpu"]: a["gpus"] for a in out["per_gpu"]}
    assert gpus["gh200"] <= 1.5 * gpus["h100-sxm"], gpus
    # the shipped calibration's GH200 factor (measured GH200 systems) is named, for GH200 only
    scoped = [n for n in out["notes"] if "compute_scale_gh200" in n]
    assert len(scoped) == 1 and scoped[0].startswith("gh200: calibration 'default'"), out["notes"]


def test_frontier_tries_every_micro_batch_size_of_a_shape():
    """On a larger allocation the shape fastest at the answer may have no global batch in the range at its own MBS
    (GBS is a multiple of MBS x DP): the frontier costs the shape at every MBS of the space. Llama-13B on A100 with
    the default space: at 243 nodes (DP 486 at PP 2 and CP 2) only MBS 1 has a batch in 4.2M-6.2M tokens; costed
    with the answer's MBS alone, the frontier fell back to a PP 8 plan there, slower than at 162 nodes."""
    from planner.search.allocation import mbs_variants
    from planner.search.space import Candidate

    shape = Candidate(0, 2, 1, 2, 1, 4, "none", True, 1, "bf16")
    assert mbs_variants([shape], (4, 1, 2)) == [shape, shape._replace(mbs=1), shape._replace(mbs=2)]
    res = size(resolve_model("llama-13b"), 3e11, 21 * 86400, [CAT.resolve("a100-80gb")], load_space("default"),
               max_gpus=2912)
    days = {p.nodes: p.days for p in res.types[0].frontier}
    assert days[243] < days[162] and days[364] < days[243]


def test_frontier_marks_allocations_a_smaller_one_beats():
    """An allocation that a smaller one of the same GPU type beats on days and USD (the batch caps DP) is marked
    dominated in the table's legend, the Markdown report and the JSON; the others are not."""
    from planner.search.allocation import Point, dominated
    from planner.search.records import PlanRecord

    def point(nodes, days, usd):
        rec = PlanRecord.__new__(PlanRecord)
        object.__setattr__(rec, "time_to_train_s", days * 86400.0)
        object.__setattr__(rec, "cost_to_train_usd", usd)
        return Point(nodes, 8 * nodes, rec, False)

    pts = [point(8, 10.0, 100.0), point(12, 7.0, 105.0), point(18, 7.5, 160.0), point(27, 7.0, None)]
    assert dominated(pts) == {18, 27}
    # a 2M-token batch (GBS 512 at 4,096 tokens) caps DP at 512: the largest allocations cannot use their GPUs
    out = CliRunner().invoke(app, ["size", "--model", "llama-13b", "--tokens", "300B", "--deadline", "3w",
                                   "--gpu", "a100-80gb", "--max-gpus", "9824", "--tokens-per-batch", "2M",
                                   "--format", "json"])
    assert out.exit_code == 0, out.output
    front = json.loads(out.output)["types"][0]["frontier"]
    flags = {p["nodes"]: p["dominated"] for p in front}
    assert any(flags.values()) and not flags[min(flags)]
    # flagged exactly where a smaller allocation is at least as fast and at least as cheap
    beaten = {p["nodes"] for p in front if any(q["nodes"] < p["nodes"] and q["days"] <= p["days"]
                                               and q["cost_usd"] <= p["cost_usd"] for q in front)}
    assert {n for n, f in flags.items() if f} == beaten
