"""`planner gpus`: list the hardware catalogue (GPU and node types) as a table, JSON, CSV or Markdown."""

from __future__ import annotations

import dataclasses
import json
import sys
from enum import Enum
from pathlib import Path
from typing import List, Optional

import typer
from rich import box
from rich.markup import escape
from rich.table import Table

from costmodel.core.errors import PlannerError
from costmodel.core.specs.catalogue import Catalogue, load_catalogue
from planner.cli_options import Wide
from planner.formats import csv_text, md_rows
from planner.tables import console, print_table


class OutputFormat(str, Enum):
    table = "table"
    json = "json"
    csv = "csv"
    md = "md"


# Column headers, units in brackets (the CSV and Markdown headers; the table splits them over two lines).
GPU_COLUMNS = ("name", "bf16 [TFLOP/s]", "fp8 [TFLOP/s]", "HBM [GB]", "HBM BW [GB/s]", "NVLink [GB/s/dir]",
               "price [USD/GPU-h]", "price date", "measured data", "price basis")
CLUSTER_COLUMNS = ("name", "GPU", "GPUs/node", "NVLink domain [GPUs]", "intra BW [GB/s]", "inter BW [GB/s]",
                   "intra lat [us]", "inter lat [us]", "network", "price [USD/GPU-h]", "price of")


def _text(v: float | None, digits: int = 0, sep: str = ",") -> str:
    return "-" if v is None else f"{v:{sep}.{digits}f}"


def _raw(v: float | None, digits: int = 0, sep: str = "") -> object:
    return "" if v is None else v


def gpu_rows(cat: Catalogue, raw: bool = False) -> list[dict]:
    """One row (header -> cell) per GPU type; ``raw``: numbers as they are ('' = unknown), for CSV."""
    _num = _raw if raw else _text
    return [dict(zip(GPU_COLUMNS, (
        g.name, _num(g.peak_tflops.get("bf16"), 1), _num(g.peak_tflops.get("fp8"), 1), _num(g.hbm_gb),
        _num(g.hbm_bw_gbs), _num(g.nvlink_bw_gbs), _num(g.price_usd_per_gpu_hour, 2, ""), g.price_date,
        "yes" if g.measured_data else (f"via {g.sibling}" if g.sibling else "no"), g.price_basis)))
        for g in cat.gpus.values()]


def cluster_rows(cat: Catalogue, raw: bool = False) -> list[dict]:
    """One row per node type; a node type without its own price shows its GPU's ('price of' = GPU)."""
    _num = _raw if raw else _text
    rows = []
    for c in cat.clusters.values():
        own = c.price_usd_per_gpu_hour
        gpu = cat.gpus.get(c.gpu)
        price = own if own is not None else (gpu.price_usd_per_gpu_hour if gpu is not None else None)
        rows.append(dict(zip(CLUSTER_COLUMNS, (
            c.name, c.gpu, c.gpus_per_node, c.nvlink_domain or c.gpus_per_node,
            _num(c.intra_node_bw_gbs), _num(c.inter_node_bw_gbs), _num(c.intra_node_latency_us, 1),
            _num(c.inter_node_latency_us, 1), c.network, _num(price, 2, ""),
            "" if price is None else ("node type" if own is not None else "GPU")))))
    return rows


def _table(title: str, heads: tuple[str, ...], rows: list[tuple], text_columns: int, caption: str = "") -> Table:
    """A borderless table that fits 80 columns: headers on two lines (name, then [unit])."""
    t = Table(title=escape(title), box=box.SIMPLE_HEAD, pad_edge=False, show_edge=False, title_justify="left",
              padding=(0, 0, 0, 1),
              caption=escape(caption) if caption else None, caption_justify="left")
    for i, h in enumerate(heads):
        t.add_column(escape(h), justify="left" if i < text_columns else "right", no_wrap=i < text_columns)
    for r in rows:
        t.add_row(*(escape(str(c)) for c in r))
    return t


def _tables(cat: Catalogue) -> tuple[Table, Table]:
    g_heads = ("name", "bf16\n[TFLOP/s]", "fp8\n[TFLOP/s]", "HBM\n[GB]", "HBM BW\n[GB/s]", "NVLink\n[GB/s]",
               "price\n[$/GPU-h]", "measured\ndata")
    g_rows = [tuple(r[h] for h in GPU_COLUMNS if h not in ("price date", "price basis")) for r in gpu_rows(cat)]
    gpus = _table("GPUs (dense peak; NVLink per direction; sources, dates: --format json)", g_heads, g_rows, 1,
                  "price - = none in the catalogue (pass --price GPU=USD_PER_GPU_HOUR); what each price is "
                  "(provider, instance, on-demand or capacity block): --format csv|md|json")
    c_heads = ("name", "GPU", "GPUs/node\n(NVLink)", "BW [GB/s]\nintra/inter", "lat [us]\nintra/inter",
               "price\n[$/GPU-h]")
    c_rows = [(r["name"], r["GPU"], f"{r['GPUs/node']} ({r['NVLink domain [GPUs]']})",
               f"{r['intra BW [GB/s]']}/{r['inter BW [GB/s]']}", f"{r['intra lat [us]']}/{r['inter lat [us]']}",
               r["price [USD/GPU-h]"] + ("*" if r["price of"] == "GPU" else "")) for r in cluster_rows(cat)]
    clusters = _table("Node types (bandwidth per GPU per direction; intra = inside the NVLink domain)", c_heads,
                      c_rows, 2, "legend: * = the GPU type's price (the node type has none of its own); "
                      "networks: --format csv|md|json")
    return gpus, clusters


def catalogue_json(cat: Catalogue) -> dict:
    """The catalogue as plain JSON-ready data (every field, with figure sources and the registry)."""
    return {"gpus": [dataclasses.asdict(g) for g in cat.gpus.values()],
            "clusters": [dataclasses.asdict(c) for c in cat.clusters.values()],
            "sources": cat.sources}


def catalogue_csv(cat: Catalogue) -> str:
    """GPU and node-type rows in one CSV: 'kind' (gpu | cluster) first, then the union of both headers."""
    head = ["kind", *GPU_COLUMNS, *[h for h in CLUSTER_COLUMNS if h not in GPU_COLUMNS]]
    rows = [{"kind": "gpu", **r} for r in gpu_rows(cat, True)] + \
        [{"kind": "cluster", **r} for r in cluster_rows(cat, True)]
    return csv_text(rows, head)


def gpus_command(
    format: OutputFormat = typer.Option(OutputFormat.table, "--format", help="table | json | csv | md."),
    hardware_file: Optional[List[Path]] = typer.Option(
        None, "--hardware-file", help="TOML/YAML file with [gpus.NAME] / [clusters.NAME] tables (repeatable)."),
    wide: Wide = False,
) -> None:
    """List the GPU and node types the planner knows, with their figures, prices and sources.

    GPUs: dense bf16 and fp8 peak [TFLOP/s], HBM capacity [GB] and bandwidth [GB/s], NVLink bandwidth per
    direction [GB/s/dir], price [USD/GPU-h]. Node types: GPUs per node and per NVLink domain, bandwidth per
    GPU per direction inside (intra) and across (inter) the NVLink domain [GB/s], latency [us], network,
    price [USD/GPU-h] (the GPU's where the node type has none). Sources of every figure: --format json.
    """
    try:
        cat = load_catalogue(hardware_file or ())
    except PlannerError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(code=2) from None
    if format == OutputFormat.json:
        typer.echo(json.dumps(catalogue_json(cat), indent=2))
    elif format == OutputFormat.csv:
        sys.stdout.write(catalogue_csv(cat))
    elif format == OutputFormat.md:
        sys.stdout.write("### GPUs\n\n" + md_rows(gpu_rows(cat)) + "\n### Node types\n\n" + md_rows(cluster_rows(cat)))
    else:
        con = console()
        for table in _tables(cat):
            print_table(con, table)


def register(app: typer.Typer) -> None:
    app.command("gpus")(gpus_command)
