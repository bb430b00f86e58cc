"""Fuzzing the input boundaries (issue 6, item 3).

Generated malformed inputs (random bytes, truncated files, wrong types, huge / negative numbers,
NaN / inf, unicode, empty files) go to every loader planner reads user files with. Each one must
either load (when the mangling happened to leave a valid file) or raise ``PlannerError`` - never
another exception - within a budget of work: the Python function calls one input may make
(``CALL_BUDGET``, counted with ``sys.setprofile``; an input that exceeds it is stopped and fails). The count
does not depend on the machine or its load, unlike a wall-clock bound; the loaders' speed itself is
benchmarks/bench_components.py's business (``fuzz_*`` lines). ``HANG_GUARD_S`` only stops an input stuck
in a loop that calls no function, so that the test fails instead of hanging. The generators use a seeded
``random.Random`` so every run tries the same inputs; the total is counted and asserted (>= 1,000).
"""

from __future__ import annotations

import json
import math
import random
import shutil
from functools import partial
from pathlib import Path

import numpy as np

from tests import fuzzing
from tests.fuzzing import (  # noqa: F401
    BAD_VALUES,
    BATCH_BASE,
    CALLS,
    FIXTURES,
    MODELS_DIR,
    SEED,
    _budgeted,
    _check,
    _count_per_test,
    _dumps,
    _mutate_bytes,
    _mutate_json,
    _report,
)


def test_the_budget_stops_a_runaway_input(monkeypatch):
    """The budget can fail: a loop of Python calls past it is stopped, also when the code swallows the stop;
    a loop that calls nothing is stopped by the hang guard; an input within the budget runs to the end."""
    def step():
        return 1

    def runaway():
        while True:
            step()

    def swallowing():
        for _ in range(3000):
            try:
                step()
            except BaseException:  # noqa: BLE001 - a loader that swallows everything
                pass
        return "finished"

    def spin():
        x = 0
        while True:
            x += 1

    failures: list = []
    assert _budgeted("t", runaway, failures, budget=1000) == (False, None)
    assert _budgeted("t", swallowing, failures, budget=1000) == (False, None)
    assert _budgeted("t", lambda: sum(step() for _ in range(300)), failures, budget=1000) == (True, 300)
    assert CALLS["t"] > 1000 and len(failures) == 2 and all("more than 1,000 Python calls" in f for f in failures)
    monkeypatch.setattr(fuzzing, "HANG_GUARD_S", 0.2)
    assert _budgeted("t", spin, failures, budget=1000) == (False, None)
    assert "hang guard" in failures[-1]


# ------------------------------------------------------------------------------------ config.json
def test_fuzz_hf_config(tmp_path):
    from costmodel.core.specs.hf_config import from_hf_config

    rng = random.Random(SEED)
    bases = sorted(FIXTURES.glob("hf_configs/*.json"))
    assert bases
    failures: list = []
    f = tmp_path / "config.json"
    for i in range(300):
        base = rng.choice(bases)
        if i % 2:
            f.write_bytes(_mutate_bytes(rng, base.read_bytes()))
        else:
            doc = json.loads(base.read_text())
            for _ in range(rng.randrange(1, 4)):
                doc = _mutate_json(rng, doc)
            f.write_text(_dumps(doc), encoding="utf-8")
        _check("config.json", lambda: from_hf_config(f), failures)
    # the same documents passed inline (the batch predictor's {"model": {...}})
    for _ in range(100):
        doc = json.loads(rng.choice(bases).read_text())
        doc = _mutate_json(rng, doc)
        _check("config.json", partial(from_hf_config, doc), failures)
    # exhaustively: every top-level field of every fixture config set to every bad value
    for base in bases:
        doc = json.loads(base.read_text())
        for key in sorted(doc):
            for bad in BAD_VALUES:
                spec = _check("config.json", partial(from_hf_config, {**doc, key: bad}), failures)
                if spec is not None and spec.rope_theta is not None and not math.isfinite(spec.rope_theta):
                    failures.append(f"config.json {base.name} {key}={bad!r}: non-finite rope_theta accepted")
    _report(failures, "config.json")


# ------------------------------------------------------------------------------------ batch predictor


def test_fuzz_batch_predictor():
    from planner.cli_predict import predict_one, run_batch
    from planner.requests import REQUEST_KEYS

    rng = random.Random(SEED + 1)
    keys = list(REQUEST_KEYS)
    failures: list = []
    lines = []
    for i in range(250):
        raw = dict(BATCH_BASE)
        for _ in range(rng.randrange(1, 3)):
            raw[rng.choice(keys)] = rng.choice(BAD_VALUES)
        if i % 10 == 0:
            raw[rng.choice(["ünknown", "TP", ""])] = 1
        pred = _check("batch request", partial(predict_one, raw), failures)
        if pred is not None:
            t = pred["iteration_time_s"]
            if not (math.isfinite(t) and t > 0 and math.isfinite(pred["memory_gib_per_gpu"])):
                failures.append(f"batch request {raw}: silent nonsense iteration_time_s={t}")
        lines.append(_dumps(raw))
    # exhaustively: every request key set to every bad value
    for key in keys:
        for bad in BAD_VALUES:
            raw = {**BATCH_BASE, key: bad}
            pred = _check("batch request", partial(predict_one, raw), failures)
            if pred is not None and not (math.isfinite(pred["iteration_time_s"]) and pred["iteration_time_s"] > 0):
                failures.append(f"batch request {raw}: silent nonsense iteration_time_s={pred['iteration_time_s']}")
    # whole lines: truncated JSON, random text, non-objects; each yields a record with 'error'
    for _ in range(150):
        line = _dumps(BATCH_BASE)
        k = rng.randrange(3)
        if k == 0:
            line = line[:rng.randrange(len(line))]
        elif k == 1:
            line = "".join(chr(rng.randrange(32, 0x2FF)) for _ in range(rng.randrange(1, 60)))
        else:
            line = _dumps(rng.choice(BAD_VALUES))
        lines.append(line)
    recs = []
    for line in lines:
        def one(line=line):
            recs.extend(run_batch([line]))
        _check("batch line", one, failures)
    assert len(recs) == sum(1 for x in lines if x.strip())
    for rec in recs:
        if "error" in rec:
            assert rec["error"] and "\n" not in rec["error"]
        else:
            assert math.isfinite(rec["iteration_time_s"]) and rec["iteration_time_s"] > 0
    _report(failures, "batch request", "batch line")


# ------------------------------------------------------------------------------------ datasets
def _tiny_dataset(tmp_path: Path) -> Path:
    from costmodel.core.kinds import FEATURES
    from costmodel.fitting.datasets.schema import Dataset, save_dataset

    kind = "gemm" if "gemm" in FEATURES else sorted(FEATURES)[0]
    nf = len(FEATURES[kind])
    rng = np.random.default_rng(0)
    ds = Dataset(kind, "a100-80gb", rng.integers(1, 4096, size=(6, nf)).astype(float),
                 np.array(["fwd", "bwd"] * 3, dtype=object), np.array(["bf16"] * 6, dtype=object),
                 rng.uniform(1e-5, 1e-3, 6), meta={"notes": "fuzz base"})
    return save_dataset(ds, tmp_path / "base" / "ds.csv")


def test_fuzz_dataset_loader(tmp_path):
    from costmodel.fitting.datasets.schema import load_dataset

    base = _tiny_dataset(tmp_path)
    csv_bytes, side_bytes = base.read_bytes(), base.with_suffix(".json").read_bytes()
    load_dataset(base)  # the unmangled base loads
    rng = random.Random(SEED + 2)
    failures: list = []
    target = tmp_path / "fz" / "ds.csv"
    target.parent.mkdir()
    for i in range(200):
        csv_out, side_out = csv_bytes, side_bytes
        if i % 3 == 0:
            csv_out = _mutate_bytes(rng, csv_bytes)
        elif i % 3 == 1:
            side_out = _mutate_bytes(rng, side_bytes)
        else:
            side_out = _dumps(_mutate_json(rng, json.loads(side_bytes))).encode()
        target.write_bytes(csv_out)
        target.with_suffix(".json").write_bytes(side_out)
        _check("dataset", lambda: load_dataset(target), failures)
    _report(failures, "dataset")


# ------------------------------------------------------------------------------------ model artifacts
def _small_artifact() -> tuple[Path, Path]:
    """The smallest shipped model JSON with its sidecar (fast to mangle and parse)."""
    from costmodel.cost.regressors.io import sidecar_path

    cands = [p for p in MODELS_DIR.glob("*/*.json")
             if not p.name.endswith((".meta.json", ".interval.json")) and sidecar_path(p).is_file()]
    assert cands, "no shipped artifacts under costmodel/data/models"
    main = min(cands, key=lambda p: p.stat().st_size)
    return main, sidecar_path(main)


def test_fuzz_artifact_loader(tmp_path, monkeypatch):
    from costmodel.cost.regressors.io import sidecar_path
    from costmodel.cost.regressors.runtime import RuntimeRegressor

    monkeypatch.setenv("PLANNER_CACHE_DIR", str(tmp_path / "cache"))
    main, side = _small_artifact()
    work = tmp_path / "m"
    work.mkdir()
    dst = work / main.name
    shutil.copy(main, dst)
    shutil.copy(side, sidecar_path(dst))
    extra = json.loads(side.read_text()).get("extra_files", {})
    for name in extra.values():
        shutil.copy(main.with_name(name), work / name)
    RuntimeRegressor(dst)  # the unmangled copy loads
    main_bytes, side_bytes = main.read_bytes(), side.read_bytes()
    main_doc = json.loads(main_bytes)
    rng = random.Random(SEED + 3)
    failures: list = []
    for i in range(150):
        m_out, s_out = main_bytes, side_bytes
        k = i % 4
        if k == 0:
            m_out = _mutate_bytes(rng, main_bytes)
        elif k == 1:
            m_out = _dumps(_mutate_json(rng, main_doc)).encode()
        elif k == 2:
            s_out = _mutate_bytes(rng, side_bytes)
        else:
            s_out = _dumps(_mutate_json(rng, json.loads(side_bytes))).encode()
        dst.write_bytes(m_out)
        sidecar_path(dst).write_bytes(s_out)
        _check("artifact", lambda: RuntimeRegressor(dst), failures)
    # every sidecar field and every learner parameter set to every bad value, exhaustively
    side_doc = json.loads(side_bytes)
    dst.write_bytes(main_bytes)
    for key in sorted(side_doc):
        for bad in BAD_VALUES:
            sidecar_path(dst).write_text(_dumps({**side_doc, key: bad}), encoding="utf-8")
            _check("artifact", lambda: RuntimeRegressor(dst), failures)
    sidecar_path(dst).write_bytes(side_bytes)
    learner = main_doc["learner"]
    for key in sorted(learner["learner_model_param"]):
        for bad in BAD_VALUES:
            doc = {**main_doc, "learner": {**learner, "learner_model_param": {**learner["learner_model_param"],
                                                                                key: bad}}}
            dst.write_text(_dumps(doc), encoding="utf-8")
            _check("artifact", lambda: RuntimeRegressor(dst), failures)
    _report(failures, "artifact")


# ------------------------------------------------------------------------------------ calibrations
def test_fuzz_calibration_loader(tmp_path):
    from planner.calibrate import identity, load_calibration, save_calibration

    good = save_calibration(identity({"compute_scale": 1.2, "comm_scale": 0.9, "overlap_efficiency": 0.5,
                                      "iteration_overhead_s": 0.1}, name="fuzzbase"), tmp_path)
    load_calibration(good)
    base_bytes = good.read_bytes()
    base_doc = json.loads(base_bytes)
    rng = random.Random(SEED + 4)
    failures: list = []
    f = tmp_path / "cal.json"
    for i in range(150):
        if i % 2:
            f.write_bytes(_mutate_bytes(rng, base_bytes))
        else:
            doc = _mutate_json(rng, base_doc)
            if rng.random() < 0.5 and isinstance(doc, dict):
                doc["constants"] = {**base_doc["constants"], rng.choice(list(base_doc["constants"])):
                                    rng.choice(BAD_VALUES)}
            f.write_text(_dumps(doc), encoding="utf-8")
        if i % 5 == 4:  # every top-level field or constant set to a bad value, in turn
            k = i // 5
            doc = dict(base_doc)
            fields = sorted(doc) + [f"constants.{c}" for c in sorted(base_doc["constants"])]
            field = fields[k % len(fields)]
            bad = BAD_VALUES[k % len(BAD_VALUES)]
            if field.startswith("constants."):
                doc["constants"] = {**doc["constants"], field.split(".", 1)[1]: bad}
            else:
                doc[field] = bad
            f.write_text(_dumps(doc), encoding="utf-8")
        cal = _check("calibration", lambda: load_calibration(f), failures)
        if cal is not None:
            for name in ("compute_scale", "comm_scale", "overlap_efficiency", "iteration_overhead_s"):
                v = cal.value(name)
                if not math.isfinite(v):
                    failures.append(f"calibration loaded a non-finite {name}={v}")
    _report(failures, "calibration")


# ------------------------------------------------------------------------------------ run files
def test_fuzz_run_loader(tmp_path):
    from planner.validation.runs import load_runs

    base = (FIXTURES / "runs_small.csv").read_bytes()
    rng = random.Random(SEED + 5)
    failures: list = []
    f = tmp_path / "runs.csv"
    for _ in range(150):
        f.write_bytes(_mutate_bytes(rng, base))
        _check("run file", lambda: load_runs(f), failures)
    _report(failures, "run file")


# ------------------------------------------------------------------------------------ hardware files
HW_TOML = b"""[gpus.fuzz-gpu]
display_name = "Fuzz GPU"
peak_tflops = { bf16 = 900.0, fp8 = 1800.0 }
hbm_gb = 80
hbm_bw_gbs = 3000.0
nvlink_bw_gbs = 450.0
default_cluster = "fuzz-node"

[clusters.fuzz-node]
gpu = "fuzz-gpu"
gpus_per_node = 8
intra_node_bw_gbs = 450.0
intra_node_latency_us = 5.0
inter_node_bw_gbs = 50.0
inter_node_latency_us = 10.0
"""

HW_YAML = b"""gpus:
  fuzz-gpu:
    peak_tflops: {bf16: 900.0, fp8: 1800.0}
    hbm_gb: 80
    hbm_bw_gbs: 3000.0
    nvlink_bw_gbs: 450.0
    default_cluster: fuzz-node
clusters:
  fuzz-node:
    gpu: fuzz-gpu
    gpus_per_node: 8
    intra_node_bw_gbs: 450.0
    intra_node_latency_us: 5.0
    inter_node_bw_gbs: 50.0
    inter_node_latency_us: 10.0
"""


def test_fuzz_hardware_files(tmp_path):
    import yaml

    from costmodel.core.specs.catalogue import load_catalogue

    for name, text in (("hw.toml", HW_TOML), ("hw.yaml", HW_YAML)):
        p = tmp_path / "ok" / name
        p.parent.mkdir(exist_ok=True)
        p.write_bytes(text)
        load_catalogue([p]).resolve("fuzz-gpu")  # the unmangled bases load
    base_doc = yaml.safe_load(HW_YAML)
    rng = random.Random(SEED + 6)
    failures: list = []
    for i in range(200):
        # a fresh path each time: the catalogue is cached per (path, mtime)
        if i % 3 == 0:
            p = tmp_path / f"h{i}.toml"
            p.write_bytes(_mutate_bytes(rng, HW_TOML))
        elif i % 3 == 1:
            p = tmp_path / f"h{i}.yaml"
            p.write_bytes(_mutate_bytes(rng, HW_YAML))
        else:
            p = tmp_path / f"h{i}.yaml"
            doc = base_doc
            for _ in range(rng.randrange(1, 3)):
                doc = _mutate_json(rng, doc)
            p.write_text(yaml.safe_dump(doc, allow_unicode=True), encoding="utf-8")

        def load(p=p):
            cat = load_catalogue([p])
            hw = cat.resolve("a100-80gb")
            for g in cat.gpus.values():
                assert all(math.isfinite(v) and v > 0 for v in g.peak_tflops.values()), g
            return hw
        _check("hardware file", load, failures)
    _report(failures, "hardware file")
