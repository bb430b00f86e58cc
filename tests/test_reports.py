"""planner.reports: Markdown reports with PNG plots for search / compare / size / validate --report."""

from __future__ import annotations

import re
import shlex
import struct
import subprocess
import sys
from datetime import date
from pathlib import Path

import pytest
from typer.testing import CliRunner

from costmodel.core.errors import PlannerError
from planner.reports import markdown as M

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
MIN_PNG_BYTES = 8_000
"""A matplotlib figure with axes, labels and data is tens of kB; an empty or broken one is far smaller."""
FIXTURE_RUNS = Path(__file__).parent / "fixtures" / "runs_small.csv"
TINY_SPACE = """description = "tiny test space"
tp = [1, 2]
pp = [1, 2]
cp = [1]
vpp = [1]
mbs = [1, 2]
recompute = ["selective", "full"]
sequence_parallel = [true]
zero = [1]
dtype = ["bf16"]
allow_tp_across_nodes = false
"""


# ------------------------------------------------------------------------------------------ helpers
def links(md: Path) -> list[Path]:
    """Image targets of a report, resolved against its folder."""
    return [md.parent / t for t in re.findall(r"!\[[^\]]*\]\(([^)]+)\)", md.read_text(encoding="utf-8"))]


def assert_valid_png(path: Path) -> None:
    data = path.read_bytes()
    assert data[:8] == PNG_SIGNATURE, path
    assert len(data) > MIN_PNG_BYTES, (path, len(data))
    assert data[12:16] == b"IHDR"
    width, height = struct.unpack(">II", data[16:24])
    assert width >= 300 and height >= 150, (path, width, height)


def assert_report(md: Path, n_images: int) -> None:
    assert md.is_file()
    imgs = links(md)
    assert len(imgs) == n_images, imgs
    for p in imgs:
        assert p.parent.resolve() == md.parent.resolve()  # saved beside the .md, linked relatively
        assert p.name.startswith(md.stem + "_")
        assert_valid_png(p)
    assert not [p for p in md.parent.iterdir() if p.name.endswith(".tmp")], "temporary file left behind"


@pytest.fixture(scope="module")
def tiny_space(tmp_path_factory) -> Path:
    p = tmp_path_factory.mktemp("space") / "tiny.toml"
    p.write_text(TINY_SPACE)
    return p


@pytest.fixture(scope="module")
def search_result(tiny_space):
    from costmodel.core.specs.catalogue import load_catalogue
    from costmodel.core.specs.presets import resolve_model
    from planner.search.engine import search
    from planner.search.space import build_problem, load_space, make_target

    hw = load_catalogue().resolve("a100-80gb", None, None)
    problem = build_problem(resolve_model("llama-7b"), [make_target(hw, 16)], load_space(str(tiny_space)))
    res = search(problem, "time", exhaustive=True)
    assert len(res.records) >= 3
    return res


# ------------------------------------------------------------------------------------ atomic writes
def test_atomic_write_replaces_and_leaves_no_temp(tmp_path):
    p = tmp_path / "sub" / "r.md"
    M.atomic_write_text(p, "one\n")
    M.atomic_write_text(p, "two\n")
    M.atomic_write_bytes(tmp_path / "b.png", b"\x00\x01")
    assert p.read_text() == "two\n" and (tmp_path / "b.png").read_bytes() == b"\x00\x01"
    assert sorted(x.name for x in p.parent.iterdir()) == ["r.md"]
    assert p.stat().st_mode & 0o044  # readable like a file opened normally (not mkstemp's 0600)


def test_exception_mid_write_keeps_old_file(tmp_path):
    p = tmp_path / "r.md"
    p.write_text("old report\n")
    with pytest.raises(RuntimeError):
        with M.atomic_writer(p) as fh:
            fh.write("half a new rep")
            raise RuntimeError("disk full")
    assert p.read_text() == "old report\n"
    assert [x.name for x in tmp_path.iterdir()] == ["r.md"]


def test_report_path_rules(tmp_path):
    assert M.report_path("reports/x.md") == Path("reports/x.md")
    with pytest.raises(PlannerError, match=r"\.md"):
        M.report_path("reports/x.txt")
    (tmp_path / "d.md").mkdir()
    with pytest.raises(PlannerError, match="folder"):
        M.report_path(tmp_path / "d.md")


def test_command_line_quotes_and_names_planner():
    assert M.command_line(["/usr/bin/planner", "search", "--model", "my model", "--gpus", "16"]) == \
        "planner search --model 'my model' --gpus 16"
    assert M.image_link("p", Path("/a/b/x_pareto.png"), Path("/a/b/x.md")) == "![p](x_pareto.png)"
    assert M.md_table(["a|b"], [["1\n2"]]) == "| a\\|b |\n|---|\n| 1 2 |\n"


# ---------------------------------------------------------------------------------- search reports
def test_search_report_contents_pngs_and_determinism(tmp_path, search_result):
    from planner import __version__
    from planner.reports.search_report import write_search_report

    cmd = "planner search --model llama-7b --gpus 16 --exhaustive --report a/r.md"
    files = write_search_report(tmp_path / "a" / "r.md", search_result, top=4, command=cmd)
    md = files.markdown
    assert_report(md, 2)
    assert {p.name for p in files.images} == {"r_pareto.png", "r_breakdown.png"}
    text = md.read_text()
    assert f"```sh\n{cmd}\n```" in text
    assert f"planner {__version__}" in text and f"cost model: {search_result.records[0].cost_model}" in text
    assert "| # | GPU | nodes x GPUs/node |" in text and "\n| 4 | a100-80gb" in text and "\n| 5 |" not in text
    assert "Pareto front" in text and "## Where the numbers leave the sampled range" in text
    best = search_result.records[0]
    assert f"{best.iteration_time_s:.3f}" in text
    assert date.today().isoformat() not in text and str(date.today().year) not in text.split("| date |")[0]
    # the same inputs give the same files
    again = write_search_report(tmp_path / "b" / "r.md", search_result, top=4, command=cmd)
    assert again.markdown.read_text() == text
    for a, b in zip(files.images, again.images):
        assert a.read_bytes() == b.read_bytes()


def test_breakdown_categories_add_up_to_iteration_time(search_result):
    from planner.reports.search_report import plan_details

    rec = search_result.records[0]
    hw = search_result.problem.targets[0].hardware
    d = plan_details([("#1", rec)], search_result.problem.model, lambda r: hw)[0]
    assert sum(d.categories.values()) == pytest.approx(rec.iteration_time_s, rel=1e-6)
    assert max(d.categories, key=d.categories.get) == rec.bottleneck


def test_failing_plot_leaves_the_old_report_intact(tmp_path, search_result, monkeypatch):
    from planner.reports import search_report
    from planner.reports.search_report import write_search_report

    md = tmp_path / "r.md"
    write_search_report(md, search_result, top=2, command="planner search")
    before = {p.name: p.read_bytes() for p in tmp_path.iterdir()}

    def boom(*a, **k):
        raise RuntimeError("renderer crashed")

    monkeypatch.setattr(search_report, "breakdown_png", boom)
    with pytest.raises(RuntimeError):
        write_search_report(md, search_result, top=3, command="planner search --top 3")
    assert {p.name: p.read_bytes() for p in tmp_path.iterdir()} == before


def test_reports_module_does_not_import_matplotlib_until_plotting():
    code = ("import sys, planner.cli, planner.reports.search_report, planner.reports.validate_report; "
            "print('matplotlib' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


# ---------------------------------------------------------------------------------------------- CLI
def _invoke(monkeypatch, args: list[str]):
    from planner.cli import app

    monkeypatch.setattr(sys, "argv", ["/somewhere/bin/planner", *args])  # what the console script sees
    return CliRunner().invoke(app, args)


def test_cli_search_report(tmp_path, monkeypatch, tiny_space):
    md = tmp_path / "tmp" / "x.md"
    args = ["search", "--model", "llama-7b", "--gpus", "16", "--exhaustive", "--space", str(tiny_space),
            "--top", "3", "--format", "json", "--report", str(md)]
    r = _invoke(monkeypatch, args)
    assert r.exit_code == 0, r.output
    assert_report(md, 2)
    assert shlex.join(["planner", *args]) in md.read_text()


def test_cli_compare_report(tmp_path, monkeypatch, tiny_space):
    md = tmp_path / "cmp.md"
    args = ["compare", "--model", "llama-7b", "--gpus", "16", "--gpu", "a100-80gb", "--gpu", "gh200",
            "--tokens", "1e11", "--space", str(tiny_space), "--report", str(md)]
    r = _invoke(monkeypatch, args)
    assert r.exit_code == 0, r.output
    assert_report(md, 2)
    text = md.read_text()
    assert shlex.join(["planner", *args]) in text
    assert "| a100-80gb |" in text and "| gh200 |" in text and "time to train" in text
    # the GPU basis `planner compare` prints: node types, the GH200 factor, the GH200 plan at the kernel rate
    assert "### GPUs and node types" in text and "- gh200 on jupiter-booster: 4 GPUs per node" in text
    assert "- gh200 on jupiter-booster at the kernel rate (without compute_scale_gh200" in text


def test_cli_size_report(tmp_path, monkeypatch, tiny_space):
    md = tmp_path / "size.md"
    args = ["size", "--model", "llama-7b", "--tokens", "1e11", "--deadline", "30d", "--gpu", "a100-80gb",
            "--max-gpus", "32", "--space", str(tiny_space), "--report", str(md)]
    r = _invoke(monkeypatch, args)
    assert r.exit_code == 0, r.output
    assert_report(md, 2)
    text = md.read_text()
    assert shlex.join(["planner", *args]) in text and "GPU-hours" in text and "smallest" in text
    assert {p.name for p in links(md)} == {"size_frontier.png", "size_breakdown.png"}
    assert "## Frontier: GPUs vs days vs USD" in text and "| meets the deadline |" in text
    assert "goodput" in text and "ckpt every [iterations]" in text and "not modelled:" in text


def test_cli_bad_report_path_is_one_line_exit_2(tmp_path, monkeypatch):
    r = _invoke(monkeypatch, ["search", "--model", "llama-7b", "--gpus", "16", "--report", str(tmp_path / "x.txt")])
    assert r.exit_code == 2
    assert "must be a Markdown file path ending in .md" in r.output and len(r.output.strip().splitlines()) == 1
    assert not list(tmp_path.iterdir())


def test_cli_validate_report(tmp_path, monkeypatch):
    md = tmp_path / "reports" / "validation.md"
    args = ["validate", "--runs", str(FIXTURE_RUNS), "--report", str(md)]
    r = _invoke(monkeypatch, args)
    assert r.exit_code == 0, r.output
    assert "wrote" in r.output and "| KORTHI22-002" not in r.output  # summary only, no tables printed
    assert_report(md, 1)
    assert links(md)[0].name == "validation_scatter.png"
    text = md.read_text()
    assert shlex.join(["planner", *args]) in text
    assert "### Predicted vs measured" in text and "### Error summary" in text and "MAPE [%]" in text
    assert "| KORTHI22-002 |" in text
