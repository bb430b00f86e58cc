"""Importers of the public data: header checks, filters, mappings, sidecars, round trip."""

import hashlib
import math
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from costmodel.core.errors import PlannerError
from costmodel.core.paths import data_dir
from costmodel.fitting.datasets import filters as F
from costmodel.fitting.datasets import importers as I
from costmodel.fitting.datasets.schema import load_dataset, save_dataset
from tests.helpers import require_shared

ETT = "estimate-train-time"
PERL = "NVIDIAA100-SXM4-80GB"
VISTA = "NVIDIAGH200120GB"


def _write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def _rows(ds, **match):
    """Indices of rows whose features equal ``match`` (feature name -> value)."""
    sel = np.ones(len(ds), dtype=bool)
    for name, v in match.items():
        sel &= ds.features[:, ds.feature_names.index(name)] == v
    return np.nonzero(sel)[0]


# ------------------------------------------------------------------------------------------------
# Synthetic data (no shared folder needed)
# ------------------------------------------------------------------------------------------------

def test_filters_on_synthetic_tables():
    keep, n = F.filter_ett_perlmutter_inter_node({"nodes": np.array([1.0, 2, 1, 8])})
    assert keep.tolist() == [True, False, True, False] and n == 2
    keep, n = F.filter_ett_vista_allgather_large_4_8_nodes({"nodes": np.array([2.0, 4, 8, 2, 8])})
    assert keep.tolist() == [True, False, False, True, False] and n == 3
    for f in (F.filter_ett_vista_flash_atten_backward, F.filter_ett_res_add_backward):
        keep, n = f({"b": np.ones(5)})
        assert not keep.any() and n == 5
    ks = np.array(["fa3", "triton", "fa3", "flashinfer"], dtype=object)
    keep, n = F.filter_aic_default_attention_kernel({"kernel_source": ks}, "h100_sxm")
    assert keep.tolist() == [True, False, True, False] and n == 2
    keep, n = F.filter_aic_default_attention_kernel({"kernel_source": ks}, "b200_sxm")
    assert not keep.any() and n == 4
    assert set(F.FILTERS) == {"filter_ett_perlmutter_inter_node", "filter_ett_vista_allgather_large_4_8_nodes",
                              "filter_ett_vista_flash_atten_backward", "filter_ett_res_add_backward",
                              "filter_aic_default_attention_kernel"}


@pytest.mark.parametrize("rel,text,importer,column", [
    (f"{ETT}/Perlmutter/operator/{PERL}_gelu_fp16.csv", "mp,b,seq,dim,F_dur(us),B_dur(us)\n1,2,1024,2048,1,2\n",
     I.import_estimate_train_time, "'seq'"),
    (f"{ETT}/Vista/nccl/{VISTA}_p2p_fp16_2_1.csv", "shape,nodes,GPUsPerNode\n2,2,1\n",
     I.import_estimate_train_time, "(no column)"),
    ("aiconfigurator/gemm/h100_sxm_bf16_gemm__trtllm-1.3.0rc20.csv", "m,n,k,latency\n1,2,3,0.1\n",
     I.import_aiconfigurator, "'latency'"),
    ("vidur/network/a100_dgx/send_recv.csv", ",time_stats.send_recv.min\n0,1\n", I.import_vidur, "column 3"),
    ("llmcompass-a100/matmul_A100.csv", "M,N,K,time,throughput\n64, 1, 1, 0.1ms, 1Tflops\n",
     I.import_llmcompass, "'time'"),
])
def test_wrong_header_is_a_planner_error_naming_file_and_column(tmp_path, rel, text, importer, column):
    for folder in ("aiconfigurator", ETT, "vidur/compute", "vidur/network", "llmcompass-a100"):
        (tmp_path / folder).mkdir(parents=True, exist_ok=True)
    _write(tmp_path / rel, text)
    with pytest.raises(PlannerError) as exc:
        importer(tmp_path)
    msg = str(exc.value)
    assert Path(rel).name in msg and column in msg


def test_bad_values_are_planner_errors(tmp_path):
    base = tmp_path / ETT / "Vista"
    p = _write(base / "operator" / f"{VISTA}_gelu_fp16.csv", "mp,b,l,dim,F_dur(us),B_dur(us)\n1,2,1024,2048,x,2\n")
    with pytest.raises(PlannerError, match=r"line 2, column 'F_dur\(us\)'"):
        I.import_estimate_train_time(tmp_path)
    p.write_text("mp,b,l,dim,F_dur(us),B_dur(us)\n1,2,1024,2048,-1,2\n")
    with pytest.raises(PlannerError, match="not a positive number"):
        I.import_estimate_train_time(tmp_path)
    p.write_text("mp,b,l,dim,F_dur(us),B_dur(us)\n3,2,1024,2048,1,2\n")  # 4*2048/3 is not an integer width
    with pytest.raises(PlannerError, match="'width'"):
        I.import_estimate_train_time(tmp_path)
    p.write_text("mp,b,l,dim,F_dur(us),B_dur(us)\n1,2,1024\n")
    with pytest.raises(PlannerError, match="truncated"):
        I.import_estimate_train_time(tmp_path)
    p.unlink()
    _write(base / "nccl" / f"{VISTA}_p2p_fp16_2_1.csv", "shape,nodes,GPUsPerNode,dur(us)\n2,4,1,5\n")
    with pytest.raises(PlannerError, match="'nodes'"):
        I.import_estimate_train_time(tmp_path)


def _tiny_ett(root: Path) -> None:
    vop, pn = root / ETT / "Vista" / "operator", root / ETT / "Perlmutter" / "nccl"
    _write(vop / f"{VISTA}_flash_atten_fp16.csv",
           "mp,b,h,l,dim,F_dur(us),B_dur(us)\n2,4,16,1024,2048,100,10\n1,2,32,2048,4096,400,50\n")
    _write(vop / f"{VISTA}_res_add_fp16.csv", "b,l,dim,F_dur(us),B_dur(us)\n2,1024,2048,20,20\n")
    _write(vop / f"{VISTA}_linear_final_fp16.csv", "mp,b,l,dim,F_dur(us),B_dur(us)\n2,2,1024,2048,300,600\n")
    _write(vop / f"{VISTA}_bmm_fp16.csv", "mp,b,h,l,dim,F_dur(us),B_dur(us)\n1,2,16,1024,2048,1,2\n")
    _write(pn / f"{PERL}_allgather_large_fp16_1_4.csv", "shape,nodes,GPUsPerNode,dur(us)\n1000,1,4,50\n3000,1,4,90\n")
    _write(pn / f"{PERL}_allgather_large_fp16_2_2.csv", "shape,nodes,GPUsPerNode,dur(us)\n1000,2,2,5000\n")
    _write(pn / f"{PERL}_p2p_fp16_2_1.csv", "shape,nodes,GPUsPerNode,dur(us)\n1000,2,1,800\n")


def test_ett_importer_on_synthetic_files(tmp_path):
    _tiny_ett(tmp_path)
    out = {(d.kind, d.gpu): d for d in I.import_estimate_train_time(tmp_path)}
    assert set(out) == {("attention_fwd", "gh200"), ("residual_add", "gh200"), ("gemm", "gh200"),
                        ("all_gather", "a100-80gb")}  # p2p: every row is inter-node Perlmutter -> no dataset
    att = out[("attention_fwd", "gh200")]
    assert att.features.tolist() == [[4, 1024, 1024, 8, 8, 128, 0], [2, 2048, 2048, 32, 32, 128, 0]]
    assert np.allclose(att.time_s, [100e-6, 400e-6])
    bwd_src = [s for s in att.meta["sources"] if s.get("kind") == "attention_bwd"]
    assert bwd_src[0]["filters"] == [{"name": "filter_ett_vista_flash_atten_backward", "dropped": 2}]
    assert any("no attention_bwd dataset for gh200" in n for n in att.meta["notes"])
    res = out[("residual_add", "gh200")]
    assert res.direction.tolist() == ["fwd"] and res.features.tolist() == [[2 * 1024 * 2048]]
    assert res.meta["sources"][1]["filters"] == [{"name": "filter_ett_res_add_backward", "dropped": 1}]
    gemm = out[("gemm", "gh200")]
    # per-rank padded vocab ceil(50257 / (128*2)) * 128 = 197 * 128
    assert gemm.features.tolist() == [[2048, 25216, 2048], [2048, 25216, 2048]]
    assert gemm.direction.tolist() == ["fwd", "bwd"]
    # nn.Linear on torch.rand inputs: another basis than the training GEMM
    # (costmodel.graph.kernel_basis.ETT_GEMM_INPUTS)
    assert I.role_mask(gemm, "other_basis").tolist() == [True, True]
    ag = out[("all_gather", "a100-80gb")]
    assert ag.features.tolist() == [[2 * 1000 * 4, 4, 1, 4], [2 * 3000 * 4, 4, 1, 4]]  # bytes = 2*shape*ranks
    drops = [f for s in ag.meta["sources"] for f in s["filters"] if "kind" not in s]
    assert drops == [{"name": "filter_ett_perlmutter_inter_node", "dropped": 0},
                     {"name": "filter_ett_perlmutter_inter_node", "dropped": 1}]
    # the p2p file lost every row: its record and a note land on the other a100-80gb dataset
    orphan = [s for s in ag.meta["sources"] if s.get("kind") == "send_recv"]
    assert orphan[0]["filters"] == [{"name": "filter_ett_perlmutter_inter_node", "dropped": 1}]
    assert any("no send_recv dataset for a100-80gb" in n for n in ag.meta["notes"])
    assert any("bmm" in n for n in gemm.meta["notes"])


def test_partition_vocab_matches_megatron_padding():
    # Megatron pads GPT-2's 50257 to 50304 (multiple of 128) at TP=1; per rank ceil(V/(128 tp))*128
    assert I.ett_partition_vocab([1, 2, 4, 8]).tolist() == [50304, 25216, 12672, 6400]


def test_save_load_round_trip(tmp_path):
    _tiny_ett(tmp_path / "data")
    for ds in I.import_estimate_train_time(tmp_path / "data"):
        path = save_dataset(ds, tmp_path / "out" / ds.gpu / ds.kind)
        back = load_dataset(path)
        assert (back.kind, back.gpu) == (ds.kind, ds.gpu)
        assert np.array_equal(back.features, ds.features) and np.array_equal(back.time_s, ds.time_s)
        assert back.direction.tolist() == ds.direction.tolist() and back.dtype.tolist() == ds.dtype.tolist()
        assert np.array_equal(back.source_row, ds.source_row)
        assert back.meta["sources"] == ds.meta["sources"] and back.meta["notes"] == ds.meta["notes"]
        assert np.array_equal(I.role_mask(back, "train"), I.role_mask(ds, "train"))


def test_registry_refuses_duplicate_names():
    assert list(I.importers()) == ["aiconfigurator", "estimate-train-time", "vidur", "llmcompass-a100"]
    with pytest.raises(PlannerError, match="registered twice"):
        I.register("vidur")(lambda d: [])
    assert I.importers()["vidur"] is I.import_vidur


# ------------------------------------------------------------------------------------------------
# The shared data
# ------------------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def imported():
    d = require_shared(data_dir(), "shared data")
    return d, I.import_all(d)  # its speed: benchmarks/bench_components.py (import_all_s)


AIC_GPUS = ("a100-80gb", "h100-sxm", "h200", "b200", "gb200", "b300", "gb300")
EXPECTED = (
    {("gemm", g) for g in (*AIC_GPUS, "gh200")}
    | {("attention_fwd", g) for g in (*AIC_GPUS, "gh200")} | {("attention_bwd", "a100-80gb")}
    | {(k, g) for k in ("norm", "activation", "rope", "residual_add", "embedding")
       for g in ("a100-80gb", "h100-sxm", "gh200")}
    | {("cross_entropy", "a100-80gb"), ("cross_entropy", "gh200"), ("optimizer", "a100-80gb")}
    | {(k, g) for k in ("all_reduce", "all_gather", "reduce_scatter", "all_to_all") for g in AIC_GPUS}
    | {("all_reduce", "gh200"), ("all_gather", "gh200"), ("send_recv", "gh200"),
       ("send_recv", "a100-80gb"), ("send_recv", "h100-sxm")}
)


def test_import_all_returns_every_expected_pair(imported):
    _, out = imported
    assert set(out) == EXPECTED
    for (kind, gpu), ds in out.items():
        assert (ds.kind, ds.gpu) == (kind, gpu) and len(ds) > 0
        assert ds.meta["sources"][-1]["dataset_rows"][1] == len(ds)
        assert sum(s["rows_kept"] for s in ds.meta["sources"]) == len(ds)
        assert set(ds.direction) <= {"fwd", "bwd"}


def test_sidecars_carry_sha256_of_their_sources(imported):
    d, out = imported
    paths = {}
    for ds in out.values():
        for s in ds.meta["sources"]:
            paths.setdefault(s["path"], set()).add(s["sha256"])
    for rel, shas in paths.items():
        assert shas == {hashlib.sha256((d / rel).read_bytes()).hexdigest()}, rel
    assert not any("fp8_block" in p or "pairwise" in p for p in paths)
    assert any("gb300" in p for p in paths) and any("b300_sxm" in p for p in paths)


def _drops(ds, name):
    return sum(f["dropped"] for s in ds.meta["sources"] for f in s["filters"] if f["name"] == name)


def test_perlmutter_inter_node_filter(imported):
    d, out = imported
    name = "filter_ett_perlmutter_inter_node"
    # counts verified by reading every Perlmutter nccl file with nodes > 1 (estimate-train-time PROVENANCE)
    assert _drops(out[("all_reduce", "a100-80gb")], name) == 11281
    assert _drops(out[("all_gather", "a100-80gb")], name) == 2848
    assert _drops(out[("send_recv", "a100-80gb")], name) == 1995
    for kind in ("all_reduce", "all_gather", "send_recv"):
        ds = out[(kind, "a100-80gb")]
        ett = np.isin(I.source_index(ds), [i for i, s in enumerate(ds.meta["sources"]) if s["importer"] == ETT])
        assert ett.any() and np.all(ds.features[ett, 2] == 1)  # every kept Perlmutter row is single-node
    # the documented symptom of the dropped rows: 2 nodes x 1 GPU all-reduce far below the NIC
    t = I.read_table(d, d / ETT / f"Perlmutter/nccl/{PERL}_allreduce_fp16_2_1.csv", ("shape", "nodes", "GPUsPerNode",
                                                                                     "dur(us)"))
    keep, n = F.filter_ett_perlmutter_inter_node(t)
    assert n == t.n == 1729 and not keep.any()
    algbw = 2 * t.num("shape") / (t.num("dur(us)") * 1e-6) / 1e9
    assert np.median(algbw) < 5


def test_vista_filters(imported):
    d, out = imported
    assert _drops(out[("all_gather", "gh200")], "filter_ett_vista_allgather_large_4_8_nodes") == 2 * 195
    assert set(out[("all_gather", "gh200")].features[:, 2]) == {2}
    t = I.read_table(d, d / ETT / f"Vista/nccl/{VISTA}_allgather_large_fp16_8_1.csv",
                     ("shape", "nodes", "GPUsPerNode", "dur(us)"))
    assert (2 * t.num("shape") * 8 / (t.num("dur(us)") * 1e-6) / 1e9).max() > 5000  # "impossible values"
    # flash attention backward: all 4068 rows (PROVENANCE row count) dropped; they have B < F in ~97 %
    att = out[("attention_fwd", "gh200")]
    assert _drops(att, "filter_ett_vista_flash_atten_backward") == 4068
    t = I.read_table(d, d / ETT / f"Vista/operator/{VISTA}_flash_atten_fp16.csv",
                     ("mp", "b", "h", "l", "dim", "F_dur(us)", "B_dur(us)"))
    assert 0.96 <= float(np.mean(t.num("B_dur(us)") < t.num("F_dur(us)"))) <= 0.98
    assert ("attention_bwd", "gh200") not in out
    bwd, fwd = out[("attention_bwd", "a100-80gb")], out[("attention_fwd", "a100-80gb")]
    a, b = next(s["dataset_rows"] for s in fwd.meta["sources"] if s["importer"] == ETT)
    assert len(bwd) == b - a == 4071  # PROVENANCE: flash_atten rows A100 4071
    assert 2.9 < np.median(bwd.time_s / fwd.time_s[a:b]) < 3.3  # PROVENANCE: "A100 B/F median 3.1 — normal"


def test_res_add_backward_filter(imported):
    d, out = imported
    for gpu, (system, dev) in (("a100-80gb", ("Perlmutter", PERL)), ("gh200", ("Vista", VISTA))):
        ds = out[("residual_add", gpu)]
        assert _drops(ds, "filter_ett_res_add_backward") == 351  # PROVENANCE: res_add 351 / 351
        assert set(ds.direction) == {"fwd"}
        t = I.read_table(d, d / ETT / f"{system}/operator/{dev}_res_add_fp16.csv",
                         ("b", "l", "dim", "F_dur(us)", "B_dur(us)"))
        assert np.array_equal(t.num("B_dur(us)"), t.num("F_dur(us)"))  # "B_dur is just a copy of F_dur"


@pytest.mark.parametrize("gpu,dropped,kept", [  # aiconfigurator PROVENANCE context_attention table
    ("a100-80gb", 0, 5627), ("h100-sxm", 578, 13703), ("h200", 578, 13703), ("b200", 3638, 13703),
    ("gb200", 3638, 13227)])
def test_attention_kernel_filter(imported, gpu, dropped, kept):
    ds = imported[1][("attention_fwd", gpu)]
    src = [s for s in ds.meta["sources"] if s["importer"] == "aiconfigurator"]
    assert len(src) == 1 and src[0]["rows_kept"] == kept
    assert src[0]["filters"] == [{"name": "filter_aic_default_attention_kernel", "dropped": dropped}]
    a, b = src[0]["dataset_rows"]
    assert len({tuple(r) for r in ds.features[a:b]}) == kept  # one row per shape
    assert np.all(ds.features[a:b, -1] == 1)  # causal


def test_aiconfigurator_mappings(imported):
    _, out = imported
    g = out[("gemm", "a100-80gb")]
    # aiconfigurator/gemm/a100_sxm_bf16_gemm__sglang-0.5.10.csv line 2: 81,3584,8192,0.05631999837027656
    assert g.features[0].tolist() == [81, 3584, 8192] and g.time_s[0] == 0.05631999837027656 / 1000
    assert g.dtype[0] == "bf16" and g.direction[0] == "fwd" and g.source_row[0] == 0
    h = out[("gemm", "h100-sxm")]
    assert set(h.dtype) == {"bf16", "fp8", "fp16"} and (h.dtype == "fp8").sum() == 35700
    ag = out[("all_gather", "a100-80gb")]
    # aiconfigurator/nccl/a100_sxm_nccl_fp16__nccl-2.27.3.csv line 2: all_gather,2,256,0.00898
    assert ag.features[0].tolist() == [512, 2, 1, 2] and math.isclose(ag.time_s[0], 0.00898e-3)
    for kind in ("all_reduce", "all_gather", "reduce_scatter", "all_to_all"):
        assert sorted(set(out[(kind, "h100-sxm")].features[:, 1])) == [2, 4, 8]
        assert sorted(set(out[(kind, "gb200")].features[:, 1])) == [2, 4]


def test_ett_mappings(imported):
    d, out = imported
    g = out[("gemm", "a100-80gb")]
    # Perlmutter linear_final line 2: mp=1,b=2,l=1024,dim=5632,F=5085.6,B=10046.6 -> (2048, 50304, 5632)
    src = [s for s in g.meta["sources"] if s["path"].endswith(f"{PERL}_linear_final_fp16.csv")]
    assert [s["role"] for s in src] == ["other_basis", "other_basis"]  # kernel_basis.ETT_GEMM_INPUTS
    f, b = src[0]["dataset_rows"][0], src[1]["dataset_rows"][0]
    assert g.features[f].tolist() == g.features[b].tolist() == [2048, 50304, 5632]
    assert math.isclose(g.time_s[f], 5085.6e-6) and math.isclose(g.time_s[b], 10046.6e-6)
    bwd = I.role_mask(g, "other_basis") & (g.direction == "bwd")  # dgrad + wgrad rows, for fit.gemm_checks
    assert bwd.sum() == 3 * 1755 + 351 + 1755  # linear2 is mp=1 only on A100
    # linear1 line 2: 1,2,1024,5632 -> (2048, 3*5632, 5632)
    src = [s for s in g.meta["sources"] if s["path"].endswith(f"{PERL}_linear1_fp16.csv")]
    assert g.features[src[0]["dataset_rows"][0]].tolist() == [2048, 16896, 5632]
    # all_gather on Perlmutter 1 node x 4 GPUs: bytes = 2 * shape * ranks
    ag = out[("all_gather", "a100-80gb")]
    src = [s for s in ag.meta["sources"] if s["path"].endswith("allgather_large_fp16_1_4.csv")][0]
    t = I.read_table(d, d / src["path"], ("shape", "nodes", "GPUsPerNode", "dur(us)"))
    a, _ = src["dataset_rows"]
    assert ag.features[a].tolist() == [2 * t.num("shape")[0] * 4, 4, 1, 4]
    assert ag.time_s[a] == t.num("dur(us)")[0] * 1e-6
    # RoPE heads = q + k heads = 2 h/mp; embedding vocab = padded per-rank vocab
    rope = out[("rope", "gh200")]
    assert rope.features[0].tolist() == [4 * 1024, 2 * 16, 5632 / 16]
    emb = out[("embedding", "gh200")]
    assert emb.features[0].tolist() == [2 * 1024, 5632, 50304]
    assert out[("optimizer", "a100-80gb")].features[0].tolist() == [27335680]
    # norm: rms = 0 for torch LayerNorm (layernorm), 1 for Megatron RMSNorm (RMSlayernorm)
    norm = out[("norm", "gh200")]
    for name, rms in (("layernorm", 0), ("RMSlayernorm", 1)):
        rows = [r for s in norm.meta["sources"] if s["path"].endswith(f"_{name}_fp16.csv") for r in s["dataset_rows"]]
        assert rows and set(norm.features[rows[0]:rows[1], 2].tolist()) == {rms}


def test_vidur_mappings(imported):
    d, out = imported
    rel = "vidur/compute/a100/meta-llama/Llama-2-7b-hf/mlp.csv"

    def first(kind, column):
        ds = out[(kind, "a100-80gb")]
        s = next(s for s in ds.meta["sources"] if s["path"] == rel and s["column"] == column)
        return ds, s["dataset_rows"][0]

    # line 2: n_head 32, n_kv 32, n_embd 4096, F 11008, gated, 4096 tokens, TP 1
    ds, i = first("gemm", "time_stats.attn_pre_proj.median")
    assert ds.features[i].tolist() == [4096, 3 * 4096, 4096] and math.isclose(ds.time_s[i], 1.911e-3)
    ds, i = first("gemm", "time_stats.mlp_up_proj.median")
    assert ds.features[i].tolist() == [4096, 2 * 11008, 4096] and math.isclose(ds.time_s[i], 3.3655e-3)
    assert math.isclose(ds.spread_s[i], 0.12552429047797878e-3)
    ds, i = first("activation", "time_stats.mlp_act.median")
    assert ds.features[i].tolist() == [4096, 2 * 11008, 1]
    ds, i = first("embedding", "time_stats.emb.median")
    assert ds.features[i].tolist() == [4096, 4096, 32768]
    # TP-sharded: Llama-2-70B at TP 8 has 1 KV head per GPU
    g = out[("gemm", "a100-80gb")]
    assert len(_rows(g, n=(64 + 16) * 128 / 8, k=8192)) > 0
    ar = out[("all_reduce", "a100-80gb")]
    s = next(s for s in ar.meta["sources"] if s["path"] == "vidur/network/a100_dgx/all_reduce.csv")
    a = s["dataset_rows"][0]  # line 2: median 0.043 ms, 2 workers, 2048 B, 1 device per node
    assert ar.features[a].tolist() == [2048, 2, 2, 1] and math.isclose(ar.time_s[a], 0.043e-3)
    assert ar.repeats[a] == 3
    assert not any("phi-2" in s["path"] for s in out[("residual_add", "a100-80gb")].meta["sources"])
    # norm: Llama-family blocks (with a post-attention norm) are RMSNorm, phi-2's are LayerNorm (mlp_impl.py)
    ds, i = first("norm", "time_stats.input_layernorm.median")
    assert ds.features[i].tolist() == [4096, 4096, 1]
    phi = next(s for s in ds.meta["sources"] if "phi-2" in s["path"])
    assert set(ds.features[phi["dataset_rows"][0]:phi["dataset_rows"][1], 2].tolist()) == {0}
    # vidur PROVENANCE: h100_pairwise_nvlink/send_recv.csv is a byte-identical copy of the A100 one (not imported)
    assert I.sha256(d / "vidur/network/h100_pairwise_nvlink/send_recv.csv") == \
        I.sha256(d / "vidur/network/a100_pairwise_nvlink/send_recv.csv")


def test_llmcompass_rows_are_spot_checks(imported):
    g = imported[1][("gemm", "a100-80gb")]
    spot = I.role_mask(g, "spot_check")
    assert spot.sum() == 20
    assert g.features[spot][0].tolist() == [64, 12288, 12288] and math.isclose(g.time_s[spot][0], 0.19e-3)
    assert not (spot & I.role_mask(g, "train")).any()


def test_importers_are_deterministic(shared_data):
    a, b = I.import_estimate_train_time(shared_data), I.import_estimate_train_time(shared_data)
    for x, y in zip(a, b):
        assert (x.kind, x.gpu) == (y.kind, y.gpu) and np.array_equal(x.features, y.features)
        assert np.array_equal(x.time_s, y.time_s) and x.meta == y.meta


def test_module_entry_point_runs_the_cli(tmp_path):
    # `python -m costmodel.fitting.datasets.importers` (the package's __main__ -> cli.main): a data folder without the
    # sources is a one-line error and exit status 2
    r = subprocess.run([sys.executable, "-m", "costmodel.fitting.datasets.importers", "--data-dir", str(tmp_path)],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 2, r.stderr
    assert r.stderr.strip().splitlines()[-1] == f"error: no aiconfigurator folder under {tmp_path.resolve()}; point " \
                                                 "PLANNER_DATA_DIR at shared/data"
