"""Part 3's table: where the fused merge's time goes at the batch-1 / 16 x 4k decode (PDL on), from its processes'
bench.kernels JSONs, each round's folders side by side (untar results3.tgz first).

    python experiments/decode-regcap/arrival.py DIR     (DIR holds plainN/, nomergeN/, arriveN/, relaxedN/ .json)

Rows per (model, batch): the default (fused merge), the merge launch, the split decode without any merge (nomerge.py),
the fused merge cut to its arrival (--arrive) and that arrival without its fence (--arrive-relaxed), as the range over
rounds; then the differences, round by round: the arrival (arrive - merge-less), its fence (arrive - relaxed), and the
merge proper (default - arrive). Each process is its own: the default appears in plainN and nomergeN (its anchor).
"""

from __future__ import annotations

import argparse
import json
import pathlib

# (folder prefix, backend spec in that process, row label)
ROWS = [("plain", "triton+pdl", "default (fused merge)"),
        ("nomerge", "triton+pdl", "default, nomerge.py's process"),
        ("plain", "triton/fused_merge=false+pdl", "merge launch"),
        ("nomerge", "triton/fused_merge=false+pdl", "no merge (nomerge.py)"),
        ("arrive", "triton+pdl", "arrival only (--arrive)"),
        ("relaxed", "triton+pdl", "arrival, no fence (--arrive-relaxed)")]
DIFFS = [("arrival: arrive - no merge", ("arrive", "triton+pdl"), ("nomerge", "triton/fused_merge=false+pdl")),
         ("its fence: arrive - relaxed", ("arrive", "triton+pdl"), ("relaxed", "triton+pdl")),
         ("merge proper: default - arrive", ("plain", "triton+pdl"), ("arrive", "triton+pdl"))]


def load(root: pathlib.Path) -> dict:
    """{(prefix, round): {(model, batch, backend): us}} from every PREFIXN/*.json under root."""
    out = {}
    for f in sorted(root.glob("*/*.json")):
        prefix = f.parent.name.rstrip("0123456789")
        rnd = f.parent.name[len(prefix):]
        cells = json.loads(f.read_text())["cells"]
        out[(prefix, rnd)] = {(c["model"], c["batch"], c["backend"]): c["ms"] * 1e3 for c in cells
                              if c.get("status") == "ok" and c["phase"] == "decode"}
    return out


def table(data: dict) -> list[str]:
    rounds = sorted({r for _, r in data})
    keys = sorted({(m, b) for d in data.values() for m, b, _ in d})
    lines = ["| model, batch x 4k | row | us (range over rounds) |", "|---|---|---|"]
    for m, b in keys:
        for prefix, spec, label in ROWS:
            vals = [data.get((prefix, r), {}).get((m, b, spec)) for r in rounds]
            vals = [v for v in vals if v is not None]
            lines.append(f"| {m}, {b} | {label} | {fmt(vals)} |")
        for label, (pa, sa), (pb, sb) in DIFFS:
            vals = [data[(pa, r)][(m, b, sa)] - data[(pb, r)][(m, b, sb)] for r in rounds
                    if (m, b, sa) in data.get((pa, r), {}) and (m, b, sb) in data.get((pb, r), {})]
            lines.append(f"| {m}, {b} | **{label}** | {fmt(vals, signed=True)} |")
    return lines


def fmt(vals: list[float], signed: bool = False) -> str:
    if not vals:
        return "-"
    f = "{:+.2f}" if signed else "{:.2f}"
    lo, hi = min(vals), max(vals)
    return f.format(lo) if abs(hi - lo) < 0.005 else f"{f.format(lo)} to {f.format(hi)}"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("dir", type=pathlib.Path)
    a = ap.parse_args()
    data = load(a.dir)
    if not data:
        raise SystemExit(f"{a.dir}: no PREFIXN/*.json (untar results3.tgz there first)")
    print("\n".join(table(data)))


if __name__ == "__main__":
    main()
