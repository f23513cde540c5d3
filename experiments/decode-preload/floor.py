"""Issue 16's decode floor from floor rounds (fused-merge-auto/run.sh 8's old.json, c101f91, and new.json, today's arms,
one folder a round): each arm's time and speed-up over c101f91 per round, then their ranges over the rounds.

    python experiments/decode-preload/floor.py experiments/decode-preload/results/call1/floor*
"""

from __future__ import annotations

import argparse
import json
import pathlib


def cells(path: pathlib.Path) -> list[dict]:
    with open(path) as f:
        return [c for c in json.load(f)["cells"] if c.get("status") == "ok"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("rounds", nargs="+", type=pathlib.Path, help="folders holding old.json and new.json")
    rounds = ap.parse_args().rounds
    spans: dict[tuple, list[tuple[float, float]]] = {}
    for folder in rounds:
        old = {(c["model"], c["batch"]): c["ms"] * 1000 for c in cells(folder / "old.json")}
        print(f"{folder}:")
        for c in cells(folder / "new.json"):
            key = (c["model"], c["batch"], c["backend"])
            us, before = c["ms"] * 1000, old[key[:2]]
            spans.setdefault(key, []).append((us, before / us))
            print(f"  {key[0]:8} b{key[1]:<3} {key[2]:40} {us:7.3f} us (spread {c['spread_pct']:.1f}%)"
                  f"  c101f91 {before:7.3f} us  {before / us:.3f}x")
    print(f"over {len(rounds)} round(s): time, speed-up over c101f91")
    for key, v in spans.items():
        us, up = [x for x, _ in v], [y for _, y in v]
        print(f"  {key[0]:8} b{key[1]:<3} {key[2]:40} {min(us):.2f}-{max(us):.2f} us  {min(up):.3f}-{max(up):.3f}x")


if __name__ == "__main__":
    main()
