"""Scale-up (NVLink) domains apart from the allocation unit, and the hardware checks (issue 14 items 2-3).

GB200/GB300 NVL72: nodes are 4-GPU trays (any multiple of 4 GPUs is a job), the NVLink domain is the 72-GPU
rack; collectives inside a domain are costed with the cluster's NVLink figures, across domains with its
scale-out network. fp8 is refused on GPUs without fp8 tensor cores, a --cluster must carry the --gpu, and TP/CP
groups that leave the NVLink domain are warned about.
"""

from __future__ import annotations

import dataclasses
import json

import pytest
from typer.testing import CliRunner

from costmodel.core.errors import PlannerError
from costmodel.core.specs.catalogue import load_catalogue
from costmodel.cost.roofline import RooflineCostModel
from costmodel.graph.build import build_graph, domain_warnings, group_topology
from planner.cli import app
from planner.prediction import predict
from planner.requests import PlanRequest
from planner.search.space import SearchSpace, build_problem, factorizations, make_target

runner = CliRunner()


def _resolve(**kw):
    return PlanRequest.from_dict({"model": "llama3-70b", **kw}).resolve()


def _tp_ops(graph):
    return [o for o in graph.stages[0].layer_ops if o.name.startswith("tp.") and o.kind == "all_gather"]


# ------------------------------------------------------------------------------------- allocation unit
@pytest.mark.parametrize("gpus", [128, 256, 512])
def test_gb200_counts_of_whole_trays_are_accepted(gpus):
    # NVIDIA's published GB200 runs use 128-512 GPUs with TP4 PP8 CP2 VPP8 (issue 14); 72 does not divide them
    r = _resolve(gpu="gb200", gpus=gpus, tp=4, pp=8, cp=2, vpp=5, seq_len=8192)
    assert (r.plan.gpus_per_node, r.plan.nvlink_domain) == (4, 64)
    pred = predict(r.model, r.plan, r.hardware)
    assert pred.iteration_time_s > 0
    make_target(r.hardware, gpus)   # the search accepts the count too


def test_gpu_count_must_fill_whole_trays():
    with pytest.raises(PlannerError, match="multiple of gpus_per_node=4"):
        _resolve(gpu="gb200", gpus=130, tp=2)


def test_partly_filled_last_domain_is_spread_evenly():
    hw = load_catalogue().resolve("gb200")
    # 128 = 2 racks x 64, 200 = 68 + 68 + 64 taken as 3 x 64, a job within one rack has a domain of its size
    assert [hw.domain_for(n) for n in (4, 64, 72, 128, 144, 200, 256, 512)] == [4, 64, 72, 64, 72, 64, 64, 64]
    # the DP x CP group of TP4 CP2 on 256 GPUs (size 16, stride 4) spans 2 domains of 64, 8 ranks on each
    assert group_topology(16, 4, hw.domain_for(256)) == (1, 16)
    assert group_topology(32, 4, hw.domain_for(512)) == (2, 16)


def test_domain_equals_node_where_the_node_is_the_domain():
    cat = load_catalogue()
    for name in ("dgx-h100", "dgx-a100", "perlmutter", "vista", "dgx-b200", "mi300x-8gpu"):
        hw = cat.resolve(None, name)
        assert all(hw.domain_for(n) == min(hw.gpus_per_node, n) for n in (1, 2, 4, 8, 16, 64, 1024)), name
    # a plan without an explicit domain (0) predicts exactly as one with the node as its domain
    r = _resolve(gpu="h100-sxm", gpus=64, tp=8, pp=2)
    assert r.plan.nvlink_domain == 8
    a = predict(r.model, r.plan, r.hardware).iteration_time_s
    b = predict(r.model, dataclasses.replace(r.plan, nvlink_domain=0), r.hardware).iteration_time_s
    assert a == b


# ------------------------------------------------------------------------------------- intra vs inter
def test_tp_group_inside_nvl72_uses_nvlink_and_one_spanning_racks_the_network(tmp_path):
    r = _resolve(gpu="gb200", gpus=128, tp=8, pp=2)
    ops = _tp_ops(build_graph(r.model, r.plan))
    assert ops and all(o.features[1:] == (8, 1, 8) for o in ops)   # 8 ranks, 1 domain, 8 per domain
    # the same TP8 on a GB200 system whose NVLink domain is a 4-GPU tray: 2 domains of 4
    f = tmp_path / "nvl4.toml"
    f.write_text('[clusters.gb200-nvl4]\ngpu = "gb200"\ngpus_per_node = 4\nnvlink_domain = 4\n'
                 "intra_node_bw_gbs = 900.0\nintra_node_latency_us = 15.63\ninter_node_bw_gbs = 50.0\n"
                 "inter_node_latency_us = 19.9\n")
    r4 = PlanRequest.from_dict({"model": "llama3-70b", "gpu": "gb200", "cluster": "gb200-nvl4", "gpus": 128,
                                "tp": 8, "pp": 2}).resolve((str(f),))
    ops4 = _tp_ops(build_graph(r4.model, r4.plan))
    assert ops4 and all(o.features[1:] == (8, 2, 4) for o in ops4)

    def cost(ops, hw, **fig):
        hw = dataclasses.replace(hw, cluster=dataclasses.replace(hw.cluster, **fig))
        return RooflineCostModel().predict(ops, hw).time_s.sum()

    hw = r.hardware
    base, base4 = cost(ops, hw), cost(ops4, r4.hardware)
    # inside the rack: only the NVLink figure matters
    assert cost(ops, hw, inter_node_bw_gbs=5.0) == base
    assert cost(ops, hw, intra_node_bw_gbs=90.0) > base
    # across trays-as-domains: the scale-out network carries part of it, and it costs more than NVLink
    assert cost(ops4, r4.hardware, inter_node_bw_gbs=5.0) > base4 > base


# ------------------------------------------------------------------------------------------- fp8 check
def test_fp8_refused_on_a100_in_predict_and_batch():
    res = runner.invoke(app, ["predict", "--model", "llama3-8b", "--gpu", "a100-80gb", "--gpus", "8", "--dtype",
                              "fp8"])
    assert res.exit_code == 2 and "a100-80gb has no fp8 tensor cores" in res.output
    assert len(res.output.strip().splitlines()) == 1
    line = json.dumps({"id": 1, "model": "llama3-8b", "gpu": "a100-40gb", "gpus": 8, "dtype": "fp8"})
    res = runner.invoke(app, ["predict", "--batch", "-", "--format", "jsonl"], input=line + "\n")
    assert "no fp8 tensor cores" in json.loads(res.stdout.strip().splitlines()[-1])["error"]
    # H100 has fp8: accepted
    assert _resolve(gpu="h100-sxm", gpus=8, dtype="fp8").plan.dtype == "fp8"


def test_fp8_refused_on_a100_in_export():
    res = runner.invoke(app, ["export", "--model", "llama3-8b", "--gpu", "a100-80gb", "--gpus", "8", "--dtype",
                              "fp8", "--to", "megatron"])
    assert res.exit_code == 2 and "no fp8 tensor cores" in res.output and "--fp8-format" not in res.output


def test_search_drops_fp8_on_a100_and_refuses_fp8_only():
    base = ["search", "--model", "llama3-8b", "--gpu", "a100-80gb", "--gpus", "8", "--tp", "1,2", "--pp", "1",
            "--exhaustive"]
    res = runner.invoke(app, [*base, "--dtype", "fp8"])
    assert res.exit_code == 2 and "no fp8 tensor cores" in res.output
    res = runner.invoke(app, [*base, "--dtype", "bf16,fp8", "--format", "json"])
    assert res.exit_code == 0, res.output
    plans = json.loads(res.stdout[res.stdout.index("{"):])["plans"]
    assert plans and {p["dtype"] for p in plans} == {"bf16"}
    res = runner.invoke(app, [*base, "--dtype", "bf16,fp8"])
    assert "note: fp8 dropped from --dtype: a100-80gb has no fp8 tensor cores" in res.output


def test_search_over_gpus_with_and_without_fp8_skips_fp8_only_where_missing():
    cat = load_catalogue()
    model = PlanRequest.from_dict({"model": "llama3-8b", "gpu": "h100-sxm", "gpus": 8}).resolve().model
    space = dataclasses.replace(SearchSpace(name="t"), tp=(1, 2), pp=(1,), cp=(1,), vpp=(1,), mbs=(1,),
                                dtype=("bf16", "fp8"))
    targets = [make_target(cat.resolve("a100-80gb"), 8), make_target(cat.resolve("h100-sxm"), 8)]
    problem = build_problem(model, targets, space)
    assert problem.space.dtype == ("bf16", "fp8") and "skipped on a100-80gb" in problem.notes[0]
    from planner.search.objective import Evaluator
    from planner.search.space import enumerate_candidates

    ev = Evaluator(problem)
    bad = [c for c in enumerate_candidates(problem) if c.dtype == "fp8" and c.target == 0]
    good = [c for c in enumerate_candidates(problem) if c.dtype == "fp8" and c.target == 1]
    assert bad and all("fp8 on a100-80gb" in ev._reject(c)[0].reason for c in bad)
    assert any(ev.feasible(c) for c in good)


# --------------------------------------------------------------------------------- cluster/GPU mismatch
def test_cluster_whose_gpu_differs_is_refused():
    res = runner.invoke(app, ["predict", "--model", "llama3-8b", "--gpu", "h100-sxm", "--cluster", "perlmutter",
                              "--gpus", "8"])
    assert res.exit_code == 2 and "--gpu h100-sxm does not match --cluster perlmutter" in res.output
    assert len(res.output.strip().splitlines()) == 1


# --------------------------------------------------------------------------------------- span warnings
def test_tp_across_perlmutter_nodes_is_warned():
    r = _resolve(gpu="a100-80gb", cluster="perlmutter", gpus=8, tp=8)
    warns = predict(r.model, r.plan, r.hardware).warnings
    assert any(w.startswith("TP=8 groups span 2 NVLink domains of 4 GPUs") for w in warns)
    ok = _resolve(gpu="a100-80gb", cluster="perlmutter", gpus=8, tp=4)
    assert domain_warnings(ok.plan) == []
    # TP8 inside an NVL72 rack of 4-GPU trays is no span
    assert domain_warnings(_resolve(gpu="gb200", gpus=128, tp=8).plan) == []


def test_cp_across_domains_is_warned():
    r = _resolve(gpu="h100-sxm", gpus=16, tp=8, cp=2, seq_len=8192)
    assert any(w.startswith("CP=2 groups span 2 NVLink domains of 8 GPUs") for w in domain_warnings(r.plan))


def test_search_keeps_tp_within_the_nvlink_domain_not_the_tray():
    cat = load_catalogue()
    model = _resolve(gpu="gb200", gpus=128).model
    space = dataclasses.replace(SearchSpace(name="t"), tp=(4, 8, 16), pp=(1,), cp=(1,))

    def tps(gpu, cluster=None):
        return {tp for tp, _, _ in factorizations(model, make_target(cat.resolve(gpu, cluster), 128), space)}

    assert tps("gb200") == {4, 8, 16}                  # inside the 64-GPU share of a rack, not the 4-GPU tray
    assert tps("a100-80gb", "perlmutter") == {4}       # 4-GPU NVLink nodes
