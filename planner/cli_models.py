"""`planner models`: list the shipped model presets."""

from __future__ import annotations

import json
import sys
from enum import Enum

import typer
from rich import box
from rich.markup import escape
from rich.table import Table

from costmodel.core.specs.model import ModelSpec
from costmodel.core.specs.presets import get_preset, preset_names
from planner.cli_options import Wide
from planner.formats import HEADERS, csv_text, md_rows
from planner.tables import console, print_table


class OutputFormat(str, Enum):
    table = "table"
    json = "json"
    csv = "csv"
    md = "md"


# model_row key -> column header (the plan columns' names where they mean the same: planner.formats.HEADERS)
COLUMNS = {"name": HEADERS["model"], "num_layers": HEADERS["num_layers"], "hidden_size": HEADERS["hidden_size"],
           "num_heads": "Heads", "num_kv_heads": "KV Heads", "ffn_hidden_size": HEADERS["ffn_hidden_size"],
           "vocab_size": "Vocab [tokens]", "activation": "Activation", "norm": "Norm",
           "position_embedding": "Position Embedding", "params_billion": HEADERS["params_billion"],
           "max_seq_len": "Max Seq Length [tokens]", "num_experts": "Experts", "experts_per_token": "Top-k",
           "num_shared_experts": "Shared Experts", "moe_ffn_hidden_size": "Expert FFN",
           "active_params_billion": "Active Params [B]", "source": "Source"}


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
        # MoE facts (0 for dense models, whose active parameters are all of them: ModelSpec.active_params)
        "num_experts": spec.num_experts if spec.is_moe else 0,
        "experts_per_token": spec.experts_per_token if spec.is_moe else 0,
        "num_shared_experts": spec.num_shared_experts if spec.is_moe else 0,
        "moe_ffn_hidden_size": spec.expert_ffn if spec.is_moe else 0,
        "active_params_billion": round(spec.active_params() / 1e9, 3),
        "source": spec.source,
    }


def _table(rows: list[dict]) -> Table:
    table = Table(title="Model presets (search_spaces/models; vocab, max seq, norm, sources: --format csv|md|json)",
                  box=box.SIMPLE_HEAD, pad_edge=False, show_edge=False, title_justify="left", padding=(0, 0, 0, 1))
    table.add_column("name", no_wrap=True)
    for head in ("layers", "hidden", "heads\n/KV", "FFN"):
        table.add_column(escape(head), justify="right")
    table.add_column("MLP")
    table.add_column(escape("params\n[B]"), justify="right")
    table.add_column(escape("experts\n/top-k"), justify="right")
    table.add_column(escape("active\n[B]"), justify="right")
    for r in rows:
        experts = f"{r['num_experts']}/{r['experts_per_token']}" if r["num_experts"] else "-"
        if r["num_shared_experts"]:
            experts += f"+{r['num_shared_experts']}"
        table.add_row(r["name"], str(r["num_layers"]), str(r["hidden_size"]),
                      f"{r['num_heads']}/{r['num_kv_heads']}", str(r["ffn_hidden_size"]), r["activation"],
                      f"{r['params_billion']:.2f}", experts, f"{r['active_params_billion']:.2f}")
    return table


def register(app: typer.Typer) -> None:
    @app.command("models")
    def models(
        fmt: OutputFormat = typer.Option(OutputFormat.table, "--format", help="table | json | csv | md."),
        wide: Wide = False,
    ) -> None:
        """List the shipped model presets (use a name with --model, or pass a config.json path)."""
        rows = [model_row(get_preset(n)) for n in preset_names()]
        if fmt is OutputFormat.json:
            typer.echo(json.dumps(rows, indent=2))
        elif fmt in (OutputFormat.csv, OutputFormat.md):
            cells = [{COLUMNS[k]: v for k, v in r.items()} for r in rows]
            sys.stdout.write(csv_text(cells) if fmt is OutputFormat.csv else md_rows(cells))
        else:
            print_table(console(), _table(rows))
