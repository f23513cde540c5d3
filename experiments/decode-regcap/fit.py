"""Issue 16's decode over contexts (run.sh 8's contexts-*.json): for each (model, batch, arm), a least-squares line of
the decode's time against the KV bytes it reads, time = fixed + bytes / bandwidth. The slope's bandwidth is what the
decode reaches once the context is long; the intercept is what no context removes (launch, merge, the chain's wait).

The heuristic changes the launch with the context (Llama-8B's batch-1 4k runs one 128-token tile of 8 warps a split
and the fused merge; 8k and up loop over 64-token tiles and merge in a second launch): each cell's launch is printed.
``--aside MODEL:CONTEXT`` leaves a cell out of its line and prints how far above the line it lies, so the floor cell
can be read against the longer contexts' line. ``--exclude`` drops a cell (e.g. one whose walk the L2 partly holds).

    python experiments/decode-regcap/fit.py DIR/contexts-*.json --exclude smollm2:4096 --aside llama8b:4096 \
        [--plot fit.png]

``--plot`` also draws it: a panel a model, time against MB read, each arm's cells (aside ones hollow; crosses for an arm
with no line) and its line.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import statistics
import sys


def fit_line(xs: list[float], ys: list[float]) -> tuple[float, float, float]:
    """Least squares y = a + b x (``statistics.linear_regression``) -> (a, b, the largest residual); ValueError under
    two distinct x, or for a slope that is not positive (a time that does not grow with the bytes has no bandwidth)."""
    distinct = len(set(xs))
    if distinct < 2:
        raise ValueError(f"a line needs two distinct contexts, got {distinct} ({len(xs)} cells)")
    b, a = statistics.linear_regression(xs, ys)
    if b <= 0:
        raise ValueError("no positive slope: the time does not grow with the bytes")
    return a, b, max(abs(y - (a + b * x)) for x, y in zip(xs, ys))


def kv_bytes(cell: dict) -> float:
    """The bytes a decode reads, from the cell's own rate (kv_gb_s x ms): the KV, and q and the output (16 KiB)."""
    return cell["kv_gb_s"] * 1e9 * cell["ms"] * 1e-3


def launch(cell: dict) -> str:
    kernels = (cell.get("extra") or {}).get("kernels") or {}
    return kernels.get("decode", cell.get("kernel", "?")).removeprefix("decode ")


def load(paths: list[pathlib.Path], exclude: list[str]) -> tuple[dict[tuple, list[dict]], set[str]]:
    """The ok decode cells by (model, batch, arm, the launch between two decodes if any), less ``exclude``'s, and
    every such cell's "model:context"; a file that cannot be read (a bench cut mid-write) is named on stderr and
    skipped."""
    groups: dict[tuple, list[dict]] = {}
    seen: set[str] = set()
    for path in paths:
        try:
            with open(path) as f:
                cells = json.load(f)["cells"]
        except (OSError, ValueError, KeyError) as e:
            print(f"{path}: skipped ({e.__class__.__name__}: {e})", file=sys.stderr)
            continue
        for c in cells:
            if c.get("status") != "ok" or c["phase"] != "decode":
                continue
            seen.add(f"{c['model']}:{c['context']}")
            if f"{c['model']}:{c['context']}" not in exclude:
                between = (c.get("extra") or {}).get("between")
                groups.setdefault((c["model"], c["batch"], c["backend"], between or ""), []).append(c)
    return groups, seen


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("files", nargs="+", type=pathlib.Path, help="bench.kernels JSON outputs (decode cells)")
    ap.add_argument("--exclude", action="append", default=[], metavar="MODEL:CONTEXT",
                    help="drop a model's context (one whose walk the L2 partly holds); repeatable")
    ap.add_argument("--aside", action="append", default=[], metavar="MODEL:CONTEXT",
                    help="leave a model's context out of the line and print its distance above it; repeatable")
    ap.add_argument("--plot", type=pathlib.Path, metavar="PNG", help="also draw the cells and lines into this file")
    args = ap.parse_args()
    groups, seen = load(args.files, args.exclude)
    unmatched = sorted(set(args.aside + args.exclude) - seen)
    if unmatched:
        ap.error(f"{', '.join(unmatched)}: no such cell (--aside / --exclude take model:context, e.g. llama8b:4096)")
    print("| model | batch | arm | context | us | GB/s | the line's us | above the line | launch |")
    print("|---|---|---|---|---|---|---|---|---|")
    lines, drawn = [], []
    for (model, batch, arm, between), cs in sorted(groups.items()):
        arm += f" (after {between})" if between else ""
        cs.sort(key=lambda c: c["context"])
        fitted = [c for c in cs if f"{model}:{c['context']}" not in args.aside]
        ctx = ",".join(str(c["context"]) for c in fitted)
        try:
            a, b, worst = fit_line([kv_bytes(c) for c in fitted], [c["ms"] * 1e3 for c in fitted])
            lines.append(f"| {model} | {batch} | {arm} | {ctx} | {a:.2f} | {1e-3 / b:.0f} | {worst:.2f} |")
        except ValueError as e:
            a = b = None
            lines.append(f"| {model} | {batch} | {arm} | {ctx} | {e} | | |")
        drawn.append((f"{model}, batch {batch}", arm, cs, fitted, (a, b) if b else None))
        for c in cs:
            us = c["ms"] * 1e3
            mark = "" if c in fitted else " (aside)"
            on_line = a + b * kv_bytes(c) if b else None
            line = "no line | " if on_line is None else f"{on_line:.2f} | {us - on_line:+.2f}"
            print(f"| {model} | {batch} | {arm} | {c['context']}{mark} | {us:.2f} | {c['kv_gb_s']:.0f} | {line} "
                  f"| {launch(c)} |")
    print("\n| model | batch | arm | contexts fitted | fixed (us) | bandwidth (GB/s) | largest residual (us) |")
    print("|---|---|---|---|---|---|---|")
    print("\n".join(lines))
    if args.plot:
        plot(drawn, args.plot)


def plot(drawn: list[tuple], path: pathlib.Path) -> None:
    """One panel per model and batch: each arm's cells (time against MB read; cells set aside hollow, labelled with
    their context) and its fitted line over the whole MB range of its panel."""
    try:
        import matplotlib
    except ImportError:
        print(f"plot: no matplotlib here, {path} not drawn (the tables stand; draw it later from the JSON)",
              file=sys.stderr)
        return
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = sorted({d[0] for d in drawn})
    fig, axes = plt.subplots(1, len(panels), figsize=(6.5 * len(panels), 4.8), squeeze=False)
    for ax, panel in zip(axes[0], panels):
        rows = [d for d in drawn if d[0] == panel]
        top = max(kv_bytes(c) for d in rows for c in d[2]) / 1e6
        named = set()
        for i, (_, arm, cs, fitted, line) in enumerate(rows):
            color = f"C{i}"
            for c in cs:
                mb, us = kv_bytes(c) / 1e6, c["ms"] * 1e3
                marker = "o" if line else "x"  # x: a cell of an arm with no line (its fit failed)
                ax.plot(mb, us, marker, color=color, mfc=color if c in fitted else "none", ms=6)
                if c not in fitted and c["context"] not in named:
                    named.add(c["context"])
                    ax.annotate(f"{c['context']} (aside)", (mb, us), textcoords="offset points", xytext=(8, -4),
                                fontsize=8)
            if line:
                a, b = line
                label = f"{arm}: {a:.2f} us + bytes at {1e-3 / b:.0f} GB/s"
                ax.plot([0, top], [a, a + b * top * 1e6], "-", color=color, lw=1, label=label)
            else:
                ax.plot([], [], "x", color=color, label=f"{arm}: no line")
        ax.set(title=panel, xlabel="MB read (KV, q, output)", ylabel="us a decode", xlim=(0, top * 1.06),
               ylim=(0, None))
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7, loc="upper left")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    print(f"plot: {path}", file=sys.stderr)


if __name__ == "__main__":
    main()
