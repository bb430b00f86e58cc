"""`planner models`: list the shipped model presets."""

from __future__ import annotations

import json
from enum import Enum

import typer
from rich.console import Console
from rich.table import Table

from costmodel.core.specs.model import ModelSpec
from costmodel.core.specs.presets import get_preset, preset_names


class OutputFormat(str, Enum):
    table = "table"
    json = "json"


def model_row(spec: ModelSpec) -> dict:
    """The listed facts of one model (params from ModelSpec.total_params())."""
    return {
        "name": spec.name,
        "num_layers": spec.num_layers,
        "hidden_size": spec.hidden_size,
        "num_heads": spec.num_heads,
        "num_kv_heads": spec.num_kv_heads,
        "ffn_hidden_size": spec.ffn_hidden_size,
        "vocab_size": spec.vocab_size,
        "activation": spec.activation,
        "norm": spec.norm,
        "position_embedding": spec.position_embedding,
        "params_billion": round(spec.total_params() / 1e9, 3),
        "max_seq_len": spec.max_seq_len,
        "source": spec.source,
    }


def _table(rows: list[dict]) -> Table:
    table = Table(title="Model presets (search_spaces/models/*.toml)")
    table.add_column("name", no_wrap=True)
    table.add_column("layers", justify="right")
    table.add_column("hidden (dim)", justify="right")
    table.add_column("heads / kv heads", justify="right")
    table.add_column("FFN (dim)", justify="right")
    table.add_column("vocab (tokens)", justify="right")
    table.add_column("activation")
    table.add_column("norm")
    table.add_column("params (B)", justify="right")
    table.add_column("max seq (tokens)", justify="right")
    table.add_column("source", overflow="fold")
    for r in rows:
        table.add_row(r["name"], str(r["num_layers"]), str(r["hidden_size"]),
                      f"{r['num_heads']} / {r['num_kv_heads']}", str(r["ffn_hidden_size"]), str(r["vocab_size"]),
                      r["activation"], r["norm"], f"{r['params_billion']:.2f}", str(r["max_seq_len"]), r["source"])
    return table


def register(app: typer.Typer) -> None:
    @app.command("models")
    def models(
        fmt: OutputFormat = typer.Option(OutputFormat.table, "--format", help="Output as a table or as JSON."),
    ) -> None:
        """List the shipped model presets (use a name with --model, or pass a config.json path)."""
        rows = [model_row(get_preset(n)) for n in preset_names()]
        if fmt is OutputFormat.json:
            typer.echo(json.dumps(rows, indent=2))
        else:
            console = Console()
            if not console.is_terminal:  # piped or captured: do not squeeze the table to 80 columns
                console = Console(width=200)
            console.print(_table(rows))
