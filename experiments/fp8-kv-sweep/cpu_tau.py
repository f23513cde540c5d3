"""What an e4m3 KV cache does to EAGLE acceptance on the real SmolLM2, measured on a CPU with the torch reference
backend on both sides (no GPU needed; fp8 *weights* need sm_89+, so the fp8-draft precision's weights are not here:
their tau on an H100 is in experiments/h100-2026-12-05c).

    python experiments/fp8-kv-sweep/cpu_tau.py [--prompts 16] [--new 128] [--out experiments/fp8-kv-sweep/results/cpu]

Four jobs of ``experiment=fp8_kv`` (the shipped EAGLE-3 head, k = 4, greedy, batch 1, held-out ShareGPT prompts, as
the H100's fp8-draft measurement), one process each, parity off (the spec run alone):

    bf16         KV bf16 on both sides
    fp8-kv       KV e4m3 on both sides (precision=fp8-kv)
    draft-kv     KV e4m3 on the draft side only (the fp8-draft precision without its fp8 weights)
    target-kv    KV e4m3 on the target side only

and a table: tau with its per-position acceptance, and how far each job's outputs follow the bf16 job's (prompts
with the same output, the mean length of the common prefix). Greedy decoding emits the target's tokens, so fp8 KV on
the target side may change them. On the draft side alone it may too, at near-ties only: other drafts are accepted to
other lengths, so the target verifies other blocks of tokens, whose bf16 rounding differs from pass shape to pass
shape (docs/precision.md; engine.invariant=true removes that, and is not used here).
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import subprocess
import sys
import time
from pathlib import Path

from omegaconf import OmegaConf

from attnlab.metrics.parity import token_parity

JOBS = {  # name -> (KV target / draft, precision overrides)
    "bf16": ("bf16 / bf16", ["precision=bf16"]),
    "fp8-kv": ("e4m3 / e4m3", ["precision=fp8-kv"]),
    "draft-kv": ("bf16 / e4m3", ["precision=bf16", "precision.kv_draft=fp8_e4m3"]),
    "target-kv": ("e4m3 / bf16", ["precision=bf16", "precision.kv_target=fp8_e4m3"]),
}


def run_job(name: str, overrides: list[str], out: Path, prompts: int, new: int) -> dict:
    folder = out / name
    cmd = [sys.executable, "-m", "attnlab", "experiment=fp8_kv", "backend=torch", "verify=torch", "device=cpu",
           "parity=off", "logger=none", "workload=sharegpt", f"workload.num_prompts={prompts}",
           f"workload.max_new_tokens={new}", *overrides, f"hydra.run.dir={folder}"]
    t0 = time.time()
    print(f"[{name}] {' '.join(cmd[2:])}", file=sys.stderr, flush=True)
    done = subprocess.run(cmd, check=False, capture_output=True, text=True, env={**os.environ, "TQDM_DISABLE": "1"})
    (folder / "console.log").parent.mkdir(parents=True, exist_ok=True)
    (folder / "console.log").write_text(done.stdout + done.stderr)
    if done.returncode != 0:
        raise SystemExit(f"[{name}] exit code {done.returncode}; see {folder / 'console.log'}")
    r = read_job(folder)
    print(f"[{name}] tau {r['metrics']['accept_len_mean']:.3f} in {time.time() - t0:.0f} s", file=sys.stderr, flush=True)
    return r


def finished(folder: Path) -> bool:
    return (folder / "metrics.json").exists() and any((folder / f).exists()
                                                      for f in ("requests.jsonl", "summary.json.gz"))


def read_job(folder: Path) -> dict:
    """A finished job's metrics, per-prompt output ids and per-prompt acceptance lengths (prompt order), from its
    requests.jsonl; written beside it as summary.json.gz (what the table needs, a few percent of its size: the
    folders of a many-prompt run can stay out of the repository), which is read where requests.jsonl is gone."""
    metrics = json.loads((folder / "metrics.json").read_text())
    summary = folder / "summary.json.gz"
    if (folder / "requests.jsonl").exists():
        reqs = [json.loads(line) for line in (folder / "requests.jsonl").read_text().splitlines()]
        rows = [{"id": q["id"], "accept_lens": q["accept_lens"], "output_token_ids": q["output_token_ids"]} for q in reqs]
        summary.write_bytes(gzip.compress(json.dumps(rows).encode(), mtime=0))
    else:
        rows = json.loads(gzip.decompress(summary.read_bytes()))
    new = OmegaConf.load(folder / ".hydra" / "config.yaml").workload.max_new_tokens  # what ran, not the flags
    return {"metrics": metrics, "outputs": [q["output_token_ids"] for q in rows], "accepts": [q["accept_lens"] for q in rows],
            "new": new}


def tau_delta(job: list[list[int]], ref: list[list[int]], draws: int = 4000, seed: int = 0) -> tuple[float, float, float]:
    """tau(job) - tau(ref), tau pooled over prompts (tokens / verify passes), with the 95% interval of a paired
    bootstrap over prompts (the same resampled prompts for both)."""
    import random

    def tau(rows, idx):
        return sum(sum(rows[i]) for i in idx) / max(1, sum(len(rows[i]) for i in idx))

    every = range(len(ref))
    rng = random.Random(seed)
    deltas = sorted(tau(job, idx) - tau(ref, idx) for idx in ([rng.randrange(len(ref)) for _ in every]
                                                              for _ in range(draws)))
    return tau(job, every) - tau(ref, every), deltas[int(0.025 * draws)], deltas[int(0.975 * draws) - 1]


def table(results: dict) -> list[str]:
    """The jobs' table; its heading from the jobs read (the 128-prompt table of 2026-12-05g, regenerated with
    --table-only and the default --prompts, was headed 16 prompts when the flags wrote it)."""
    ref, new = results["bf16"]["outputs"], {r["new"] for r in results.values()}
    if len(new) != 1 or len({len(r["outputs"]) for r in results.values()}) != 1:
        raise SystemExit(f"the jobs ran different workloads (max_new_tokens {sorted(new)}, prompts "
                         f"{sorted({len(r['outputs']) for r in results.values()})}): rerun them with the same flags")
    prompts, new = len(ref), new.pop()
    head = (f"SmolLM2-135M (real Q4_1 GGUF, bf16), shipped EAGLE-3 head, k = 4, greedy, batch 1, {prompts} held-out "
            f"ShareGPT prompts x <= {new} new tokens; torch reference backend on both sides, CPU")
    cols = ("| job | KV target / draft | tau | tau - bf16's (95% interval, paired bootstrap over prompts) | acceptance at "
            "draft position 1 / 2 / 3 / 4 | outputs = bf16's | common prefix with bf16's (mean tokens; bf16: its mean "
            "length) |")
    lines = [head, "", cols, "|---|---|---|---|---|---|---|"]
    for name, r in results.items():
        m, outs = r["metrics"], r["outputs"]
        tp = token_parity(outs, ref)
        same = sum(d is None for d in tp["first_divergence"])
        prefix = sum(len(a) if d is None else d for a, d in zip(outs, tp["first_divergence"])) / len(ref)
        rates = " / ".join(f"{m.get(f'accept_rate_pos{i}', 0.0):.3f}" for i in range(1, 5))
        d, lo, hi = tau_delta(r["accepts"], results["bf16"]["accepts"])
        delta = "-" if name == "bf16" else f"{d:+.3f} ({lo:+.3f} to {hi:+.3f})"
        lines.append(f"| {name} | {JOBS[name][0]} | {m['accept_len_mean']:.3f} | {delta} | {rates} | {same} of {len(ref)} | "
                     f"{prefix:.1f} |")
    return lines


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--prompts", type=int, default=16)
    ap.add_argument("--new", type=int, default=128)
    ap.add_argument("--jobs", default=",".join(JOBS), help=f"a subset of {','.join(JOBS)} (bf16 always runs)")
    ap.add_argument("--out", type=Path, default=Path("experiments/fp8-kv-sweep/results/cpu"))
    ap.add_argument("--table-only", action="store_true", help="run nothing: the table from the jobs already in --out")
    ap.add_argument("--resume", action="store_true",
                    help="jobs already finished in --out (metrics.json and their outputs) are read, not run again")
    a = ap.parse_args(argv)
    names = ["bf16", *[n for n in a.jobs.split(",") if n != "bf16"]]
    bad = [n for n in names if n not in JOBS]
    if bad or a.prompts < 1 or a.new < 1:
        ap.error(f"unknown job(s) {bad}" if bad else "--prompts and --new must be >= 1")
    missing = [n for n in names if not finished(a.out / n)]
    if a.table_only and missing:
        ap.error(f"--table-only: no finished job {missing} in {a.out}")
    results = {n: run_job(n, JOBS[n][1], a.out, a.prompts, a.new) if n in missing or not (a.table_only or a.resume)
               else read_job(a.out / n) for n in names}
    lines = table(results)
    (a.out / "tau.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
