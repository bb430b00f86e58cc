"""Tables fit the terminal: every table the CLI prints, rendered at COLUMNS=80 and 100, has no line wider than
the terminal and no cut number (no '…', and the numbers of the JSON output appear whole); the search footer's
counts add up and agree with the title and the JSON; every marker a table uses is in its legend; --wide shows
every column; `planner validate` shows a progress bar on a terminal's stderr only."""

from __future__ import annotations

import csv
import json
import os
import pty
import re
import subprocess
import sys

import pytest
from typer.testing import CliRunner

from planner.cli import app
from tests.helpers import ROOT

WIDTHS = (80, 100)
LOG = ROOT / "examples" / "logs" / "megatron_gpt3-175b_full.log"
GPT3 = ["--model", "gpt3-175b", "--gpu", "a100-80gb", "--gpus", "64", "--tp", "8", "--pp", "8", "--vpp", "3",
        "--mbs", "1", "--seq-len", "2048", "--dtype", "fp16", "--zero", "0"]
SEARCH = ["search", "--model", "llama-13b", "--gpus", "128", "--no-progress"]
PARETO = ["search", "--model", "llama-13b", "--gpus", "64", "--no-progress", "--objective", "pareto", "--gpu",
          "a100-80gb", "--gpu", "h100-sxm", "--tp", "1,2,4", "--pp", "1,2"]
SIZE = ["size", "--model", "llama-13b", "--tokens", "100B", "--deadline", "30d", "--gpu", "a100-80gb", "--gpu",
        "h100-sxm", "--max-gpus", "512", "--no-progress"]
COMMANDS = {
    "predict": ["predict", "--model", "llama-13b", "--gpu", "a100-80gb", "--gpus", "16", "--tp", "2", "--pp", "2"],
    "predict-moe": ["predict", "--model", "mixtral-8x7b", "--gpu", "h100-sxm", "--gpus", "64", "--tp", "1", "--pp",
                    "4", "--ep", "8"],
    "explain": ["explain", "--model", "mixtral-8x7b", "--gpu", "h100-sxm", "--gpus", "64", "--pp", "4", "--ep", "8",
                "--seq-len", "4096"],
    "search": SEARCH,
    "search-pareto": PARETO,
    "search-moe": ["search", "--model", "mixtral-8x7b", "--gpus", "64", "--gpu", "h100-sxm", "--seq-len", "4096",
                   "--no-progress", "--seed", "0", "--trials", "60"],
    "compare": ["compare", "--model", "llama-13b", "--gpu", "a100-80gb", "--gpu", "h100-sxm", "--gpus", "64",
                "--tokens", "100B"],
    "size": SIZE,
    "gpus": ["gpus"],
    "models": ["models"],
    "runs-import": ["runs", "import", "--from", "megatron", str(LOG), *GPT3, "--format", "table"],
}


def render(args: list[str], columns: int | None, wide: bool = False) -> str:
    """`planner ARGS` in-process with $COLUMNS (None: unset, i.e. piped output's default); stdout."""
    env = {"COLUMNS": str(columns) if columns else ""}
    res = CliRunner().invoke(app, [*args, *(["--wide"] if wide else [])], env=env)
    assert res.exit_code == 0, (args, res.output)
    return res.stdout


def check_fits(text: str, width: int) -> None:
    long = [line for line in text.splitlines() if len(line) > width]
    assert not long, f"{len(long)} lines over {width} columns, e.g. {long[0]!r}"
    assert "…" not in text, [line for line in text.splitlines() if "…" in line][:3]


@pytest.fixture(scope="module")
def outputs() -> dict:
    """Every command of COMMANDS rendered at each width (rendered once for the tests below)."""
    return {(name, w): render(args, w) for name, args in COMMANDS.items() for w in WIDTHS}


@pytest.mark.parametrize("width", WIDTHS)
@pytest.mark.parametrize("name", list(COMMANDS))
def test_every_table_fits_the_terminal(outputs, name, width):
    check_fits(outputs[name, width], width)


def test_piped_output_fits_100_columns_by_default():
    check_fits(render(SEARCH, None), 100)


def test_search_at_100_columns_prints_every_number_whole(outputs):
    """The headline: `COLUMNS=100 planner search --model llama-13b --gpus 128`: no line over 100, no cut number."""
    text = outputs["search", 100]
    plans = json.loads(render([*SEARCH, "--format", "json"], 100))["plans"][:10]
    for p in plans:
        for number in (f"{p['iteration_time_s']:.3f}", f"{100 * p['mfu']:.1f}"):
            assert re.search(rf"(?<![\d.]){re.escape(number)}(?![\d])", text), number
    assert "legend: * =" in text


def _table_rows(text: str) -> list[list[str]]:
    return [[c.strip() for c in line.strip("│").split("│")] for line in text.splitlines() if line.startswith("│")]


def test_markers_in_tables_are_in_their_legend(outputs):
    for name, marks in (("search-pareto", "*"), ("size", "*e")):
        for width in WIDTHS:
            text = outputs[name, width]
            cells = " ".join(c for row in _table_rows(text) for c in row if re.fullmatch(r"\d+[*e ]*[*e]", c))
            used = [m for m in marks if m in cells]
            assert used, f"{name}: no marked cell to check"
            legend = " ".join(line for line in text.splitlines() if line.startswith("legend:"))
            for m in used:
                assert f"{m} = " in legend, (name, m, legend)
    gpus = outputs["gpus", 100]
    if "*" in gpus.split("Node types")[1].split("legend")[0]:
        assert "legend: * = " in gpus


def test_search_footer_counts_agree(outputs):
    text = outputs["search", 100]
    summary = json.loads(render([*SEARCH, "--format", "json"], 100))["search"]
    flat = " ".join(text.split())
    m = re.search(r"top (\d+) of ([\d,]+) distinct feasible plans", flat)
    f = re.search(r"plans: ([\d,]+) combinations in the space; ([\d,]+) evaluated \(([\d,]+) ruled out[^)]*\) = "
                  r"([\d,]+) feasible \+ ([\d,]+) out of memory \+ ([\d,]+) invalid; ([\d,]+) feasible = ([\d,]+) "
                  r"distinct \+ ([\d,]+) folded as equivalent; ([\d,]+) shown", flat)
    assert m and f, flat[-800:]
    top, distinct_title = (int(x.replace(",", "")) for x in m.groups())
    space, evaluated, ruled_out, feasible, oom, invalid, feasible2, distinct, folded, shown = (
        int(x.replace(",", "")) for x in f.groups())
    assert space == evaluated + ruled_out == summary["space_size"]
    assert evaluated == feasible + oom + invalid == summary["evaluated"]
    assert feasible == feasible2 == distinct + folded == summary["feasible"]
    assert folded == summary["collapsed_equivalent"] and oom == summary["out_of_memory"]
    assert distinct == distinct_title and shown == top == len(_table_rows_ranked(text)) == 10


def _table_rows_ranked(text: str) -> list[list[str]]:
    return [r for r in _table_rows(text) if re.fullmatch(r"\d+\*?", r[0])]


def test_wide_shows_every_column_and_narrow_says_what_it_left_out(outputs):
    narrow = outputs["search", 80]
    left = next(line for line in " ".join(narrow.split("\n")).split("search:")[0].split("columns left out")[1:])
    assert "--wide" in left
    wide = render(SEARCH, 80, wide=True)
    for header in ("nodes x GPUs/node", "iter time [s]", "range [s]", "tokens/s", "mem/GPU [GiB]",
                   "cost [$/Mtoken]", "bottleneck", "recompute", "ZeRO", "VPP", "CP"):
        assert header in wide, header
    assert "columns left out" not in wide


def test_units_in_numeric_headers():
    from planner.search.records import SHORT_HEADERS

    for full, short in SHORT_HEADERS.items():
        if "[" in full:  # a unit in the full header: the short one keeps a unit ("[s]", or "$/Mtok" itself)
            assert "[" in short or short.startswith("$/"), (full, short)


# ---------------------------------------------------------------- validate and calibrate (shared run file)
@pytest.fixture(scope="module")
def small_runs(tmp_path_factory):
    """20 published runs of two sources (enough for --cv none and a 2-fold calibration, quickly)."""
    from costmodel.core.paths import validation_dir
    from tests.helpers import require_shared

    src = require_shared(validation_dir(), "shared/validation") / "published_runs.csv"
    with open(src, newline="", encoding="utf-8") as fh:
        reader = csv.DictReader(fh)
        rows = [r for r in reader if r["id"].split("-")[0] in ("NARAY21", "MLM")][:20]
        fields = reader.fieldnames
    path = tmp_path_factory.mktemp("runs") / "runs.csv"
    with open(path, "w", newline="", encoding="utf-8") as fh:
        w = csv.DictWriter(fh, fields)
        w.writeheader()
        w.writerows(rows)
    return path


@pytest.mark.parametrize("width", WIDTHS)
def test_validate_and_calibrate_tables_fit(small_runs, width, tmp_path):
    check_fits(render(["validate", "--runs", str(small_runs), "--cv", "none", "--verbose"], width), width)
    check_fits(render(["calibrate", "--runs", str(small_runs), "--name", "w", "--out", str(tmp_path),
                       "--folds", "2", "--constants", "compute_scale"], width), width)


def _validate_stderr_on_a_terminal(small_runs, *extra: str) -> str:
    """stderr of `planner validate` with stderr on a pseudo-terminal (stdout piped)."""
    master, slave = pty.openpty()
    proc = subprocess.Popen([sys.executable, "-m", "planner.cli", "validate", "--runs", str(small_runs), "--cv",
                             "none", *extra], stdout=subprocess.PIPE, stderr=slave, cwd=ROOT,
                            env={**os.environ, "PYTHONPATH": str(ROOT), "TERM": "xterm"})
    os.close(slave)
    chunks = []
    while True:
        try:
            data = os.read(master, 4096)
        except OSError:
            break
        if not data:
            break
        chunks.append(data)
    proc.communicate(timeout=300)
    os.close(master)
    assert proc.returncode == 0
    return b"".join(chunks).decode("utf-8", "replace")


def test_validate_progress_bar_on_a_terminal_only(small_runs):
    assert "predicting runs" in _validate_stderr_on_a_terminal(small_runs)
    assert "predicting runs" not in _validate_stderr_on_a_terminal(small_runs, "--quiet")
    assert "predicting runs" not in _validate_stderr_on_a_terminal(small_runs, "--format", "json")
    res = CliRunner().invoke(app, ["validate", "--runs", str(small_runs), "--cv", "none"])  # stderr not a TTY
    assert res.exit_code == 0 and "predicting runs" not in res.stderr


def test_fit_never_cuts_a_number_it_cannot_place():
    """The fitting rule on a synthetic table: numbers stay whole at any width the kept columns allow."""
    from rich.console import Console
    from rich.table import Table

    from planner.tables import fit

    for width in range(40, 121, 7):
        t = Table(title="t")
        for h in ("name", "a [s]", "b [GiB]", "c [%]", "note"):
            t.add_column(h)
        for i in range(5):
            t.add_row(f"row-{i}", f"{123456.789 * (i + 1):,.3f}", f"{i * 1.5:.2f}", "99.9", "some words " * i)
        con = Console(width=width, record=True, file=open(os.devnull, "w"))
        dropped = fit(t, con, ("note", "c [%]", "b [GiB]"))
        con.print(t)
        text = con.export_text()
        check_fits(text, width)
        assert "123,456.789" in text and "617,283.945" in text, (width, dropped)
