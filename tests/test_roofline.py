"""RooflineCostModel: accuracy on measured rows held out of a refit of its table, monotonicity, fallbacks.

Hardware is built directly with figures from shared/data/hardware/{gpus,clusters}.yaml.
"""
import copy
import zlib

import numpy as np
import pytest

from costmodel.core.specs.hardware import ClusterSpec, GPUSpec, Hardware
from costmodel.cost.roofline import RooflineCostModel, load_table
from costmodel.fitting import efficiency as E
from costmodel.fitting.datasets.importers import AIC_NCCL_OPS, read_table
from costmodel.fitting.datasets.importers.estimate_train_time import ETT_LINEAR
from costmodel.graph.conventions import busbw_factor, gemm_bytes, gemm_flops
from costmodel.graph.ops import Op


def _hw(name, peak, hbm_bw, gpn, intra_bw, inter_bw):
    gpu = GPUSpec(name=name, display_name=name, peak_tflops=peak, hbm_gb=80, hbm_bw_gbs=hbm_bw,
                  nvlink_bw_gbs=intra_bw, default_cluster=f"{name}-node")
    cl = ClusterSpec(name=f"{name}-node", display_name="", gpu=name, gpus_per_node=gpn,
                     intra_node_bw_gbs=intra_bw, intra_node_latency_us=0.0,
                     inter_node_bw_gbs=inter_bw, inter_node_latency_us=0.0)
    return Hardware(gpu, cl)


# gpus.yaml dense peaks, hbm_bw_gbytes_s, nvlink unidirectional; clusters.yaml nic_gbytes_s_per_gpu
H100 = _hw("h100-sxm", {"bf16": 989.4, "fp16": 989.4, "fp8": 1978.9}, 3350, 8, 450, 50)
A100 = _hw("a100-80gb", {"bf16": 312, "fp16": 312}, 2039, 8, 300, 25)
B200 = _hw("b200", {"bf16": 2250, "fp16": 2250, "fp8": 4500}, 8000, 8, 900, 50)
GH200 = _hw("gh200", {"bf16": 989, "fp16": 989, "fp8": 1979}, 4000, 1, 450, 50)
MI300X = _hw("mi300x", {"bf16": 1307.4, "fp16": 1307.4, "fp8": 2614.9}, 5300, 8, 448, 50)


def gemm(m, n, k, dtype="bf16"):
    return Op("gemm", "g", "fwd", (m, n, k), dtype=dtype)


def coll(kind, nbytes, ranks, nodes, rpn):
    return Op(kind, "c", "dp_comm", (nbytes, ranks, nodes, rpn))


def _csv(data, pattern, header):
    """The one source file matching ``pattern``, read with the importers' header check."""
    (path,) = sorted(data.glob(pattern))
    return read_table(data, path, header)


def _median_err(model, ops, measured, hw):
    pred = model.predict(ops, hw).time_s
    return float(np.median(np.abs(pred / np.asarray(measured) - 1)))


@pytest.mark.parametrize("hw,system", [(H100, "h100_sxm"), (A100, "a100_sxm"), (B200, "b200_sxm")])
def test_gemm_accuracy_on_held_out_shapes(shared_data, hw, system):
    """The GEMM efficiency table is refitted (costmodel.fitting.efficiency.fit_gemm_table, as the shipped table
    is) on 80 % of the measured shapes and scored on the other 20 %, which it never saw."""
    t = _csv(shared_data, f"aiconfigurator/gemm/{system}_bf16_gemm__*.csv", ("m", "n", "k", "latency_ms"))
    m, n, k = (np.asarray(t[c], dtype=np.int64) for c in ("m", "n", "k"))
    held = (m * 31 + n * 17 + k * 7) % 5 == 0  # by shape: a held-out shape has no row in the fit
    assert 0.1 < held.mean() < 0.3
    seconds = np.asarray(t["latency_ms"], dtype=float) * 1e-3
    table = copy.deepcopy(load_table())
    den = table["gpus"][hw.gpu.name]["denominators"]
    flops, nbytes = gemm_flops(m, n, k), gemm_bytes(m, n, k, "bf16")
    fit = E.fit_gemm_table(flops[~held], nbytes[~held], seconds[~held], den["bf16_tflops"] * 1e12,
                           den["hbm_bw_gbs"] * 1e9, float(seconds[~held].min()))
    table["gpus"][hw.gpu.name]["gemm"]["bf16"].update(fit)
    idx = np.flatnonzero(held)
    ops = [gemm(int(m[i]), int(n[i]), int(k[i])) for i in idx]
    err = _median_err(RooflineCostModel(table), ops, seconds[idx], hw)
    # actual median |pred/meas - 1| on the held-out shapes: h100 0.082, a100 0.13, b200 0.16
    assert err < 0.25, err


def _held(*keys):
    """A deterministic ~20 % of rows, chosen by the row's key (its shape or configuration), so that a
    held-out key has no row at all in the refit."""
    key = [zlib.crc32(repr(tuple(float(x) for x in k)).encode()) for k in zip(*keys)]
    return np.asarray(key) % 5 == 0


def _ett(data, system, name, header):
    return _csv(data, f"estimate-train-time/{system}/{name}", header)


def test_ett_linear_rows_are_another_basis_than_training_gemms(shared_data):
    """GH200 has no GEMM table: estimate-train-time's Vista linear rows (torch.rand inputs) run above the maximum
    achievable matmul rate stas00's mamf-finder measured on a GH200 (hardware/mamf.csv, normal inputs), which no
    training GEMM reaches (costmodel.graph.kernel_basis.ETT_GEMM_INPUTS); they are imported as other_basis."""
    assert "bf16" not in load_table()["gpus"]["gh200"].get("gemm", {})
    mamf = next(float(r.split(",")[3]) for r in (shared_data / "hardware" / "mamf.csv").read_text().splitlines()
                if r.startswith("NVIDIA GH200") and ",bfloat16," in r)
    header = ("mp", "b", "l", "dim", "F_dur(us)", "B_dur(us)")
    t = _ett(shared_data, "Vista", "operator/NVIDIAGH200120GB_linear3_fp16.csv", header)
    mp, b, seq, dim = (np.asarray(t[c], dtype=float) for c in ("mp", "b", "l", "dim"))
    n_of, k_of = ETT_LINEAR["linear3"]
    rate = gemm_flops(seq * b, n_of(mp, dim), k_of(mp, dim)) / (np.asarray(t["F_dur(us)"], dtype=float) * 1e-6)
    assert rate.max() / 1e12 > 1.04 * mamf, (rate.max() / 1e12, mamf)


@pytest.mark.parametrize("hw,system", [(H100, "h100_sxm"), (A100, "a100_sxm")])
def test_intra_node_collective_accuracy_on_held_out_sizes(shared_data, hw, system):
    """Each aiconfigurator (op, GPUs) alpha-beta entry is refitted (costmodel.fitting.efficiency.fit_alpha_beta, as
    the shipped one is) without two of the ten message sizes >= 1 MiB (2 MiB and 64 MiB), which are scored."""
    t = _csv(shared_data, f"aiconfigurator/nccl/{system}_nccl_fp16__*.csv",
             ("op_name", "num_gpus", "message_size", "latency_ms"))
    table = copy.deepcopy(load_table())
    intra = table["gpus"][hw.gpu.name]["collectives"]["intra"]
    link_bw = hw.cluster.intra_node_bw_gbs * 1e9
    names, gpus = np.asarray(t["op_name"]), np.asarray(t["num_gpus"], dtype=int)
    nbytes, secs = 2 * np.asarray(t["message_size"], dtype=float), np.asarray(t["latency_ms"], dtype=float) * 1e-3
    held = np.round(np.log2(nbytes)) % 5 == 1  # 2^21 and 2^26 bytes
    ops, meas = [], []
    for name, kind in AIC_NCCL_OPS.items():
        for n in sorted(set(gpus[names == name])):
            sel = (names == name) & (gpus == n)
            factor = float(busbw_factor(kind, n))
            full = E.fit_alpha_beta(nbytes[sel], secs[sel], factor, link_bw)  # the shipped entry's rows
            assert full["eff"] == pytest.approx(intra[kind][str(n)]["eff"], rel=1e-3), (kind, n)
            fit = E.fit_alpha_beta(nbytes[sel & ~held], secs[sel & ~held], factor, link_bw)
            intra[kind][str(n)].update(alpha_us=fit["alpha_us"], eff=fit["eff"])
            score = sel & held & (nbytes >= E.LARGE_MESSAGE_BYTES)
            assert score.sum() == 2, (kind, n)
            ops += [coll(kind, s, int(n), 1, int(n)) for s in nbytes[score]]
            meas += list(secs[score])
    err = _median_err(RooflineCostModel(table), ops, meas, hw)
    assert err < 0.25, err  # actual on the held-out sizes: h100 0.027, a100 0.030


def test_inter_node_allreduce_accuracy_vista_on_held_out_sizes(shared_data):
    """GH200's inter-node all-reduce efficiencies (costmodel.fitting.efficiency.fit_bandwidth_only over Vista's
    allreduce and allreduce_large files, per node count) are refitted without the held-out message sizes,
    which are scored."""
    table = copy.deepcopy(load_table())
    inter = table["gpus"]["gh200"]["collectives"]["inter"]["all_reduce"]
    link_bw = GH200.cluster.inter_node_bw_gbs * 1e9
    header = ("shape", "nodes", "GPUsPerNode", "dur(us)")
    ops, meas = [], []
    for nodes in (2, 4, 8):
        parts = [_ett(shared_data, "Vista", f"nccl/NVIDIAGH200120GB_{f}_fp16_{nodes}_1.csv", header)
                 for f in ("allreduce", "allreduce_large")]
        nbytes = 2 * np.concatenate([np.asarray(p["shape"], dtype=float) for p in parts])
        secs = np.concatenate([np.asarray(p["dur(us)"], dtype=float) for p in parts]) * 1e-6
        held = _held(nbytes)
        assert 0.1 < held.mean() < 0.3
        factor = float(busbw_factor("all_reduce", nodes))
        full = E.fit_bandwidth_only(nbytes, secs, factor, link_bw)  # the shipped entry's rows
        assert full["eff"] == pytest.approx(inter[str(nodes)]["eff"], rel=1e-3), nodes
        inter[str(nodes)]["eff"] = E.fit_bandwidth_only(nbytes[~held], secs[~held], factor, link_bw)["eff"]
        ops += [coll("all_reduce", s, nodes, nodes, 1) for s in nbytes[held]]
        meas += list(secs[held])
    err = _median_err(RooflineCostModel(table), ops, meas, GH200)
    assert err < 0.25, err  # actual on the held-out sizes: 0.020


def test_bigger_gemm_never_faster():
    m = RooflineCostModel()
    rng = np.random.default_rng(0)
    for hw in (H100, A100, B200, MI300X):
        for dtype in ("bf16", "fp8"):
            base = rng.integers(1, 16384, size=(200, 3))
            grow = base * rng.integers(1, 4, size=(200, 3))
            t0 = m.predict([gemm(*map(int, r), dtype=dtype) for r in base], hw).time_s
            t1 = m.predict([gemm(*map(int, r), dtype=dtype) for r in grow], hw).time_s
            assert np.all(t1 >= t0 * (1 - 1e-9))
        sizes = 2.0 ** np.arange(8, 50)
        ts = m.predict([gemm(int(s ** (1 / 3)) + 1, int(s ** (1 / 3)) + 1, int(s ** (1 / 3)) + 1) for s in sizes],
                       hw).time_s
        assert np.all(np.diff(ts) >= 0)


def test_more_bytes_never_faster_and_inter_slower_than_intra():
    m = RooflineCostModel()
    sizes = 2.0 ** np.arange(10, 34)
    for kind in ("all_reduce", "all_gather", "reduce_scatter", "all_to_all", "send_recv"):
        intra = m.predict([coll(kind, s, 8, 1, 8) for s in sizes], H100).time_s
        inter = m.predict([coll(kind, s, 16, 2, 8) for s in sizes], H100).time_s
        flat_inter = m.predict([coll(kind, s, 8, 8, 1) for s in sizes], H100).time_s
        assert np.all(np.diff(intra) > 0) and np.all(np.diff(inter) > 0)
        assert np.all(flat_inter > intra)
        assert np.all(inter > intra)
    norms = m.predict([Op("norm", "n", "fwd", (t, 4096, 1)) for t in (128, 1024, 8192, 65536)], H100).time_s
    assert np.all(np.diff(norms) > 0)


def test_fp8_gemm_faster_than_bf16_on_h100():
    m = RooflineCostModel()
    shapes = [(8192, 8192, 8192), (16384, 4096, 4096), (4096, 14336, 4096)]
    bf16 = m.predict([gemm(*s) for s in shapes], H100).time_s
    fp8 = m.predict([gemm(*s, dtype="fp8") for s in shapes], H100).time_s
    assert np.all(fp8 < bf16)


def test_gpu_without_data_gets_warning():
    m = RooflineCostModel()
    r = m.predict([gemm(4096, 4096, 4096), coll("all_reduce", 1e8, 8, 1, 8)], MI300X)
    assert "no measured data for mi300x: efficiencies are the median of measured GPUs" in r.warnings
    assert r.method == ["roofline", "roofline"]
    assert np.all(r.time_s > 0)
    measured = m.predict([gemm(4096, 4096, 4096)], H100)
    assert not any("no measured data for h100-sxm" in w for w in measured.warnings)


def test_every_kind_supported_and_positive():
    from costmodel.core.kinds import FEATURES

    m = RooflineCostModel()
    feats = {"gemm": (1024, 1024, 1024), "attention_fwd": (1, 2048, 2048, 32, 8, 128, 1),
             "attention_bwd": (1, 2048, 2048, 32, 8, 128, 1), "norm": (4096, 4096, 1), "activation": (4096, 14336),
             "rope": (4096, 32, 128), "residual_add": (4096 * 4096,), "embedding": (4096, 4096, 128256),
             "cross_entropy": (4096, 128256), "optimizer": (8e9,)}
    ops = [Op(k, k, "fwd", feats.get(k, (1e8, 16, 2, 8))) for k in FEATURES]
    assert all(m.supports(k, H100) for k in FEATURES)
    t = m.predict(ops, H100).time_s
    assert np.all(t > 0) and np.all(np.isfinite(t))
    bwd = m.predict([Op("attention_bwd", "a", "bwd", feats["attention_bwd"])], A100).time_s
    fwd = m.predict([Op("attention_fwd", "a", "fwd", feats["attention_fwd"])], A100).time_s
    assert 2 < bwd[0] / fwd[0] < 4  # A100 flash_atten B/F median 3.1 (estimate-train-time)


def test_single_gpu_collective_is_free_and_gh200_has_inter_tier_only():
    m = RooflineCostModel()
    assert m.predict([coll("all_reduce", 1e9, 1, 1, 1)], H100).time_s[0] == 0
    t = m.predict([coll("all_reduce", 1e9, 4, 4, 1)], GH200).time_s[0]
    # inter tier only: 2(n-1)/n * bytes / (50 GB/s * eff), eff ~0.93 from Vista
    assert 1.5e9 / 50e9 < t < 1.5e9 / (50e9 * 0.8)


def test_a_repeated_prediction_is_the_same():
    # its speed when cached: benchmarks/bench_components.py (roofline_cached_s)
    m = RooflineCostModel()
    ops = [gemm(4096 + i, 4096, 4096) for i in range(60)] + \
          [Op("attention_fwd", "a", "fwd", (1, 4096, 4096, 32, 8, 128, 1))] * 10 + \
          [coll("all_reduce", 1e8 + i, 16, 2, 8) for i in range(30)]
    first = m.predict(ops, H100)
    assert np.array_equal(m.predict(ops, H100).time_s, first.time_s)
    assert np.array_equal(RooflineCostModel().predict(ops, H100).time_s, first.time_s)  # the cache changes nothing
