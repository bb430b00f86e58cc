"""`planner runs import`: measured runs from Megatron-LM, NeMo or torchtitan training logs (planner.runs_import)."""

from __future__ import annotations

import csv
import io
import re
from pathlib import Path
from typing import Annotated, Optional

import typer

from costmodel.core.errors import PlannerError
from costmodel.core.fileio import atomic_write_text
from planner import cli_options as O
from planner.formats import FORMATS, render_rows, rich_rows
from planner.runs_import import DEFAULT_SKIP, FRAMEWORKS, Layout, check_row, lost_fields, read_log, run_row, to_csv
from planner.tables import console, print_table

EXAMPLE = ("planner runs import --from megatron train.log --model llama-7b --gpu h100-sxm --gpus 8 --tp 1 --pp 1 "
           "--mbs 1 --seq-len 4096 --dtype bf16 --out runs.csv")


def import_runs(logs: list[Path], framework: str, layout: Layout, skip: int, out: Path | None, append: bool,
                id_prefix: str | None, from_iteration: int | None = None) -> tuple[str, list[str]]:
    """(run-file CSV text, notes for stderr) for ``logs``; PlannerError (one line) on bad input."""
    from costmodel.core.specs.presets import resolve_model  # deferred: presets load only when importing

    missing = layout.missing()
    summaries = [read_log(p, framework, skip, from_iteration) for p in logs]
    if "--gbs" in missing and all("gbs" in s.medians for s in summaries):
        missing.remove("--gbs")  # Megatron and NeMo print the global batch size
    if missing:
        raise PlannerError(f"the log does not state the layout: give {', '.join(missing)}; e.g. {EXAMPLE}")
    existing = out.read_text(encoding="utf-8") if append and out is not None and out.is_file() else ""
    taken = set(re.findall(r"^([^,\n]+),", existing, flags=re.M))
    rows, notes = [], []
    preset = resolve_model(layout.model)
    for s in summaries:
        stem = id_prefix or re.sub(r"[^A-Za-z0-9]+", "-", s.path.stem).strip("-").upper() or "RUN"
        n = 1
        while f"{stem}-{n:03d}" in taken:
            n += 1
        row_id = f"{stem}-{n:03d}"
        taken.add(row_id)
        row = run_row(s, layout, row_id)
        lost = lost_fields(preset, check_row(row))
        if lost:
            notes.append(f"{s.path.name}: the run-file schema cannot carry {'; '.join(lost)}; validate and "
                         "calibrate predict the row's model")
        rows.append(row)
        value = float(row["measured_value"])
        where = f"; measured on {s.segment}" if s.segment else ""
        notes.append(f"{s.path.name}: {row['id']} {row['measured_metric']} = {value:.6g} (median of "
                     f"{len(s.used)} lines, iterations {s.used[0].first}-{s.used[-1].iteration}; "
                     f"{len(s.lines) - len(s.used)} lines before them skipped{where})")
    return to_csv(rows, existing), notes


def register(app: typer.Typer) -> None:
    runs = typer.Typer(help="Your own measured runs: import them from training logs.", no_args_is_help=True,
                       rich_markup_mode=None)
    app.add_typer(runs, name="runs")

    @runs.command("import")
    def import_cmd(
        logs: Annotated[list[Path], typer.Argument(help="Training log file(s); one measured run each.")],
        framework: Annotated[str, typer.Option("--from", help="Log format: megatron | nemo | torchtitan.")],
        model: O.Model = None,
        gpu: O.Gpu = None,
        gpus: O.Gpus = None,
        gpus_per_node: O.GpusPerNode = None,
        tp: Annotated[Optional[int], typer.Option("--tp", help="Tensor-parallel degree.")] = None,
        pp: Annotated[Optional[int], typer.Option("--pp", help="Pipeline-parallel degree.")] = None,
        cp: O.Cp = 1,
        vpp: O.Vpp = 1,
        mbs: Annotated[Optional[int], typer.Option("--mbs", help="Micro-batch size (sequences).")] = None,
        gbs: Annotated[Optional[int], typer.Option(
            "--gbs", help="Global batch size (sequences); read from Megatron and NeMo logs.")] = None,
        seq_len: Annotated[Optional[int], typer.Option("--seq-len", help="Sequence length.")] = None,
        dtype: Annotated[Optional[str], typer.Option("--dtype", help="bf16 | fp16 | fp8 | fp32.")] = None,
        recompute: Annotated[Optional[str], typer.Option(
            "--recompute", help="none | selective | full (unstated: validate assumes selective, tier B).")] = None,
        sequence_parallel: Annotated[Optional[bool], typer.Option(
            "--sequence-parallel/--no-sequence-parallel", help="Unstated: assumed on when TP > 1 (tier B).")] = None,
        zero: Annotated[Optional[int], typer.Option(
            "--zero", help="ZeRO stage 0-3 (unstated: assumed 1, the distributed optimizer; tier B).")] = None,
        interconnect: Annotated[str, typer.Option("--interconnect", help="Free text for the run file.")] = "",
        skip: Annotated[int, typer.Option(
            "--skip", help=f"Warm-up iterations left out (default {DEFAULT_SKIP}); the median of the rest is used.")
        ] = DEFAULT_SKIP,
        from_iteration: Annotated[Optional[int], typer.Option(
            "--from-iteration", help="Measure from this iteration on (default: the whole run after --skip, or "
                                     "its final constant-batch segment after a batch-size ramp-up).")] = None,
        out: Annotated[Optional[Path], typer.Option("--out", help="Run CSV to write (default: stdout).")] = None,
        fmt: Annotated[str, typer.Option(
            "--format", help="Without --out: csv (the run file) | json | md | table; --out always writes csv.")
        ] = "csv",
        append: Annotated[bool, typer.Option("--append", help="Add the rows to an existing --out file.")] = False,
        id_prefix: Annotated[Optional[str], typer.Option(
            "--id", help="Run id prefix (default: the log's file name); ids get -001, -002, ...")] = None,
        wide: O.Wide = False,
    ) -> None:
        """Read iteration times (TFLOP/s, tokens/s, MFU where printed) from training logs into the run-file
        schema of `planner validate --runs` and `planner calibrate --runs`."""
        if fmt not in FORMATS:
            raise PlannerError(f"--format {fmt!r} is not one of {', '.join(FORMATS)}")
        if framework not in FRAMEWORKS:
            raise PlannerError(f"--from {framework!r} is not one of {', '.join(FRAMEWORKS)}")
        if append and out is None:
            raise PlannerError("--append needs --out FILE (the run file to add to)")
        layout = Layout(model=model, gpu=gpu, gpus=gpus, tp=tp, pp=pp, mbs=mbs, gbs=gbs, seq_len=seq_len,
                        dtype=dtype, cp=cp, vpp=vpp, gpus_per_node=gpus_per_node, recompute=recompute,
                        sequence_parallel=sequence_parallel, zero=zero, interconnect=interconnect)
        text, notes = import_runs(logs, framework, layout, skip, out, append, id_prefix, from_iteration)
        for note in notes:
            typer.echo(note, err=True)
        if out is None:
            rows = list(csv.DictReader(io.StringIO(text)))
            shown = text if fmt == "csv" else render_rows(fmt, rows, title="Imported runs")
            if shown is None:
                table = rich_rows(rows, "Imported runs (run-file schema)")
                print_table(console(), table, [h for h in reversed(list(rows[0])) if h != "id"] if rows else ())
            else:
                typer.echo(shown, nl=False)
        else:
            atomic_write_text(out, text)
            typer.echo(f"wrote {out}", err=True)
