"""Hardware catalogue: built-in TOML, user override files, resolve(), the build script and `planner gpus`."""

from __future__ import annotations

import importlib.util
import json
import math
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from costmodel.core.errors import PlannerError
from costmodel.core.specs.catalogue import ENV_VAR, catalogue_dir, load_catalogue

REPO = Path(__file__).resolve().parent.parent
GPU_KEYS = ["a100-40gb", "a100-80gb", "h100-sxm", "h100-pcie", "h200", "gh200", "gh200-144gb", "b200", "gb200",
            "mi300x", "b300", "gb300"]
CLUSTER_KEYS = ["perlmutter", "vista", "dgx-a100", "dgx-h100", "hgx-h200", "dgx-b300", "gb300-nvl72"]
GPU_FIGURES = ["hbm_gb", "hbm_bw_gbs", "nvlink_bw_gbs", "tdp_w"]
CLUSTER_FIGURES = ["gpus_per_node", "nvlink_domain", "intra_node_bw_gbs", "intra_node_latency_us", "inter_node_bw_gbs",
                   "inter_node_latency_us"]


@pytest.fixture(autouse=True)
def _no_env_files(monkeypatch):
    monkeypatch.delenv(ENV_VAR, raising=False)


@pytest.fixture
def cat():
    return load_catalogue()


def _build_module():
    spec = importlib.util.spec_from_file_location("build_catalogue", REPO / "scripts" / "build_catalogue.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


# ------------------------------------------------------------------------------------------ built-in data
def test_required_gpus_have_positive_figures_and_sources(cat):
    assert set(GPU_KEYS) <= set(cat.gpus)
    for key in GPU_KEYS:
        g = cat.gpu(key)
        assert g.peak_tflops["bf16"] > 0 and g.peak_tflops["fp16"] == g.peak_tflops["bf16"], key
        for dtype, tf in g.peak_tflops.items():
            assert tf > 0 and g.sources[f"peak_tflops.{dtype}"], (key, dtype)
        for fig in GPU_FIGURES:
            assert getattr(g, fig) > 0 and g.sources[fig], (key, fig)
        if g.price_usd_per_gpu_hour is not None:
            assert g.price_usd_per_gpu_hour > 0 and g.price_date and g.price_source in cat.sources
            assert g.sources["price_usd_per_gpu_hour"] == [g.price_source]
        assert g.default_cluster in cat.clusters, key
        for ids in g.sources.values():
            assert all(i in cat.sources for i in ids), (key, ids)


def test_required_clusters_have_positive_figures_and_sources(cat):
    assert set(CLUSTER_KEYS) <= set(cat.clusters)
    for key, c in cat.clusters.items():
        assert c.gpu in cat.gpus, key
        for fig in CLUSTER_FIGURES:
            assert getattr(c, fig) > 0 and c.sources[fig], (key, fig)
            assert all(i in cat.sources for i in c.sources[fig]), (key, fig)
        assert c.network


def test_every_source_has_a_description(cat):
    assert cat.sources and all(s.get("what") for s in cat.sources.values())


def test_spot_values_match_notes(cat):
    h100 = cat.gpu("h100-sxm")
    assert h100.peak_tflops["bf16"] == 989.4 and h100.peak_tflops["fp8"] == 1978.9
    assert (h100.hbm_gb, h100.hbm_bw_gbs, h100.nvlink_bw_gbs, h100.tdp_w) == (80, 3350, 450, 700)
    assert "fp8" not in cat.gpu("a100-80gb").peak_tflops  # no FP8 on Ampere
    assert cat.gpu("a100-40gb").hbm_bw_gbs == 1555 and cat.gpu("a100-80gb").hbm_bw_gbs == 2039
    assert cat.gpu("mi300x").peak_tflops["bf16"] == 1307.4 and cat.gpu("mi300x").nvlink_bw_gbs == 448
    assert cat.gpu("gh200").hbm_gb == 96 and cat.gpu("b200").peak_tflops["bf16"] == 2250
    assert cat.cluster("perlmutter").gpus_per_node == 4 and cat.cluster("perlmutter").inter_node_bw_gbs == 25
    assert cat.cluster("vista").gpus_per_node == 1 and cat.cluster("vista").inter_node_bw_gbs == 50
    # NVL72: the node (allocation unit) is a 4-GPU compute tray, the NVLink domain the 72-GPU rack
    assert (cat.cluster("gb200-nvl72").gpus_per_node, cat.cluster("gb200-nvl72").nvlink_domain) == (4, 72)
    assert (cat.cluster("gb300-nvl72").gpus_per_node, cat.cluster("gb300-nvl72").nvlink_domain) == (4, 72)
    domains = {k: cat.cluster(k).nvlink_domain for k in ("dgx-a100", "dgx-h100", "hgx-h200", "dgx-b200", "dgx-b300",
                                                        "perlmutter", "vista")}
    assert domains == {"dgx-a100": 8, "dgx-h100": 8, "hgx-h200": 8, "dgx-b200": 8, "dgx-b300": 8, "perlmutter": 4,
                       "vista": 1}
    assert cat.gpu("a100-40gb").measured_data is False and cat.gpu("h100-sxm").measured_data is True
    assert "UNCERTAIN" in cat.gpu("gh200-144gb").notes


def test_spot_values_equal_shared_yaml(cat, shared_data):
    gy = yaml.safe_load((shared_data / "hardware" / "gpus.yaml").read_text())["gpus"]
    cy = yaml.safe_load((shared_data / "hardware" / "clusters.yaml").read_text())["systems"]
    pairs = {"h100-sxm": "h100_sxm_80gb", "h200": "h200_sxm_141gb", "b200": "b200_sxm", "mi300x": "mi300x",
             "a100-40gb": "a100_40gb_sxm", "gb200": "gb200_nvl72_gpu"}
    for key, gid in pairs.items():
        g = cat.gpu(key)
        assert g.peak_tflops["bf16"] == gy[gid]["bf16_dense_tflops"]
        assert g.hbm_gb == gy[gid]["hbm_gb"] and g.hbm_bw_gbs == gy[gid]["hbm_bw_gbytes_s"]
        assert g.tdp_w == gy[gid]["tdp_w"]
    assert cat.cluster("dgx-h100").inter_node_bw_gbs == cy["nvidia_dgx_h100"]["inter_node"]["nic_gbytes_s_per_gpu"]
    assert (cat.cluster("perlmutter").intra_node_bw_gbs
            == cy["nersc_perlmutter_gpu"]["intra_node"]["nvlink_bw_gbytes_s_per_gpu_unidirectional"])


def test_nvl72_tray_and_domain_come_from_clusters_yaml(cat, shared_data):
    e = yaml.safe_load((shared_data / "hardware" / "clusters.yaml").read_text())["systems"]["nvidia_gb200_nvl72"]
    c = cat.cluster("gb200-nvl72")
    assert c.nvlink_domain == e["gpus_per_nvlink_domain"] and c.gpus_per_node * e["compute_trays"] == c.nvlink_domain


def test_b300_gb300_present_with_sources(cat, shared_data):
    b300, gb300 = cat.gpu("b300"), cat.gpu("gb300")
    # dense peaks the shared aiconfigurator PROVENANCE quotes from the upstream system YAMLs
    assert (b300.peak_tflops["bf16"], b300.peak_tflops["fp8"]) == (2250, 4500)
    assert (gb300.peak_tflops["bf16"], gb300.peak_tflops["fp8"]) == (2500, 5000)
    assert b300.has_fp8 and gb300.has_fp8 and b300.tdp_w == 1100 and gb300.tdp_w == 1400
    assert b300.default_cluster == "dgx-b300" and gb300.default_cluster == "gb300-nvl72"
    for g in (b300, gb300):
        for fig in ["peak_tflops.bf16", "peak_tflops.fp8", *GPU_FIGURES]:
            assert g.sources[fig] and all(i in cat.sources for i in g.sources[fig]), (g.name, fig)
        assert cat.sources["aiconfigurator_blackwell_ultra"]["what"]
    assert all(cat.sources[i].get("url") for i in ("aic_system_b300_sxm", "aic_system_gb300"))
    prov = (shared_data / "aiconfigurator" / "PROVENANCE.md").read_text()
    assert "B300 2250 / 4500; GB200 and GB300 2500 / 5000" in prov
    mamf = {(r.split(",")[1], r.split(",")[2]): float(r.split(",")[4])
            for r in (shared_data / "hardware" / "mamf.csv").read_text().splitlines()[1:] if r.split(",")[1] == "b300"}
    assert mamf[("b300", "bfloat16")] == b300.peak_tflops["bf16"] and mamf[("b300", "float8_e4m3fn")] == 4500
    build = _build_module()
    for cluster, system, n in (("dgx-b300", "b300_sxm", 8), ("gb300-nvl72", "gb300", 4)):
        assert cat.cluster(cluster).intra_node_latency_us == build._small_message_latency_us(shared_data, system, n)


def test_build_script_output_equals_checked_in_toml(shared_data):
    rendered = _build_module().render(shared_data)
    for name, text in rendered.items():
        assert (catalogue_dir() / name).read_text() == text, f"{name} is stale: run scripts/build_catalogue.py"


def test_measured_latency_is_read_from_aiconfigurator(cat, shared_data):
    lat = _build_module()._small_message_latency_us(shared_data, "h100_sxm", 8)
    assert cat.cluster("dgx-h100").intra_node_latency_us == lat
    assert 1 < lat < 100


# ------------------------------------------------------------------------------------------ resolve
def test_resolve_gpu_only_uses_default_cluster(cat):
    hw = cat.resolve("h100-sxm")
    assert hw.gpu.name == "h100-sxm" and hw.cluster.name == "dgx-h100" and hw.gpus_per_node == 8


def test_resolve_cluster_only_uses_its_gpu(cat):
    hw = cat.resolve(None, "vista")
    assert hw.gpu.name == "gh200" and hw.gpus_per_node == 1


def test_resolve_both_and_gpus_per_node_override(cat):
    hw = cat.resolve("a100-40gb", "perlmutter", gpus_per_node=2)
    assert hw.gpu.name == "a100-40gb" and hw.cluster.name == "perlmutter" and hw.gpus_per_node == 2
    assert cat.cluster("perlmutter").gpus_per_node == 4  # the catalogue entry is untouched
    assert hw.price_usd_per_gpu_hour == cat.gpu("a100-40gb").price_usd_per_gpu_hour


def test_cluster_whose_gpu_differs_from_gpu_is_refused(cat):
    with pytest.raises(PlannerError, match="--gpu h100-sxm does not match --cluster perlmutter"):
        cat.resolve("h100-sxm", "perlmutter")
    # the node types' documented variants are accepted: Perlmutter's and the DGX A100 320GB's A100-40GB
    assert cat.resolve("a100-40gb", "dgx-a100").gpu.name == "a100-40gb"
    assert cat.resolve("a100-80gb", "perlmutter").cluster.name == "perlmutter"


def test_gpus_per_node_override_keeps_the_rack_domain(cat):
    assert cat.resolve("h100-sxm", gpus_per_node=4).nvlink_domain == 4   # node = domain: both change
    hw = cat.resolve("gb200", gpus_per_node=8)
    assert (hw.gpus_per_node, hw.nvlink_domain) == (8, 72)
    with pytest.raises(PlannerError, match="does not divide the 72-GPU NVLink domain"):
        cat.resolve("gb200", gpus_per_node=5)


def test_a_resized_node_type_says_so_and_names_the_node_types_that_match(cat):
    """--gpus-per-node that differs from the node type's own count resizes it and says so, naming the node types
    that hold that many of the GPU (issue 24: outputs say which node type they assumed); its own count says
    nothing."""
    hw = cat.resolve("gh200", gpus_per_node=8)
    assert hw.cluster.name == "jupiter-booster" and (hw.gpus_per_node, hw.nvlink_domain) == (8, 8)
    assert hw.cluster.resized.startswith("--gpus-per-node 8 resizes jupiter-booster (4 GPUs per node)")
    assert "no node type in the catalogue has 8 gh200 per node" in hw.cluster.resized
    a100 = cat.resolve("a100-80gb", gpus_per_node=4).cluster.resized
    assert "node types with 4 a100-80gb per node: perlmutter" in a100
    assert "NVLink domain 72 GPUs, unchanged" in cat.resolve("gb200", gpus_per_node=8).cluster.resized
    assert cat.resolve("gh200", gpus_per_node=4).cluster.resized == "" and cat.resolve("gh200").cluster.resized == ""
    assert cat.resolve("gh200", gpus_per_node=8).cluster == cat.resolve("gh200", gpus_per_node=8).cluster


def test_predict_search_and_compare_lines_print_the_resize():
    """The note reaches every output that names the node type: predict's warnings, search's notes and the
    hardware lines of compare's table."""
    from costmodel.core.specs.plan import ParallelPlan
    from costmodel.core.specs.presets import resolve_model
    from costmodel.cost.roofline import RooflineCostModel
    from costmodel.estimate import estimate
    from planner.reports.results import hardware_lines

    hw = load_catalogue().resolve("gh200", gpus_per_node=8)
    plan = ParallelPlan(gpus=16, gpus_per_node=8, tp=1, pp=1, mbs=1, gbs=16, seq_len=2048)
    est = estimate(resolve_model("llama3-8b"), plan, hw, cost_model=RooflineCostModel())
    assert hw.cluster.resized in est.warnings
    assert any(hw.cluster.resized in line for line in hardware_lines([hw]))
    plain = load_catalogue().resolve("gh200")
    assert not any("resizes" in line for line in hardware_lines([plain]))
    from typer.testing import CliRunner

    from planner.cli import app

    out = CliRunner().invoke(app, ["search", "--model", "llama3-8b", "--gpus", "16", "--gpu", "gh200",
                                   "--gpus-per-node", "8", "--top", "1"], env={"COLUMNS": "400"})
    assert out.exit_code == 0 and f"note: {hw.cluster.resized}" in out.output


def test_nvlink_domain_must_hold_whole_nodes(tmp_path):
    f = tmp_path / "hw.toml"
    f.write_text("[clusters.dgx-h100]\nnvlink_domain = 12\n")
    with pytest.raises(PlannerError, match="nvlink_domain=12 must be a multiple of gpus_per_node=8"):
        load_catalogue([f])


def test_names_are_case_insensitive_and_accept_underscores(cat):
    assert cat.gpu("H100_SXM") is cat.gpu("h100-sxm")
    assert cat.resolve("GH200_144GB").cluster.name == "gh200-144gb-node"


@pytest.mark.parametrize("call, fragment", [
    (lambda c: c.gpu("x100"), "unknown GPU 'x100'; choose one of: a100-40gb"),
    (lambda c: c.resolve(None, "frontier"), "unknown cluster 'frontier'"),
    (lambda c: c.resolve(None, None), "pass --gpu"),
    (lambda c: c.resolve("h100-sxm", gpus_per_node=0), "positive integer"),
])
def test_unknown_names_and_bad_arguments(cat, call, fragment):
    with pytest.raises(PlannerError, match="planner gpus|positive integer") as err:
        call(cat)
    assert fragment in str(err.value)


# ------------------------------------------------------------------------------------------ user files
def test_toml_override_merges_fields(tmp_path, cat):
    f = tmp_path / "hw.toml"
    f.write_text('[gpus.h100_sxm]\nprice_usd_per_gpu_hour = 4.5\nprice_date = "2026-01-01"\n'
                 '[gpus.h100-sxm.peak_tflops]\nfp8 = 1500\n')
    g = load_catalogue([f]).gpu("h100-sxm")
    assert g.price_usd_per_gpu_hour == 4.5 and g.peak_tflops["fp8"] == 1500
    assert g.peak_tflops["bf16"] == 989.4 and g.hbm_gb == 80          # untouched fields kept
    assert g.sources["price_usd_per_gpu_hour"] == [str(f)]            # overridden figure cites the file
    assert g.sources["hbm_gb"] == cat.gpu("h100-sxm").sources["hbm_gb"]
    assert cat.gpu("h100-sxm").price_usd_per_gpu_hour == 2.99         # default catalogue unchanged


def test_yaml_file_adds_new_entries(tmp_path):
    f = tmp_path / "hw.yaml"
    f.write_text(yaml.safe_dump({
        "gpus": {"my-gpu": {"peak_tflops": {"bf16": 100}, "hbm_gb": 24, "hbm_bw_gbs": 900, "nvlink_bw_gbs": 0,
                            "default_cluster": "my_box"}},
        "clusters": {"my_box": {"gpu": "my-gpu", "gpus_per_node": 2, "intra_node_bw_gbs": 32,
                                "intra_node_latency_us": 10, "inter_node_bw_gbs": 12.5,
                                "inter_node_latency_us": 30}}}))
    hw = load_catalogue([f]).resolve("MY_GPU")
    assert hw.cluster.name == "my-box" and hw.gpus_per_node == 2 and hw.gpu.peak_flops("bf16") == 100e12
    assert hw.gpu.price_usd_per_gpu_hour is None


def test_env_var_adds_files(tmp_path, monkeypatch):
    f = tmp_path / "env.toml"
    f.write_text("[clusters.vista]\ninter_node_latency_us = 3.5\n")
    monkeypatch.setenv(ENV_VAR, str(f))
    assert load_catalogue().cluster("vista").inter_node_latency_us == 3.5


@pytest.mark.parametrize("name, text, fragments", [
    ("bad.toml", "[gpus.h100-sxm\nhbm_gb = 1\n", ["not valid TOML"]),
    ("bad.yaml", "gpus: [unclosed\n", ["not valid YAML"]),
    ("unknown.toml", "[gpus.h100-sxm]\nhbm_tb = 1\n", ["[gpus.h100-sxm]", "unknown field 'hbm_tb'", "hbm_gb"]),
    ("neg.toml", "[clusters.dgx-h100]\ninter_node_bw_gbs = -50\n",
     ["[clusters.dgx-h100]", "'inter_node_bw_gbs' = -50", "> 0"]),
    ("type.toml", '[clusters.dgx-h100]\ngpus_per_node = "8"\n', ["'gpus_per_node' = '8'", "integer > 0"]),
    ("dtype.toml", "[gpus.b200.peak_tflops]\nfp4 = 9000\n", ["unknown dtype 'fp4'"]),
    ("new.toml", "[gpus.mystery]\nhbm_gb = 10\n", ["[gpus.mystery]", "required fields", "peak_tflops"]),
    ("ref.toml", '[clusters.dgx-h100]\ngpu = "tpu-v5"\n', ["gpu 'tpu-v5' is not a known GPU"]),
    ("top.toml", "[gpu.h100]\nhbm_gb = 1\n", ["unknown top-level table"]),
    ("file.txt", "", ["must end in .toml"]),
])
def test_malformed_files_raise_planner_error(tmp_path, name, text, fragments):
    f = tmp_path / name
    f.write_text(text)
    with pytest.raises(PlannerError) as err:
        load_catalogue([f])
    msg = str(err.value)
    assert str(f) in msg and "\n" not in msg.strip()
    for fragment in fragments:
        assert fragment in msg


def test_missing_file_raises(tmp_path):
    with pytest.raises(PlannerError, match="not found"):
        load_catalogue([tmp_path / "nope.toml"])


def test_load_is_cached():
    # served from the cache (its speed: benchmarks/bench_components.py)
    assert load_catalogue() is load_catalogue()


# ------------------------------------------------------------------------------------------ CLI
def _invoke(args):
    from planner.cli import app

    # With a single registered command typer runs it without its name; the full CLI has several.
    if len(app.registered_commands) + len(app.registered_groups) < 2 and app.registered_callback is None:
        args = args[1:]
    return CliRunner().invoke(app, args, env={"COLUMNS": "250"})


def test_cli_gpus_table():
    result = _invoke(["gpus"])
    assert result.exit_code == 0, result.output
    for text in ("h100-sxm", "989.4", "perlmutter", "[GB/s]", "[$/GPU-h]"):
        assert text in result.output


def test_cli_gpus_json_with_hardware_file(tmp_path):
    f = tmp_path / "hw.toml"
    f.write_text("[gpus.h100-sxm]\nprice_usd_per_gpu_hour = 4.5\n")
    result = _invoke(["gpus", "--format", "json", "--hardware-file", str(f)])
    assert result.exit_code == 0, result.output
    data = json.loads(result.output)
    h100 = next(g for g in data["gpus"] if g["name"] == "h100-sxm")
    assert h100["price_usd_per_gpu_hour"] == 4.5 and h100["sources"]["hbm_gb"]
    assert {c["name"] for c in data["clusters"]} >= set(CLUSTER_KEYS) and "nccl_tests_150" in data["sources"]
    assert not any(isinstance(v, float) and math.isnan(v) for g in data["gpus"] for v in g.values())


def test_cli_bad_hardware_file_exits_2(tmp_path):
    f = tmp_path / "bad.toml"
    f.write_text("[gpus.h100-sxm]\nhbm_bw_gbs = -1\n")
    result = _invoke(["gpus", "--hardware-file", str(f)])
    assert result.exit_code == 2
    assert "error:" in result.output and "hbm_bw_gbs" in result.output


def test_hbm_capacity_is_the_driver_figure_with_a_source():
    """Capacity in MiB as nvidia-smi reports it, cited; GPUs without a cited figure keep hbm_gb and say so."""
    cat = load_catalogue()
    assert cat.gpu("a100-80gb").hbm_mib == 81920 and cat.gpu("a100-80gb").hbm_bytes == 80 * 2**30
    assert cat.gpu("a100-40gb").hbm_bytes == 40 * 2**30
    assert cat.gpu("h100-sxm").hbm_mib == 81559           # modal_client_pr_2797, nccl_issue_1264
    assert cat.gpu("h100-sxm").hbm_bytes / 2**30 == pytest.approx(79.65, abs=0.005)
    for name, g in cat.gpus.items():
        if g.hbm_mib:
            assert g.sources["hbm_mib"] and all(s in cat.sources for s in g.sources["hbm_mib"]), name
        else:
            assert "hbm_mib: no cited driver-reported capacity" in g.notes, name
            assert g.hbm_bytes == g.hbm_gb * 1e9


def test_hardware_file_capacity_in_gb_replaces_the_driver_figure(tmp_path):
    f = tmp_path / "hw.toml"
    f.write_text("[gpus.h100-sxm]\nhbm_gb = 40\n")
    g = load_catalogue([f]).gpu("h100-sxm")
    assert g.hbm_mib == 0 and g.hbm_bytes == 40e9 and "hbm_mib" not in g.sources


def test_quad_gh200_nodes_are_a_direct_wired_mesh(cat):
    # JUPITER / Alps / Isambard-AI: four GH200 wired pairwise (150 GB/s per direction per pair), no NVSwitch: a
    # 2-GPU group has one pair link, the whole node all three; an NVSwitch node gives any group the full figure
    for name in ("jupiter-booster", "alps-gh200", "isambard-ai"):
        c = cat.cluster(name)
        assert c.nvlink_mesh == 4 and c.intra_bw_gbs(2) == 150.0 and c.intra_bw_gbs(4) == 450.0, name
        assert c.sources["nvlink_mesh"]
    assert cat.cluster("dgx-h100").nvlink_mesh == 0 and cat.cluster("dgx-h100").intra_bw_gbs(2) == 450.0
    resized = cat.resolve("gh200", "jupiter-booster", 2).cluster  # two GPUs of a quad node: still one pair link
    assert resized.intra_bw_gbs(2) == 150.0
