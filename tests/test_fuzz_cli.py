"""Fuzzing the CLI: malformed batch files and every flag of every command set to bad
values; the machinery and its rules are in tests/fuzzing.py and tests/test_fuzz.py's docstring."""


from __future__ import annotations

import random

from costmodel.core.errors import PlannerError
from tests.fuzzing import (  # noqa: F401
    BATCH_BASE,
    CLI_CALL_BUDGET,
    FIXTURES,
    MIN_INPUTS,
    SEED,
    _budgeted,
    _count_per_test,
    _dumps,
    _mutate_bytes,
    _report,
    cli_runner,
)


# ------------------------------------------------------------------------------------ the CLI
def test_fuzz_cli_batch_file(tmp_path, monkeypatch):
    """The CLI on mangled batch files / flags: exit 0 or 2, never a traceback."""
    from planner.cli import app

    runner = cli_runner(monkeypatch)
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
SMALL_SPACE = str(FIXTURES / "space_small.toml")
"""A four-plan search space: a valid size / compare command line searches it in milliseconds."""
CLI_BASE = {
    "predict": ["--model", "llama-7b", "--gpu", "a100-80gb", "--gpus", "16", "--tp", "2", "--pp", "2", "--gbs", "64"],
    "gpus": [], "models": [],
    "validate": ["--runs", str(FIXTURES / "runs_small.csv"), "--cv", "none"],  # --cv source fits (slow)
    "search": ["--model", "llama-7b", "--gpu", "a100-80gb", "--gpus", "16", "--trials", "3", "--tp", "1,2", "--pp",
               "1", "--cp", "1", "--vpp", "1", "--mbs", "1", "--seed", "1", "--no-progress"],
    "explain": ["--model", "llama-7b", "--gpu", "a100-80gb", "--gpus", "16", "--tp", "2"],
    "compare": ["--model", "llama-7b", "--gpu", "a100-80gb", "--gpus", "16", "--space", SMALL_SPACE],
    "size": ["--model", "llama-7b", "--tokens", "1B", "--deadline", "30d", "--gpu", "a100-80gb", "--max-gpus", "64",
             "--space", SMALL_SPACE],
    "export": ["--model", "llama-7b", "--gpu", "a100-80gb", "--gpus", "16", "--tp", "2", "--to", "megatron"],
    "calibrate": ["--runs", str(FIXTURES / "runs_small.csv"), "--name", "fz"],
    "costmodel report": [],
    "runs import": ["--from", "nemo", str(FIXTURES.parent.parent / "examples" / "logs" / "nemo_llama2-7b.log"),
                    "--model", "llama-7b", "--gpu", "h100-sxm", "--gpus", "8", "--tp", "1", "--pp", "1", "--mbs", "1",
                    "--seq-len", "4096", "--dtype", "fp8", "--out", "runs.csv"],
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
    from planner.cli import app

    monkeypatch.chdir(tmp_path)  # outputs such as --out abc land here
    runner = cli_runner(monkeypatch)
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
