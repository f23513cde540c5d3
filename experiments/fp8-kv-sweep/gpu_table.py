"""The README's table of one GPU sweep of experiment=fp8_kv, read from its run folders (metrics.json, parity.json,
.hydra/config.yaml): one row a job, precision by precision, with tau beside the torch reference's on the same
precision and beside the bf16 job of the same backend pair.

    python experiments/fp8-kv-sweep/gpu_table.py experiments/fp8-kv-sweep/results/h200-eagle/fp8kv \
        experiments/fp8-kv-sweep/results/h200-eagle/fp8draft
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import yaml

ORDER = ("bf16", "fp8-kv", "fp8-draft")


def read_job(folder: Path) -> dict:
    """One job's row: what it ran and what it measured (KeyError / FileNotFoundError for a job that did not finish)."""
    metrics = json.loads((folder / "metrics.json").read_text())
    parity = json.loads((folder / "parity.json").read_text())
    cfg = yaml.safe_load((folder / ".hydra" / "config.yaml").read_text())
    tokens = parity["tokens"]["vs_target_only"]
    div = tokens["divergences"]
    logits = parity["logits"]
    return {
        "precision": cfg["precision"]["name"],
        "pair": metrics["backend_pair"],
        "tau": metrics["accept_len_mean"],
        "tau_ref": parity["acceptance"]["accept_len_mean_ref"],
        "match": tokens["match_rate"],
        "div": f"{div['divergences']}: {div['near_tie']} near-tie, {div['unexplained']} unexplained",
        "logits": f"{logits['max_abs_err']:.2f} / {logits['mean_kl']:.4f} / {logits['top1_agree']:.3f}",
        "kernel": parity["kernel"]["verify"]["verify"]["max_abs_err"],
        "tok_s": (metrics["output_tokens_per_s"], metrics["output_tokens_per_s_min"],
                  metrics["output_tokens_per_s_max"]),
        "speedup": (metrics["speedup_vs_target_only"], metrics["speedup_vs_target_only_min"],
                    metrics["speedup_vs_target_only_max"]),
        "noisy": bool(metrics.get("noisy")),
        "workload": (cfg["workload"]["num_prompts"], cfg["workload"]["max_new_tokens"],
                     cfg["workload"]["batch_size"], cfg["spec"]["num_draft_tokens"], cfg["engine"]["cuda_graph"],
                     cfg["warmup"]["plan"]),
    }


def table(rows: list[dict]) -> str:
    works = {r["workload"] for r in rows}
    if len(works) != 1:
        raise SystemExit(f"the jobs ran different workloads (prompts, new tokens, batch, k, graphs, warmup): {sorted(works)}")
    n, new, batch, k, graphs, warmup = works.pop()
    bf16 = {r["pair"]: r["tau"] for r in rows if r["precision"] == "bf16"}
    rows = sorted(rows, key=lambda r: (ORDER.index(r["precision"]) if r["precision"] in ORDER else 9, r["pair"]))
    out = [(f"{len(rows)} jobs; {n} prompts x {new} new tokens, batch {batch}, k {k}, CUDA graphs "
            f"{'on' if graphs else 'off'}, warmup plan {warmup}"),
           "",
           ("| precision | draft / verify | tau | tau, torch reference | tau - bf16's, same pair | token match vs own "
            "target-only | divergences | logits max abs / mean KL / top-1 agree vs reference | verify kernel max abs "
            "vs reference | tok/s (min-max) | speedup (min-max) |"),
           "|" + "---|" * 11]
    for r in rows:
        base = bf16.get(r["pair"])
        delta = "-" if base is None or r["precision"] == "bf16" else f"{r['tau'] - base:+.3f}"
        t, s = r["tok_s"], r["speedup"]
        out.append(f"| {r['precision']} | {r['pair']} | {r['tau']:.3f} | {r['tau_ref']:.3f} | {delta} | "
                   f"{r['match']:.3f} | {r['div']} | {r['logits']} | {r['kernel']:.1e} | "
                   f"{t[0]:.1f} ({t[1]:.0f}-{t[2]:.0f}){' noisy' if r['noisy'] else ''} | "
                   f"{s[0]:.2f}x ({s[1]:.2f}-{s[2]:.2f}) |")
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("sweeps", nargs="+", type=Path, help="sweep folders (each holds the jobs' numbered folders)")
    a = ap.parse_args(argv)
    rows, missing = [], []
    for sweep in a.sweeps:
        jobs = sorted((p for p in sweep.iterdir() if p.is_dir() and p.name.isdigit()), key=lambda p: int(p.name))
        if not jobs:
            raise SystemExit(f"{sweep}: no job folders")
        for job in jobs:
            try:
                rows.append(read_job(job))
            except (FileNotFoundError, KeyError) as e:
                missing.append(f"{job}: {e}")
    for m in missing:
        print(f"left out (not finished, or no .hydra/config.yaml): {m}", file=sys.stderr)
    if not rows:
        raise SystemExit("no job to tabulate")
    print(table(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
