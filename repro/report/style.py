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


def log_ticks_at(ax, values, axis: str = "x", fmt=lambda v: f"{v:.3g}") -> None:
    """Label a log axis at the values drawn (ticks closer than a factor 1.3 to the last one kept are left out), so a
    range shorter than a decade still shows numbers that do not run into each other."""
    import matplotlib.ticker as mticker
    drawn = sorted({float(v) for v in values if v and v > 0})
    gap = max(1.3, (drawn[-1] / drawn[0]) ** (1 / 6)) if drawn else 1.3   # about six labels across the axis
    vals: list[float] = []
    for v in drawn:
        if not vals or v / vals[-1] >= gap:
            vals.append(v)
    target = ax.xaxis if axis == "x" else ax.yaxis
    target.set_major_locator(mticker.FixedLocator(vals))
    target.set_major_formatter(mticker.FixedFormatter([fmt(v) for v in vals]))
    target.set_minor_formatter(mticker.NullFormatter())


def plain_log_labels(ax, axis: str = "y") -> None:
    """Numbers, not powers of ten, on a log axis, with ticks at 1, 2 and 5 of every decade."""
    import matplotlib.ticker as mticker
    target = ax.yaxis if axis == "y" else ax.xaxis
    target.set_major_locator(mticker.LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
    target.set_major_formatter(mticker.FuncFormatter(lambda v, _: f"{v:g}"))
    target.set_minor_formatter(mticker.NullFormatter())


def paper_label(hardware: str) -> str:
    return f"paper ({hardware})"


def series_label(name: str, hardware: str, hardware_label: str, machines: int) -> str:
    """A measured series' legend entry: its name, and its machine when the figure draws several."""
    return name if machines <= 1 else f"{name} ({hardware}, {hardware_label})"


def measured_title(title: str, machines: list[tuple[str, str]]) -> str:
    """The figure's title, naming the machine(s) its measured series come from."""
    return f"{title} — " + "; ".join(measured_label(hw, label) for hw, label in machines)


def measured_label(hardware: str, hardware_label: str = "") -> str:
    """``measured (<machine>, <label>)``: the label says cpu-emulated or gpu, and this machine or reference."""
    return f"measured ({hardware}{', ' + hardware_label if hardware_label else ''})"


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
