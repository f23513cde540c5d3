"""Parts 3, 4 and 6's table: where the fused merge's time goes at the batch-1 / 16 x 4k decode (PDL on), from its
processes' bench.kernels JSONs, each round's files side by side (untar resultsN.tgz first).

    python experiments/decode-regcap/arrival.py DIR     (DIR holds plainN, nomergeN, arriveN, relaxedN, leanN .json)

Rows per (model, batch): the default (fused merge), the merge launch, the split decode without any merge (nomerge.py),
the fused merge cut to its arrival (--arrive) and that arrival without its fences (--arrive-relaxed), as the range over
rounds; then the differences, round by round: the arrival (arrive - merge-less), its fences (arrive - relaxed), and the
merge proper (default - arrive). Each process is its own: the default appears in plainN and nomergeN (its anchor).
"""

from __future__ import annotations

import argparse
import json
import pathlib

# (folder prefix, backend spec in that process, row label)
ROWS = [("plain", "triton+pdl", "default (triton+pdl)"),
        ("nomerge", "triton+pdl", "default, nomerge.py's process"),
        ("plain", "triton/fused_merge=false+pdl", "merge launch"),
        ("nomerge", "triton/fused_merge=false+pdl", "no merge (nomerge.py)"),
        ("arrive", "triton+pdl", "arrival only (--arrive)"),
        ("relaxed", "triton+pdl", "arrival, no fences (--arrive-relaxed)")]
DIFFS = [("arrival: arrive - no merge", ("arrive", "triton+pdl"), ("nomerge", "triton/fused_merge=false+pdl")),
         ("its fences: arrive - relaxed", ("arrive", "triton+pdl"), ("relaxed", "triton+pdl")),
         ("merge proper: default - arrive", ("plain", "triton+pdl"), ("arrive", "triton+pdl"))]


def load(root: pathlib.Path) -> tuple[dict, set]:
    """{(prefix, round): {(model, batch, backend): us}} from every PREFIXN.json in root (bench.kernels tables: other
    JSONs, such as stamps.py's, are skipped), and the (model, batch) cells whose default (triton+pdl, plainN) merges
    inside its kernel: only there do nomerge.py, --arrive and lean.py (part 6, on d2fbb55's tree) change the
    default."""
    out, fused = {}, set()
    for f in sorted(root.glob("*.json")):
        prefix = f.stem.rstrip("0123456789")
        rnd = f.stem[len(prefix):]
        table = json.loads(f.read_text())
        if not (isinstance(table, dict) and "cells" in table and rnd):
            continue
        cells = [c for c in table["cells"] if c.get("status") == "ok" and c["phase"] == "decode"]
        out[(prefix, int(rnd))] = {(c["model"], c["batch"], c["backend"]): c["ms"] * 1e3 for c in cells}
        fused |= {(c["model"], c["batch"]) for c in cells if prefix == "plain" and c["backend"] == "triton+pdl"
                  and "merge=fused" in c.get("extra", {}).get("kernels", {}).get("decode", "")}
    return out, fused


def table(data: dict, fused: set) -> list[str]:
    rounds = sorted({r for _, r in data})
    keys = sorted({(m, b) for d in data.values() for m, b, _ in d})
    lines = ["| model, batch x 4k | row | us (range over rounds) |", "|---|---|---|"]
    for m, b in keys:
        rows = [(label, fmt(series(data, rounds, m, b, (prefix, spec)))) for prefix, spec, label in ROWS]
        if (m, b) not in fused:  # the default runs the merge launch: the diagnostics do not apply to it
            lines += [f"| {m}, {b} | {label} | {value} |" for label, value in rows if value != "-"]
            lines.append(f"| {m}, {b} | (the default runs the merge launch here: no decomposition) | - |")
            continue
        rows += [(f"**{label}**", fmt(series(data, rounds, m, b, a, minus), signed=True)) for label, a, minus in DIFFS]
        # every other arm timed both whole and cut to its arrival: its merge proper
        others = sorted({s for (pre, _), d in data.items() if pre == "arrive" for mm, bb, s in d
                         if (mm, bb) == (m, b) and s != "triton+pdl"})
        for spec in others:
            rows.append((f"{spec}: whole", fmt(series(data, rounds, m, b, ("plain", spec)))))
            rows.append((f"{spec}: arrival only", fmt(series(data, rounds, m, b, ("arrive", spec)))))
            rows.append((f"**{spec}: merge proper**",
                         fmt(series(data, rounds, m, b, ("plain", spec), ("arrive", spec)), signed=True)))
        # every arm timed with the default merge and with lean.py's: the lean one's time and its difference
        leans = {s for (pre, _), d in data.items() if pre == "lean" for mm, bb, s in d if (mm, bb) == (m, b)}
        for spec in sorted(leans):
            rows.append((f"{spec}: lean merge", fmt(series(data, rounds, m, b, ("lean", spec)))))
            rows.append((f"**{spec}: lean - default**",
                         fmt(series(data, rounds, m, b, ("lean", spec), ("plain", spec)), signed=True)))
        lines += [f"| {m}, {b} | {label} | {value} |" for label, value in rows if value != "-"]
    return lines


def series(data: dict, rounds: list[int], m: str, b: int, a: tuple[str, str], minus: tuple[str, str] | None = None):
    """A's time (us) at (m, b) in each round that has it, less MINUS's in the same round when given."""
    out = []
    for r in rounds:
        va = data.get((a[0], r), {}).get((m, b, a[1]))
        vb = data.get((minus[0], r), {}).get((m, b, minus[1])) if minus else 0.0
        if va is not None and vb is not None:
            out.append(va - vb)
    return out


def fmt(vals: list[float], signed: bool = False) -> str:
    if not vals:
        return "-"
    f = "{:+.2f}" if signed else "{:.2f}"
    lo, hi = f.format(min(vals)), f.format(max(vals))
    return lo if lo == hi else f"{lo} to {hi}"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("dir", type=pathlib.Path)
    a = ap.parse_args()
    data, fused = load(a.dir)
    if not data:
        raise SystemExit(f"{a.dir}: no PREFIXN.json (untar results3.tgz there first)")
    print("\n".join(table(data, fused)))


if __name__ == "__main__":
    main()
