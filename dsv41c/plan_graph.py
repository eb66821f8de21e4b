"""One layer of a compiled plan as a picture: its ops on stream lanes, data and event edges (SVG).

    dsv41c inspect ARTIFACT --graph LAYER [--function prefill|decode] -o FILE.svg

What is drawn: the ops of one function of the artifact's `plan.ir` (the final IR, after
schedule-streams and the memory plan) whose `loc` is `layers.N` or under it (`layers.N.attn`,
`layers.N.engram`, ...), one box per op. A kernel call is labelled with its template and
variant; any other op with its name (`aten.mul`, `dsv41.compressor_fused`); an op that
hoist-invariants runs once (`once = true`) says so. Each stream the layer's ops use is a
horizontal lane (0: main and Q path, 1: KV path, 2: Engram look-ahead). Grey arrows are data
dependencies between the layer's ops (an operand made by another op of the layer); red
dashed arrows are cross-stream events, from a `stream.record` to the `stream.wait` of the
event it recorded. In the SVG each op's box carries a tooltip (a `<title>`: its position in
the function, name, stream, loc, kernel, result types) and an id (`op-<position>`), each
lane `lane-<stream>`, each edge `data-<from>-<to>` or `event-<from>-<to>`.

Layout: an op's column is one past the latest of its stream predecessor's column and its
in-layer producers' columns (the recorded event's, for a wait): a longest-path layering
over stream order and dataflow, so what may overlap across streams stands side by side and
a lane reads left to right in issue order. Columns count dependency steps, not time.

Known gaps: an operand made by an op before the layer (the previous layer's hidden state,
the RoPE tables) gets no edge, only a short stub at the op that reads it; function arguments
(weights, state buffers) get neither; an event whose record or wait lies outside the layer (none in today's plans) is a stub
too; no per-op cost (the figure is not a timeline); a layer of several hundred ops makes a
wide picture (about an inch per column), read in a browser where the tooltips work.
"""
from __future__ import annotations

import html
import io
import os
import re

from dsv41c.ir.happens_before import op_stream

STREAM_NAMES = {0: "main / Q path", 1: "KV path", 2: "Engram look-ahead"}  # schedule-streams' assignment
_LAYER = re.compile(r"layers\.(\d+)(?:\.|$)")


class InputError(ValueError):
    """A layer or function the plan does not have, or options that do not go together."""


def layer_of(loc) -> int | None:
    m = _LAYER.match(loc or "")
    return int(m.group(1)) if m else None


def load_plan(artifact: str):
    """The parsed `plan.ir` of an artifact (its manifest read, plan.ir checked against its sha256)."""
    from dsv41c.artifact_format import sha256_file
    from dsv41c.ir.parser import parse_module
    from dsv41c.runtime.manifest import ArtifactError, read_manifest

    m = read_manifest(artifact, verify_files=False)
    path = os.path.join(artifact, "plan.ir")
    if not os.path.isfile(path):
        raise ArtifactError(f"{artifact}: no plan.ir (the final IR the graph is drawn from); compile the artifact "
                            f"again with `dsv41c compile`")
    want = (m.get("files") or {}).get("plan.ir")
    if isinstance(want, str) and sha256_file(path) != want:
        raise ArtifactError(f"{artifact}: corrupt artifact: 'plan.ir' does not match its sha256 in the manifest")
    with open(path, encoding="utf-8") as f:
        return parse_module(f.read(), path)


class Node:
    __slots__ = ("pos", "op", "stream", "col", "label")

    def __init__(self, pos, op, stream, col, label):
        self.pos, self.op, self.stream, self.col, self.label = pos, op, stream, col, label


class LayerGraph:
    """The layer's nodes (program order), edges (src pos, dst pos, "data" | "event"), streams,
    and the stubs: positions of ops reading something made outside the layer (`inputs`) and of
    record/wait ops whose other end lies outside it (`open_events`)."""

    def __init__(self, function, layer, nodes, edges, streams, inputs, open_events):
        self.function, self.layer, self.nodes, self.edges = function, layer, nodes, edges
        self.streams, self.inputs, self.open_events = streams, inputs, open_events

    @property
    def events(self) -> int:
        return sum(1 for e in self.edges if e[2] == "event")


def op_label(op) -> str:
    if op.name == "kernel.call":
        label = f"{op.attrs.get('template', '?')}\n{op.attrs.get('variant', '?')}"
    elif op.name in ("stream.record", "stream.wait"):
        label = op.name.split(".", 1)[1]
    else:
        label = op.name if len(op.name) <= 16 else op.name.replace(".", ".\n", 1)  # dsv41.\ncompressor_fused
    return label + ("\n(once)" if op.attrs.get("once") is True else "")


def layer_graph(module, function: str, layer: int) -> LayerGraph:
    """The nodes, columns and edges of `layer`'s ops in `function` (InputError if it has none)."""
    if function not in module.functions:
        raise InputError(f"--function {function}: the plan has no function @{function} "
                         f"(functions: {', '.join(module.functions)})")
    f = module.functions[function]
    layers = sorted({n for n in (layer_of(op.loc) for op in f.ops) if n is not None})
    picked = [(i, op) for i, op in enumerate(f.ops) if layer_of(op.loc) == layer]
    if not picked:
        have = f"layers {layers[0]}..{layers[-1]}" if layers else "no layers"
        raise InputError(f"--graph {layer}: @{function} has no ops of layer {layer} (the plan has {have})")
    made_by = {id(r): i for i, op in picked for r in op.results}
    col: dict[int, int] = {}
    last_on: dict[int, int] = {}  # stream -> column of its latest op
    nodes, edges, inputs, open_events = [], [], set(), set()
    for i, op in picked:
        s = op_stream(op)
        c = last_on.get(s, -1) + 1
        for v in op.operands:
            src = made_by.get(id(v))
            if src is None:
                if op.name == "stream.wait":
                    open_events.add(i)
                elif v.op is not None:  # made by an op before the layer (function arguments get no stub)
                    inputs.add(i)
                continue
            c = max(c, col[src] + 1)
            kind = "event" if f.ops[src].name == "stream.record" and op.name == "stream.wait" else "data"
            edges.append((src, i, kind))
        col[i] = last_on[s] = c
        nodes.append(Node(i, op, s, c, op_label(op)))
    waited = {e[0] for e in edges if e[2] == "event"}
    open_events.update(i for i, op in picked if op.name == "stream.record" and i not in waited)
    return LayerGraph(function, layer, nodes, edges, sorted({n.stream for n in nodes}), inputs, open_events)


_KIND_COLORS = (("kernel call", "#cfe0fc"), ("dsv41 op", "#d5f0d5"), ("aten / other op", "#ececec"),
                ("stream event op", "#ffd8b0"))


def _fill(op) -> str:
    if op.name == "kernel.call":
        return _KIND_COLORS[0][1]
    if op.name.startswith("dsv41."):
        return _KIND_COLORS[1][1]
    if op.name.startswith("stream."):
        return _KIND_COLORS[3][1]
    return _KIND_COLORS[2][1]


def _tooltip(n: Node) -> str:
    op = n.op
    lines = [f"#{n.pos} {op.name}  stream {n.stream}", f"loc {op.loc}"]
    if op.name == "kernel.call":
        lines.append(f"kernel {op.attrs.get('template')} / {op.attrs.get('variant')}")
    if op.results:
        lines.append("-> " + ", ".join(str(r.type) for r in op.results))
    return "\n".join(lines)


def draw_svg(g: LayerGraph) -> bytes:
    """The SVG bytes of `g` (reproducible: no date or software name, a fixed id salt)."""
    import matplotlib

    matplotlib.use("Agg", force=False)
    import matplotlib.pyplot as plt
    from matplotlib.patches import FancyArrowPatch, FancyBboxPatch, Patch, Rectangle
    from matplotlib.lines import Line2D

    cw, lh = 1.0, 1.0  # a column's width and a lane's height, in inches (data units = inches)
    bw, bh = 0.86 * cw, 0.42 * lh
    lane_of = {s: k for k, s in enumerate(g.streams)}
    ncols = max(n.col for n in g.nodes) + 1
    left = 1.3  # room for the lane names
    width, height = left + ncols * cw + 0.3, len(g.streams) * lh + 1.5
    by_pos = {n.pos: n for n in g.nodes}

    def xy(n):  # centre of a node's box
        return left + n.col * cw + cw / 2, height - 1.0 - (lane_of[n.stream] + 0.5) * lh

    with matplotlib.rc_context({"svg.fonttype": "none", "svg.hashsalt": "dsv41c-plan-graph",
                                "font.family": "DejaVu Sans"}):
        fig = plt.figure(figsize=(width, height))
        ax = fig.add_axes((0, 0, 1, 1))
        ax.set_xlim(0, width)
        ax.set_ylim(0, height)
        ax.axis("off")
        for s, k in lane_of.items():
            y0 = height - 1.0 - (k + 1) * lh
            lane = Rectangle((0.05, y0 + 0.03), width - 0.1, lh - 0.06, facecolor="#f7f7fb" if k % 2 else "#fbfbf4",
                             edgecolor="#c8c8d0", linewidth=0.5, zorder=0)
            lane.set_gid(f"lane-{s}")
            ax.add_patch(lane)
            ax.text(0.12, y0 + lh / 2, f"stream {s}\n{STREAM_NAMES.get(s, '')}".rstrip(), fontsize=7,
                    va="center", ha="left", zorder=1)
        for src, dst, kind in g.edges:
            a, b = by_pos[src], by_pos[dst]
            (x0, y0), (x1, y1) = xy(a), xy(b)
            start, end = (x0 + bw / 2, y0), (x1 - bw / 2, y1)
            style = "arc3,rad=0"
            if a.stream == b.stream and b.col - a.col > 1:  # a bow over the boxes between them, inside the lane
                bow = (0.27 + 0.04 * (dst % 4)) * lh  # apex height; staggered so parallel bows stay apart
                style = f"arc3,rad={-2 * bow / (x1 - x0 - bw):.4f}"
            if kind == "event":
                p = FancyArrowPatch(start, end, arrowstyle="-|>", mutation_scale=7, color="#d62728", linewidth=1.1,
                                    linestyle=(0, (3, 2)), connectionstyle=style, zorder=4)
            else:
                p = FancyArrowPatch(start, end, arrowstyle="-|>", mutation_scale=5, color="#7f7f7f", linewidth=0.45,
                                    alpha=0.8, connectionstyle=style, zorder=2)
            p.set_gid(f"{kind}-{src}-{dst}")
            ax.add_patch(p)
        for n in g.nodes:
            x, y = xy(n)
            box = FancyBboxPatch((x - bw / 2, y - bh / 2), bw, bh, boxstyle="round,pad=0,rounding_size=0.05",
                                 facecolor=_fill(n.op), edgecolor="#404040", zorder=3,
                                 linewidth=0.5, linestyle="--" if n.op.attrs.get("once") is True else "-")
            box.set_gid(f"op-{n.pos}")
            ax.add_patch(box)
            longest = max(len(t) for t in n.label.split("\n"))
            ax.text(x, y, n.label, fontsize=min(5.0, 5.0 * 15 / max(longest, 1)), ha="center", va="center", zorder=5)
            if n.pos in g.inputs or n.pos in g.open_events:  # read from outside the layer: a stub
                red = n.pos in g.open_events
                stub = FancyArrowPatch((x - bw / 2 - 0.08, y + bh / 2 + 0.1), (x - bw / 2 + 0.04, y + bh / 2),
                                       arrowstyle="-|>", mutation_scale=4, linewidth=0.5, zorder=4,
                                       color="#d62728" if red else "#7f7f7f")
                stub.set_gid(f"{'open-event' if red else 'input'}-{n.pos}")
                ax.add_patch(stub)
        ax.text(0.12, height - 0.35,
                f"@{g.function} layer {g.layer}: {len(g.nodes)} ops on {len(g.streams)} stream"
                f"{'s' if len(g.streams) != 1 else ''}, {g.events} cross-stream event{'s' if g.events != 1 else ''}; "
                f"columns are dependency steps (stream order and dataflow), not time; a stub marks an op reading "
                f"something made before the layer", fontsize=8, va="center", ha="left")
        handles = [Patch(facecolor=c, edgecolor="#404040", label=name) for name, c in _KIND_COLORS]
        handles += [Line2D([], [], color="#7f7f7f", linewidth=0.8, label="data dependency"),
                    Line2D([], [], color="#d62728", linewidth=1.1, linestyle=(0, (3, 2)), label="event (record -> wait)")]
        ax.legend(handles=handles, loc="upper left", bbox_to_anchor=(0.1 / width, (height - 0.5) / height),
                  ncol=len(handles), fontsize=6.5, frameon=False)
        buf = io.BytesIO()
        fig.savefig(buf, format="svg", metadata={"Date": None, "Creator": None})
        plt.close(fig)
    return _add_tooltips(buf.getvalue(), {n.pos: _tooltip(n) for n in g.nodes})


def _add_tooltips(svg: bytes, tips: dict) -> bytes:
    """A `<title>` as the first child of each `<g id="op-N">` (a browser shows it on hover)."""
    def one(m):
        tip = tips.get(int(m.group(1)))
        return m.group(0) if tip is None else f"{m.group(0)}\n   <title>{html.escape(tip)}</title>"

    return re.sub(r'<g id="op-(\d+)">', one, svg.decode("utf-8")).encode("utf-8")


def cmd_inspect_graph(args) -> int:
    """`dsv41c inspect ARTIFACT --graph LAYER [--function F] -o FILE.svg`."""
    from dsv41c.outputs import check_output_file, note_kept, write_file_atomic

    if getattr(args, "json", False) or getattr(args, "memory", False):
        raise InputError("--graph writes a picture; leave out --json and --memory")
    out = getattr(args, "output", None)
    if not out:
        raise InputError("--graph LAYER needs -o FILE.svg (where to write the picture)")
    if not out.lower().endswith(".svg"):
        raise InputError(f"-o {out}: the graph is SVG; give a FILE.svg")
    check_output_file(out, "-o")
    g = layer_graph(load_plan(args.artifact), getattr(args, "function", None) or "decode", int(args.graph))
    write_file_atomic(out, draw_svg(g), "-o")
    note_kept(out)
    print(f"inspect: wrote {out}: @{g.function} layer {g.layer}, {len(g.nodes)} ops on {len(g.streams)} "
          f"stream{'s' if len(g.streams) != 1 else ''} ({', '.join(map(str, g.streams))}), {g.events} events")
    return 0
