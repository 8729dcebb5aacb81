"""``net.plot()``: the layer graph as a picture (matplotlib).

Layers are boxes (name, then type) in rows by depth: a layer's row is one below the deepest
layer feeding it, network inputs' layers in the first row; within a row, layers keep the
network's order. Arrows follow the connections, each labelled with the layout of the value it
carries (``summary``'s layouts, resolved for networks with known input layouts). The artists
carry ids (``gid``): ``layer:<name>`` for a box, ``edge:<source>/<port>-><target>/<port>`` for an
arrow and ``layout:...`` for its label, which an SVG keeps as element ids (so a test or a tool
can find them in the file).

matplotlib rather than graphviz: it is the plotting library difffn already uses (the training
plot), and a graphviz drawing needs the ``dot`` program installed outside Python as well.
"""

from __future__ import annotations

import os

from .._core import MissingDependencyError, NetworkError
from ._summary import edges, layout_text

SUFFIXES = (".png", ".svg", ".pdf")


def _figure_class():
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
    except ImportError:
        raise MissingDependencyError(
            "Network.plot draws with matplotlib, which is not installed. Fix: pip install "
            "'difffn[plot]' (or pip install matplotlib)."
        ) from None
    return Figure, FigureCanvasAgg


def positions(net) -> dict[str, tuple[float, int]]:
    """Per layer name, ``(x, row)``: the row is its depth, x its place within the row
    (centred on 0)."""
    g = net.graph
    depth: dict[int, int] = {}
    for i in g.order:
        feeding = [s.index for s in g.sources[i] if s.kind == "layer"]
        depth[i] = 1 + max((depth[k] for k in feeding), default=-1)
    rows: dict[int, list[int]] = {}
    for i in g.order:
        rows.setdefault(depth[i], []).append(i)
    placed = {}
    for row, members in rows.items():
        for k, i in enumerate(members):
            placed[g.names[i]] = (k - (len(members) - 1) / 2, row)
    return placed


def _label_point(ax, start, end, rad: float) -> tuple[float, float]:
    """Where an arrow's label goes: beside the middle of matplotlib's ``arc3`` curve (a
    quadratic Bezier whose control point is the chord's middle moved ``rad`` times the chord,
    perpendicular to it, in display coordinates)."""
    to_display = ax.transData
    (a, b), (c, d) = to_display.transform(start), to_display.transform(end)
    dx, dy = c - a, d - b
    control = ((a + c) / 2 + rad * dy, (b + d) / 2 - rad * dx)
    middle = (0.25 * a + 0.5 * control[0] + 0.25 * c, 0.25 * b + 0.5 * control[1] + 0.25 * d)
    x, y = to_display.inverted().transform(middle)
    return float(x) + (0.03 if rad == 0 else -0.03), float(y)


def plot(net, path=None, *, title: str | None = None):
    """Draw ``net``'s graph; save it to ``path`` if given; return the figure."""
    if path is not None:
        suffix = os.path.splitext(os.fspath(path))[1].lower()
        if suffix not in SUFFIXES:
            raise NetworkError(
                f"Network.plot(path={os.fspath(path)!r}): the picture's type comes from the "
                f"suffix; got {suffix or 'none'!r}, expected one of {list(SUFFIXES)}. Fix: "
                "path='network.png' or 'network.svg'."
            )
    Figure, FigureCanvasAgg = _figure_class()
    from matplotlib.patches import FancyArrowPatch

    g = net.graph
    placed = positions(net)
    width = max(sum(1 for _, r in placed.values() if r == row) for row in range(len(placed)))
    depth = 1 + max((r for _, r in placed.values()), default=0)
    figure = Figure(figsize=(max(4.0, 3.2 * width), max(2.0, 1.25 * depth)))
    FigureCanvasAgg(figure)
    ax = figure.add_axes((0, 0, 1, 1 if title is None else 0.93))
    ax.set_axis_off()
    ax.set_xlim(-width / 2 - 0.1, width / 2 + 0.1)
    ax.set_ylim(depth - 0.45, -0.55)  # the first row on top
    for i in g.order:
        layer = net.layers[i]
        x, row = placed[layer.name]
        ax.text(
            x,
            row,
            f"{layer.name}\n{layer.type}",
            ha="center",
            va="center",
            fontsize=9,
            gid=f"layer:{layer.name}",
            bbox={"boxstyle": "round,pad=0.4", "fc": "#dbe9f6", "ec": "#2a5d8f"},
        )
    for edge in edges(net):
        (x0, r0), (x1, r1) = placed[edge.source], placed[edge.target]
        name = f"{edge.source}/{edge.source_port}->{edge.target}/{edge.target_port}"
        start, end = (x0, r0 + 0.22), (x1, r1 - 0.22)
        # an edge that skips rows bends aside, so that it passes the boxes between
        # (its widest point about 1.4 inches from the straight line, however many rows it skips)
        rad = 0.0 if r1 == r0 + 1 else min(1.0, 2.4 / max(r1 - r0, 1))
        arrow = FancyArrowPatch(
            start,
            end,
            arrowstyle="-|>",
            mutation_scale=12,
            color="0.35",
            lw=1,
            connectionstyle=f"arc3,rad={rad}",
            gid=f"edge:{name}",
        )
        ax.add_patch(arrow)
        ax.text(
            *_label_point(ax, start, end, rad),
            layout_text(edge.layout),
            fontsize=7,
            color="0.25",
            ha="left" if rad == 0 else "right",
            va="center",
            gid=f"layout:{name}",
        )
    if title is not None:
        figure.suptitle(title)
    if path is not None:
        folder = os.path.dirname(os.path.abspath(os.fspath(path)))
        if not os.path.isdir(folder):
            raise NetworkError(
                f"Network.plot(path={os.fspath(path)!r}): the folder {folder!r} does not exist. "
                "Fix: create it first."
            )
        figure.savefig(os.fspath(path), dpi=100)
    return figure
