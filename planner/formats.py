"""Output formats shared by every command that prints results: ``--format table | json | csv | md``.

The column names of plan results (with their units) are defined once here, in :data:`PLAN_FIELDS`, and
used by every command that prints plans: `search`, `compare` and `size` (through
:mod:`planner.search.records`) and `predict`, so a CSV of one command joins a CSV of another on the same
headers. Where a field means the same as a column of NeMo Auto Configurator's results summary
(``final_summary_<N>nodes.csv``, written by ``get_results()`` in NVIDIA/NeMo
``nemo/collections/llm/tools/auto_configurator/core/calculate_performance.py``: "Model Name", "Model Size",
"Seq Length", "TP", "PP", "CP", "EP", "MBS", "Num Layers", "Hidden Size", "FFN Hidden Size", "GBS", "Nodes",
"GPUs per Node", "Time per Step", "Samples per Second", "Model TFLOPS / GPU", "Model TFLOPS Aggregate") the
header is that name, followed by its unit in brackets; the others are planner's. Every quantity with a unit
carries it in its header; names, counts and parallel degrees have none.

This module also groups warnings (:func:`group_warnings`): one line per cause with a count; commands show
every line with ``--verbose``.
"""

from __future__ import annotations

import csv
import io
import json
import re
from dataclasses import dataclass
from typing import Callable, Iterable, Sequence

from costmodel.core.kinds import describe_cost_sources

FORMATS = ("table", "json", "csv", "md")
"""Formats every result-printing command accepts."""


def check_format(fmt: str, allowed: Sequence[str] = FORMATS) -> str:
    """``fmt`` when allowed; else ValueError with one line naming the choices."""
    if fmt not in allowed:
        raise ValueError(f"--format {fmt!r} is not one of {', '.join(allowed)}")
    return fmt


def _g6(v) -> str:
    return "" if v is None else f"{v:.6g}"


@dataclass(frozen=True)
class Field:
    """One column of plan results: the key it is read from, its header (unit included) and its cell."""

    key: str
    """Key in the flat plan dict (PlanRecord.to_dict() names; model facts: params_billion, num_layers, ...)."""
    header: str
    """Column header, unit in brackets where the quantity has one."""
    cell: Callable[[dict], object]
    """Cell value from the flat dict ('' where the field is unknown)."""


def _f(key: str, header: str, cell: Callable[[dict], object] | None = None) -> Field:
    return Field(key, header, cell or (lambda d: "" if d.get(key) is None else d[key]))


def _per_s(d: dict, num: str) -> str:
    t = d.get("iteration_time_s")
    return f"{d[num] / t:.6g}" if t and d.get(num) is not None else ""


PLAN_FIELDS: list[Field] = [
    _f("rank", "Rank"),
    _f("model", "Model Name"),
    _f("params_billion", "Model Size [B params]", lambda d: "" if d.get("params_billion") is None
       else round(d["params_billion"], 2)),
    _f("seq_len", "Seq Length [tokens]"),
    _f("tp", "TP"),
    _f("pp", "PP"),
    _f("cp", "CP"),
    _f("ep", "EP", lambda d: d.get("ep") or 1),
    _f("etp", "ETP", lambda d: d["etp"] if d.get("etp") is not None else d.get("tp", "")),  # default ETP = TP
    _f("mbs", "MBS [seq]"),
    _f("num_layers", "Num Layers"),
    _f("hidden_size", "Hidden Size"),
    _f("ffn_hidden_size", "FFN Hidden Size"),
    _f("gbs", "GBS [seq]"),
    _f("nodes", "Nodes"),
    _f("gpus_per_node", "GPUs per Node"),
    _f("iteration_time_s", "Time per Step [s]", lambda d: _g6(d.get("iteration_time_s"))),
    _f("samples_per_s", "Samples per Second [seq/s]", lambda d: _per_s(d, "gbs")),
    _f("model_tflops_per_gpu", "Model TFLOPS / GPU [TFLOP/s]", lambda d: _g6(d.get("model_tflops_per_gpu"))),
    _f("model_tflops_aggregate", "Model TFLOPS Aggregate [TFLOP/s]",
       lambda d: "" if d.get("model_tflops_per_gpu") is None or d.get("gpus") is None
       else f"{d['model_tflops_per_gpu'] * d['gpus']:.6g}"),
    _f("gpu", "GPU"),
    _f("cluster", "Cluster"),
    _f("gpus", "GPUs"),
    _f("dp", "DP"),
    _f("vpp", "VPP"),
    _f("layer_split", "Layers per Stage", lambda d: " ".join(map(str, d["layer_split"])) if d.get("layer_split")
       else ""),
    _f("recompute", "Recompute"),
    _f("sequence_parallel", "Sequence Parallel"),
    _f("zero", "ZeRO"),
    _f("dtype", "Dtype"),
    _f("iteration_time_low_s", "Time per Step Low [s]", lambda d: _g6(d.get("iteration_time_low_s"))),
    _f("iteration_time_high_s", "Time per Step High [s]", lambda d: _g6(d.get("iteration_time_high_s"))),
    _f("tokens_per_s", "Tokens per Second [tokens/s]", lambda d: _g6(d.get("tokens_per_s"))),
    _f("mfu", "MFU [fraction of peak]", lambda d: "" if d.get("mfu") is None else f"{d['mfu']:.4f}"),
    _f("memory_gib_per_gpu", "Memory per GPU [GiB]",
       lambda d: "" if d.get("memory_gib_per_gpu") is None else f"{d['memory_gib_per_gpu']:.2f}"),
    _f("price_usd_per_gpu_hour", "Price [USD/GPU-h]", lambda d: _g6(d.get("price_usd_per_gpu_hour"))),
    _f("usd_per_mtoken", "Cost per Million Tokens [USD/Mtoken]", lambda d: _g6(d.get("usd_per_mtoken"))),
    _f("time_to_train_s", "Time to Train [s]", lambda d: _g6(d.get("time_to_train_s"))),
    _f("cost_to_train_usd", "Cost to Train [USD]", lambda d: _g6(d.get("cost_to_train_usd"))),
    _f("bottleneck", "Bottleneck"),
    _f("pareto", "Pareto"),
    _f("cost_model_text", "Cost Model"),
]
"""Columns of plan results, in CSV order (search, compare, size, predict)."""

HEADERS: dict[str, str] = {f.key: f.header for f in PLAN_FIELDS}
"""Field key -> column header (with unit)."""


def model_facts(model) -> dict:
    """The model columns of :data:`PLAN_FIELDS` from a ModelSpec (None: none known)."""
    if model is None:
        return {}
    return {"params_billion": model.total_params() / 1e9, "num_layers": model.num_layers,
            "hidden_size": model.hidden_size, "ffn_hidden_size": model.ffn_hidden_size}


def plan_row(flat: dict, fields: Sequence[Field] = PLAN_FIELDS) -> dict[str, object]:
    """Header -> cell for one plan (``flat``: PlanRecord.to_dict() keys plus :func:`model_facts`)."""
    return {f.header: f.cell(flat) for f in fields}


# ------------------------------------------------------------------------------------- renderers
def csv_text(rows: Sequence[dict], headers: Sequence[str] | None = None) -> str:
    """Rows (header -> cell) as CSV with a header line (``headers`` default: the first row's keys)."""
    head = list(headers if headers is not None else (rows[0].keys() if rows else []))
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=head, lineterminator="\n", extrasaction="ignore")
    w.writeheader()
    for r in rows:
        w.writerow({k: "" if v is None else v for k, v in r.items()})
    return buf.getvalue()


def md_cell(cell: object) -> str:
    """A Markdown table cell: pipes escaped, line breaks flattened, None as '-'."""
    return "-" if cell is None else str(cell).replace("|", "\\|").replace("\n", " ")


def md_table(headers: Sequence[str], rows: Iterable[Sequence[object]]) -> str:
    """A GitHub-flavoured Markdown table (ends with a newline)."""
    lines = ["| " + " | ".join(md_cell(h) for h in headers) + " |", "|" + "---|" * len(headers)]
    lines += ["| " + " | ".join(md_cell(c) for c in row) + " |" for row in rows]
    return "\n".join(lines) + "\n"


def md_rows(rows: Sequence[dict], headers: Sequence[str] | None = None) -> str:
    """Rows (header -> cell) as a Markdown table."""
    head = list(headers if headers is not None else (rows[0].keys() if rows else []))
    return md_table(head, [[r.get(h) for h in head] for r in rows])


def rich_rows(rows: Sequence[dict], title: str = "", headers: Sequence[str] | None = None):
    """Rows (header -> cell) as a rich Table; headers and cells are escaped (no markup in data)."""
    # deferred: rich loads only when a table is printed
    from rich.markup import escape
    from rich.table import Table

    head = list(headers if headers is not None else (rows[0].keys() if rows else []))
    t = Table(title=escape(title) if title else None)
    for h in head:
        t.add_column(escape(h))
    for r in rows:
        t.add_row(*(escape("-" if r.get(h) is None else str(r.get(h))) for h in head))
    return t


def render_rows(fmt: str, rows: Sequence[dict], *, title: str = "", json_data=None) -> str | None:
    """Text of ``rows`` (header -> cell) in ``fmt`` (json: ``json_data`` when given, else the rows);
    None for 'table' (print :func:`rich_rows` yourself)."""
    if fmt == "json":
        return json.dumps(rows if json_data is None else json_data, indent=2) + "\n"
    if fmt == "csv":
        return csv_text(rows)
    if fmt == "md":
        return (f"### {title}\n\n" if title else "") + md_rows(rows)
    return None


# -------------------------------------------------------------------------------------- warnings
# Warnings of one prediction that differ only in the operator (or feature) they name share a cause:
# (pattern, cause template). The pattern's "item" group is what differs; the cause is the rest.
_WARNING_CAUSES: list[tuple[re.Pattern, str]] = [
    (re.compile(r"^(?P<item>\S+ \S+=\S+) outside sampled range \[[^\]]*\] (?P<rest>for .+)$"),
     "outside sampled range {rest}"),
    (re.compile(r"^no measured (?P<item>.+?) data (?P<rest>for .+)$"), "no measured data {rest}"),
    (re.compile(r"^(?P<item>\S+) across nodes: (?P<rest>.+)$"), "across nodes: {rest}"),
]
SHOWN_ITEMS = 4
"""Items named on a grouped warning line before '...'."""


def group_warnings(warnings: Sequence[str]) -> list[str]:
    """One line per cause, in first-seen order: a warning that several operators share (e.g. a feature
    outside the sampled range) becomes 'CAUSE (xN: item, item, ...)'; repeated identical lines become
    'LINE (xN)'; a cause seen once keeps its line as it was."""
    groups: dict[str, list[str]] = {}
    lines: dict[str, str] = {}
    for w in warnings:
        key, item = w, ""
        for pattern, template in _WARNING_CAUSES:
            m = pattern.match(w)
            if m:
                key, item = template.format(**m.groupdict()), m.group("item")
                break
        groups.setdefault(key, []).append(item)
        lines.setdefault(key, w)
    out = []
    for key, items in groups.items():
        n = len(items)
        if n == 1:
            out.append(lines[key])
            continue
        named = [i for i in dict.fromkeys(items) if i]
        shown = ", ".join(named[:SHOWN_ITEMS]) + (", ..." if len(named) > SHOWN_ITEMS else "")
        out.append(f"{key} (x{n}" + (f": {shown})" if shown else ")"))
    return out


def shown_warnings(warnings: Sequence[str], verbose: bool) -> tuple[list[str], str]:
    """(lines, note): every warning when ``verbose``, else :func:`group_warnings` and a note saying how many
    lines were folded ('' when none were)."""
    if verbose:
        return list(warnings), ""
    grouped = group_warnings(warnings)
    note = (f"{len(warnings)} warnings grouped into {len(grouped)} by cause; --verbose lists each"
            if len(grouped) < len(warnings) else "")
    return grouped, note


def prediction_row(rec: dict) -> dict[str, object]:
    """The plan columns of one `planner predict` record (its JSON: metrics at the top, the plan under 'plan');
    the model's size columns stay empty (the record does not carry them)."""
    plan = rec.get("plan") or {}
    flat = {**rec, **plan}
    if plan.get("gpus") and plan.get("gpus_per_node"):
        flat["nodes"] = -(-plan["gpus"] // plan["gpus_per_node"])
    if rec.get("cost_model"):
        flat["cost_model_text"] = describe_cost_sources(rec.get("cost_sources") or {}, rec["cost_model"])
    return plan_row(flat)
