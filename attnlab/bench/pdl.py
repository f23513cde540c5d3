"""Programmatic dependent launch on and off (and the GEMM's split modes), side by side in one process (CUDA,
compute capability >= 9.0).

    python -m attnlab.bench.pdl [--models smollm2-135m,llama-3.2-1b] [--engines fused,gemm] [--host thin8]
                                [--batches 1] [--rounds 5] [--gemm-splits fill/pass] [--weights bf16,fp8w,fp8wh]
                                [--new 256] [--out PREFIX]

Target-only greedy decode with CUDA graphs on random weights (decode speed does not depend on their values), per
(model, batch, engine, host path): the side is built once, then ``--rounds`` rounds over its arms, the order
rotating by one arm per round (so a drift inside a round does not always favour the same arm), the graphs
re-captured at every switch. Arms (``--gemm-splits``, each ``attnlab.kernels.gemm.arm``'s text): PDL off and on with
the first, then PDL on with each further one. Their split mode and weight prefetch act on the gemm engines; their
other switches (``+kvsep``: the KV store as its own kernel; ``+kvpf0``: no decode KV prefetch; ``+amtorch``: torch's
argmax) on every engine; ``+normpro`` / ``+normsep`` / ``+normtail`` (the norms as GEMM prologues / their own launches /
the tail of the GEMM before them) on the gemm
engine. Reported per arm: median tok/s with its min-max, its share of the weight-bandwidth roofline (batch x the
copy bandwidth measured in the process / the weight bytes a step reads), the median of its per-round ratios to
the first arm (min-max), and whether it decoded the first arm's tokens (PDL and the reduction mechanism change
when and where sums happen, never their order: anything but "yes" is a bug; a different split *policy* changes
the order of fp32 sums, so its tokens may differ on random weights at near-ties: "differs" there, not a bug).
Engines: ``unfused`` (cuBLAS and torch ops between attnlab's attention kernels), ``fused`` (engine.fused_ops:
the norms, RoPE, SiLU-mul and KV store as attnlab kernels), ``gemm`` (engine.gemm=triton: every GEMM of a
decode pass is attnlab's small-M kernel too, so every launch of a layer can overlap the one before), ``gemm-attn``
(engine.gemm=triton_attn: qkv and o on that kernel, the MLP and LM head on cuBLAS). ``--weights bf16,fp8w``: a side
per weights (fp8w: the layer projections e4m3 with per-row scales, converted inside the small-M GEMM, the LM head
and KV pool bf16: precision=fp8w-draft's weights; fp8wh: the LM head e4m3 too, precision.fp8_lm_head), every arm
on each in the same rotating rounds, and a column of each
row's per-round ratio to the first weights' same arm (issue 17's "fp8 draft weights vs bf16"); each side's roofline
is its own weight bytes.
"""

from __future__ import annotations

import argparse

import torch

from attnlab.bench.e2e import (
    WEIGHTS,
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


def sums_differ(a: str, b: str, norms: bool = True, fp8: bool = False) -> bool:
    """Whether two gemm arms may sum in different fp32 orders (``gemm.sums_key``: another split policy at a call site,
    BLOCK_K or warp count, a paired loop's dots; with
    ``norms``, an engine that has them, the norms as GEMM prologues or not), so that their tokens may differ at
    near-ties on random weights. A forced loop against the default (by K) counts as different; so do another fp8
    split target and the fp8 mode ``half`` against the others, on a side with ``fp8`` weights (the only GEMMs they
    act on)."""
    pa, pb = gemm.parse_arm(a), gemm.parse_arm(b)
    return gemm.sums_key(pa, fp8) != gemm.sums_key(pb, fp8) or norms and pa.norm_place != pb.norm_place


def arm_name(engine: str, arm: tuple[bool, str]) -> str:
    on, split = arm
    if engine in GEMM_ENGINES:
        return f"PDL {'on' if on else 'off'}, {split}"
    extras = split.partition("+")[2]  # a cuBLAS engine: only the switches, never its (inert) split mode
    return f"PDL {'on' if on else 'off'}" + (f", +{extras}" if extras else "")


def rounds_over(runners: dict, prompts, new: int, host: str, rounds: int, arms: list[tuple]) -> dict:
    """``rounds`` rounds over ``arms`` ((weights, PDL on, arm), run on ``runners[weights]``), round i starting at arm
    i mod len(arms); -> per-arm tok/s lists, per-round ratios to the first arm on its side, and whether it decoded
    that arm's tokens in every round; ``first``: that arm's index, per arm."""
    n = len(arms)
    tok = [[] for _ in arms]
    same = [True] * n
    first = {w: next(i for i, a in enumerate(arms) if a[0] == w) for w, _, _ in arms}  # each side's first arm
    for i in range(rounds):
        outs = [None] * n
        for a in [(i + j) % n for j in range(n)]:
            w, on, split = arms[a]
            runner = runners[w]
            with pdl.using(on, runner.device), gemm.arm(split):
                set_host_path(runner, host)  # re-captures the graphs with this arm's launches
                t, outs[a] = timed_decode(runner, prompts, new)
            tok[a].append(t)
        same = [s and outs[a] == outs[first[arms[a][0]]] for a, s in enumerate(same)]
    ratios = [[t / t0 for t0, t in zip(tok[first[arms[a][0]]], tok[a])] for a in range(n)]  # to its side's first
    return {"tok_s": tok, "ratio": ratios, "same_tokens": same, "first": [first[arm[0]] for arm in arms]}


def _spread(v: list[float], fmt: str) -> str:
    return f"{percentile(v, 50):{fmt}} ({min(v):{fmt}}-{max(v):{fmt}})"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m attnlab.bench.pdl",
                                 description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
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
    ap.add_argument("--weights", default="bf16",
                    help=f"comma-separated, of {', '.join(WEIGHTS)}: one side each (fp8w: e4m3 layer weights "
                         f"converted in the small-M GEMM; fp8wh: the LM head too), every arm on each, in the same rounds; the others' "
                         f"rows also give their ratio to the first's, arm for arm")
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
    weights = list(dict.fromkeys(w.strip() for w in a.weights.split(",") if w.strip()))
    if not weights or any(w not in WEIGHTS for w in weights):
        ap.error(f"--weights {a.weights!r}: comma-separated, of {', '.join(WEIGHTS)}")
    why = pdl.unsupported("cuda")
    if why:
        print(f"attnlab.bench.pdl: {why}")
        return 2
    bw = copy_bandwidth_gb_s()
    res = {"gpu": torch.cuda.get_device_name(), "versions": versions(), "rounds": a.rounds, "copy_gb_s": bw,
           "weights": weights, "rows": []}
    vs_w = len(weights) > 1  # a column: each row's per-round ratio to the first weights' same arm
    lines = [(f"{res['gpu']}; {res['versions']}; greedy target-only decode, random weights, CUDA graphs, "
              f"{a.new} new tokens, {a.rounds} rounds over the arms (order rotating); roofline: batch x copy "
              f"bandwidth ({bw:.0f} GB/s, measured here) / the weight bytes a step reads"), "",
             ("| model | batch | engine | host | arm | tok/s (min-max) | of roofline | "
              + ("vs its side's first arm, per round (min-max) | " if vs_w else "vs first arm, per round (min-max) | ")
              + (f"vs {weights[0]}, same arm (min-max) | " if vs_w else "")
              + ("same tokens as its side's first arm |" if vs_w else "same tokens as the first arm |")),
             "|---|---|---|---|---|---|---|---|---|" + ("---|" if vs_w else "")]
    print(lines[0], flush=True)

    def emit(key: dict, arm: str, cells: str, data: dict) -> None:  # one row: the table, the JSON, the console
        res["rows"].append({**key, "arm": arm, **data})
        eng = key["engine"] + (f", {key['weights']}" if key.get("weights", "bf16") != "bf16" else "")
        lines.append(f"| {key['model']} | {key['batch']} | {eng} | {key.get('host', '')} | {arm} | {cells} |")
        print(lines[-1], flush=True)

    for model in [m.strip() for m in a.models.split(",") if m.strip()]:
        for batch in [int(b) for b in a.batches.split(",") if b]:
            for eng in engines:
                key = {"model": model, "batch": batch, "engine": eng}
                try:
                    sides = {w: side(model, "triton", batch, True, 32 + a.new + 16, fused=ENGINES[eng], weights=w)
                             for w in weights}
                except Exception as e:  # noqa: BLE001 - one engine failing must not lose the table
                    emit(key, "-", f"error: {e!r} ||||" + ("|" if vs_w else ""), {"error": repr(e)})
                    continue
                first = sides[weights[0]]
                roofs = {w: roofline_tok_s(step_weight_bytes(rs.model), batch, bw) for w, rs in sides.items()}
                prompts = random_prompts(first.model_config.vocab_size, batch)
                arms = [(w, *arm) for w in weights for arm in arms_for(eng, splits)]
                for host in a.host:
                    try:
                        r = rounds_over(sides, prompts, a.new, host, a.rounds, arms)
                    except Exception as e:  # noqa: BLE001
                        emit({**key, "host": host}, "-", f"error: {e!r} ||||" + ("|" if vs_w else ""),
                             {"error": repr(e)})
                        continue
                    for i, (w, *arm) in enumerate(arms):
                        # another split policy changes fp32 sums: tokens may differ at near-ties (the gemm engines'
                        # GEMMs, and on any engine fp8 weights' weight-only FP8Linear, which runs attnlab's GEMM)
                        base = arms[r["first"][i]][2]  # its side's first arm
                        fp8 = w.startswith("fp8")
                        policy_differs = (eng in GEMM_ENGINES or fp8) and sums_differ(arm[1], base, eng == "gemm", fp8)
                        same = "yes" if r["same_tokens"][i] else "differs" if policy_differs else "NO"
                        frac = percentile(r["tok_s"][i], 50) / roofs[w]
                        vs = [t / t0 for t0, t in zip(r["tok_s"][arms.index((weights[0], *arm))], r["tok_s"][i])]
                        cells = (f"{_spread(r['tok_s'][i], '.0f')} | {frac:.1%} | {_spread(r['ratio'][i], '.3f')} | "
                                 + (f"{_spread(vs, '.3f')} | " if vs_w else "") + same)
                        emit({**key, "host": host, "weights": w}, arm_name(eng, tuple(arm)), cells,
                             {"pdl": arm[0], "gemm_split": arm[1] if eng in GEMM_ENGINES else None, "arm": arm[1],
                              "tok_s": r["tok_s"][i], "ratio": r["ratio"][i], "vs_first_weights": vs,
                              "same_tokens": r["same_tokens"][i], "same_required": not policy_differs,
                              "roofline_tok_s": roofs[w], "frac_roofline": frac})
                del sides, first
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
