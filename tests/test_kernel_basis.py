"""One kernel basis (costmodel/graph/kernel_basis.py, costmodel/cost/basis.py), quad-GH200 node types and the H800
(scripts/catalogue_gh200.py), host dispatch and CUDA graphs (issue 24, items 1, 2 and 4)."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from costmodel.core.errors import PlannerError
from costmodel.core.specs.catalogue import load_catalogue
from costmodel.cost.basis import dominates, siblings
from costmodel.cost.fp8_block import TRAINING_FLOOR, ratio
from costmodel.estimate import default_cost_model
from costmodel.graph.build import build_graph
from costmodel.graph.kernel_basis import (
    FUSED_ELEMENTWISE,
    FUSED_TABLE_PATH,
    MEASUREMENT,
    OTHER_BASIS_ROLE,
    ett_operator_role,
    fit_fused,
    fused_efficiency,
    graph_bytes,
    host_layer_s,
)
from planner.prediction import predict
from tests.helpers import llama, plan

REPO = Path(__file__).resolve().parent.parent


# ------------------------------------------------------------------------------------------ catalogue
def test_gh200_is_a_quad_nvlink_node_by_default_and_vista_is_kept():
    cat = load_catalogue()
    hw = cat.resolve("gh200")
    assert hw.cluster.name == "jupiter-booster" and hw.gpus_per_node == 4 and hw.nvlink_domain == 4
    assert hw.cluster.intra_node_bw_gbs == 450.0 and hw.cluster.inter_node_bw_gbs == 25.0
    for name in ("alps-gh200", "isambard-ai"):
        c = cat.cluster(name)
        assert (c.gpu, c.gpus_per_node, c.intra_node_bw_gbs, c.inter_node_bw_gbs) == ("gh200", 4, 450.0, 25.0)
        assert c.sources["intra_node_bw_gbs"] and "UNCERTAIN" in c.notes
    assert cat.cluster("vista").gpus_per_node == 1


def test_gpus_per_node_contradicting_the_node_type_names_the_matching_ones():
    cat = load_catalogue()
    with pytest.raises(PlannerError, match="node types with 1 gh200 per node: vista"):
        cat.resolve("gh200", None, 1)
    assert cat.resolve("gh200", "vista", 1).cluster.name == "vista"
    resized = cat.resolve("gh200", "jupiter-booster", 1)       # explicit --cluster: a resize, as asked
    assert resized.gpus_per_node == 1
    assert cat.resolve("h100-sxm", None, 4).gpus_per_node == 4  # no H100 node type of 4: resized as before


def test_h800_is_the_h100_die_with_400_gbs_nvlink():
    cat = load_catalogue()
    h800, h100 = cat.gpu("h800"), cat.gpu("h100-sxm")
    assert h800.nvlink_bw_gbs == 200.0 and h800.peak_tflops["bf16"] == h100.peak_tflops["bf16"]
    assert "deepseek_isca_h800" in h800.sources["nvlink_bw_gbs"]
    hw = cat.resolve("h800")
    assert hw.cluster.name == "hgx-h800" and hw.cluster.intra_node_bw_gbs == 200.0


def test_same_die_relations():
    cat = load_catalogue()
    gpu = cat.gpu
    assert dominates(gpu("gh200"), gpu("h100-sxm")) and dominates(gpu("h200"), gpu("h100-sxm"))
    assert dominates(gpu("gb200"), gpu("b200")) and dominates(gpu("a100-80gb"), gpu("a100-40gb"))
    assert not dominates(gpu("h100-sxm"), gpu("gh200")) and not dominates(gpu("h800"), gpu("h100-sxm"))
    assert not dominates(gpu("b200"), gpu("a100-80gb"))
    assert [g.name for g in siblings(gpu("gh200"), gpu)][0] == "h100-sxm"   # nearest HBM bandwidth first


# ------------------------------------------------------------------------------------------ kernel basis
def test_eager_and_flash2_samples_are_another_basis():
    assert ett_operator_role("RMSlayernorm", "gh200")[0] == OTHER_BASIS_ROLE
    assert ett_operator_role("RoPE", "a100-80gb")[0] == OTHER_BASIS_ROLE
    assert ett_operator_role("parallel_cross_entropy_128", "gh200")[0] == OTHER_BASIS_ROLE
    assert ett_operator_role("flash_atten", "gh200")[0] == OTHER_BASIS_ROLE     # FA2 is not Hopper's fused kernel
    assert ett_operator_role("flash_atten", "a100-80gb")[0] == "train"          # it is Ampere's
    assert ett_operator_role("linear1", "gh200")[0] == OTHER_BASIS_ROLE        # torch.rand inputs: a faster clock
    assert ett_operator_role("embedding", "gh200")[0] == "train"


def test_fused_efficiencies_are_the_measured_kernels_at_the_hbm_roofline():
    for kind in FUSED_ELEMENTWISE:
        assert fused_efficiency(kind, False) is not None, kind
    # fused element-wise kernels stream their bytes near the HBM rate (H100: copy ceiling 2,920 of 3,350 GB/s)
    for kind in ("norm", "rope", "activation", "residual_add"):
        assert 0.75 < fused_efficiency(kind, False) < 1.0, kind


def test_fused_table_regenerates_from_the_h100_measurements():
    folder = REPO / MEASUREMENT
    if not (folder / "elementwise.csv").is_file():
        pytest.skip(f"{MEASUREMENT} not in this checkout (branch gpu)")
    assert fit_fused(folder)["kinds"] == json.loads(FUSED_TABLE_PATH.read_text())["kinds"]


def test_graph_bytes_are_the_graphs_own_byte_counts():
    """The fused efficiencies are fitted against kernel_basis.graph_bytes: they must be the bytes the graph charges."""
    model = llama(layers=2, hidden=1024, heads=8, kv=8, ffn=2048, vocab=32000, seq=1024)
    g = build_graph(model, plan(gpus=1, gpn=1, gbs=2, seq=1024, mbs=2, recompute="none", zero=0))
    tokens = 2 * 1024
    widths = {"norm": 1024, "activation": 2048, "rope": 1024, "residual_add": 1024, "cross_entropy": 32000}
    seen = set()
    for o in g.stages[0].layer_ops + g.stages[0].stage_ops:
        if o.kind in widths and not o.name.startswith("hbm."):
            assert o.bytes == graph_bytes(o.kind, tokens, widths[o.kind], o.backward), (o.name, o.phase)
            seen.add(o.kind)
    assert seen == set(widths)


def test_fp8_block_is_never_faster_than_fp8():
    for gpu in ("h100-sxm", "b200", "gb200"):
        for shape in ((4096, 4096, 4096), (32768, 1024, 1024), (8192, 28672, 8192)):
            assert ratio(gpu, *shape) >= TRAINING_FLOOR
    model = llama(layers=4, hidden=4096, heads=32, kv=8, ffn=14336, vocab=128256, seq=8192)
    hw = load_catalogue().resolve("b200")
    p = plan(gpus=8, gpn=8, gbs=64, seq=8192, mbs=1, recompute="none")
    t8 = predict(model, replace(p, dtype="fp8"), hw).iteration_time_s
    tb = predict(model, replace(p, dtype="fp8-block"), hw).iteration_time_s
    assert tb >= t8


# ------------------------------------------------------------------------------------------ host dispatch
def test_small_eager_steps_are_bound_by_the_cpu_issuing_kernels_and_cuda_graphs_remove_it():
    model = llama(layers=12, hidden=768, heads=12, kv=12, ffn=2048, vocab=32000, seq=1024)
    hw = load_catalogue().resolve("h100-sxm", None, 1)
    p = plan(gpus=1, gpn=1, gbs=1, seq=1024, mbs=1, recompute="none", zero=0)
    eager = predict(model, replace(p, framework="torchtitan-eager"), hw).iteration_time_s
    graphs = predict(model, replace(p, framework="torchtitan-eager", cuda_graphs=True), hw).iteration_time_s
    # measured on H100: 34.9-42.7 ms eager, 8.6 ms as one CUDA graph (reports/gpu-runs/h100-2026-11-27): a layer of a
    # PyTorch-module stack costs the CPU the measured ~3.1 ms (host_layer_s), the per-kernel dispatch sum a third of it
    assert 34.9e-3 * 0.85 < eager < 42.7e-3 * 1.15 and eager > 3.5 * graphs
    g = build_graph(model, replace(p, framework="torchtitan-eager"))
    assert sum(g.stages[0].host_s[:2]) == pytest.approx(host_layer_s()) and 3.0e-3 < host_layer_s() < 3.2e-3
    assert build_graph(model, replace(p, cuda_graphs=True)).stages[0].host_s == (0,) * 4
    # Megatron-Core's layers are PyTorch (Transformer Engine) modules too: the same floor; llm.c's C loop issues
    # kernels only (the per-kernel estimate, a third of the floor)
    mega = build_graph(model, replace(p, framework="megatron")).stages[0].host_s
    assert sum(mega[:2]) == pytest.approx(host_layer_s())
    llmc = build_graph(model, replace(p, framework="llmc")).stages[0].host_s
    assert 0 < sum(llmc[:2]) < host_layer_s()


def test_cost_sources_name_the_fused_basis():
    model = llama(layers=2, hidden=1024, heads=8, kv=8, ffn=2048, vocab=32000, seq=1024)
    hw = load_catalogue().resolve("gh200")
    g = build_graph(model, plan(gpus=1, gpn=1, gbs=2, seq=1024, mbs=2, zero=0))
    ops = [o for o in g.stages[0].layer_ops if o.kind == "norm"]
    res = default_cost_model().predict(ops, hw)
    assert all("fused kernel" in m for m in res.method)


def test_megatron_loss_is_its_counted_fp32_chain_and_a_single_kernel_reads_the_logits_once():
    from costmodel.core.kinds import Phase
    from costmodel.graph.build import cross_entropy_ops
    from costmodel.graph.kernel_basis import MEGATRON_LOSS_BYTES
    from costmodel.graph.opbuild import hbm_pass
    from planner.export import megatron_args

    p, tokens, v = plan(gpus=1, gbs=1), 4096, 32000
    hw = load_catalogue().resolve("h100-sxm")
    cm = default_cost_model()
    chain, single = cross_entropy_ops(p, tokens, v), cross_entropy_ops(replace(p, cross_entropy_fusion=True), tokens, v)
    assert [o.name for o in single] == ["cross_entropy", "cross_entropy"]
    assert [o.name for o in chain][2:] == ["hbm.megatron.cross_entropy"] * 2
    # the chain's time is its counted bytes streamed at the residual add's fused efficiency
    for phase, nbytes in zip((Phase.FWD, Phase.BWD), MEGATRON_LOSS_BYTES):
        got = sum(cm.predict([o], hw).time_s[0] for o in chain if o.phase is phase)
        want = cm.predict([hbm_pass("x", phase, nbytes * tokens * v, "bf16")], hw).time_s[0]
        assert got == pytest.approx(want, rel=1e-2)  # one kernel launch floor apart
    # torchtitan's loss is PyTorch's eager F.cross_entropy(pred.float()), not Megatron's chain
    titan = cross_entropy_ops(replace(p, framework="torchtitan"), tokens, v)
    assert [o.name for o in titan][2:] == ["hbm.eager.cross_entropy"] * 2
    args = megatron_args(llama(layers=2), replace(p, cross_entropy_fusion=True))[0]
    i = args.index("--cross-entropy-fusion-impl")
    assert "--cross-entropy-loss-fusion" in args and args[i + 1] == "te"
