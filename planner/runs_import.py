"""Measured runs from training logs: `planner runs import --from megatron|nemo|torchtitan LOG...`.

Each log gives one measured run: the per-iteration lines the framework prints are parsed (formats below, each
taken from the framework's source at the cited commit), lines whose averaging window reaches into the first
``skip`` iterations (warm-up) are dropped, and the median of the rest is the run's measurement. A log does not
say the layout it ran, so the model, GPU and parallel layout come from the caller (:class:`Layout`); the row is
written in the run-file schema that `planner validate --runs` and `planner calibrate --runs` read
(:mod:`planner.validation.runs`) and is checked by mapping it back to planner inputs before it is written.

What each framework prints, and the metric written:

* **megatron** -- Megatron-LM ``megatron/training/training.py::training_log`` (NVIDIA/Megatron-LM
  @001b00c2734d8f0fad096fe48a382fedf755d321): ``[date] iteration {i:8d}/{n:8d} | consumed samples: ... |
  elapsed time per iteration (ms): {:.1f} | throughput per GPU (TFLOP/s/GPU): {:.1f} | learning rate: ... |
  global batch size: {:5d} | lm loss: ...``; the time is the mean over the iterations since the last reset
  of the ``interval-time`` timer; the line of the first iteration is printed without resetting it
  (``should_reset = not is_first_iteration``), so the next line's window starts at the first iteration.
  Metric: ``iteration_time_s``.
* **nemo** -- NeMo 2 ``nemo/lightning/pytorch/callbacks/progress_printer.py::ProgressPrinter``
  (NVIDIA/NeMo @01f7dbc537d780c4faa456ea2078da037b109e57): ``Training epoch {e}, iteration {n}/{total} |
  lr: ... | global_batch_size: 8 | global_step: 1 | reduced_train_loss: ... | train_step_timing in s: 2.505``
  (values averaged over ``log_interval`` steps, ``{:.4}``); and the Lightning progress bar
  (``... [10:48<00:00, reduced_train_loss=0.0172, global_step=99.00, ..., train_step_timing in s=3.130]``,
  one step per update). ``train_step_timing in s`` is the TimingCallback's step time that NeMo's own
  FLOPs callback reads (``flops_callback.py`` @0240b890c93fc0795f9d5614cac05a5478eaaf77, which logs
  ``tflops_per_sec_per_gpu``). Metric: ``iteration_time_s``.
* **torchtitan** -- ``torchtitan/components/metrics.py::MetricsProcessor.log`` (pytorch/torchtitan
  @00fbaafa6ea1b54dd1a9b451a648f196781e8b26): ``step: {s:2}  loss: ...  grad_norm: ...  memory: {:5.2f}GiB({:.2f}%)
  tps: {round(tps):,}  tflops: {:,.2f}  mfu: {:.2f}%`` (ANSI colours unless ``disable_color_printing``), logged
  at step 1 and every ``log_freq`` steps (``should_log``); ``tps`` = tokens since the last log / (seconds x
  non-data-parallel size) = tokens/s per GPU. torchtitan prints no iteration time, so the metric is
  ``tokens_per_s_per_gpu``.

Warm-up (``skip``, default :data:`DEFAULT_SKIP`): a line is used only when every iteration it averages comes
after iteration ``skip``. Other figures the log prints (TFLOP/s, MFU, tokens/s) go into the row's notes as the
median of the same lines, in the framework's own FLOP convention (not planner's; see README "MFU convention").
"""

from __future__ import annotations

import csv
import dataclasses
import io
import re
import statistics
from dataclasses import dataclass, field
from pathlib import Path

from costmodel.core.errors import PlannerError

FRAMEWORKS = ("megatron", "nemo", "torchtitan")

DEFAULT_SKIP = 10
"""Iterations treated as warm-up. Source: NeMo's FLOPs callback (``flops_callback.py`` @0240b890,
``eval_tflops_per_sec_per_gpu``): "Step time will be less stable for initial steps (~10 steps)"; Megatron-LM
logs the first iteration on its own "to document initialization overhead" and torchtitan lowers its
collective timeout after step 1 "assuming lazy init and compilation are finished" (train.py), so the first
iteration at least is never steady state."""

RUN_COLUMNS = ("id", "source", "model_name", "n_layers", "hidden", "n_heads", "n_kv_heads", "ffn_hidden", "vocab",
               "seq_len", "arch_notes", "gpu", "n_gpus", "gpus_per_node", "interconnect", "tp", "pp", "dp", "cp",
               "ep", "vp", "mbs", "gbs", "recompute", "seq_parallel", "dist_optimizer_or_zero", "precision",
               "framework", "measured_metric", "measured_value", "notes")
"""Header of the run file, in the column order of ``shared/validation/published_runs.csv`` (the columns
:data:`planner.validation.runs.REQUIRED_COLUMNS` requires plus ``interconnect``)."""

_ANSI = re.compile(r"\x1b\[[0-9;]*m")
_NUM = r"[-+]?(?:\d[\d,]*\.?\d*|\.\d+)(?:[eE][-+]?\d+)?"


@dataclass
class LogLine:
    """One per-iteration line of a training log."""

    iteration: int
    """Iteration (step) the line reports, 1-based."""
    first: int
    """First iteration the line's figures average over."""
    values: dict
    """iteration_time_s, tflops_per_gpu, tokens_per_s_per_gpu, mfu_pct, gbs: whatever the line prints."""


@dataclass
class LogSummary:
    """What one log measured after warm-up."""

    path: Path
    framework: str
    lines: list
    """Every parsed LogLine."""
    used: list
    """The lines after warm-up."""
    skip: int
    medians: dict = field(default_factory=dict)
    segment: str = ""
    """The part of the log measured, in words, when not the whole run (the final constant-batch segment after a
    batch-size ramp-up, or the iterations from --from-iteration on)."""

    @property
    def metric(self) -> str:
        return "tokens_per_s_per_gpu" if self.framework == "torchtitan" else "iteration_time_s"


def _number(text: str) -> float:
    return float(text.replace(",", ""))


def _fields(parts, sep: str) -> dict:
    out = {}
    for part in parts:
        key, _, val = part.partition(sep)
        m = re.match(rf"\s*({_NUM})", val)
        if key.strip() and m:
            out[key.strip()] = _number(m.group(1))
    return out


# ----------------------------------------------------------------------------------- per framework
_MEGATRON = re.compile(r"iteration\s+(\d+)\s*/\s*\d+\s*\|(.*)$")


def _megatron(text: str) -> list[LogLine]:
    out: list[LogLine] = []
    run: list[LogLine] = []  # the lines of the current run (a restarted job starts a new one in the same file)
    for raw in text.splitlines():
        m = _MEGATRON.search(raw)
        if not m:
            continue
        it = int(m.group(1))
        f = _fields(m.group(2).split("|"), ":")
        if "elapsed time per iteration (ms)" not in f:
            continue
        if run and it <= run[-1].iteration:
            run = []
        # a run's first line averages from start-up; its second line does too when the first was the
        # first-iteration line, printed without resetting the timer (training.py: should_reset); counted
        # from iteration 1 in both cases, so they fall in the warm-up
        first = run[-1].iteration + 1 if len(run) >= 2 else 1
        vals = {"iteration_time_s": f["elapsed time per iteration (ms)"] / 1000.0}
        if "throughput per GPU (TFLOP/s/GPU)" in f:
            vals["tflops_per_gpu"] = f["throughput per GPU (TFLOP/s/GPU)"]
        if "global batch size" in f:
            vals["gbs"] = int(f["global batch size"])
        line = LogLine(it, first, vals)
        run.append(line)
        out.append(line)
    return out


_NEMO_PRINTER = re.compile(r"Training epoch \d+, iteration (\d+)/\d+((?:\s*\|[^|]*)*)")
_NEMO_BAR = re.compile(r"\[[^\[\]]*train_step_timing in s=[^\[\]]*\]")


def _nemo(text: str) -> list[LogLine]:
    out: list[LogLine] = []
    for raw in re.split(r"[\r\n]", text):
        m = _NEMO_PRINTER.search(raw)
        if m:
            it = int(m.group(1))
            f = _fields(m.group(2).split("|"), ":")
            first = out[-1].iteration + 1 if out and out[-1].iteration < it else 1
        else:
            bar = _NEMO_BAR.search(raw)
            if not bar:
                continue
            f = _fields(bar.group(0).strip("[]").split(","), "=")
            if "global_step" not in f:
                continue
            it = int(f["global_step"]) + 1  # Lightning's global_step counts completed steps from 0
            first = it
        if "train_step_timing in s" not in f:
            continue
        if out and it == out[-1].iteration:  # the progress bar repeats a step: keep the last update
            out.pop()
        vals = {"iteration_time_s": f["train_step_timing in s"]}
        if "tflops_per_sec_per_gpu" in f:
            vals["tflops_per_gpu"] = f["tflops_per_sec_per_gpu"]
        if "global_batch_size" in f:
            vals["gbs"] = int(f["global_batch_size"])
        out.append(LogLine(it, first, vals))
    return out


_TITAN = re.compile(rf"(?<!validate )step:\s*(\d+)\s.*?tps:\s*({_NUM})(?:\s+tflops:\s*({_NUM}))?"
                    rf"(?:\s+mfu:\s*({_NUM})%)?")


def _torchtitan(text: str) -> list[LogLine]:
    out: list[LogLine] = []
    for raw in text.splitlines():
        m = _TITAN.search(_ANSI.sub("", raw))
        if not m:
            continue
        it = int(m.group(1))
        # the window since the last log (metrics.py: time_last_log reset after each log; set at start-up)
        first = out[-1].iteration + 1 if out and out[-1].iteration < it else 1
        vals = {"tokens_per_s_per_gpu": _number(m.group(2))}
        if m.group(3):
            vals["tflops_per_gpu"] = _number(m.group(3))
        if m.group(4):
            vals["mfu_pct"] = _number(m.group(4))
        out.append(LogLine(it, first, vals))
    return out


PARSERS = {"megatron": _megatron, "nemo": _nemo, "torchtitan": _torchtitan}
LINE_FORMATS = {
    "megatron": "'iteration N/M | ... | elapsed time per iteration (ms): X |' (Megatron-LM training_log)",
    "nemo": "'Training epoch E, iteration N/M | ... | train_step_timing in s: X' (NeMo ProgressPrinter) or "
            "'train_step_timing in s=X' in the progress bar",
    "torchtitan": "'step: N  loss: ...  tps: X  tflops: Y  mfu: Z%' (torchtitan MetricsProcessor)",
}


def read_log(path: str | Path, framework: str, skip: int = DEFAULT_SKIP,
             from_iteration: int | None = None) -> LogSummary:
    """Parse one log; PlannerError (one line, with the fix) when it has no usable line after warm-up.

    A log whose global batch changes (batch-size ramp-up) is measured on its final constant-batch segment: the lines
    whose window starts after the first line that prints the final batch (the window of that line may still hold
    iterations of the previous batch). ``from_iteration`` N instead uses the lines whose window starts at N or
    later (their batch must then be constant)."""
    if framework not in PARSERS:
        raise PlannerError(f"--from {framework!r} is not one of {', '.join(FRAMEWORKS)}")
    if skip < 0:
        raise PlannerError(f"--skip {skip} must be 0 or more iterations")
    if from_iteration is not None and from_iteration < 1:
        raise PlannerError(f"--from-iteration {from_iteration} must be an iteration number, 1 or more")
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except OSError as exc:
        raise PlannerError(f"cannot read log {path}: {exc.strerror}; pass an existing log file") from None
    lines = PARSERS[framework](text)
    if not lines:
        raise PlannerError(f"{path}: no {framework} iteration lines found (expected {LINE_FORMATS[framework]}); "
                           "check --from")
    start, segment = _segment_start(lines, from_iteration)
    used = [ln for ln in lines if ln.first > skip and ln.first >= start]
    if not used:
        raise PlannerError(f"{path}: no iteration line in {segment or 'the run'} after the first {skip} warm-up "
                           f"iterations (the log ends at iteration {lines[-1].iteration}); lower --skip or "
                           "--from-iteration, or log a longer run")
    gbs = {ln.values["gbs"] for ln in used if "gbs" in ln.values}
    if len(gbs) > 1:
        raise PlannerError(f"{path}: the global batch size changes from iteration {from_iteration} on "
                           f"({sorted(gbs)}); pass a later --from-iteration, after the ramp-up")
    keys = sorted({k for ln in used for k in ln.values if k != "gbs"})
    medians = {k: statistics.median(ln.values[k] for ln in used if k in ln.values) for k in keys}
    if gbs:
        medians["gbs"] = gbs.pop()
    return LogSummary(path, framework, lines, used, skip, medians, segment)


def _segment_start(lines: list, from_iteration: int | None) -> tuple[int, str]:
    """(first iteration a used line's window may start at, the segment in words; "" for the whole run)."""
    if from_iteration is not None:
        return from_iteration, f"the iterations from {from_iteration} on (--from-iteration)"
    batches = [(ln.iteration, ln.values["gbs"]) for ln in lines if "gbs" in ln.values]
    if len({b for _, b in batches}) <= 1:
        return 1, ""
    final = batches[-1][1]
    changed = max(i for i, (_, b) in enumerate(batches) if b != final)
    first_final = batches[changed + 1][0]  # the first line that prints the final batch
    ramp = " -> ".join(str(b) for b in dict.fromkeys(b for _, b in batches))
    return first_final + 1, (f"the final constant-batch segment (global batch {final} from iteration "
                             f"{first_final + 1}, after the batch-size ramp-up {ramp})")


# ----------------------------------------------------------------------------------- the run row
@dataclass
class Layout:
    """The run's model and layout, which the log does not state (from the command's flags)."""

    model: str | None = None
    gpu: str | None = None
    gpus: int | None = None
    tp: int | None = None
    pp: int | None = None
    mbs: int | None = None
    gbs: int | None = None
    seq_len: int | None = None
    dtype: str | None = None
    cp: int = 1
    vpp: int = 1
    gpus_per_node: int | None = None
    recompute: str | None = None
    sequence_parallel: bool | None = None
    zero: int | None = None
    interconnect: str = ""

    REQUIRED = ("model", "gpu", "gpus", "tp", "pp", "mbs", "gbs", "seq_len", "dtype")

    def missing(self) -> list[str]:
        return ["--" + name.replace("_", "-") for name in self.REQUIRED if getattr(self, name) is None]


_ZERO_TEXT = {0: "none", 1: "distributed optimizer (ZeRO-1)", 2: "ZeRO-2", 3: "ZeRO-3 (FSDP)"}
_ACT = {"swiglu": "SwiGLU", "gelu": "GELU", "squared_relu": "squared-ReLU"}
_NORM = {"rmsnorm": "RMSNorm", "layernorm": "LayerNorm"}
_POS = {"rope": "RoPE", "learned": "learned abs pos emb"}


def _arch_notes(spec) -> str:
    parts = [_ACT.get(spec.activation, spec.activation), _NORM.get(spec.norm, spec.norm),
             _POS.get(spec.position_embedding, spec.position_embedding)]
    return ", ".join(parts) + " (from planner's model spec)"


def _fmt(v: float) -> str:
    return f"{v:.6g}"


def run_row(summary: LogSummary, layout: Layout, row_id: str) -> dict:
    """The run-file row of one log (``source`` = the log's file name, ``framework`` = the --from value)."""
    from costmodel.core.specs.presets import resolve_model  # deferred: presets load only when importing runs

    spec = resolve_model(layout.model)
    gbs = layout.gbs if layout.gbs is not None else summary.medians.get("gbs")
    if layout.gbs is not None and "gbs" in summary.medians and summary.medians["gbs"] != layout.gbs:
        raise PlannerError(f"{summary.path}: the log prints global batch size {summary.medians['gbs']}, "
                           f"--gbs says {layout.gbs}; drop --gbs or fix it")
    tp, pp, cp, n = layout.tp or 1, layout.pp or 1, layout.cp or 1, layout.gpus or 0
    if n % (tp * pp * cp):
        raise PlannerError(f"--gpus {n} is not a multiple of TP*PP*CP = {tp}*{pp}*{cp}; fix the layout flags")
    gaps = [what for what, val in (("recompute", layout.recompute), ("sequence parallelism",
            layout.sequence_parallel), ("optimizer sharding (--zero)", layout.zero)) if val is None]
    tier = "B" if gaps else "A"
    med = summary.medians
    seen = [f"{k} {_fmt(med[k])}" for k in ("tflops_per_gpu", "mfu_pct", "tokens_per_s_per_gpu")
            if k in med and k != summary.metric]
    after = f"; measured on {summary.segment}" if summary.segment else ""
    notes = (f"TIER={tier}; imported by `planner runs import --from {summary.framework}`: median of "
             f"{len(summary.used)} of {len(summary.lines)} logged lines (iterations {summary.used[0].first}-"
             f"{summary.used[-1].iteration}; the first {summary.skip} iterations skipped as warm-up{after})"
             + (f"; also printed (framework's own FLOP count): {', '.join(seen)}" if seen else "")
             + (f"; not stated: {', '.join(gaps)}" if gaps else ""))
    sp = layout.sequence_parallel
    row = {
        "id": row_id, "source": summary.path.name, "model_name": spec.name, "n_layers": spec.num_layers,
        "hidden": spec.hidden_size, "n_heads": spec.num_heads, "n_kv_heads": spec.num_kv_heads,
        "ffn_hidden": spec.ffn_hidden_size, "vocab": spec.vocab_size, "seq_len": layout.seq_len,
        "arch_notes": _arch_notes(spec), "gpu": layout.gpu, "n_gpus": n, "gpus_per_node": layout.gpus_per_node or "",
        "interconnect": layout.interconnect, "tp": tp, "pp": pp, "dp": n // (tp * pp * cp), "cp": cp, "ep": "",
        "vp": layout.vpp if layout.vpp and layout.vpp > 1 else "", "mbs": layout.mbs, "gbs": gbs,
        "recompute": layout.recompute or "", "seq_parallel": "" if sp is None else ("y" if sp else "n"),
        "dist_optimizer_or_zero": "" if layout.zero is None else _ZERO_TEXT.get(layout.zero, f"ZeRO-{layout.zero}"),
        "precision": layout.dtype, "framework": summary.framework, "measured_metric": summary.metric,
        "measured_value": _fmt(med[summary.metric]), "notes": notes,
    }
    return row


def check_row(row: dict):
    """The ModelSpec validate/calibrate will build from ``row`` (:func:`planner.validation.runs.row_to_inputs`);
    PlannerError (one line) when the row cannot be predicted."""
    # deferred: the validation package loads only when importing runs
    from planner.validation.runs import INT_COLUMNS, OPTIONAL_TEXT_COLUMNS, TEXT_COLUMNS, RunRow, row_to_inputs

    values = {c: (int(row[c]) if str(row[c]).strip() != "" else None) for c in INT_COLUMNS}
    text = {c: str(row.get(c, "")) for c in TEXT_COLUMNS + OPTIONAL_TEXT_COLUMNS}
    rr = RunRow(id=row["id"], source=row["source"], model_name=row["model_name"], values=values, text=text,
                measured_metric=row["measured_metric"], measured_value=float(row["measured_value"]))
    try:
        model, _, _, _ = row_to_inputs(rr)
    except PlannerError as exc:
        raise PlannerError(f"{row['source']}: the layout cannot be predicted ({exc}); fix the layout flags") from None
    return model


def lost_fields(preset, model) -> list[str]:
    """Architecture fields of ``preset`` that ``model`` (rebuilt from the run row) lacks: what the run-file
    schema cannot carry (validate and calibrate predict the row's model, not the preset)."""
    skip = {"name", "source", "extra", "max_seq_len"}
    return [f"{f.name}={getattr(preset, f.name)!r} (the row gives {getattr(model, f.name)!r})"
            for f in dataclasses.fields(preset)
            if f.name not in skip and getattr(preset, f.name) != getattr(model, f.name)]


def to_csv(rows: list[dict], existing: str = "") -> str:
    """CSV text of ``rows`` under the run-file header (after the rows of ``existing``, a run file's text)."""
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=RUN_COLUMNS, lineterminator="\n")
    if existing.strip():
        reader = csv.DictReader(io.StringIO(existing))
        missing = [c for c in RUN_COLUMNS if c not in (reader.fieldnames or [])]
        if missing:
            raise PlannerError(f"--append: the existing run file lacks column {missing[0]!r}; write a new --out file")
        w.writeheader()
        for old in reader:
            w.writerow({c: old.get(c, "") for c in RUN_COLUMNS})
    else:
        w.writeheader()
    for r in rows:
        w.writerow(r)
    return buf.getvalue()
