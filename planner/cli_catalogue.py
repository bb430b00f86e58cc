"""`planner gpus`: list the hardware catalogue (GPU and node types) as a table or JSON."""

from __future__ import annotations

import dataclasses
import json
from enum import Enum
from pathlib import Path
from typing import List, Optional

import typer
from rich.console import Console
from rich.table import Table

from costmodel.core.errors import PlannerError
from costmodel.core.specs.catalogue import Catalogue, load_catalogue


class OutputFormat(str, Enum):
    table = "table"
    json = "json"


def _num(v: float | None, digits: int = 0) -> str:
    if v is None:
        return "-"
    return f"{v:,.{digits}f}"


def _price(price: float | None, date: str) -> str:
    if price is None:
        return "-"
    return f"{price:.2f} ({date})" if date else f"{price:.2f}"


def _tables(cat: Catalogue):
    gpus = Table(title="GPUs (dense peak; sources: planner gpus --format json)")
    for header in ("name", "bf16 [TFLOP/s]", "fp8 [TFLOP/s]", "HBM [GB]", "HBM [GB/s]", "NVLink [GB/s/dir]",
                   "price [$/GPU-h] (date)", "measured data"):
        gpus.add_column(header, overflow="fold", no_wrap=header == "name")
    for g in cat.gpus.values():
        gpus.add_row(g.name, _num(g.peak_tflops.get("bf16"), 1), _num(g.peak_tflops.get("fp8"), 1),
                     _num(g.hbm_gb), _num(g.hbm_bw_gbs), _num(g.nvlink_bw_gbs),
                     _price(g.price_usd_per_gpu_hour, g.price_date), "yes" if g.measured_data else "no")
    clusters = Table(title="Clusters / node types (bandwidth per GPU per direction; intra = inside the NVLink domain)")
    for header in ("name", "GPU", "GPUs/node", "NVLink domain", "intra [GB/s]", "inter [GB/s]", "intra lat [us]",
                   "inter lat [us]", "network", "price [$/GPU-h]"):
        clusters.add_column(header, overflow="fold", no_wrap=header in ("name", "GPU"))
    for c in cat.clusters.values():
        clusters.add_row(c.name, c.gpu, str(c.gpus_per_node), str(c.nvlink_domain or c.gpus_per_node),
                         _num(c.intra_node_bw_gbs), _num(c.inter_node_bw_gbs),
                         _num(c.intra_node_latency_us, 1), _num(c.inter_node_latency_us, 1), c.network,
                         _price(c.price_usd_per_gpu_hour, c.price_date) if c.price_usd_per_gpu_hour is not None
                         else "GPU's")
    return gpus, clusters


def catalogue_json(cat: Catalogue) -> dict:
    """The catalogue as plain JSON-ready data (every field, with figure sources and the registry)."""
    return {"gpus": [dataclasses.asdict(g) for g in cat.gpus.values()],
            "clusters": [dataclasses.asdict(c) for c in cat.clusters.values()],
            "sources": cat.sources}


def gpus_command(
    format: OutputFormat = typer.Option(OutputFormat.table, "--format", help="table or json."),
    hardware_file: Optional[List[Path]] = typer.Option(
        None, "--hardware-file", help="TOML/YAML file with [gpus.NAME] / [clusters.NAME] tables (repeatable)."),
) -> None:
    """List the GPU and node types the planner knows, with their figures, prices and sources."""
    try:
        cat = load_catalogue(hardware_file or ())
    except PlannerError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(code=2) from None
    if format == OutputFormat.json:
        typer.echo(json.dumps(catalogue_json(cat), indent=2))
        return
    console = Console()
    for table in _tables(cat):
        console.print(table)


def register(app: typer.Typer) -> None:
    app.command("gpus")(gpus_command)
