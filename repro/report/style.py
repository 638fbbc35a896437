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
