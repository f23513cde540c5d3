"""Issue 16's verify floor with verify_as_decode=auto, from results/rows1.json (run.sh 1): FlashInfer verify / its own
decode per cell for three verify plans (the default: fa2 split by rule; the decode rows always; the rows by rule), each
against the decode cell of the same backend spec (timed in the same process), and whether the rule took the faster of
the default and the rows (within 3%: the spread of a cell). The floor is 1.3x.

    tar xzf results/results1.tgz -C results && python experiments/h200-2026-12-05/rows_table.py
"""

import json
import sys
from pathlib import Path

RESULTS = Path(sys.argv[1]) if len(sys.argv) > 1 else Path(__file__).parent / "results" / "rows1.json"
PLANS = {"default": "flashinfer", "rows": "flashinfer/verify_as_decode=true",
         "by rule": "flashinfer/verify_as_decode=auto"}
FLOOR, SPREAD = 1.3, 1.03


def main() -> None:
    cells = json.loads(RESULTS.read_text())["cells"]
    us = {(c["phase"], c["model"], c["batch"], c["context"], c["q_len"], c["backend"]): c["ms"] * 1000
          for c in cells if c.get("status", "ok") == "ok" and c.get("ms")}
    kernel = {(c["model"], c["batch"], c["context"], c["q_len"], c["backend"]): c.get("kernel", "") for c in cells
              if c["phase"] == "verify"}
    shapes = sorted({k[1:5] for k in us if k[0] == "verify"})
    print("| model | batch | context | q | decode us | " + " | ".join(f"{p} us (/ decode)" for p in PLANS)
          + " | rule took | right |")
    print("|---|---|---|---|---|" + "---|" * len(PLANS) + "---|---|")
    met, right, wrong = {p: 0 for p in PLANS}, 0, []
    for model, batch, ctx, q in shapes:
        row, ratios = [], {}
        for p, spec in PLANS.items():
            v, d = us.get(("verify", model, batch, ctx, q, spec)), us.get(("decode", model, batch, ctx, 1, spec))
            if v is None or d is None:
                row.append("-")
                continue
            ratios[p] = v / d
            met[p] += ratios[p] <= FLOOR
            row.append(f"{v:.2f} ({ratios[p]:.2f}x)")
        took = kernel.get((model, batch, ctx, q, PLANS["by rule"]), "")
        ok = "-"
        if set(PLANS) <= set(ratios):
            ok = "yes" if ratios["by rule"] <= min(ratios["default"], ratios["rows"]) * SPREAD else "no"
            right += ok == "yes"
            if ok == "no":
                wrong.append(f"{model} b{batch} x {ctx} q{q}")
        dec = us.get(("decode", model, batch, ctx, 1, PLANS["default"]))
        print(f"| {model} | {batch} | {ctx} | {q} | {dec:.2f} | " + " | ".join(row) + f" | {took} | {ok} |"
              if dec else f"| {model} | {batch} | {ctx} | {q} | - | " + " | ".join(row) + f" | {took} | {ok} |")
    print(f"\ncells at or under {FLOOR}x of their decode, of {len(shapes)}: "
          + ", ".join(f"{p} {n}" for p, n in met.items()))
    print(f"the rule within {SPREAD - 1:.0%} of the faster plan in {right} of {len(shapes)} cells"
          + (f"; not in: {', '.join(wrong)}" if wrong else ""))


if __name__ == "__main__":
    main()
