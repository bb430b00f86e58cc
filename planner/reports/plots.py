"""PNG plots for the reports, drawn with matplotlib's Agg renderer.

matplotlib is imported inside the functions only, so ``planner predict`` and ``planner search``
without ``--report`` never import it. No pyplot: each plot is a standalone Figure on an Agg
canvas, so no global state or display backend is touched. Every function returns PNG bytes
(written by the caller atomically); the PNG metadata carries no date or software version, so the
bytes depend only on the data and the matplotlib renderer.
"""

from __future__ import annotations

import io
import math
from typing import Sequence

import numpy as np

BREAKDOWN_CATEGORIES = ("compute", "pipeline bubble", "exposed TP comm", "exposed CP comm", "exposed EP comm",
                        "exposed PP comm", "exposed DP comm", "exposed ZeRO comm", "optimizer")
"""Time categories of a plan (costmodel.core.kinds.Category values of breakdown rows), in stacking order."""

_CATEGORY_COLOURS = {"compute": "#4c72b0", "pipeline bubble": "#c7c7c7", "exposed TP comm": "#dd8452",
                     "exposed CP comm": "#8172b3", "exposed PP comm": "#937860", "exposed DP comm": "#c44e52",
                     "exposed ZeRO comm": "#da8bc3", "optimizer": "#55a868", "exposed EP comm": "#64b5cd"}
DPI = 110


def _figure(width: float, height: float):
    # deferred: matplotlib (~0.3 s) is loaded only when a report with plots is written
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure  # deferred: as above

    fig = Figure(figsize=(width, height), dpi=DPI)
    FigureCanvasAgg(fig)
    return fig


def _png(fig) -> bytes:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=DPI, bbox_inches="tight", metadata={"Software": None})
    return buf.getvalue()


def _palette(n: int) -> list:
    from matplotlib import colormaps  # deferred: matplotlib only for plots

    cmap = colormaps["tab10" if n <= 10 else "tab20"]
    return [cmap(i % cmap.N) for i in range(n)]


def _plans(n: int) -> str:
    return f"{n} plan" if n == 1 else f"{n} plans"


def pareto_png(points: Sequence[tuple[str, float, float]], front: Sequence[tuple[float, float]], title: str,
               xlabel: str = "iteration time [s]", ylabel: str = "USD per million tokens",
               best: tuple[float, float] | None = None, vline: tuple[float, str] | None = None,
               notes: Sequence[tuple[float, float, str]] = ()) -> bytes:
    """Scatter of every plan (group label, x, y), coloured by group, with the Pareto front (x, y points,
    sorted by x) drawn as a highlighted step line; ``best`` marks the top-ranked plan, ``vline`` draws a
    labelled vertical line (x, label), ``notes`` writes text next to points (x, y, text)."""
    fig = _figure(7.5, 4.8)
    ax = fig.add_subplot()
    groups = sorted({g for g, _, _ in points})
    few = len(points) <= 20
    for colour, g in zip(_palette(len(groups)), groups):
        xs = [x for gg, x, _ in points if gg == g]
        ys = [y for gg, _, y in points if gg == g]
        ax.scatter(xs, ys, s=45 if few else 12, alpha=0.9 if few else 0.45, color=colour,
                   label=f"{g} ({_plans(len(xs))})", linewidths=0)
    if front:
        fx, fy = [x for x, _ in front], [y for _, y in front]
        ax.step(fx, fy, where="post", color="black", linewidth=1.2, zorder=3)
        ax.scatter(fx, fy, s=90 if few else 40, facecolors="none", edgecolors="black", linewidths=1.4, zorder=4,
                   label=f"Pareto front ({_plans(len(front))})")
    if vline is not None:
        ax.axvline(vline[0], color="firebrick", linestyle="--", linewidth=1.0, label=vline[1])
    for x, y, text in notes:
        ax.annotate(text, (x, y), textcoords="offset points", xytext=(6, 6), fontsize=8)
    if best is not None:
        ax.scatter([best[0]], [best[1]], s=120, marker="*", color="gold", edgecolors="black", zorder=5,
                   label="rank 1")
    xs_all = [x for _, x, _ in points] or [1.0]
    ys_all = [y for _, _, y in points] or [1.0]
    if max(xs_all) / max(min(xs_all), 1e-300) > 20:
        ax.set_xscale("log")
    if max(ys_all) / max(min(ys_all), 1e-300) > 20:
        ax.set_yscale("log")
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title, fontsize=10)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8, loc="best")
    return _png(fig)


def breakdown_png(bars: Sequence[tuple[str, dict]], title: str, xlabel: str = "seconds per iteration") -> bytes:
    """Horizontal stacked bars, one per plan (label, {category: seconds}), first plan on top; only the
    categories present in some plan get a legend entry."""
    cats = [c for c in BREAKDOWN_CATEGORIES if any(v.get(c, 0.0) > 0 for _, v in bars)]
    cats += sorted({c for _, v in bars for c in v if c not in BREAKDOWN_CATEGORIES and v[c] > 0})
    fig = _figure(8.0, 1.2 + 0.45 * max(1, len(bars)))
    ax = fig.add_subplot()
    ys = list(range(len(bars)))
    left = [0.0] * len(bars)
    for c in cats:
        widths = [v.get(c, 0.0) for _, v in bars]
        ax.barh(ys, widths, left=left, color=_CATEGORY_COLOURS.get(c), label=c, height=0.65)
        left = [a + b for a, b in zip(left, widths)]
    ax.set_yticks(ys, [label for label, _ in bars], fontsize=8)
    ax.invert_yaxis()
    ax.set_xlabel(xlabel)
    ax.set_title(title, fontsize=10)
    ax.grid(True, axis="x", alpha=0.3)
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False)
    return _png(fig)


_METRIC_MARKERS = ("o", "s", "^", "D", "v", "P", "X")


def validation_png(points: Sequence[tuple[str, str, float, float]], title: str) -> bytes:
    """Log-log scatter of (source, metric, measured, predicted), coloured by source and shaped by
    metric, with the y = x line and the +-10 % and +-20 % bands around it."""
    pts = [p for p in points if p[2] > 0 and p[3] > 0 and math.isfinite(p[2]) and math.isfinite(p[3])]
    fig = _figure(8.0, 6.0)
    ax = fig.add_subplot()
    vals = [v for _, _, m, p in pts for v in (m, p)] or [1.0, 10.0]
    lo, hi = min(vals) / 1.5, max(vals) * 1.5
    x = np.geomspace(lo, hi, 200)
    ax.fill_between(x, x * 0.8, x * 1.2, color="0.9", label="±20 %", linewidth=0)
    ax.fill_between(x, x * 0.9, x * 1.1, color="0.78", label="±10 %", linewidth=0)
    ax.plot(x, x, color="black", linewidth=1.0, label="predicted = measured")
    sources = sorted({s for s, _, _, _ in pts})
    metrics = sorted({m for _, m, _, _ in pts})
    colours = dict(zip(sources, _palette(len(sources))))
    markers = {m: _METRIC_MARKERS[i % len(_METRIC_MARKERS)] for i, m in enumerate(metrics)}
    for s in sources:
        for m in metrics:
            sel = [(a, b) for ss, mm, a, b in pts if ss == s and mm == m]
            if sel:
                ax.scatter([a for a, _ in sel], [b for _, b in sel], s=28, color=colours[s], marker=markers[m],
                           edgecolors="black", linewidths=0.4, zorder=3)
    from matplotlib.lines import Line2D  # deferred: matplotlib only for plots

    handles, labels = ax.get_legend_handles_labels()
    handles += [Line2D([], [], linestyle="", marker="o", color=colours[s], markeredgecolor="black",
                       markeredgewidth=0.4) for s in sources]
    labels += sources
    if len(metrics) > 1:
        handles += [Line2D([], [], linestyle="", marker=markers[m], color="0.4") for m in metrics]
        labels += [f"metric: {m}" for m in metrics]
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlim(lo, hi)
    ax.set_ylim(lo, hi)
    ax.set_aspect("equal")
    unit = "in the run's own metric unit" if len(metrics) > 1 else (metrics[0] if metrics else "")
    ax.set_xlabel(f"measured ({unit})")
    ax.set_ylabel(f"predicted ({unit})")
    ax.set_title(title, fontsize=10)
    ax.grid(True, which="both", alpha=0.25)
    ax.legend(handles, labels, fontsize=7, loc="upper left", bbox_to_anchor=(1.02, 1.0), frameon=False)
    return _png(fig)


def frontier_png(series: dict[str, Sequence[tuple[int, float, float | None, bool]]], deadline_days: float,
                 title: str) -> bytes:
    """The sizing frontier: per GPU type, (GPUs, days, cost in million USD or None, meets the deadline) points as
    lines in two panels sharing the GPU axis, expected days to train (with the deadline) above and cost below;
    filled markers meet the deadline."""
    fig = _figure(7.5, 6.2)
    top, bottom = fig.add_subplot(2, 1, 1), fig.add_subplot(2, 1, 2)
    for colour, (gpu, pts) in zip(_palette(len(series)), series.items()):
        pts = sorted(pts)
        xs = [p[0] for p in pts]
        top.plot(xs, [p[1] for p in pts], color=colour, linewidth=1.0, label=gpu)
        for ax, k in ((top, 1), (bottom, 2)):
            sel = [(p[0], p[k], p[3]) for p in pts if p[k] is not None]
            ax.scatter([x for x, _, m in sel if m], [y for _, y, m in sel if m], s=30, color=colour, zorder=3)
            ax.scatter([x for x, _, m in sel if not m], [y for _, y, m in sel if not m], s=30, zorder=3,
                       facecolors="none", edgecolors=[colour])
        priced = [p for p in pts if p[2] is not None]
        if priced:
            bottom.plot([p[0] for p in priced], [p[2] for p in priced], color=colour, linewidth=1.0, label=gpu)
    top.axhline(deadline_days, color="firebrick", linestyle="--", linewidth=1.0, label="deadline")
    for ax in (top, bottom):
        ax.set_xscale("log")
        ax.grid(True, which="both", alpha=0.3)
    top.set_ylabel("expected days to train")
    bottom.set_ylabel("expected cost [million USD]")
    bottom.set_xlabel("GPUs")
    top.set_title(title, fontsize=10)
    top.legend(fontsize=8, loc="best")
    if bottom.get_legend_handles_labels()[0]:
        bottom.legend(fontsize=8, loc="best")
    else:
        bottom.text(0.5, 0.5, "no price known: pass --price GPU=USD_PER_GPU_HOUR", ha="center", va="center",
                    transform=bottom.transAxes, fontsize=9)
    return _png(fig)
