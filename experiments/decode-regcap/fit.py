"""Issue 16's decode over contexts (run.sh 8's contexts-*.json): for each (model, batch, arm), a least-squares line of
the decode's time against the KV bytes it reads, time = fixed + bytes / bandwidth. The slope's bandwidth is what the
decode reaches once the context is long; the intercept is what no context removes (launch, merge, the chain's wait).
Cells whose KV fits the L2 bend the line: keep contexts whose walk is at least twice the L2 (run.sh 8 does).

    python experiments/decode-regcap/fit.py DIR/contexts-llama8b.json DIR/contexts-smollm2.json
"""

from __future__ import annotations

import argparse
import json
import pathlib


def fit_line(xs: list[float], ys: list[float]) -> tuple[float, float, float]:
    """Least squares y = a + b x -> (a, b, the largest residual); ValueError under two distinct x."""
    n = len(xs)
    if n < 2 or len(set(xs)) < 2:
        raise ValueError(f"a line needs two distinct points, got x = {xs}")
    mx, my = sum(xs) / n, sum(ys) / n
    b = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sum((x - mx) ** 2 for x in xs)
    a = my - b * mx
    return a, b, max(abs(y - (a + b * x)) for x, y in zip(xs, ys))


def kv_bytes(cell: dict) -> float:
    """The KV bytes a decode reads, from the cell's own rate: kv_gb_s x ms."""
    return cell["kv_gb_s"] * 1e9 * cell["ms"] * 1e-3


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("files", nargs="+", type=pathlib.Path, help="bench.kernels JSON outputs (decode cells)")
    ap.add_argument("--exclude", action="append", default=[], metavar="MODEL:CONTEXT",
                    help="leave a model's context out of the fit (one whose walk the L2 partly holds); repeatable")
    args = ap.parse_args()
    drop = set(args.exclude)
    groups: dict[tuple, list[dict]] = {}
    for path in args.files:
        with open(path) as f:
            for c in json.load(f)["cells"]:
                if f"{c['model']}:{c['context']}" in drop:
                    continue
                if c.get("status") == "ok" and c["phase"] == "decode":
                    groups.setdefault((c["model"], c["batch"], c["backend"]), []).append(c)
    print("| model | batch | arm | contexts | fixed (us) | bandwidth (GB/s) | largest residual (us) |")
    print("|---|---|---|---|---|---|---|")
    for (model, batch, arm), cs in sorted(groups.items()):
        cs.sort(key=lambda c: c["context"])
        ctx = ",".join(str(c["context"]) for c in cs)
        try:
            a, b, worst = fit_line([kv_bytes(c) for c in cs], [c["ms"] * 1e3 for c in cs])
        except ValueError as e:
            print(f"| {model} | {batch} | {arm} | {ctx} | {e} | | |")
            continue
        print(f"| {model} | {batch} | {arm} | {ctx} | {a:.2f} | {1e-3 / b:.0f} | {worst:.2f} |")


if __name__ == "__main__":
    main()
