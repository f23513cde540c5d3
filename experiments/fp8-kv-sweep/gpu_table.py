"""The README's table of one GPU sweep of experiment=fp8_kv, read from its run folders (metrics.json, parity.json,
.hydra/config.yaml): one row a job, precision by precision, with tau beside the torch reference's on the same
precision and beside the bf16 job of the same backend pair.

    python experiments/fp8-kv-sweep/gpu_table.py experiments/fp8-kv-sweep/results/h200-eagle/fp8kv \
        experiments/fp8-kv-sweep/results/h200-eagle/fp8draft        (from the repository's root)
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import yaml

ORDER = ("bf16", "fp8-kv", "fp8-draft")


class Unreadable(Exception):
    """A job folder that cannot give a row: a file missing (not finished) or a parity section not recorded."""


def _get(d: dict, *keys: str, where: str):
    """d[k0][k1]...; Unreadable naming the missing key (a section left out by the run's parity settings)."""
    for k in keys:
        if not isinstance(d, dict) or d.get(k) is None:
            raise Unreadable(f"{where} has no {'.'.join(keys)} (parity section off for this job?)")
        d = d[k]
    return d


def _divergences(div: dict) -> str:
    """"n: t near-tie, u unexplained", with "(w within the reference's rounding)" where parity.rounding measured it
    (runs from 2026-12-06b on)."""
    within = div.get("unexplained_within_rounding")
    extra = f" ({within} within the reference's rounding)" if div["unexplained"] and isinstance(within, int) else ""
    return f"{div['divergences']}: {div['near_tie']} near-tie, {div['unexplained']} unexplained{extra}"


def read_job(folder: Path) -> dict:
    """One job's row: what it ran and what it measured (Unreadable for a job that did not finish or lacks a section)."""
    try:
        metrics = json.loads((folder / "metrics.json").read_text())
        parity = json.loads((folder / "parity.json").read_text())
        cfg = yaml.safe_load((folder / ".hydra" / "config.yaml").read_text())
    except FileNotFoundError as e:
        raise Unreadable(f"no {Path(e.filename).relative_to(folder)} (not finished?)") from e
    tokens = _get(parity, "tokens", "vs_target_only", where="parity.json")
    ref = _get(parity, "tokens", "vs_reference", where="parity.json")
    div = _get(tokens, "divergences", where="parity.json tokens.vs_target_only")
    logits = _get(parity, "logits", where="parity.json")
    kernel = _get(parity, "kernel", "verify", "verify", "max_abs_err", where="parity.json")
    return {
        "precision": cfg["precision"]["name"],
        "pair": metrics["backend_pair"],
        "tau": metrics["accept_len_mean"],
        "tau_ref": _get(parity, "acceptance", "accept_len_mean_ref", where="parity.json"),
        "match": tokens["match_rate"],
        "div": _divergences(div),
        "ref": f"{ref['match_rate']:.3f} / {_divergences(_get(ref, 'divergences', where='tokens.vs_reference'))}",
        "logits": f"{logits['max_abs_err']:.2f} / {logits['mean_kl']:.4f} / {logits['top1_agree']:.3f}",
        "kernel": kernel,
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
            "target-only | divergences vs own target-only | token match / divergences vs the torch reference | "
            "logits max abs / mean KL / top-1 agree vs reference | verify kernel max abs vs reference | tok/s (min-max) "
            "| speedup (min-max) |"),
           "|" + "---|" * 12]
    for r in rows:
        base = bf16.get(r["pair"])
        delta = "-" if base is None or r["precision"] == "bf16" else f"{r['tau'] - base:+.3f}"
        t, s = r["tok_s"], r["speedup"]
        out.append(f"| {r['precision']} | {r['pair']} | {r['tau']:.3f} | {r['tau_ref']:.3f} | {delta} | "
                   f"{r['match']:.3f} | {r['div']} | {r['ref']} | {r['logits']} | {r['kernel']:.1e} | "
                   f"{t[0]:.1f} ({t[1]:.0f}-{t[2]:.0f}){' noisy' if r['noisy'] else ''} | "
                   f"{s[0]:.2f}x ({s[1]:.2f}-{s[2]:.2f}) |")
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("sweeps", nargs="+", type=Path, help="sweep folders (each holds the jobs' numbered folders)")
    a = ap.parse_args(argv)
    rows, missing = [], []
    for sweep in a.sweeps:
        if not sweep.is_dir():
            raise SystemExit(f"{sweep}: not a folder (a sweep's folder holds its jobs' numbered folders)")
        jobs = sorted((p for p in sweep.iterdir() if p.is_dir() and p.name.isdigit()), key=lambda p: int(p.name))
        if not jobs:
            raise SystemExit(f"{sweep}: no job folders")
        for job in jobs:
            try:
                rows.append(read_job(job))
            except Unreadable as e:
                missing.append(f"{job}: {e}")
    for m in missing:
        print(f"left out: {m}", file=sys.stderr)
    if not rows:
        raise SystemExit("no job to tabulate")
    print(table(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
