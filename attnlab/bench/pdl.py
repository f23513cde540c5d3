"""Programmatic dependent launch on and off, side by side in one process (CUDA, compute capability >= 9.0).

    python -m attnlab.bench.pdl [--models smollm2-135m,llama-3.2-1b] [--engines fused,gemm] [--host thin8]
                                [--batches 1] [--rounds 5] [--new 256] [--out PREFIX]

Target-only greedy decode with CUDA graphs on random weights (decode speed does not depend on their values), per
(model, batch, engine, host path): the side is built once, then ``--rounds`` rounds of both settings of
attnlab.kernels.pdl (engine.pdl; off first in even rounds, on first in odd ones), the graphs re-captured at every
switch. Reported: median
tok/s with its min-max per setting, the median of the per-round ratios on / off with their min-max, and whether
the two settings decoded the same tokens (PDL changes when a kernel starts, never what it computes: anything but
"yes" is a bug). Engines: ``unfused`` (cuBLAS and torch ops between attnlab's attention kernels), ``fused``
(engine.fused_ops: the norms, RoPE, SiLU-mul and KV store as attnlab kernels), ``gemm`` (engine.gemm=triton:
every GEMM of a decode pass is attnlab's small-M kernel too, so every launch of a layer can overlap the one before).
"""

from __future__ import annotations

import argparse

import torch

from attnlab.bench.e2e import (
    check_host,
    random_prompts,
    set_host_path,
    side,
    target_only,
    timed_generate,
)
from attnlab.bench.kernels import versions
from attnlab.bench.output import write_report
from attnlab.kernels import pdl
from attnlab.metrics.perf import percentile

ENGINES = {"unfused": False, "fused": True, "gemm": "gemm"}


def timed_decode(runner, prompts: list[list[int]], new: int) -> tuple[float, list[list[int]]]:
    """One untimed warmup (compiles, settles the graphs), one timed run: -> (decode tok/s, output tokens)."""
    dec = target_only(runner)
    dec.generate(prompts, 8)
    out, decode_ms = timed_generate(dec, prompts, new)
    tokens = [r.output_ids for r in out.requests]
    decoded = sum(max(0, len(t) - 1) for t in tokens)  # the first token comes from the prefill
    return decoded / (decode_ms / 1e3), tokens


def ab_rounds(runner, prompts, new: int, host: str, rounds: int) -> dict:
    """``rounds`` rounds of both settings, the order alternating (off first in even rounds), so a drift inside a
    round does not always favour the same setting; -> per-setting tok/s lists, per-round ratios, same tokens."""
    tok = {"off": [], "on": []}
    same = True
    for i in range(rounds):
        outs = {}
        for setting in (("off", "on") if i % 2 == 0 else ("on", "off")):
            with pdl.using(setting == "on", runner.device):
                set_host_path(runner, host)  # re-captures the graphs with this setting's launches
                t, outs[setting] = timed_decode(runner, prompts, new)
            tok[setting].append(t)
        same &= outs["off"] == outs["on"]
    ratios = [b / a for a, b in zip(tok["off"], tok["on"])]
    return {"tok_s_off": tok["off"], "tok_s_on": tok["on"], "ratio": ratios, "same_tokens": same}


def _spread(v: list[float], fmt: str) -> str:
    return f"{percentile(v, 50):{fmt}} ({min(v):{fmt}}-{max(v):{fmt}})"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", default="smollm2-135m,llama-3.2-1b")
    ap.add_argument("--engines", default="fused,gemm", help=f"comma-separated, of {', '.join(ENGINES)}")
    ap.add_argument("--host", type=check_host, default=check_host("thin8"), help="host paths (bench.e2e's)")
    ap.add_argument("--batches", default="1")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--new", type=int, default=256)
    ap.add_argument("--out", default=None, help="write PREFIX.json and PREFIX.md")
    a = ap.parse_args(argv)
    engines = [e.strip() for e in a.engines.split(",") if e.strip()]
    bad = [e for e in engines if e not in ENGINES]
    if bad or a.rounds < 1:
        ap.error(f"--engines: unknown {bad} (choose from {', '.join(ENGINES)})" if bad else "--rounds must be >= 1")
    why = pdl.unsupported("cuda")
    if why:
        print(f"attnlab.bench.pdl: {why}")
        return 2
    res = {"gpu": torch.cuda.get_device_name(), "versions": versions(), "rounds": a.rounds, "rows": []}
    lines = [(f"{res['gpu']}; {res['versions']}; greedy target-only decode, random weights, CUDA graphs, "
              f"{a.new} new tokens, {a.rounds} rounds of (off, on)"), "",
             "| model | batch | engine | host | tok/s PDL off | tok/s PDL on | on / off (per round) | same tokens |",
             "|---|---|---|---|---|---|---|---|"]
    print(lines[0], flush=True)

    def emit(key: dict, cells: str, data: dict) -> None:  # one row: the table, the JSON, the console
        res["rows"].append({**key, **data})
        lines.append(f"| {key['model']} | {key['batch']} | {key['engine']} | {key.get('host', '')} | {cells} |")
        print(lines[-1], flush=True)

    for model in [m.strip() for m in a.models.split(",") if m.strip()]:
        for batch in [int(b) for b in a.batches.split(",") if b]:
            for eng in engines:
                key = {"model": model, "batch": batch, "engine": eng}
                try:
                    rs = side(model, "triton", batch, True, 32 + a.new + 16, fused=ENGINES[eng])
                except Exception as e:  # noqa: BLE001 - one engine failing must not lose the table
                    emit(key, f"error: {e!r} |||", {"error": repr(e)})
                    continue
                prompts = random_prompts(rs.model_config.vocab_size, batch)
                for host in a.host:
                    try:
                        r = ab_rounds(rs, prompts, a.new, host, a.rounds)
                    except Exception as e:  # noqa: BLE001
                        emit({**key, "host": host}, f"error: {e!r} |||", {"error": repr(e)})
                        continue
                    cells = (f"{_spread(r['tok_s_off'], '.0f')} | {_spread(r['tok_s_on'], '.0f')} | "
                             f"{_spread(r['ratio'], '.3f')} | {'yes' if r['same_tokens'] else 'NO'}")
                    emit({**key, "host": host}, cells, r)
                del rs
                torch.cuda.empty_cache()
    write_report(a.out, res, "\n".join(lines))
    bad_rows = [r for r in res["rows"] if "error" not in r and not r["same_tokens"]]
    if bad_rows:
        print(f"PDL changed the decoded tokens in {len(bad_rows)} rows: a missing wait in some kernel")
        return 3
    failed = [r for r in res["rows"] if "error" in r]
    if failed:
        print(f"{len(failed)} rows failed (their errors are in the table and the JSON)")
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
