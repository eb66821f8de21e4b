"""The memory timeline of a planned function as a picture: PNG and SVG bytes (matplotlib).

    png, svg = draw_timeline(plan)        # plan: passes/plan_memory.MemoryPlan

Top panel: every arena buffer as a rectangle, x = its lifetime in schedule positions,
y = its offset and size (MiB); lines at the arena size and the lower bound. Bottom panel:
bytes live at each position against the same lines, so the gap between the two is the
fragmentation the placement left.

The bytes are reproducible: the Agg backend, no dates or software names in the metadata,
and a fixed SVG id salt. In the SVG the buffer rectangles are one embedded raster (thousands
of vector paths made it ~1 MB and slow to write); axes, lines and text stay vector.

Buffers under 1/4000 of the arena are left out of the top panel (thinner than a pixel;
drawing tens of thousands of them cost seconds); the live curve counts every buffer.

Known gaps: no per-layer axis labels.
"""
from __future__ import annotations

import io


def _mib(x):
    return x / (1 << 20)


def draw_timeline(plan) -> tuple[bytes, bytes]:
    import matplotlib

    matplotlib.use("Agg", force=False)
    import matplotlib.pyplot as plt
    from matplotlib.collections import PolyCollection

    matplotlib.rcParams["svg.hashsalt"] = "dsv41c-memory"
    n_ops = max([b.end for b in plan.buffers] + [0]) + 1
    fig, (ax, live_ax) = plt.subplots(2, 1, figsize=(12, 7), sharex=True, gridspec_kw={"height_ratios": [3, 1]})
    polys, colors = [], []
    palette = plt.get_cmap("tab20")
    thin = plan.arena / 4000  # below a pixel at this height: not drawn (the live curve still counts them)
    for k, (b, off) in enumerate(zip(plan.buffers, plan.offsets)):
        if b.size < thin:
            continue
        x0, x1, y0, y1 = b.start, b.end + 1, _mib(off), _mib(off + b.size)
        polys.append([(x0, y0), (x1, y0), (x1, y1), (x0, y1)])
        colors.append(palette(k % 20))
    ax.add_collection(PolyCollection(polys, facecolors=colors, edgecolors="none", rasterized=True))
    for y, label, style in ((plan.arena, "arena", "-"), (plan.lower_bound, "lower bound", "--")):
        ax.axhline(_mib(y), color="black", linestyle=style, linewidth=0.8, label=f"{label} {_mib(y):.3f} MiB")
        live_ax.axhline(_mib(y), color="black", linestyle=style, linewidth=0.8)
    ax.set_xlim(0, n_ops)
    ax.set_ylim(0, _mib(max(plan.arena, 1)) * 1.05)
    ax.set_ylabel("offset (MiB)")
    bind = ", ".join(f"{k}={v}" for k, v in sorted(plan.binding.items()))
    ax.set_title(f"@{plan.function}: {len(plan.buffers)} buffers, arena {plan.arena} B, lower bound "
                 f"{plan.lower_bound} B, no reuse {plan.no_reuse} B, caching allocator ~{plan.caching.reserved_peak} B"
                 + (f"\n({bind})" if bind else ""), fontsize=8)
    ax.legend(loc="upper right", fontsize=7)
    delta = [0] * (n_ops + 1)
    for b in plan.buffers:
        delta[b.start] += b.size
        delta[b.end + 1] -= b.size
    xs, ys, live = [], [], 0
    for p in range(n_ops):
        live += delta[p]
        xs.append(p)
        ys.append(_mib(live))
    live_ax.step(xs, ys, where="post", linewidth=0.6, color="tab:blue")
    live_ax.set_xlabel("schedule position (op #)")
    live_ax.set_ylabel("live (MiB)")
    fig.tight_layout()
    out = []
    for fmt, meta in (("png", {"Software": None}), ("svg", {"Date": None, "Creator": None})):
        buf = io.BytesIO()
        fig.savefig(buf, format=fmt, dpi=110, metadata=meta)
        out.append(buf.getvalue())
    plt.close(fig)
    return out[0], out[1]
