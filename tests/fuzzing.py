"""Shared machinery of the fuzz tests (tests/test_fuzz.py, tests/test_fuzz_cli.py): call budgets, the
per-test input counts, the seeded mutators and the one-line-error check. See tests/test_fuzz.py's docstring."""


from __future__ import annotations

import json
import random
import signal
import sys
from pathlib import Path

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
CLI_CALL_BUDGET = {"calibrate": 1_000_000, "compare": 2_000_000, "costmodel report": 8_000_000,
                   "explain": 2_000_000, "export": 400_000, "fit": 400_000, "gpus": 400_000, "models": 400_000,
                   "predict": 700_000, "profile": 400_000, "search": 5_000_000, "size": 2_000_000,
                   "runs import": 450_000, "validate": 1_500_000}
"""The same per command for test_fuzz_every_cli_flag (its command lines, the click command built once: see
:func:`cli_runner`), at least 10x the most one command line made (first ones included, which import lazily) on
2026-11-27: calibrate 84,128, compare 25,171, costmodel report 788,470, explain 59,448, export 5,986, fit 2,484,
gpus 5,164, models 737, predict 39,328, profile 2,944, runs import 4,553, search 312,076 (3 trials), size 18,582,
validate 156,531; and at least 400,000."""
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


def cli_runner(monkeypatch):
    """typer's CliRunner with planner's click command built once per test: typer builds the command tree of the
    whole app on every ``invoke`` (about 45 ms and 43,000 Python calls on the 2-core dev machine), most of the
    cost of a rejected flag, and the CLI fuzz tests invoke it thousands of times."""
    import typer.testing

    real = typer.testing._get_command  # the name every typer release's CliRunner.invoke calls
    built: dict[int, object] = {}

    def get_command(app):
        if id(app) not in built:
            built[id(app)] = real(app)
        return built[id(app)]

    monkeypatch.setattr(typer.testing, "_get_command", get_command)
    return typer.testing.CliRunner()


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


# a valid batch request that the batch fuzzers mangle
BATCH_BASE = {"id": "r1", "model": "llama-7b", "gpu": "a100-80gb", "gpus": 16, "tp": 2, "pp": 2, "mbs": 1,
              "gbs": 64, "seq_len": 2048, "recompute": "selective", "zero": 1, "dtype": "bf16"}
