"""profile.png: per-node FP16 sensitivity along the graph, and the output errors of one plan.

matplotlib with the Agg backend (no display needed), imported lazily so the CLI starts fast.
"""

from __future__ import annotations

from pathlib import Path
from typing import Iterable, Mapping, Sequence

import numpy as np

FLOOR = 1e-6  # scores below this (exact nodes) are drawn on the floor of the log axis


def render_profile_png(
    profile_nodes: Sequence[Mapping],
    fp32_nodes: Iterable[str],
    path: str | Path,
    output_errors: Mapping[str, np.ndarray] | None = None,
    title: str | None = None,
    tolerance: Mapping[str, float] | None = None,
) -> Path:
    """Write the picture and return its path.

    `profile_nodes`: records from `profile.compute_scores` (name, op, score, and index = topological position;
    without index the list order is taken as topological). `fp32_nodes`: highlighted (e.g. a search's final
    set). `output_errors`: {output name: absolute error array} of one plan, drawn as histograms under the
    profile. `tolerance`: {output name: atol}, drawn as a line on each histogram.
    """
    import matplotlib

    matplotlib.use("Agg", force=False)
    import matplotlib.pyplot as plt
    from matplotlib.lines import Line2D

    nodes = sorted(profile_nodes, key=lambda r: r.get("index", 0)) if all("index" in r for r in profile_nodes) \
        else list(profile_nodes)
    fp32 = set(fp32_nodes)
    n = len(nodes)
    outs = dict(output_errors or {})
    width = max(12.0, min(40.0, 0.16 * n + 4))
    rows = 2 if outs else 1
    fig = plt.figure(figsize=(width, 7.5 + (3.5 if outs else 0)), dpi=100)
    grid = fig.add_gridspec(rows, max(1, len(outs)), height_ratios=[2.2, 1] if outs else [1], hspace=1.0)
    ax = fig.add_subplot(grid[0, :])

    scores = np.array([max(float(r.get("score", 0.0)), FLOOR) for r in nodes], dtype=float)
    x = np.arange(n)
    ops = sorted({str(r.get("op", "?")) for r in nodes})
    cmap = plt.get_cmap("tab20", max(len(ops), 1))
    colour = {op: cmap(i) for i, op in enumerate(ops)}
    bar_colours = [colour[str(r.get("op", "?"))] for r in nodes]
    edges = ["crimson" if r["name"] in fp32 else "none" for r in nodes]
    ax.bar(x, scores, color=bar_colours, edgecolor=edges, linewidth=[2.0 if e != "none" else 0 for e in edges],
           bottom=FLOOR * 0.5)
    ax.set_yscale("log")
    ax.axhline(1.0, color="black", linestyle="--", linewidth=1)
    ax.text(n - 0.5 if n else 0, 1.0, " tolerance (score 1)", va="bottom", ha="right", fontsize=9)
    for i, r in enumerate(nodes):
        if r["name"] in fp32:
            ax.annotate("FP32", (i, scores[i]), xytext=(0, 3), textcoords="offset points", ha="center",
                        va="bottom", fontsize=7, color="crimson", fontweight="bold", rotation=90)
    ax.set_xlim(-0.7, n - 0.3 if n else 0.5)
    ax.set_xticks(x)
    labels = [_label(f"{r['name']} ({r.get('op', '?')})") for r in nodes]
    ax.set_xticklabels(labels, rotation=90, fontsize=6.5 if n > 60 else 8)
    for tick, r in zip(ax.get_xticklabels(), nodes):
        if r["name"] in fp32:
            tick.set_color("crimson")
            tick.set_fontweight("bold")
    ax.set_ylabel("FP16 sensitivity score (x tolerance, log)")
    ax.set_xlabel("candidate nodes in topological order")
    ax.set_title(_label(title) if title else f"FP16 sensitivity per node ({n} candidates, {len(fp32 & {r['name'] for r in nodes})} FP32)",
                 pad=50 + 14 * ((len(ops) + (1 if fp32 else 0)) // 12))
    ax.grid(axis="y", which="major", alpha=0.3)
    handles = [Line2D([0], [0], marker="s", linestyle="", markersize=8, color=colour[op], label=op) for op in ops]
    if fp32:
        handles.append(Line2D([0], [0], marker="s", linestyle="", markersize=8, markerfacecolor="white",
                              markeredgecolor="crimson", markeredgewidth=2, label="kept FP32"))
    ax.set_ylim(FLOOR * 0.5, max(float(scores.max(initial=1.0)), 1.0) * 300)
    ax.legend(handles=handles, ncol=min(len(handles), 12), fontsize=8, loc="lower center",
              bbox_to_anchor=(0.5, 1.06), frameon=False, title="op type (bar colour)", title_fontsize=8)

    for j, (name, err) in enumerate(outs.items()):
        hx = fig.add_subplot(grid[1, j])
        e = np.asarray(err, dtype=np.float64).ravel()
        finite = e[np.isfinite(e)]
        positive = finite[finite > 0]
        n_bad, n_zero = int(e.size - finite.size), int(finite.size - positive.size)
        if positive.size:
            lo, hi = positive.min(), positive.max()
            bins = np.logspace(np.log10(lo), np.log10(hi * 1.0001) if hi > lo else np.log10(lo) + 1, 30)
            hx.hist(positive, bins=bins, color="steelblue")
            hx.set_xscale("log")
        else:
            hx.text(0.5, 0.5, "no nonzero finite error", ha="center", va="center", transform=hx.transAxes)
        if tolerance and name in tolerance and tolerance[name] > 0:
            hx.axvline(tolerance[name], color="black", linestyle="--", linewidth=1, label=f"atol {tolerance[name]:g}")
            hx.legend(fontsize=8)
        hx.set_title(f"output '{_label(name)}': |error| ({e.size} elements; {n_zero} exact, {n_bad} inf/NaN)", fontsize=9)
        hx.set_xlabel("absolute error (log)")
        hx.set_ylabel("elements")

    import io

    from bisector.files import write_bytes_atomic

    path = Path(path)
    buf = io.BytesIO()
    fig.savefig(buf, format="png", bbox_inches="tight")
    plt.close(fig)
    write_bytes_atomic(path, buf.getvalue())  # atomic, like every artifact
    return path


def _label(text: str) -> str:
    """A name as matplotlib text: `$` would start mathtext (and fail to parse), control characters have no glyph."""
    from bisector.text import terminal

    return terminal(text).replace("$", r"\$")
