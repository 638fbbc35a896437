"""The suite's one figure style, and byte-stable saving.

Every figure: ``apply_style()``, draw, then ``save_figure(fig, stem)`` which writes ``stem.pdf`` and
``stem.png`` with Type 42 fonts and no timestamps (identical bytes for identical data, so Snakemake
and git stay quiet). Paper values are drawn with ``paper_style()``: hollow markers or dashed lines,
labelled with the paper's hardware, never in a measured series' style.

    from repro.report.style import apply_style, save_figure, paper_style, measured_label
"""
from __future__ import annotations

import io
import os
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from repro.core.io import write_atomic  # noqa: E402

STYLE_FILE = Path(__file__).with_name("paper.mplstyle")
PAPER_COLOR = "0.35"


def apply_style() -> None:
    plt.style.use(str(STYLE_FILE))
    # Hash salt for SVG ids and deterministic PNG/PDF metadata.
    matplotlib.rcParams["svg.hashsalt"] = "repro"


def paper_style(kind: str = "marker") -> dict[str, Any]:
    """Keyword arguments for drawing a paper value: hollow markers or a dashed line."""
    if kind == "marker":
        return {"marker": "o", "markerfacecolor": "none", "markeredgecolor": PAPER_COLOR,
                "linestyle": "none", "markersize": 5, "markeredgewidth": 0.9, "zorder": 5}
    if kind == "line":
        return {"color": PAPER_COLOR, "linestyle": (0, (4, 2)), "linewidth": 0.9, "zorder": 1}
    raise ValueError(f"paper_style kind {kind!r}: expected 'marker' or 'line'")


def legend_below(ax, **kw) -> None:
    """The axes' legend under it, outside the data (the figure's constrained layout makes room)."""
    handles, labels = ax.get_legend_handles_labels()
    if handles:
        ax.legend(handles, labels, fontsize=kw.pop("fontsize", 5), loc="upper center", bbox_to_anchor=(0.5, -0.22),
                  frameon=False, **kw)


def log_ticks_at(ax, values, axis: str = "x", fmt=lambda v: f"{v:g}") -> None:
    """Label a log axis at the values drawn, so a range shorter than a decade still shows numbers."""
    import matplotlib.ticker as mticker
    vals = sorted({float(v) for v in values if v and v > 0})
    target = ax.xaxis if axis == "x" else ax.yaxis
    target.set_major_locator(mticker.FixedLocator(vals))
    target.set_major_formatter(mticker.FixedFormatter([fmt(v) for v in vals]))
    target.set_minor_formatter(mticker.NullFormatter())


def include_points(ax, xs, ys) -> None:
    """Widen the axes' limits so that every (x, y) drawn, the paper's points included, lies inside them."""
    ax.update_datalim(list(zip(xs, ys)))
    ax.autoscale_view()


def paper_label(hardware: str) -> str:
    return f"paper ({hardware})"


def measured_label(hardware: str, hardware_label: str = "") -> str:
    suffix = ", cpu-emulated" if hardware_label == "cpu-emulated" else ""
    return f"measured ({hardware}{suffix})"


def save_figure(fig, stem: str | os.PathLike) -> list[Path]:
    """Write ``stem.pdf`` and ``stem.png`` atomically, byte-stable; closes the figure."""
    stem = Path(stem)
    paths = []
    for ext, metadata in (("pdf", {"CreationDate": None, "ModDate": None, "Producer": "repro"}),
                          ("png", {"Software": None})):
        buf = io.BytesIO()
        fig.savefig(buf, format=ext, metadata=metadata)
        paths.append(write_atomic(stem.with_suffix(f".{ext}"), buf.getvalue()))
    plt.close(fig)
    return paths
