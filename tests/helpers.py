"""What several test modules share (tests import this module, never each other): spec builders (no presets:
tests state the architecture they use), synthetic datasets and a test CPU, the Hypothesis strategies of the
property tests, Megatron-LM's argument parser for exports, the source scanner of the static checks
(tests/test_faults.py, tests/test_safety.py), a JSON file writer, and ``require_shared`` (the one skip of the
data-backed tests)."""

import argparse
import ast
import json
import os
import shlex
from functools import lru_cache
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, assume, settings
from hypothesis import strategies as st

from costmodel.core.specs.catalogue import load_catalogue
from costmodel.core.specs.hardware import ClusterSpec, GPUSpec, Hardware
from costmodel.core.specs.hf_config import from_hf_config
from costmodel.core.specs.model import ModelSpec
from costmodel.core.specs.plan import ParallelPlan
from costmodel.cost.regressors.features import CPU_NOMINAL, build_features
from costmodel.fitting.datasets.schema import Dataset
from costmodel.graph.ops import Op


def gpt(layers=96, hidden=12288, heads=96, vocab=51200, seq=2048, **kw) -> ModelSpec:
    """GPT-3-style model (GELU, LayerNorm, learned positions, ffn 4h, biases, dropout)."""
    args = dict(name="gpt-test", num_layers=layers, hidden_size=hidden, num_heads=heads, num_kv_heads=heads,
                ffn_hidden_size=4 * hidden, vocab_size=vocab, activation="gelu", norm="layernorm",
                position_embedding="learned", max_seq_len=seq, linear_bias=True, dropout=True)
    args.update(kw)
    return ModelSpec(**args)


def llama(layers=32, hidden=4096, heads=32, kv=32, ffn=11008, vocab=32000, seq=4096, **kw) -> ModelSpec:
    args = dict(name="llama-test", num_layers=layers, hidden_size=hidden, num_heads=heads, num_kv_heads=kv,
                ffn_hidden_size=ffn, vocab_size=vocab, activation="swiglu", norm="rmsnorm",
                position_embedding="rope", max_seq_len=seq)
    args.update(kw)
    return ModelSpec(**args)


def plan(gpus=8, gpn=8, gbs=64, seq=2048, **kw) -> ParallelPlan:
    return ParallelPlan(gpus=gpus, gpus_per_node=gpn, gbs=gbs, seq_len=seq, **kw)


ROOT = Path(__file__).resolve().parents[1]
FIXTURES = ROOT / "tests" / "fixtures"


def hf_model(name: str) -> ModelSpec:
    """A model from the config.json fixture ``tests/fixtures/hf_configs/NAME.json``."""
    return from_hf_config(FIXTURES / "hf_configs" / f"{name}.json")

SHARED_HINT = "set PLANNER_DATA_DIR to ../shared/data to run this test"


def in_ci() -> bool:
    """True when the environment says CI (``CI=true``, ``1`` or ``yes``, as CI services set it)."""
    return os.environ.get("CI", "").strip().lower() in ("true", "1", "yes")


def require_shared(found: Path | None, what: str = "shared data") -> Path:
    """``found`` (a folder of the shared data), or stop the test when it is None: a skip on a
    developer's machine, a failure under ``CI=true`` (CI must run the data-backed tests, so a missing
    ../shared/data is an error there, not a silent skip). Every data-backed test goes through this."""
    if found is None:
        message = f"{what} not found: {SHARED_HINT}"
        if in_ci():
            pytest.fail(f"{message} (CI=true: data-backed tests must run in CI)", pytrace=False)
        pytest.skip(message)
    return found


def python_sources(tops):
    """(path relative to the repository, parsed AST) of every .py file under the folders ``tops``."""
    for top in tops:
        for p in sorted((ROOT / top).rglob("*.py")):
            yield p.relative_to(ROOT).as_posix(), ast.parse(p.read_text(encoding="utf-8"))


def write_json(folder: Path, name: str, data: dict, **over) -> Path:
    """Write ``data`` with the fields of ``over`` replaced as ``folder/name``; returns ``folder`` (the
    profile folder the measurement loaders read)."""
    (folder / name).write_text(json.dumps({**data, **over}))
    return folder


# ------------------------------------------------------------------------ synthetic datasets, a test CPU
def synthetic(n=300, seed=0):
    """GEMM-like data: time = roofline / efficiency(shape) with a smooth efficiency, > 0."""
    rng = np.random.default_rng(seed)
    raw = 2.0 ** rng.integers(6, 12, size=(n, 3))
    X = build_features("gemm", raw, "bf16", False, CPU_NOMINAL)
    eff = 0.2 + 0.6 / (1 + np.exp(-(np.log2(raw).sum(1) - 27) / 3))
    return raw, X, X[:, -1] / eff * 10


def tiny_dataset(gpu="cpu", seed=0) -> Dataset:
    """120 synthetic CPU GEMM samples (:func:`synthetic`)."""
    raw, X, y = synthetic(120, seed)
    return Dataset("gemm", gpu, raw, ["fwd"] * len(y), ["fp32"] * len(y), y,
                   meta={"sources": [{"path": "synthetic", "sha256": "0" * 64}]})


def three_row_dataset(scale: float = 1.0) -> Dataset:
    """Three CPU GEMM samples, times scaled by ``scale`` (tells two versions of a file apart)."""
    raw = np.array([[64, 64, 64], [128, 64, 32], [256, 128, 64]], dtype=float)
    return Dataset("gemm", "cpu", raw, ["fwd"] * 3, ["fp32"] * 3, scale * np.array([1e-4, 2e-4, 3e-4]),
                   meta={"sources": [{"path": "synthetic", "sha256": "0" * 64}]})


TEST_CPU = Hardware(GPUSpec("cpu", "test CPU", {"fp32": 1.0, "bf16": 1.0}, 16, 50, 0, "cpu-node"),
                    ClusterSpec("cpu-node", "test node", "cpu", 1, 10, 5, 10, 5))
"""A one-device CPU 'cluster' for the measured cost model's tests."""


def gemm_op(m, n, k, phase="fwd", dtype="fp32") -> Op:
    return Op("gemm", "g", phase, (m, n, k), flops=2.0 * m * n * k, dtype=dtype)


def cpu_profile_datasets() -> dict:
    """One-sample GEMM, residual-add and all-reduce datasets of a test CPU (what ``planner fit`` derives a CPU
    hardware entry from)."""
    def ds(kind, feats, t):
        n = len(t)
        return Dataset(kind, "cpu", np.array(feats, dtype=float), np.array(["fwd"] * n, dtype=object),
                       np.array(["fp32"] * n, dtype=object), np.array(t), np.zeros(n), np.ones(n), np.arange(n),
                       {"fingerprint": {"cpu_model": "test CPU", "threads": 1}})

    return {("gemm", "cpu"): ds("gemm", [[256, 256, 256]], [0.001]),
            ("residual_add", "cpu"): ds("residual_add", [[1_000_000]], [0.001]),
            ("all_reduce", "cpu"): ds("all_reduce", [[1_000_000, 2, 1, 2]], [0.002])}


# ------------------------------------------------------------------------ Hypothesis strategies
EXAMPLES = 200
"""Examples per property (tests/test_properties.py, tests/test_invariants.py)."""
SETTINGS = settings(max_examples=EXAMPLES, deadline=None, derandomize=True,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
"""derandomize: the same examples on every run (a failure reproduces; results are seed-free)."""
GPUS = ("a100-80gb", "h100-sxm")
POW2 = (1, 2, 4, 8)


@lru_cache(maxsize=None)
def hardware(gpu: str):
    return load_catalogue().resolve(gpu)


def _divisors(n: int, cap: int | None = None) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0 and (cap is None or d <= cap)]


@st.composite
def models(draw, layers=None, family=None):
    """A small dense model; heads divide hidden/64 (head_dim a multiple of 64), KV heads divide heads."""
    hidden = 64 * draw(st.integers(1, 32))
    heads = draw(st.sampled_from(_divisors(hidden // 64)))
    kv = draw(st.sampled_from(_divisors(heads)))
    ffn = 64 * draw(st.integers(2, 128))
    vocab = draw(st.integers(1000, 60000))
    n = layers if layers is not None else draw(st.integers(2, 16))
    fam = family or draw(st.sampled_from(("gpt", "llama")))
    seq = draw(st.sampled_from((128, 256, 512, 1024, 2048)))
    if fam == "gpt":
        return gpt(layers=n, hidden=hidden, heads=heads, vocab=vocab, seq=seq, ffn_hidden_size=ffn)
    return llama(layers=n, hidden=hidden, heads=heads, kv=kv, ffn=ffn, vocab=vocab, seq=seq)


@st.composite
def setups(draw, model_strategy=None, pp_choices=POW2, min_dp=1):
    """(model, plan, gpu) with a valid plan: TP among the powers of 2 dividing heads and FFN."""
    model = draw(model_strategy if model_strategy is not None else models())
    tp = draw(st.sampled_from([t for t in POW2 if model.num_heads % t == 0 and model.ffn_hidden_size % t == 0
                               and (model.num_kv_heads % t == 0 or t % model.num_kv_heads == 0)]))
    pp = draw(st.sampled_from([p for p in pp_choices if model.num_layers % p == 0] or [1]))
    dp = draw(st.sampled_from([d for d in POW2 if d >= min_dp]))
    mbs = draw(st.integers(1, 4))
    k = draw(st.integers(1, 8))
    gpu = draw(st.sampled_from(GPUS))
    gpus = tp * pp * dp
    plan = ParallelPlan(gpus=gpus, gpus_per_node=min(hardware(gpu).cluster.gpus_per_node, gpus),
                        gbs=mbs * dp * k, seq_len=model.max_seq_len, tp=tp, pp=pp,
                        mbs=mbs, recompute=draw(st.sampled_from(("none", "selective", "full"))),
                        zero=draw(st.sampled_from((0, 1, 2, 3))))
    assume(not plan.problems(model))
    return model, plan, gpu


# ------------------------------------------------------------------------ Megatron-LM's argument parser
MEGATRON_ARGUMENTS = json.loads((FIXTURES / "launchers" / "megatron_arguments.json").read_text())
"""Megatron-LM's add_argument specs of the flags planner exports (the fixture names its source and commit)."""


def _tuple_type(x: str) -> tuple:
    """Megatron-LM arguments.py tuple_type: "1,2,3" or "(1,2,3)" -> (1, 2, 3)."""
    return tuple(int(i) for i in x.strip("()").split(","))


def _moe_freq_type(x: str):
    """Megatron-LM arguments.py moe_freq_type: an integer, or a list expression of digits, brackets, '+', '*'
    (validated by _eval_pattern's character class, then evaluated)."""
    if "[" not in x:
        return int(x)
    if any(c not in "0123456789,[]()+*" for c in x):
        raise ValueError(f"Invalid pattern: {x}")
    return eval(x)


def megatron_parser() -> argparse.ArgumentParser:
    """argparse parser with Megatron-LM's own specs for the flags in the fixture (allow_abbrev=False, as
    Megatron's parse_args)."""
    parser = argparse.ArgumentParser(allow_abbrev=False, exit_on_error=False)
    types = {"int": int, "float": float, "str": str, "tuple": _tuple_type, "moe_freq": _moe_freq_type}
    for flag, spec in MEGATRON_ARGUMENTS["flags"].items():
        if "action" in spec:
            parser.add_argument(flag, action=spec["action"])
        else:
            parser.add_argument(flag, type=types[spec["type"]], choices=spec.get("choices"), nargs=spec.get("nargs"))
    return parser


def parse_megatron(text: str) -> argparse.Namespace:
    argv = shlex.split(text, comments=True)
    try:
        return megatron_parser().parse_args(argv)
    except (argparse.ArgumentError, SystemExit) as exc:  # an unknown flag or a bad value
        raise AssertionError(f"Megatron-LM's argparse specs refuse {argv}: {exc}") from None


TITAN_JOB_CONFIG = json.loads((FIXTURES / "launchers" / "torchtitan_job_config_keys.json").read_text())
TITAN_MODELS = json.loads((FIXTURES / "launchers" / "torchtitan_models.json").read_text())


def check_torchtitan_keys(t: dict) -> None:
    """Every section and key is torchtitan's (job_config.py at the pinned commit), every choice allowed."""
    for section, table in t.items():
        assert section in TITAN_JOB_CONFIG["sections"], section
        sec = TITAN_JOB_CONFIG["sections"][section]
        assert set(table) <= set(sec), set(table) - set(sec)
    for key, allowed in TITAN_JOB_CONFIG["choices"].items():
        section, name = key.split(".")
        value = t.get(section, {}).get(name, allowed[0])
        assert all(v in allowed for v in value) if isinstance(value, list) else value in allowed, (key, value)


def cli_flags(plan: dict) -> list[str]:
    """The `planner predict` flags of a batch-line dict (booleans as --x / --no-x, lists comma-separated)."""
    out: list[str] = []
    for key, value in plan.items():
        flag = "--" + key.replace("_", "-")
        if isinstance(value, bool):
            out.append(flag if value else flag.replace("--", "--no-", 1))
        elif isinstance(value, (list, tuple)):
            out += [flag, ",".join(map(str, value))]
        else:
            out += [flag, str(value)]
    return out


@lru_cache(maxsize=1)
def _planner_command():
    """The click command typer builds from planner's app (built once: typer's CliRunner rebuilds it per call)."""
    from typer.main import get_command

    from planner.cli import app

    return get_command(app)


def run_cli(args: list[str], stdin: str | None = None):
    """`planner ARGS` in-process (click's CliRunner on the command typer builds, as typer's CliRunner invokes it):
    the result, exit code 0 asserted with the output shown."""
    from click.testing import CliRunner

    res = CliRunner().invoke(_planner_command(), args, input=stdin)
    assert res.exit_code == 0, (args, res.output)
    return res


def cli_json(args: list[str]) -> dict:
    """`planner ARGS --format json` in-process, parsed."""
    return json.loads(run_cli([*args, "--format", "json"]).stdout)
