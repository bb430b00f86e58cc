"""Spec builders shared by tests (no presets: tests state the architecture they use), the source
scanner of the static checks (tests/test_faults.py, tests/test_safety.py), a JSON file writer, and
``require_shared`` (the one skip of the data-backed tests)."""

import ast
import functools
import json
import os
from pathlib import Path

import pytest

from costmodel.core.specs.model import ModelSpec
from costmodel.core.specs.plan import ParallelPlan


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
    return ParallelPlan(world_size=gpus, gpus_per_node=gpn, global_batch_size=gbs, seq_len=seq, **kw)


ROOT = Path(__file__).resolve().parents[1]

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


@functools.lru_cache(maxsize=1)
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
