"""Issue 16's verify floor, read from a ``bench.kernels`` JSON (``--out PREFIX`` wrote PREFIX.json): per cell, each
plan's verify time over its own decode time (the decode cell of the same backend spec, timed in the same process),
which plan was fastest, and, for a plan chosen by rule (``--rule``), whether it ran within the spread of the fastest
of the others and which kernel it took. ``--computed`` scores today's ``verify_as_decode=auto`` rule
(``flashinfer.verify_as_rows``) on cells measured without it: per cell the rows plan's time where the rule takes the
rows, the other plan's elsewhere, judged as a rule (a refit is scored before a GPU runs it). No GPU needed.

    python -m attnlab.bench.verify_floor results/rows1-smollm2.json results/rows1-llama8b.json \\
        --plans default=flashinfer,rows=flashinfer/verify_as_decode=true \\
        --rule "by rule=flashinfer/verify_as_decode=auto" [--floor 1.3] [--spread 1.03] [--plot rows1.png]
    python -m attnlab.bench.verify_floor results/rows1-*.json --plans default=flashinfer,rows=flashinfer/verify_as_decode=true \
        --computed "rule now=default/rows"
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass, field
from pathlib import Path

FLOOR = 1.3  # issue 16: verify at most 1.3x its own decode
SPREAD = 1.03  # a rule within 3% of the fastest plan took it (a cell's repeats spread about that much)


@dataclass
class Row:
    model: str
    batch: int
    context: int
    q_len: int
    decode_us: float | None  # the first plan's decode
    verify_us: dict[str, float] = field(default_factory=dict)  # plan -> verify us
    ratio: dict[str, float] = field(default_factory=dict)  # plan -> verify / its own decode
    rule_kernel: str = ""
    rule_right: bool | None = None  # None: no rule, or a plan missing in this cell


def parse_plans(text: str) -> dict[str, str]:
    """``name=spec,name=spec`` -> {name: backend spec}; a spec may hold ``=`` itself (its options)."""
    plans = {}
    for item in filter(None, (s.strip() for s in text.split(","))):
        name, sep, spec = item.partition("=")
        if not sep or not name or not spec:
            raise ValueError(f"plan {item!r}: write name=backend-spec (e.g. rows=flashinfer/verify_as_decode=true)")
        if name in plans:
            raise ValueError(f"plan name {name!r} given twice")
        plans[name] = spec
    if not plans:
        raise ValueError("no plans given")
    return plans


def measured(cell: dict) -> bool:
    """Whether a bench.kernels cell holds a time (not failed, cut or skipped)."""
    return cell.get("status", "ok") == "ok" and bool(cell.get("ms"))


def rows_of(cells: list[dict], plans: dict[str, str], rule: tuple[str, str] | None = None,
            spread: float = SPREAD) -> list[Row]:
    """One Row per verify shape (model, batch, context, q_len) any plan measured, sorted; the rule's plan joins
    ``plans`` in the ratios and is judged against the fastest of the others."""
    every = dict(plans, **({rule[0]: rule[1]} if rule else {}))
    us = {(c["phase"], c["model"], c["batch"], c["context"], c["q_len"], c["backend"]): c["ms"] * 1000
          for c in cells if measured(c)}
    kernel = {(c["model"], c["batch"], c["context"], c["q_len"], c["backend"]): c.get("kernel", "") for c in cells
              if c["phase"] == "verify"}
    specs = set(every.values())
    shapes = sorted({k[1:5] for k in us if k[0] == "verify" and k[5] in specs})
    first = next(iter(plans.values()))
    out = []
    for model, batch, ctx, q in shapes:
        row = Row(model, batch, ctx, q, us.get(("decode", model, batch, ctx, 1, first)))
        for name, spec in every.items():
            v, d = us.get(("verify", model, batch, ctx, q, spec)), us.get(("decode", model, batch, ctx, 1, spec))
            if v is not None and d is not None:
                row.verify_us[name], row.ratio[name] = v, v / d
        if rule:
            row.rule_kernel = kernel.get((model, batch, ctx, q, rule[1]), "")
            if set(every) <= set(row.ratio):
                row.rule_right = row.ratio[rule[0]] <= min(row.ratio[p] for p in plans) * spread
        out.append(row)
    return out


def markdown(rows: list[Row], plans: list[str], rule: str | None = None, floor: float = FLOOR,
             spread: float = SPREAD) -> str:
    """The table, then how many cells each plan holds at or under ``floor``, and the rule's record."""
    names = plans + ([rule] if rule else [])
    head = "| model | batch | context | q | decode us | " + " | ".join(f"{p} us (/ decode)" for p in names)
    head += " | best |" + (" rule took | right |" if rule else "")
    lines = [head, "|" + "---|" * (head.count("|") - 1)]
    for r in rows:
        cells = [f"{r.verify_us[p]:.2f} ({r.ratio[p]:.2f}x)" if p in r.ratio else "-" for p in names]
        best = min((p for p in plans if p in r.ratio), key=r.ratio.get, default="-")
        dec = f"{r.decode_us:.2f}" if r.decode_us else "-"
        line = f"| {r.model} | {r.batch} | {r.context} | {r.q_len} | {dec} | " + " | ".join(cells) + f" | {best} |"
        if rule:
            line += f" {r.rule_kernel} | {'-' if r.rule_right is None else 'yes' if r.rule_right else 'no'} |"
        lines.append(line)
    met = {p: sum(p in r.ratio and r.ratio[p] <= floor for r in rows) for p in names}
    lines += ["", f"cells at or under {floor}x of their decode, of {len(rows)}: "
              + ", ".join(f"{p} {n}" for p, n in met.items())]
    if rule:
        judged = [r for r in rows if r.rule_right is not None]
        wrong = [f"{r.model} b{r.batch} x {r.context} q{r.q_len}" for r in judged if not r.rule_right]
        lines.append(f"{rule} within {spread - 1:.0%} of the fastest other plan in {len(judged) - len(wrong)} of "
                     f"{len(judged)} cells" + (f"; not in: {', '.join(wrong)}" if wrong else ""))
    return "\n".join(lines)


def plot(rows: list[Row], names: list[str], path: str, floor: float = FLOOR) -> None:
    """Verify / decode against the batch's KV tokens (batch x context), one panel per model and q_len: a color per
    plan, a marker per batch (a line joins one plan's cells of one batch); the floor as a dashed line."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.lines import Line2D
    from matplotlib.ticker import FixedLocator, FuncFormatter, NullFormatter

    panels = sorted({(r.model, r.q_len) for r in rows})
    batches = sorted({r.batch for r in rows})
    marks = dict(zip(batches, "osD^v<>ph*x+"))
    colors = {p: f"C{i}" for i, p in enumerate(names)}
    fig, axes = plt.subplots(1, len(panels), figsize=(5 * len(panels), 4), squeeze=False, layout="constrained")
    for ax, (model, q) in zip(axes[0], panels):
        mine = [r for r in rows if (r.model, r.q_len) == (model, q)]
        for p in names:
            for b in batches:
                pts = sorted((r.batch * r.context, r.ratio[p]) for r in mine if r.batch == b and p in r.ratio)
                if pts:
                    ax.plot(*zip(*pts), color=colors[p], marker=marks.get(b, "o"), ms=4, lw=1, alpha=0.8)
        ax.axhline(floor, color="k", lw=0.8, ls="--")
        ax.set(xscale="log", yscale="log", xlabel="batch x context (KV tokens)", ylabel="verify / decode",
               title=f"{model}, q {q}")
        lo, hi = ax.get_ylim()  # autoscaled to the points and the floor
        ax.yaxis.set_major_locator(FixedLocator(ratio_ticks(lo, hi, floor)))
        ax.set_ylim(lo, hi)
        ax.yaxis.set_major_formatter(FuncFormatter(lambda y, _pos: f"{y:g}x"))
        ax.yaxis.set_minor_formatter(NullFormatter())  # the log axis' default labels its minor ticks 2x10^0 etc.
    handles = [Line2D([], [], color=c, lw=2, label=p) for p, c in colors.items()]
    handles += [Line2D([], [], color="gray", marker=m, ls="", label=f"batch {b}") for b, m in marks.items()]
    fig.legend(handles=handles, loc="outside right center", fontsize=7)
    fig.savefig(path, dpi=120)
    plt.close(fig)


# a ratio axis' ticks per decade, coarse first
LEVELS = ((1,), (1, 2, 5), (1, 1.5, 2, 3, 5, 7.5), (1, 1.2, 1.5, 2, 2.5, 3, 4, 5, 6, 8),
          (1, 1.1, 1.2, 1.3, 1.4, 1.5, 1.75, 2, 2.5, 3, 4, 5, 6, 7, 8, 9))


def ratio_ticks(lo: float, hi: float, floor: float, gap: float = 0.07, most: int = 10) -> list[float]:
    """Ticks of a log ratio axis from ``lo`` to ``hi``: the finest of LEVELS whose ticks lie at least ``gap`` of the
    axis apart, ``most`` of them, and the floor (where in range; a tick nearer it than ``gap`` gives way)."""
    import itertools
    import math

    span = math.log(hi / lo)
    decades = range(math.floor(math.log10(lo)), math.ceil(math.log10(hi)) + 1)
    ticks: list[float] = []
    for level in LEVELS:
        these = sorted(t for t in {round(m * 10.0 ** e, 9) for e in decades for m in level} if lo <= t <= hi)
        if ticks and (len(these) > most or any(math.log(b / a) < gap * span for a, b in itertools.pairwise(these))):
            break
        ticks = these
    if lo <= floor <= hi:
        ticks = sorted([t for t in ticks if abs(math.log(t / floor)) >= gap * span] + [floor])
    return ticks


CELL_KEYS = {"phase", "model", "batch", "context", "q_len", "backend"}  # what rows_of reads of a cell


def read_cells(paths: list[str]) -> list[dict]:
    """The cells of ``bench.kernels`` JSONs, read together; ValueError naming the file that is not one."""
    cells = []
    for path in paths:
        text = Path(path).read_text()  # OSError: the file's own message names it
        try:
            data = json.loads(text)
        except ValueError as e:
            raise ValueError(f"{path}: not a bench.kernels JSON (not JSON: {e})") from None
        why = ""
        if not isinstance(data, dict) or not isinstance(data.get("cells"), list):
            why = 'no "cells" list; --out PREFIX writes PREFIX.json'
        elif any(not isinstance(c, dict) or not CELL_KEYS <= set(c) for c in data["cells"]):
            why = f"a cell without {', '.join(sorted(CELL_KEYS))}"
        if why:
            raise ValueError(f"{path}: not a bench.kernels JSON ({why})")
        cells += data["cells"]
    extras = [c.get("extra") or {} for c in cells]  # files before 2026-12-06c mark --cold cells "cold": true
    kinds = {e.get("between") or ("cold" if e.get("cold") else "back to back") for e in extras}
    if len(kinds) > 1:
        raise ValueError(f"bench.kernels cells of several contexts mixed ({', '.join(sorted(kinds))}: --cold, "
                         f"--between and back-to-back runs): their times are not comparable; pass files of one kind")
    return cells


def computed_cells(cells: list[dict], name: str, off: str, on: str) -> list[dict]:
    """--computed: cells of a synthetic spec ``name``, per verify shape the ``on`` spec's verify cell (the rows) where
    today's verify_as_decode=auto rule takes the rows at that shape (kv tokens: bench.kernels' batch x context, the
    longest request: context; head_dim from bench.kernels' HEADS), else the ``off`` spec's; its decode cells are
    ``off``'s. ValueError for a model bench.kernels does not know."""
    from attnlab.backends.flashinfer import verify_as_rows
    from attnlab.bench.kernels import HEADS

    out = []
    for c in cells:
        if c["backend"] == off and c["phase"] == "decode":
            out.append(dict(c, backend=name))
        if c["backend"] not in (off, on) or c["phase"] != "verify":
            continue
        if c["model"] not in HEADS:
            raise ValueError(f"--computed: model {c['model']!r} is not one of bench.kernels' ({', '.join(HEADS)})")
        b, ctx = c["batch"], c["context"]
        takes_rows = verify_as_rows(b * ctx, HEADS[c["model"]][2], b, c["q_len"], ctx)
        if (c["backend"] == on) == takes_rows:
            took, kernel = "rows" if takes_rows else "other", c.get("kernel", "")
            out.append(dict(c, backend=name, kernel=f"{took} ({kernel})" if kernel else took))
    return out


def check_specs(cells: list[dict], plans: dict[str, str], rule: tuple[str, str] | None, paths: list[str]) -> list[str]:
    """ValueError where a plan's (or the rule's) backend spec is in no cell of the files (a typo), or where no plan
    has a measured verify cell; the notes (one per spec) where a spec's verify cells all failed or timed out: a GPU
    sitting's partial file still gives the other plans' table, the failed one a column of "-"."""
    known = {c["backend"] for c in cells}
    timed = sorted({c["backend"] for c in cells if c["phase"] == "verify" and measured(c)})
    specs = [("plan", n, s) for n, s in plans.items()] + ([("rule", *rule)] if rule else [])
    notes = []
    for what, name, spec in specs:
        if spec in timed:
            continue
        where = f"{spec} ({what} {name}) in {', '.join(paths)}; measured there: {', '.join(timed) or 'none'}"
        if spec not in known:
            raise ValueError(f"no cell of {where}")
        notes.append(f"no measured verify cell of {where}")
    if not any(spec in timed for what, _, spec in specs if what == "plan"):
        raise ValueError(notes[0])
    return notes


def plot_path(path: str) -> str:
    """--plot's path, its folder made; ValueError where it cannot be written as an image."""
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    p = Path(path)
    fmt = p.suffix.lstrip(".").lower()
    kinds = FigureCanvasAgg.get_supported_filetypes()
    if fmt and fmt not in kinds:
        raise ValueError(f"--plot {path}: an image's extension, e.g. .png ({', '.join(sorted(kinds))})")
    if p.is_dir():
        raise ValueError(f"--plot {path}: a folder; give a file name, e.g. {p / 'verify_floor.png'}")
    above = next(q for q in p.absolute().parents if q.exists())
    if not above.is_dir():
        raise ValueError(f"--plot {path}: {above} is a file, not a folder")
    try:
        p.parent.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise ValueError(f"--plot {path}: cannot make its folder ({e.strerror or e})") from None
    return path


def ratio_arg(flag: str, text: str, least: float, closed: bool = False) -> float:
    """``text`` as a finite ratio above ``least`` (at or above it where ``closed``); ValueError naming ``flag``."""
    try:
        v = float(text)
    except ValueError:
        v = float("nan")
    if not (v >= least if closed else v > least) or v == float("inf"):
        raise ValueError(f"{flag} {text}: a ratio {'>=' if closed else '>'} {least:g}")
    return v


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], prog="python -m attnlab.bench.verify_floor")
    ap.add_argument("results", nargs="+", help="bench.kernels JSONs (--out PREFIX wrote PREFIX.json); their cells "
                    "are read together")
    ap.add_argument("--plans", required=True, help="name=backend-spec,... (the first one's decode is the table's)")
    ap.add_argument("--rule", help="name=backend-spec of a plan chosen by rule among --plans")
    ap.add_argument("--computed", help="NAME=OFF/ON (plan names of --plans: the rows' plan ON, the other OFF): "
                    "today's verify_as_decode=auto rule scored as --rule on these cells (not with --rule)")
    ap.add_argument("--floor", default=FLOOR, help=f"verify / its own decode a cell meets, > 0 (default {FLOOR})")
    ap.add_argument("--spread", default=SPREAD, help=f"the rule is right within this ratio of the fastest other "
                    f"plan, >= 1 (default {SPREAD})")
    ap.add_argument("--plot", help="write a PNG of verify / decode per plan here (its folder is made)")
    args = ap.parse_args(argv)
    try:
        floor = ratio_arg("--floor", str(args.floor), 0)
        spread = ratio_arg("--spread", str(args.spread), 1, closed=True)
        plans = parse_plans(args.plans)
        rule = next(iter(parse_plans(args.rule).items())) if args.rule else None
        if rule and rule[0] in plans:
            raise ValueError(f"--rule {args.rule}: {rule[0]!r} names a plan of --plans too; give the rule its own name")
        cells = read_cells(args.results)
        if args.computed:
            if rule:
                raise ValueError("--computed and --rule: give one (each is the table's judged column)")
            name, sep, pair = args.computed.partition("=")
            off, slash, on = pair.partition("/")
            if not (sep and slash and name and off in plans and on in plans and off != on) or name in plans:
                raise ValueError(f"--computed {args.computed}: write NAME=OFF/ON, two plan names of --plans "
                                 f"({', '.join(plans)}), and a NAME of its own")
            rule = (name, f"computed:{name}")
            cells = cells + computed_cells(cells, rule[1], plans[off], plans[on])
        notes = check_specs(cells, plans, rule, args.results)
        plot_to = plot_path(args.plot) if args.plot else None  # its folder made: before the table, after the checks
    except (ValueError, OSError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    for note in notes:
        print(f"note: {note}", file=sys.stderr)
    rows = rows_of(cells, plans, rule, spread)
    names = list(plans)
    print(markdown(rows, names, rule[0] if rule else None, floor, spread))
    if plot_to:
        plot(rows, names + ([rule[0]] if rule else []), plot_to, floor)
        print(f"\nplot: {plot_to}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
