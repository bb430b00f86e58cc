"""Hardware files: the worked examples of examples/hardware load and predict as the README says, a declared sibling
lends its measured models with the roofline-ratio scaling, the network fields (rails, oversubscription, leaf_nodes)
act on the collectives across nodes only, bad values are one-line errors, and the README's commands run."""

from __future__ import annotations

import dataclasses
import re
import shlex
from pathlib import Path

import pytest
from typer.testing import CliRunner

from costmodel.core.errors import PlannerError
from costmodel.core.kinds import Phase
from costmodel.core.specs.catalogue import load_catalogue
from costmodel.core.specs.plan import ParallelPlan
from costmodel.core.specs.presets import resolve_model
from costmodel.cost.roofline import RooflineCostModel
from costmodel.graph.ops import Op
from planner.calibrate import calibration_option
from planner.cli import app
from planner.prediction import predict

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "examples" / "hardware"
QUAD, TAPER, SIBLING = (str(EXAMPLES / f)
                        for f in ("quad_gh200.toml", "tapered_fabric.toml", "custom_gpu_sibling.toml"))


def _predict(model: str, hw, **plan):
    m = resolve_model(model)
    p = ParallelPlan(gpus=plan.pop("gpus"), gpus_per_node=hw.gpus_per_node, nvlink_domain=hw.nvlink_domain,
                     **plan)
    return predict(m, p, hw, calibration=calibration_option(None))


# ---------------------------------------------------------------------------------------------- examples
def test_the_examples_load_with_their_cited_figures():
    cat = load_catalogue([QUAD, SIBLING])
    quad = cat.cluster("example-quad-gh200")
    assert (quad.gpu, quad.gpus_per_node, quad.nvlink_domain, quad.rails, quad.leaf_nodes) == ("gh200", 4, 4, 4, 240)
    assert quad.intra_node_bw_gbs == 3 * 150.0 and quad.inter_node_bw_gbs == 200 / 8 and quad.oversubscription == 1.0
    assert set(quad.sources) >= {"rails", "leaf_nodes", "inter_node_bw_gbs"}
    assert "cscs_alps_hardware" in cat.sources
    gpu = cat.gpu("example-h100-sxm-600w")
    assert gpu.sibling == "h100-sxm" and gpu.measured_as == "h100-sxm" and not gpu.measured_data
    h100 = cat.gpu("h100-sxm")
    for dtype, peak in gpu.peak_tflops.items():  # the 700 W peaks x (600/700)^(1/3), rounded to 0.1
        assert peak == pytest.approx(h100.peak_tflops[dtype] * (600 / 700) ** (1 / 3), abs=0.051)
    assert load_catalogue([QUAD, TAPER]).cluster("example-quad-gh200").oversubscription == 2.0


def _twin_file(tmp_path: Path, sibling: bool) -> str:
    """A GPU with h100-sxm's own figures, with or without ``sibling = "h100-sxm"``."""
    h = load_catalogue().gpu("h100-sxm")
    peaks = "\n".join(f"{k} = {v!r}" for k, v in h.peak_tflops.items())
    path = tmp_path / f"twin_{sibling}.toml"
    path.write_text(f'[gpus.twin]\n{"sibling = " + chr(34) + "h100-sxm" + chr(34) if sibling else ""}\n'
                    f'default_cluster = "dgx-h100"\nhbm_gb = {h.hbm_gb!r}\nhbm_mib = {h.hbm_mib!r}\n'
                    f"hbm_bw_gbs = {h.hbm_bw_gbs!r}\nnvlink_bw_gbs = {h.nvlink_bw_gbs!r}\n"
                    f"[gpus.twin.peak_tflops]\n{peaks}\n", encoding="utf-8")
    return str(path)


def test_a_sibling_backed_gpu_with_the_siblings_figures_predicts_the_siblings_time(tmp_path):
    plan = dict(gpus=64, tp=8, pp=2, gbs=256, seq_len=4096)
    ref = _predict("llama-13b", load_catalogue().resolve("h100-sxm"), **plan)
    twin = _predict("llama-13b", load_catalogue([_twin_file(tmp_path, True)]).resolve("twin"), **plan)
    assert twin.iteration_time_s == ref.iteration_time_s
    assert (twin.iteration_time_low_s, twin.iteration_time_high_s) == (ref.iteration_time_low_s,
                                                                        ref.iteration_time_high_s)
    assert any("derived from h100-sxm measurements" in w for w in twin.warnings)
    # without the sibling the same figures get the analytical roofline: another time
    alone = _predict("llama-13b", load_catalogue([_twin_file(tmp_path, False)]).resolve("twin"), **plan)
    assert alone.iteration_time_s != ref.iteration_time_s and "measured" not in alone.cost_sources


def test_the_600w_example_is_h100_scaled_by_the_roofline_ratio():
    plan = dict(gpus=64, tp=8, gbs=256, seq_len=4096)
    ref = _predict("llama-13b", load_catalogue().resolve("h100-sxm"), **plan)
    capped = _predict("llama-13b", load_catalogue([SIBLING]).resolve("example-h100-sxm-600w"), **plan)
    ratio = capped.iteration_time_s / ref.iteration_time_s
    assert 1.0 < ratio <= 1 / (600 / 700) ** (1 / 3) + 1e-9
    assert capped.cost_sources.get("roofline") == ref.cost_sources.get("roofline")
    assert capped.cost_sources["derived"] == ref.cost_sources["measured"] + ref.cost_sources["derived"]


# ------------------------------------------------------------------------------------------------ network
def test_oversubscription_slows_an_inter_node_dp_reduction_only_beyond_the_leaf():
    """llama3-8b with TP 4 inside the node: the DP gradient reduction crosses nodes. On 1,024 GPUs (256 nodes >
    240 per group) the 2:1 taper lengthens it and the iteration; on 64 GPUs (16 nodes) nothing changes."""
    flat = load_catalogue([QUAD]).resolve("gh200", "example-quad-gh200")
    tapered = load_catalogue([QUAD, TAPER]).resolve("gh200", "example-quad-gh200")
    big = dict(gpus=1024, tp=4, gbs=512, seq_len=8192)
    a, b = _predict("llama3-8b", flat, **big), _predict("llama3-8b", tapered, **big)
    assert b.exposed_comm_s["dp"] > 1.5 * a.exposed_comm_s["dp"] and b.iteration_time_s > a.iteration_time_s
    assert b.exposed_comm_s["tp"] == a.exposed_comm_s["tp"]  # NVLink traffic untouched
    small = dict(gpus=64, tp=4, gbs=512, seq_len=8192)
    assert _predict("llama3-8b", tapered, **small).iteration_time_s == \
        _predict("llama3-8b", flat, **small).iteration_time_s


def _all_reduce(hw, nodes: int, rpn: int, nbytes: float = 2e9) -> float:
    op = Op("all_reduce", "dp.grad_all_reduce", Phase.BWD, (nbytes, nodes * rpn, nodes, rpn))
    return float(RooflineCostModel().predict([op], hw).time_s[0])


def test_scale_out_bandwidth_formula():
    c = load_catalogue([QUAD]).cluster("example-quad-gh200")
    assert c.scale_out_bw_gbs(300) == 25.0  # 4 rails for 4 GPUs, non-blocking
    assert dataclasses.replace(c, rails=2).scale_out_bw_gbs(2) == 12.5  # 2 NICs shared by 4 GPUs
    assert dataclasses.replace(c, rails=8).scale_out_bw_gbs(2) == 25.0  # more NICs than GPUs add nothing
    t = dataclasses.replace(c, oversubscription=2.0)
    assert t.scale_out_bw_gbs(240) == 25.0 and t.scale_out_bw_gbs(241) == 12.5
    assert dataclasses.replace(t, leaf_nodes=0).scale_out_bw_gbs(2) == 12.5  # unknown leaf: every crossing
    # an NVL72 rack of 4-GPU trays: 2 domains = 36 nodes, more than a 32-node leaf
    rack = dataclasses.replace(t, nvlink_domain=72, leaf_nodes=32)
    assert rack.scale_out_bw_gbs(1) == 25.0 and rack.scale_out_bw_gbs(2) == 12.5
    # the catalogue's clusters (no network fields): exactly their NIC figure
    for cl in load_catalogue().clusters.values():
        assert cl.scale_out_bw_gbs(64) is cl.inter_node_bw_gbs or cl.scale_out_bw_gbs(64) == cl.inter_node_bw_gbs


def test_the_alpha_beta_collective_uses_the_shared_and_tapered_bandwidth():
    flat = load_catalogue([QUAD]).resolve("gh200", "example-quad-gh200")
    tapered = dataclasses.replace(flat, cluster=dataclasses.replace(flat.cluster, oversubscription=2.0))
    shared = dataclasses.replace(flat, cluster=dataclasses.replace(flat.cluster, rails=1))
    base, big = _all_reduce(flat, 256, 1), _all_reduce(flat, 256, 1, 4e9)
    beta = big - base  # the bandwidth term of 2 GB more
    assert _all_reduce(tapered, 256, 1, 4e9) - _all_reduce(tapered, 256, 1) == pytest.approx(2 * beta, rel=1e-9)
    assert _all_reduce(shared, 256, 1, 4e9) - _all_reduce(shared, 256, 1) == pytest.approx(4 * beta, rel=1e-9)
    assert _all_reduce(tapered, 2, 4) == _all_reduce(flat, 2, 4)  # 2 nodes: below the leaf


# ------------------------------------------------------------------------------------------------ errors
@pytest.mark.parametrize("body, message", [
    ('[gpus.x]\nsibling = "nope"\n', "sibling 'nope' is not a measured GPU"),
    ('[gpus.h100-sxm-500w]\nsibling = "a100-40gb"\n', "sibling 'a100-40gb' is not a measured GPU"),
    ('[gpus.h100-sxm]\nsibling = "h100-sxm"\n', "sibling 'h100-sxm' is not a measured GPU"),
    ("[clusters.dgx-h100]\noversubscription = 0.5\n", "a number >= 1"),
    ("[clusters.dgx-h100]\nrails = 0\n", "an integer > 0"),
    ("[clusters.dgx-h100]\nrails = true\n", "an integer > 0"),
    ('[clusters.dgx-h100]\nleaf_nodes = "32"\n', "an integer > 0"),
])
def test_bad_network_and_sibling_fields_are_one_line_errors(tmp_path, body, message):
    f = tmp_path / "bad.toml"
    f.write_text(body, encoding="utf-8")
    with pytest.raises(PlannerError, match=re.escape(message)):
        load_catalogue([str(f)])
    r = CliRunner().invoke(app, ["gpus", "--hardware-file", str(f)])
    assert r.exit_code == 2 and message in r.output and "Traceback" not in r.output


# ------------------------------------------------------------------------------------------------ README
def _readme_commands() -> list[list[str]]:
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    section = text[text.index("### Hardware files"):]
    section = section[:section.index("\n### ", 1)]
    blocks = re.findall(r"```bash\n(.*?)```", section, re.S)
    return [shlex.split(line)[1:] for b in blocks for line in b.splitlines() if line.startswith("planner ")]


README_COMMANDS = _readme_commands()


def test_the_readme_documents_every_hardware_field():
    from costmodel.core.specs.catalogue import CLUSTER_FIELDS, GPU_FIELDS

    text = (ROOT / "README.md").read_text(encoding="utf-8")
    section = text[text.index("### Hardware files"):text.index("### Your runs from logs")]
    for field in [*GPU_FIELDS, *CLUSTER_FIELDS]:
        assert f"`{field}`" in section, field
    assert len(README_COMMANDS) >= 4


@pytest.mark.parametrize("args", README_COMMANDS, ids=lambda a: " ".join(a[:6]))
def test_readme_hardware_commands_run(args, monkeypatch):
    monkeypatch.chdir(ROOT)  # the README's paths are relative to the repository root
    r = CliRunner().invoke(app, args)
    assert r.exit_code == 0, r.output
    # the example's GPU or node type is what ran (search tables show the node shape: 16 nodes x 4 GH200, "16x4"
    # in a terminal-width table, "16 x 4" with --wide)
    assert re.search(r"16 ?x ?4", r.output) if args[0] == "search" else "example-" in r.output
