"""Issue 16's verify floor from results/split2.json (run.sh 2): FlashInfer verify / its own decode per cell for the
three verify plans, split always (the default), verify_split_kv=auto and verify_as_decode=true, each against the decode
cell of the same backend spec (the same decode kernel, timed in the same process); the floor is 1.3x.

    tar xzf results/results2.tgz -C results && python experiments/h200-2026-12-04h/floor_table.py
"""

import json
import sys
from pathlib import Path

RESULTS = Path(sys.argv[1]) if len(sys.argv) > 1 else Path(__file__).parent / "results" / "split2.json"
PLANS = {"split": "flashinfer", "auto": "flashinfer/verify_split_kv=auto", "rows": "flashinfer/verify_as_decode=true"}
FLOOR = 1.3


def main() -> None:
    cells = json.loads(RESULTS.read_text())["cells"]
    us = {(c["phase"], c["model"], c["batch"], c["context"], c["backend"]): c["ms"] * 1000
          for c in cells if c.get("status", "ok") == "ok" and c.get("ms")}
    kernel = {(c["model"], c["batch"], c["context"], c["backend"]): c.get("kernel", "") for c in cells
              if c["phase"] == "verify"}
    shapes = sorted({k[1:4] for k in us if k[0] == "verify"}, key=lambda s: (s[0], s[1], s[2]))
    print("| model | batch | context | decode us | " + " | ".join(f"verify {p} us (/ decode)" for p in PLANS)
          + " | best | rows kernel |")
    print("|---|---|---|---|" + "---|" * len(PLANS) + "---|---|")
    met = {p: 0 for p in PLANS}
    for model, batch, ctx in shapes:
        dec = us.get(("decode", model, batch, ctx, PLANS["split"]))
        row, ratios = [], {}
        for p, spec in PLANS.items():
            v, d = us.get(("verify", model, batch, ctx, spec)), us.get(("decode", model, batch, ctx, spec))
            if v is None or d is None:
                row.append("-")
                continue
            ratios[p] = v / d
            met[p] += ratios[p] <= FLOOR
            row.append(f"{v:.2f} ({ratios[p]:.2f}x)")
        best = min(ratios, key=ratios.get) if ratios else "-"
        print(f"| {model} | {batch} | {ctx} | {dec:.2f} | " + " | ".join(row)
              + f" | {best} | {kernel.get((model, batch, ctx, PLANS['rows']), '')} |")
    print(f"\ncells at or under {FLOOR}x of their decode, of {len(shapes)}: "
          + ", ".join(f"{p} {n}" for p, n in met.items()))


if __name__ == "__main__":
    main()
