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
import signal
import sys
from functools import partial
from pathlib import Path

import numpy as np
import pytest

from costmodel.core.errors import PlannerError

FIXTURES = Path(__file__).parent / "fixtures"
MODELS_DIR = Path(__file__).resolve().parents[1] / "costmodel" / "data" / "models"
CALL_BUDGET = {"config.json": 100_000, "batch request": 500_000, "batch line": 100_000, "dataset": 100_000,
               "artifact": 100_000, "calibration": 100_000, "run file": 100_000, "hardware file": 6_500_000,
               "cli": 1_000_000}
"""Most Python function calls one malformed input may make, per loader: about 10x the most any input made
on 2026-11-26 (config.json 144, batch request 43,114, batch line 4,346, dataset 91, artifact 891,
calibration 27, run file 2,040, hardware file 606,139 (the 100,000-deep nesting bomb in YAML),
cli 97,048) and at least 100,000 (a lazy import on the first input), so a library upgrade or another test
order does not trip it, while a loop that grows with a mangled number (a layer count of 2**63, a retry
loop) does."""
CLI_CALL_BUDGET = {"calibrate": 1_000_000, "compare": 30_000_000, "costmodel report": 8_000_000,
                   "explain": 2_000_000, "export": 400_000, "fit": 400_000, "gpus": 400_000, "models": 400_000,
                   "predict": 700_000, "profile": 400_000, "search": 5_000_000, "size": 75_000_000,
                   "validate": 1_500_000}
"""The same per command for test_fuzz_every_cli_flag, about 10x the most one command line made on
2026-11-26: calibrate 88,975, compare 2,910,108, costmodel report 817,754, explain 155,217, export 36,643,
fit 32,908, gpus 33,721, models 31,498, predict 68,480, profile 32,448, search 420,549 (3 trials),
size 7,337,730 (the valid base command line does this much), validate 121,647."""
HANG_GUARD_S = 120
"""Stops an input stuck in a loop that calls no function (the call budget cannot see it): a hang guard,
not a speed check (every input here takes milliseconds to seconds)."""
CALLS: dict[str, int] = {}
"""Most calls one input of each loader made in the running test (printed with -s)."""
SEED = 20261122

# Values that are wrong for almost any field: wrong types, huge / negative / zero numbers, NaN / inf,
# unicode and empty strings, containers where scalars belong.
BAD_VALUES = [None, True, False, 0, -1, -7, 1.5, -0.0, 2**52, 2**63, 10**30, -(10**30), 10**400, 1e308, -1e308,
              float("nan"), float("inf"), float("-inf"), "", "x", "12", "ünïcødé ✓", "\x00", "1e999",
              [], [1, 2], {}, {"a": 1}, [None], "NaN"]

COUNTS: dict[str, int] = {}
"""Malformed inputs tried per loader in the running test (emptied before each test)."""
MIN_INPUTS = {"config.json": 6000, "batch request": 700, "batch line": 400, "dataset": 200, "artifact": 1000,
              "calibration": 150, "run file": 150, "hardware file": 200, "cli": 40, "cli-flags": 1000}
"""The fewest malformed inputs each loader's test must try (each test checks its own, so the total holds
whatever order or subset of the tests runs; on 2026-11-25 they tried 6,490 / 790 / 400 / 200 / 1,050 /
150 / 150 / 200 / 40 / 1,339)."""


@pytest.fixture(autouse=True)
def _count_per_test():
    COUNTS.clear()
    CALLS.clear()
    yield
    print({k: v for k, v in CALLS.items()})


class _Stopped(BaseException):
    """Raised inside the code under test when an input exceeds its budget (a BaseException, so that a
    loader's ``except Exception`` cannot swallow it)."""


def _budgeted(label: str, fn, failures: list, budget: int | None = None, what: str = "", key: str = ""):
    """Run ``fn`` counting its Python function calls; past ``budget`` (default CALL_BUDGET[label]) or
    HANG_GUARD_S it is stopped and a failure recorded (``what`` describes the input there). CALLS keeps the
    most calls per ``key`` (default ``label``). Returns (ran to the end, result or exception)."""
    budget = CALL_BUDGET[label] if budget is None else budget
    COUNTS[label] = COUNTS.get(label, 0) + 1
    calls = 0
    why = []

    def count(frame, event, arg):
        nonlocal calls
        if event == "call":
            calls += 1
            if calls > budget and not why:
                why.append(f"more than {budget:,} Python calls")
                raise _Stopped

    def hung(signum, frame):
        why.append(f"still running after {HANG_GUARD_S} s (hang guard)")
        raise _Stopped

    old = signal.signal(signal.SIGALRM, hung)
    signal.setitimer(signal.ITIMER_REAL, HANG_GUARD_S)
    sys.setprofile(count)
    outcome: object = None
    try:
        outcome = fn()
    except _Stopped:
        pass
    except Exception as exc:  # noqa: BLE001 - returned to the caller, which judges it
        outcome = exc
    finally:
        sys.setprofile(None)
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)
    key = key or label
    CALLS[key] = max(CALLS.get(key, 0), calls)
    if why:  # also when the code under test swallowed _Stopped (the profiler is then unset, the flag stays)
        failures.append(f"{label} {what}".strip() + f": stopped: {why[0]}")
        return False, None
    return True, outcome


def _check(label: str, fn, failures: list) -> object:
    """Run ``fn``; a PlannerError or a result is fine; any other exception, or exceeding the budget, is a
    failure."""
    done, outcome = _budgeted(label, fn, failures)
    if not done:
        return None
    if isinstance(outcome, PlannerError):
        msg = str(outcome)
        if not msg or "\n" in msg.strip():
            failures.append(f"{label}: PlannerError message is not one line: {msg!r}")
        return None
    if isinstance(outcome, Exception):
        failures.append(f"{label}: {type(outcome).__name__}: {str(outcome)[:200]}")
        return None
    return outcome


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
    monkeypatch.setattr(sys.modules[__name__], "HANG_GUARD_S", 0.2)
    assert _budgeted("t", spin, failures, budget=1000) == (False, None)
    assert "hang guard" in failures[-1]


def _report(failures: list, *labels: str) -> None:
    """No unclean outcome, and this test tried at least MIN_INPUTS of each of its loaders ``labels``."""
    for label in labels:
        assert COUNTS.get(label, 0) >= MIN_INPUTS[label], (label, COUNTS.get(label, 0), MIN_INPUTS[label])
    assert not failures, f"{len(failures)} unclean outcomes, e.g.:\n" + "\n".join(failures[:15])


# ------------------------------------------------------------------------------------ byte mutators
def _mutate_bytes(rng: random.Random, data: bytes) -> bytes:
    """One random corruption of a file's bytes."""
    op = rng.randrange(9)
    if op == 8:  # deeply nested brackets (a recursion bomb for recursive-descent parsers)
        i = rng.randrange(len(data) + 1)
        return data[:i] + rng.choice([b"[", b"{\"a\":", b"- "]) * rng.choice([50, 5000, 100000]) + data[i:]
    if op == 0:
        return bytes(rng.randrange(256) for _ in range(rng.randrange(1, 400)))  # random bytes
    if op == 1:
        return data[:rng.randrange(len(data) + 1)]  # truncated
    if op == 2:
        return b""  # empty
    if op == 3:  # flipped bytes
        b = bytearray(data)
        for _ in range(rng.randrange(1, 8)):
            if b:
                b[rng.randrange(len(b))] = rng.randrange(256)
        return bytes(b)
    if op == 4:  # unicode / NUL inserted
        i = rng.randrange(len(data) + 1)
        return data[:i] + rng.choice(["ü", "✓", "\x00", "\ufeff", "𝔘"]).encode() + data[i:]
    if op == 5:  # a number replaced by a huge / negative / non-finite one
        text = data.decode("utf-8", "replace")
        digits = [i for i, c in enumerate(text) if c.isdigit()]
        if digits:
            i = rng.choice(digits)
            j = i
            while j < len(text) and (text[j].isdigit() or text[j] == "."):
                j += 1
            text = text[:i] + rng.choice(["-5", "0", "1e999", "NaN", "Infinity", "-Infinity", "9" * 40,
                                          "-0.0", "1e-320", "inf", "nan"]) + text[j:]
        return text.encode()
    if op == 6:  # lines shuffled / duplicated / dropped
        lines = data.split(b"\n")
        k = rng.randrange(3)
        if k == 0:
            rng.shuffle(lines)
        elif k == 1 and lines:
            lines.insert(rng.randrange(len(lines) + 1), rng.choice(lines))
        elif lines:
            lines.pop(rng.randrange(len(lines)))
        return b"\n".join(lines)
    return data[rng.randrange(len(data) + 1):]  # head cut off


def _mutate_json(rng: random.Random, obj: object, depth: int = 0) -> object:
    """A copy of a parsed JSON document with one field changed, removed or added (recursively)."""
    if isinstance(obj, dict) and obj:
        out = dict(obj)
        key = rng.choice(list(out))
        op = rng.randrange(4)
        if op == 0:
            del out[key]
        elif op == 1:
            out[rng.choice(["ключ", "✓", "", "\x00", "__proto__", key.upper()])] = rng.choice(BAD_VALUES)
        elif op == 2 and isinstance(out[key], (dict, list)) and out[key] and depth < 6:
            out[key] = _mutate_json(rng, out[key], depth + 1)
        else:
            out[key] = rng.choice(BAD_VALUES)
        return out
    if isinstance(obj, list) and obj:
        out = list(obj)
        i = rng.randrange(len(out))
        op = rng.randrange(3)
        if op == 0:
            out.pop(i)
        elif op == 1 and isinstance(out[i], (dict, list)) and depth < 6:
            out[i] = _mutate_json(rng, out[i], depth + 1)
        else:
            out[i] = rng.choice(BAD_VALUES)
        return out
    return rng.choice(BAD_VALUES)


def _dumps(obj: object) -> str:
    """JSON with NaN / Infinity tokens allowed; huge ints that json cannot write become strings."""
    return json.dumps(obj, allow_nan=True, ensure_ascii=False, default=str)


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
BATCH_BASE = {"id": "r1", "model": "llama-7b", "gpu": "a100-80gb", "gpus": 16, "tp": 2, "pp": 2, "mbs": 1,
              "gbs": 64, "seq_len": 2048, "recompute": "selective", "zero": 1, "dtype": "bf16"}


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
    from costmodel.datasets.schema import Dataset, save_dataset

    kind = "gemm" if "gemm" in FEATURES else sorted(FEATURES)[0]
    nf = len(FEATURES[kind])
    rng = np.random.default_rng(0)
    ds = Dataset(kind, "a100-80gb", rng.integers(1, 4096, size=(6, nf)).astype(float),
                 np.array(["fwd", "bwd"] * 3, dtype=object), np.array(["bf16"] * 6, dtype=object),
                 rng.uniform(1e-5, 1e-3, 6), meta={"notes": "fuzz base"})
    return save_dataset(ds, tmp_path / "base" / "ds.csv")


def test_fuzz_dataset_loader(tmp_path):
    from costmodel.datasets.schema import load_dataset

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
    from costmodel.regressors.io import sidecar_path

    cands = [p for p in MODELS_DIR.glob("*/*.json")
             if not p.name.endswith((".meta.json", ".interval.json")) and sidecar_path(p).is_file()]
    assert cands, "no shipped artifacts under costmodel/data/models"
    main = min(cands, key=lambda p: p.stat().st_size)
    return main, sidecar_path(main)


def test_fuzz_artifact_loader(tmp_path, monkeypatch):
    from costmodel.regressors.io import sidecar_path
    from costmodel.regressors.runtime import RuntimeRegressor

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


# ------------------------------------------------------------------------------------ the CLI
def test_fuzz_cli_batch_file(tmp_path):
    """The CLI on mangled batch files / flags: exit 0 or 2, never a traceback."""
    from typer.testing import CliRunner

    from planner.cli import app

    runner = CliRunner()
    rng = random.Random(SEED + 7)
    base = (_dumps(BATCH_BASE) + "\n").encode()
    failures: list = []
    for i in range(40):
        f = tmp_path / f"b{i}.jsonl"
        f.write_bytes(_mutate_bytes(rng, base * 2))
        args = ["predict", "--batch", str(f)]
        if i % 4 == 0:
            args = ["predict", "--model", rng.choice(["llama-7b", "nope", "", str(f)]), "--gpu",
                    rng.choice(["a100-80gb", "zz", "ü"]), "--gpus", rng.choice(["8", "-8", "0", "x", "1e3"]),
                    "--tp", rng.choice(["2", "3", "-1", "0"])]
        done, res = _budgeted("cli", lambda args=args: runner.invoke(app, args), failures, what=str(args))
        if not done:
            continue
        out = res.output  # stdout and stderr together (click >= 8.2)
        if res.exit_code not in (0, 2) or "Traceback" in out or (
                res.exception is not None and not isinstance(res.exception, SystemExit)):
            failures.append(f"cli {args}: exit {res.exit_code} {type(res.exception).__name__}: {out[-200:]}")
        elif res.exit_code == 2 and len([x for x in out.strip().splitlines() if x.startswith("error")]) > 1:
            failures.append(f"cli {args}: more than one error line: {out!r}")
    _report(failures, "cli")


# ------------------------------------------------------------------------ every flag of every command
CLI_BASE = {
    "predict": ["--model", "llama-7b", "--gpu", "a100-80gb", "--gpus", "16", "--tp", "2", "--pp", "2", "--gbs", "64"],
    "gpus": [], "models": [],
    "validate": ["--runs", str(FIXTURES / "runs_small.csv")],
    "search": ["--model", "llama-7b", "--gpu", "a100-80gb", "--gpus", "16", "--trials", "3", "--tp", "1,2", "--pp",
               "1", "--cp", "1", "--vpp", "1", "--mbs", "1", "--seed", "1", "--no-progress"],
    "explain": ["--model", "llama-7b", "--gpu", "a100-80gb", "--gpus", "16", "--tp", "2"],
    "compare": ["--model", "llama-7b", "--gpu", "a100-80gb", "--gpus", "16", "--space", "megatron"],
    "size": ["--model", "llama-7b", "--tokens", "1B", "--deadline", "30d", "--gpu", "a100-80gb", "--max-gpus", "64"],
    "export": ["--model", "llama-7b", "--gpu", "a100-80gb", "--gpus", "16", "--tp", "2", "--to", "megatron"],
    "calibrate": ["--runs", str(FIXTURES / "runs_small.csv"), "--name", "fz"],
    "costmodel report": [],
    # fit and profile with valid flags do minutes of work: fuzzed against a missing input instead
    "fit": ["--profile", "/nonexistent/profile", "--no-public"],
    "profile": ["--plan", "/nonexistent/plan.toml", "--no-progress"],
}
CLI_BAD = ["", "-1", "0", "nan", "inf", "-inf", "1e999", "99999999999999999999999", "abc", "1,,2", "ünï✓",
           "/nonexistent/x.json", "1.5", "-0", "2,x", " "]
CLI_COSTLY_IF_VALID = {"--trials", "--iterations", "--max-gpus", "--jobs", "--top", "--folds", "--threads",
                       "--nproc", "--max-rows", "--explain", "--nodes", "--nodes-range"}
"""Counts where a huge valid number means a long (but legitimate) run: fuzzed with the invalid values only."""


def _cli_leaves():
    import typer.main

    from planner.cli import app

    def walk(c, prefix=()):
        if hasattr(c, "commands"):
            for n, sub in sorted(c.commands.items()):
                yield from walk(sub, prefix + (n,))
        else:
            yield " ".join(prefix), [p for p in c.params if getattr(p, "param_type_name", "") == "option"]
    return list(walk(typer.main.get_command(app)))


def test_fuzz_every_cli_flag(tmp_path, monkeypatch):
    """Every option of every command, one at a time, set to each bad value on an otherwise valid command
    line (flags: added alone and given a stray value): exit 0 or 2, never a traceback, within the command's
    call budget (CLI_CALL_BUDGET)."""
    from typer.testing import CliRunner

    from planner.cli import app

    monkeypatch.chdir(tmp_path)  # outputs such as --out abc land here
    runner = CliRunner()
    failures: list = []
    leaves = _cli_leaves()
    assert {name for name, _ in leaves} == set(CLI_BASE), "a new command needs a CLI_BASE entry"
    for name, options in leaves:
        base = name.split() + CLI_BASE[name]
        for opt in options:
            flag = opt.opts[0]
            if opt.is_flag:
                cases = [base + [flag], base + [flag, "x"]] + (
                    [base + [opt.secondary_opts[0]]] if opt.secondary_opts else [])
            else:
                # half of CLI_BAD per option, rotating with the option's position, so every value meets
                # every command and the test stays under a minute
                k = len(CLI_BAD) // 2
                j = (k * options.index(opt)) % len(CLI_BAD)
                values = [""] + [v for v in (CLI_BAD + CLI_BAD)[j:j + k] if v]  # empty: e.g. an unset $VAR
                values = [v for v in values if not (flag in CLI_COSTLY_IF_VALID and v in ("99999999999999999999999",
                                                                                          "1e999", "inf"))]
                cases = [base + [flag, v] for v in values]
            for args in cases:
                done, res = _budgeted("cli-flags", lambda args=args: runner.invoke(app, args), failures,
                                      CLI_CALL_BUDGET[name], str(args), f"cli-flags {name}")
                if not done:
                    continue
                out = res.output
                exc = res.exception
                if isinstance(exc, PlannerError):  # planner.cli.main prints it as one 'error:' line, exit 2
                    if "\n" in str(exc).strip() or not str(exc).strip():
                        failures.append(f"{args}: PlannerError not one line: {str(exc)!r}")
                elif res.exit_code not in (0, 2) or "Traceback" in out or (
                        exc is not None and not isinstance(exc, SystemExit)):
                    failures.append(f"{args}: exit {res.exit_code} {type(exc).__name__}: {str(exc)[:200]} {out[-300:]}")
    _report(failures, "cli-flags")


def test_total_count():
    """>= 1,000 malformed inputs in all: the per-test minimums (each enforced by its own test) add up."""
    assert sum(MIN_INPUTS.values()) >= 1000
