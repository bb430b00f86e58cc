"""Help and tables readable at 80 columns (issue 16 item 3): help is plain text, so bracketed units and
colon-separated syntax survive (rich markup ate "[us]" and made ":b:" of "A:B:STEP" an emoji); `planner gpus`
and `planner models` fit 80 columns without cutting a cell."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from costmodel.core.specs.catalogue import load_catalogue
from planner.cli import app

NARROW = {"COLUMNS": "80", "LINES": "50"}
COMMANDS = [["predict"], ["explain"], ["search"], ["compare"], ["size"], ["gpus"], ["models"], ["validate"],
            ["export"], ["profile"], ["fit"], ["calibrate"], ["costmodel", "report"], ["runs", "import"]]


def _run(args: list[str]) -> str:
    res = CliRunner().invoke(app, args, env=NARROW)
    assert res.exit_code == 0, res.output
    return res.stdout


def test_search_help_keeps_the_node_range_syntax():
    assert "A:B:STEP" in _run(["search", "--help"])


def test_gpus_help_keeps_bracketed_units():
    out = _run(["gpus", "--help"])
    assert "[us]" in out and "[GB/s]" in out and "[gpus.NAME]" in out


def test_profile_help_names_the_cpu_workload_plan():
    assert "cpu-workload" in _run(["profile", "--help"])


@pytest.mark.parametrize("args", COMMANDS, ids=" ".join)
def test_help_fits_80_columns(args):
    out = _run([*args, "--help"])
    assert "--help" in out
    assert max(len(line) for line in out.splitlines()) <= 80, out


@pytest.mark.parametrize("args", [["gpus"], ["models"]], ids=" ".join)
def test_tables_fit_80_columns_without_cut_cells(args):
    out = _run(args)
    assert max(len(line) for line in out.splitlines()) <= 80, out
    assert "…" not in out, out  # no header or cell cut short


def test_node_types_show_a_price_not_the_word_gpus():
    out = _run(["gpus"])
    assert "GPU's" not in out
    assert "legend: * = the GPU type's price" in out
    cat = load_catalogue()
    inherit = [c for c in cat.clusters.values() if c.price_usd_per_gpu_hour is None
               and cat.gpus[c.gpu].price_usd_per_gpu_hour is not None]
    assert inherit  # the catalogue has such node types (e.g. perlmutter: a100-80gb's price)
    for c in inherit:
        line = next(ln for ln in out.splitlines() if ln.startswith(c.name + " "))
        assert line.rstrip().endswith(f"{cat.gpus[c.gpu].price_usd_per_gpu_hour:.2f}*"), line
