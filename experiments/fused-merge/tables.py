"""The README's tables from bench.kernels' JSON: per cell, each arm's time in us and its ratio to the first arm.

    cd experiments/fused-merge && python tables.py results/call3/grid-smollm2.json [more.json ...] [--arms A,B,...]

Arms default to every backend spec in the file, in the order of its first cell; a cell an arm lacks reads "-"; an arm
no cell of the file has is an error.
"""

from __future__ import annotations

import argparse
import json


def cells(path: str) -> list[dict]:
    with open(path) as f:
        return [c for c in json.load(f)["cells"] if c.get("status") == "ok"]


def table(path: str, arms: list[str] | None) -> str:
    ok = cells(path)
    have = list(dict.fromkeys(c["backend"] for c in ok))
    missing = [a for a in arms or () if a not in have]
    if missing:
        raise SystemExit(f"{path}: no cell of {missing}; its arms: {have}")
    arms = arms or have
    keys = list(dict.fromkeys((c["model"], c["batch"], c["context"]) for c in ok))
    short = [a.replace("triton/", "").replace("+pdl", "") or a for a in arms]
    lines = [f"{path}: us (ratio to {short[0]})", "| shape | batch | context | " + " | ".join(short) + " |",
             "|---|---|---|" + "---|" * len(arms)]
    for key in keys:
        t = {c["backend"]: c["ms"] * 1000 for c in ok if (c["model"], c["batch"], c["context"]) == key}
        base = t.get(arms[0])
        row = [f"{t[a]:.2f} ({t[a] / base:.3f})" if a in t and base else "-" for a in arms]
        lines.append(f"| {key[0]} | {key[1]} | {key[2]} | " + " | ".join(row) + " |")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("files", nargs="+")
    ap.add_argument("--arms", default=None, help="comma-separated backend specs, the first the baseline")
    a = ap.parse_args()
    for f in a.files:
        print(table(f, a.arms.split(",") if a.arms else None) + "\n")


if __name__ == "__main__":
    main()
