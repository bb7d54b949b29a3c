"""Plots a benchmark row file (megamoe bench --csv/--json, python -m megamoe.bench --csv):

    python -m megamoe.plot FILE [-o bench.png] [--title TEXT]

Two panels against tokens per rank (log x): µs (log y) and TFLOP/s per GPU;
one line per arm (per arm and experts per rank when the file has several);
the floor (the largest of the compute, HBM and NVLink floors) dashed on the µs
panel, and the TFLOP/s it would give dashed on the other. matplotlib is
imported only here, when plotting (python3 -m pip install matplotlib).
"""

import argparse
import sys
from collections import defaultdict

from .benchfile import floor_of, read_rows


def _series(rows):
    """{label: [(tokens, row), ...] sorted by tokens}, one per arm (and per
    experts per rank when there are several), in the file's order."""
    several = len({r["experts_per_rank"] for r in rows}) > 1
    out = defaultdict(list)
    for r in rows:
        label = f"{r['arm']}, {r['experts_per_rank']} experts/rank" if several else r["arm"]
        out[label].append((r["tokens_per_rank"], r))
    return {k: sorted(v, key=lambda p: p[0]) for k, v in out.items()}


def _floors(rows):
    """{experts per rank: [(tokens, floor µs, flop count), ...]}: per cell, the
    first row's floor (the floors depend on the routing, not the arm)."""
    cells = {}
    for r in rows:
        f = floor_of(r)
        key = (r["experts_per_rank"], r["tokens_per_rank"])
        if f and key not in cells and r.get("tflops") is not None:
            cells[key] = (f, r["tflops"] * 1e12 * r["us"] * 1e-6)
    out = defaultdict(list)
    for (e, t), (f, flops) in sorted(cells.items()):
        out[e].append((t, f, flops))
    return out


def plot_rows(rows, output, title=None):
    """Draws rows into output (PNG, or whatever the suffix says). Returns the
    labels of the lines drawn on the µs panel."""
    try:
        from matplotlib.figure import Figure  # no pyplot: no global backend or figure state
    except ImportError:
        raise RuntimeError("matplotlib is not installed (python3 -m pip install matplotlib)") from None
    fig = Figure(figsize=(12, 4.8))
    ax_us, ax_tf = fig.subplots(1, 2)
    labels = []
    for label, points in _series(rows).items():
        t = [p[0] for p in points]
        line, = ax_us.plot(t, [p[1]["us"] for p in points], marker="o", label=label)
        ax_tf.plot(t, [p[1]["tflops"] for p in points], marker="o", label=label, color=line.get_color())
        labels.append(label)
    floors = _floors(rows)
    for e, cells in floors.items():
        label = "floor" + (f", {e} experts/rank" if len(floors) > 1 else "")
        t = [c[0] for c in cells]
        ax_us.plot(t, [c[1] for c in cells], "k--", label=label)
        ax_tf.plot(t, [c[2] / (c[1] * 1e-6) / 1e12 for c in cells], "k--", label=label.replace("floor", "at the floor"))
        labels.append(label)
    first = rows[0]
    experts = "" if len({r["experts_per_rank"] for r in rows}) > 1 else f"{first['experts_per_rank']} experts/rank, "
    shape = (f"H {first['hidden']}, I {first['intermediate']}, {experts}top-{first['top_k']}, "
             f"{first['ranks']} rank(s)")
    fig.suptitle(title or f"megamoe: {shape}")
    ax_us.set(xscale="log", yscale="log", xlabel="tokens per rank", ylabel="µs per forward (median)")
    ax_tf.set(xscale="log", xlabel="tokens per rank", ylabel="TFLOP/s per GPU")
    for ax in (ax_us, ax_tf):
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize="small")
    fig.tight_layout()
    fig.savefig(output, dpi=120)
    return labels


def main(argv=None):
    p = argparse.ArgumentParser(prog="python -m megamoe.plot", description=__doc__.split("\n\n")[0])
    p.add_argument("file", help="a row file (CSV or JSON) from megamoe bench or python -m megamoe.bench")
    p.add_argument("-o", "--output", default="bench.png", help="the image to write (default bench.png)")
    p.add_argument("--title", help="the figure's title (default: the shape)")
    a = p.parse_args(argv)
    try:
        rows = read_rows(a.file)
    except (OSError, ValueError) as e:
        p.error(f"argument file: '{a.file}': {e}")
    try:
        labels = plot_rows(rows, a.output, a.title)
    except RuntimeError as e:
        print(f"python -m megamoe.plot: {e}", file=sys.stderr)
        return 1
    print(f"wrote {a.output}: {len(rows)} rows; lines: {', '.join(labels)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
