"""Programmatic dependent launch on and off (and the GEMM's split modes), side by side in one process (CUDA,
compute capability >= 9.0).

    python -m attnlab.bench.pdl [--models smollm2-135m,llama-3.2-1b] [--engines fused,gemm] [--host thin8]
                                [--batches 1] [--rounds 5] [--gemm-splits fill/pass] [--new 256] [--out PREFIX]

Target-only greedy decode with CUDA graphs on random weights (decode speed does not depend on their values), per
(model, batch, engine, host path): the side is built once, then ``--rounds`` rounds over its arms, the order
rotating by one arm per round (so a drift inside a round does not always favour the same arm), the graphs
re-captured at every switch. Arms (``--gemm-splits``, each ``attnlab.kernels.gemm.arm``'s text): PDL off and on with
the first, then PDL on with each further one. Their split mode and weight prefetch act on the gemm engines; their
other switches (``+kvsep``: the KV store as its own kernel; ``+kvpf0``: no decode KV prefetch; ``+amtorch``: torch's
argmax) on every engine; ``+normpro`` / ``+normsep`` (the norms as GEMM prologues / their own launches) on the gemm
engine. Reported per arm: median tok/s with its min-max, its share of the weight-bandwidth roofline (batch x the
copy bandwidth measured in the process / the weight bytes a step reads), the median of its per-round ratios to
the first arm (min-max), and whether it decoded the first arm's tokens (PDL and the reduction mechanism change
when and where sums happen, never their order: anything but "yes" is a bug; a different split *policy* changes
the order of fp32 sums, so its tokens may differ on random weights at near-ties: "differs" there, not a bug).
Engines: ``unfused`` (cuBLAS and torch ops between attnlab's attention kernels), ``fused`` (engine.fused_ops:
the norms, RoPE, SiLU-mul and KV store as attnlab kernels), ``gemm`` (engine.gemm=triton: every GEMM of a
decode pass is attnlab's small-M kernel too, so every launch of a layer can overlap the one before), ``gemm-attn``
(engine.gemm=triton_attn: qkv and o on that kernel, the MLP and LM head on cuBLAS).
"""

from __future__ import annotations

import argparse

import torch

from attnlab.bench.e2e import (
    check_host,
    random_prompts,
    roofline_tok_s,
    set_host_path,
    side,
    step_weight_bytes,
    target_only,
    timed_generate,
)
from attnlab.bench.kernels import copy_bandwidth_gb_s, versions
from attnlab.bench.output import write_report
from attnlab.kernels import gemm, pdl
from attnlab.metrics.perf import percentile

ENGINES = {"unfused": False, "fused": True, "gemm": "gemm", "gemm-attn": "gemm_attn"}
GEMM_ENGINES = ("gemm", "gemm-attn")  # engines whose arms' split mode and prefetch act


def timed_decode(runner, prompts: list[list[int]], new: int) -> tuple[float, list[list[int]]]:
    """One untimed warmup (compiles, settles the graphs), one timed run: -> (decode tok/s, output tokens)."""
    dec = target_only(runner)
    dec.generate(prompts, 8)
    out, decode_ms = timed_generate(dec, prompts, new)
    tokens = [r.output_ids for r in out.requests]
    decoded = sum(max(0, len(t) - 1) for t in tokens)  # the first token comes from the prefill
    return decoded / (decode_ms / 1e3), tokens


def arms_for(engine: str, splits: list[str]) -> list[tuple[bool, str]]:
    """(PDL on, arm) per arm (``gemm.arm``'s text); the first is the baseline of the ratios. Every engine runs every
    arm: on a cuBLAS engine only the arm's switches that touch its kernels act (``+kvsep``, ``+kvpf``, ``+amtorch``)."""
    return [(False, splits[0]), (True, splits[0])] + [(True, m) for m in splits[1:]]


def sums_differ(a: str, b: str, norms: bool = True) -> bool:
    """Whether two gemm arms may sum in different fp32 orders (another split policy, BLOCK_K or warp count; with
    ``norms``, an engine that has them, the norms as GEMM prologues or not), so that their tokens may differ at
    near-ties on random weights. A forced loop against the default (by K) counts as different."""
    pa, pb = gemm.parse_arm(a), gemm.parse_arm(b)
    loop = lambda p: (p.loop[0], p.loop[2]) if p.loop else None  # BLOCK_K and warps; stages sum alike
    return (pa.split_mode.split("/")[0] != pb.split_mode.split("/")[0] or loop(pa) != loop(pb)
            or norms and pa.norm_prologue != pb.norm_prologue)


def arm_name(engine: str, arm: tuple[bool, str]) -> str:
    on, split = arm
    if engine in GEMM_ENGINES:
        return f"PDL {'on' if on else 'off'}, {split}"
    extras = split.partition("+")[2]  # a cuBLAS engine: only the switches, never its (inert) split mode
    return f"PDL {'on' if on else 'off'}" + (f", +{extras}" if extras else "")


def rounds_over(runner, prompts, new: int, host: str, rounds: int, arms: list[tuple[bool, str]]) -> dict:
    """``rounds`` rounds over ``arms``, round i starting at arm i mod len(arms); -> per-arm tok/s lists, per-round
    ratios to arm 0, and whether each arm decoded arm 0's tokens in every round."""
    n = len(arms)
    tok = [[] for _ in arms]
    same = [True] * n
    for i in range(rounds):
        outs = [None] * n
        for a in [(i + j) % n for j in range(n)]:
            on, split = arms[a]
            with pdl.using(on, runner.device), gemm.arm(split):
                set_host_path(runner, host)  # re-captures the graphs with this arm's launches
                t, outs[a] = timed_decode(runner, prompts, new)
            tok[a].append(t)
        same = [s and outs[a] == outs[0] for a, s in enumerate(same)]
    ratios = [[t / t0 for t0, t in zip(tok[0], tok[a])] for a in range(n)]
    return {"tok_s": tok, "ratio": ratios, "same_tokens": same}


def _spread(v: list[float], fmt: str) -> str:
    return f"{percentile(v, 50):{fmt}} ({min(v):{fmt}}-{max(v):{fmt}})"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", default="smollm2-135m,llama-3.2-1b")
    ap.add_argument("--engines", default="fused,gemm", help=f"comma-separated, of {', '.join(ENGINES)}")
    ap.add_argument("--host", type=check_host, default=check_host("thin8"), help="host paths (bench.e2e's)")
    ap.add_argument("--batches", default="1")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--gemm-splits", default=gemm.DEFAULT_SPLIT_MODE,
                    help=f"engine gemm: arms to compare, split modes of {', '.join(gemm.SPLIT_MODES)}, each "
                         f"optionally +pf<chunks> (prefetch; bare: the default {gemm.DEFAULT_PREFETCH}) and "
                         f"+lmargmax / +lmlogits (greedy tokens from the LM head's argmax epilogue / its logits + argmax, the "
                         f"default); the first is also run with PDL off")
    ap.add_argument("--new", type=int, default=256)
    ap.add_argument("--out", default=None, help="write PREFIX.json and PREFIX.md")
    a = ap.parse_args(argv)
    engines = [e.strip() for e in a.engines.split(",") if e.strip()]
    bad = [e for e in engines if e not in ENGINES]
    if bad or a.rounds < 1:
        ap.error(f"--engines: unknown {bad} (choose from {', '.join(ENGINES)})" if bad else "--rounds must be >= 1")
    try:
        splits = gemm.parse_split_modes(a.gemm_splits)
    except ValueError as e:
        ap.error(f"--gemm-splits: {e}")
    why = pdl.unsupported("cuda")
    if why:
        print(f"attnlab.bench.pdl: {why}")
        return 2
    bw = copy_bandwidth_gb_s()
    res = {"gpu": torch.cuda.get_device_name(), "versions": versions(), "rounds": a.rounds, "copy_gb_s": bw,
           "rows": []}
    lines = [(f"{res['gpu']}; {res['versions']}; greedy target-only decode, random weights, CUDA graphs, "
              f"{a.new} new tokens, {a.rounds} rounds over the arms (order rotating); roofline: batch x copy "
              f"bandwidth ({bw:.0f} GB/s, measured here) / the weight bytes a step reads"), "",
             ("| model | batch | engine | host | arm | tok/s (min-max) | of roofline | vs first arm, per round (min-max) | "
              "same tokens as the first arm |"), "|---|---|---|---|---|---|---|---|---|"]
    print(lines[0], flush=True)

    def emit(key: dict, arm: str, cells: str, data: dict) -> None:  # one row: the table, the JSON, the console
        res["rows"].append({**key, "arm": arm, **data})
        lines.append(f"| {key['model']} | {key['batch']} | {key['engine']} | {key.get('host', '')} | {arm} | "
                     f"{cells} |")
        print(lines[-1], flush=True)

    for model in [m.strip() for m in a.models.split(",") if m.strip()]:
        for batch in [int(b) for b in a.batches.split(",") if b]:
            for eng in engines:
                key = {"model": model, "batch": batch, "engine": eng}
                try:
                    rs = side(model, "triton", batch, True, 32 + a.new + 16, fused=ENGINES[eng])
                except Exception as e:  # noqa: BLE001 - one engine failing must not lose the table
                    emit(key, "-", f"error: {e!r} ||||", {"error": repr(e)})
                    continue
                roof = roofline_tok_s(step_weight_bytes(rs.model), batch, bw)
                prompts = random_prompts(rs.model_config.vocab_size, batch)
                arms = arms_for(eng, splits)
                for host in a.host:
                    try:
                        r = rounds_over(rs, prompts, a.new, host, a.rounds, arms)
                    except Exception as e:  # noqa: BLE001
                        emit({**key, "host": host}, "-", f"error: {e!r} ||||", {"error": repr(e)})
                        continue
                    for i, arm in enumerate(arms):
                        # another split policy changes fp32 sums: tokens may differ at near-ties
                        policy_differs = eng in GEMM_ENGINES and sums_differ(arm[1], arms[0][1], eng == "gemm")
                        same = "yes" if r["same_tokens"][i] else "differs" if policy_differs else "NO"
                        frac = percentile(r["tok_s"][i], 50) / roof
                        cells = (f"{_spread(r['tok_s'][i], '.0f')} | {frac:.1%} | {_spread(r['ratio'][i], '.3f')} | "
                                 f"{same}")
                        emit({**key, "host": host}, arm_name(eng, arm), cells,
                             {"pdl": arm[0], "gemm_split": arm[1] if eng in GEMM_ENGINES else None, "arm": arm[1],
                              "tok_s": r["tok_s"][i], "ratio": r["ratio"][i], "same_tokens": r["same_tokens"][i],
                              "same_required": not policy_differs, "roofline_tok_s": roof, "frac_roofline": frac})
                del rs
                torch.cuda.empty_cache()
    write_report(a.out, res, "\n".join(lines))
    bad_rows = [r for r in res["rows"] if "error" not in r and r["same_required"] and not r["same_tokens"]]
    if bad_rows:
        print(f"PDL or the ticket reduction changed the decoded tokens in {len(bad_rows)} rows: a missing wait or "
              f"fence in some kernel")
        return 3
    failed = [r for r in res["rows"] if "error" in r]
    if failed:
        print(f"{len(failed)} rows failed (their errors are in the table and the JSON)")
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
