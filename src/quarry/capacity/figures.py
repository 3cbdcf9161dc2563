"""PNG figures of the capacity sweeps (Figures 7, 8, 10 and 14 of CSDPLAN).

Figures are built with the object API (``matplotlib.figure.Figure``), not pyplot, so drawing
keeps no global state and needs no display. They draw the sweeps' plain data (the dicts that go
into sweep.json), so this module does not import sweep.py, which imports it to draw.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import mpl_toolkits.mplot3d  # noqa: F401  registers the "3d" projection
import numpy as np
from matplotlib import ticker
from matplotlib.figure import Figure

DPI = 120
DEVICE_LABELS = {"smartssd": "CSD-S (SmartSSD)", "newport": "CSD-N (Newport)"}
DEVICE_STYLES = {"smartssd": ("tab:red", "--"), "newport": ("tab:green", "-.")}
HOST_COLORS = ("tab:blue", "tab:purple", "tab:orange", "tab:brown", "tab:gray", "tab:olive")


def _scale(unit: str) -> tuple[float, str]:
    if unit == "bytes per second":
        return 1e9, "throughput (GB/s, log scale)"
    return 1.0, f"throughput ({unit}, log scale)"


def _throughput_panel(axes: Any, curve: Mapping[str, Any]) -> None:
    divisor, label = _scale(curve["unit"])
    drives = curve["devices"]
    for index, (cores, values) in enumerate(curve["host"].items()):
        axes.plot(
            drives,
            np.asarray(values) / divisor,
            color=HOST_COLORS[index % len(HOST_COLORS)],
            marker="o",
            markersize=3,
            label=f"Host({cores}) + SSDs",
        )
    for name, values in curve["csd"].items():
        color, style = DEVICE_STYLES.get(name, ("black", "--"))
        axes.plot(
            drives,
            np.asarray(values) / divisor,
            color=color,
            linestyle=style,
            linewidth=2,
            label=DEVICE_LABELS.get(name, f"CSD array ({name})"),
        )
    axes.axvline(curve["k_limit"], color="0.6", linestyle=":", linewidth=1)
    axes.text(
        curve["k_limit"] + 0.2,
        0.02,
        f"k_limit={curve['k_limit']}",
        color="0.4",
        transform=axes.get_xaxis_transform(),
        fontsize=8,
    )
    # The BEPs are the point of the figure; a text box is easier to read than crossing markers.
    lines = [
        f"{DEVICE_LABELS.get(name, name).split(' ')[0]}: "
        + ", ".join(f"H{cores}:{bep}" for cores, bep in beps.items())
        for name, beps in curve["bep"].items()
    ]
    axes.text(
        0.98,
        0.03,
        "BEP (drives)\n" + "\n".join(lines),
        transform=axes.transAxes,
        ha="right",
        va="bottom",
        fontsize=7,
        family="monospace",
        bbox={"facecolor": "white", "alpha": 0.85, "edgecolor": "0.7"},
    )
    axes.set_yscale("log")
    _plain_log_labels(axes)
    axes.set_title(curve["title"].replace("_", " "))
    axes.set_xlabel("number of drives (SSDs for the host, CSDs for the arrays)")
    axes.set_ylabel(label)
    axes.set_xticks(drives[::2] if len(drives) > 12 else drives)
    axes.grid(True, which="major", alpha=0.3)


def _plain_log_labels(axes: Any) -> None:
    """Label a log axis "0.5, 1, 2" rather than "5x10^-1"; minor ticks only over short ranges,
    where there would otherwise be at most one label."""
    low, high = (value for value in axes.get_ylim())
    decades = math.log10(high / low) if low > 0 else math.inf

    def minor(value: float, _position: int) -> str:
        mantissa = round(value / 10 ** math.floor(math.log10(value)), 6)
        return f"{value:g}" if decades < 2 and mantissa in (2, 3, 5) else ""

    axes.yaxis.set_major_formatter(ticker.FuncFormatter(lambda value, _: f"{value:g}"))
    axes.yaxis.set_minor_formatter(ticker.FuncFormatter(minor))


def plot_throughput(curves: Sequence[Mapping[str, Any]], path: Path) -> Path:
    """Figure 7: one panel per workload."""
    columns = 2 if len(curves) > 1 else 1
    rows = (len(curves) + columns - 1) // columns
    figure = Figure(figsize=(7.5 * columns, 5.0 * rows), dpi=DPI, layout="constrained")
    panels = figure.subplots(rows, columns, squeeze=False).ravel()
    for axes, curve in zip(panels, curves, strict=False):
        _throughput_panel(axes, curve)
    for axes in panels[len(curves) :]:
        axes.set_visible(False)
    panels[0].legend(fontsize=8, loc="upper left")
    figure.suptitle("Throughput of a host over m SSDs vs an array of m CSDs (CSDPLAN Figure 7)")
    figure.savefig(path)
    return Path(path)


def plot_k_limit(curve: Mapping[str, Any], path: Path) -> Path:
    """Figure 8: the host's throughput flattens at k_limit drives."""
    divisor, label = _scale(curve["unit"])
    drives = curve["devices"]
    figure = Figure(figsize=(8, 5), dpi=DPI, layout="constrained")
    axes = figure.subplots()
    for index, (k_limit, values) in enumerate(curve["host"].items()):
        axes.plot(
            drives,
            np.asarray(values) / divisor,
            marker="o",
            markersize=3,
            color=HOST_COLORS[index % len(HOST_COLORS)],
            label=f"Host({curve['host_cores']}), k_limit={k_limit}: BEP {curve['bep'][k_limit]}",
        )
    axes.plot(
        drives,
        np.asarray(curve["csd"]) / divisor,
        color="tab:red",
        linestyle="--",
        linewidth=2,
        label="CSD array",
    )
    axes.set_xlabel("number of drives (SSDs for the host, CSDs for the array)")
    axes.set_ylabel(label.replace(", log scale", ""))
    axes.set_xticks(drives[::2] if len(drives) > 12 else drives)
    axes.grid(True, alpha=0.3)
    axes.legend(fontsize=9)
    axes.set_title(
        f"{curve['title']}: host bus limit k_limit caps the SSD array (CSDPLAN Figure 8)"
    )
    figure.savefig(path)
    return Path(path)


def plot_surface(surface: Mapping[str, Any], combinations: Mapping[str, Any], path: Path) -> Path:
    """Figures 10 and 14: the BEP surface in 3-D, and the same grid as a labelled heat map.
    ``surface`` is ``sweep.Surface.to_dict()``: ``bep[j][i]`` is the BEP at xs[i], ys[j]."""
    xs, ys = np.asarray(surface["xs"]), np.asarray(surface["ys"])
    grid = np.asarray(surface["bep"], dtype=float)
    target = combinations["target"]
    corners = combinations["corners"]
    figure = Figure(figsize=(15, 6.5), dpi=DPI, layout="constrained")
    # Fixed drawing order: matplotlib's depth sort would bury the stars under the BEP plane.
    left = figure.add_subplot(1, 2, 1, projection="3d", computed_zorder=False)
    mesh_x, mesh_y = np.meshgrid(xs, ys)
    left.plot_surface(
        mesh_x, mesh_y, grid, cmap="viridis", alpha=0.85, edgecolor="0.3", linewidth=0.3, zorder=1
    )
    left.plot_surface(
        mesh_x, mesh_y, np.full_like(grid, target), color="tab:green", alpha=0.25, zorder=2
    )
    if corners:
        left.scatter(
            [c["x"] for c in corners],
            [c["y"] for c in corners],
            [c["bep"] for c in corners],
            color="red",
            marker="*",
            s=160,
            depthshade=False,
            zorder=3,
            edgecolor="black",
            label=f"least hardware change for BEP <= {target}",
        )
        left.legend(loc="upper right", fontsize=8)
    left.set_xlabel(surface["x_label"], fontsize=9)
    left.set_ylabel(surface["y_label"], fontsize=9)
    left.set_zlabel("BEP (number of drives)", fontsize=9)
    # Looking from the large-factor corner keeps the tall (1, 1) end at the back, so it hides
    # nothing.
    left.view_init(elev=25, azim=40)
    left.set_title(f"plane: BEP = {target} (green)")

    # The heat map is drawn on grid indices so uneven factor grids still line up; ticks carry
    # the factor values.
    right = figure.add_subplot(1, 2, 2)
    image = right.imshow(grid, origin="lower", cmap="viridis", aspect="auto")
    if grid.size <= 400:
        middle = (grid.max() + grid.min()) / 2
        for j in range(len(ys)):
            for i in range(len(xs)):
                right.text(
                    i,
                    j,
                    f"{int(grid[j, i])}",
                    ha="center",
                    va="center",
                    fontsize=7,
                    color="white" if grid[j, i] < middle else "black",
                )
    x_index = {float(x): i for i, x in enumerate(xs)}
    y_index = {float(y): j for j, y in enumerate(ys)}
    for corner in corners:
        right.plot(
            x_index[float(corner["x"])],
            y_index[float(corner["y"])],
            marker="*",
            color="red",
            markersize=20,
            fillstyle="none",
            markeredgewidth=2,
        )
    right.set_xticks(range(len(xs)), [f"{x:g}" for x in xs])
    right.set_yticks(range(len(ys)), [f"{y:g}" for y in ys])
    colorbar = figure.colorbar(image, ax=right)
    colorbar.set_label("BEP (number of drives)")
    right.set_xlabel(surface["x_label"])
    right.set_ylabel(surface["y_label"])
    stars = ", ".join(f"({c['x']:g}, {c['y']:g})" for c in corners) or "none in this grid"
    right.set_title(f"red stars reach BEP <= {target}: {stars}", fontsize=10)
    figure.suptitle(surface["title"])
    figure.savefig(path)
    return Path(path)
