"""Parity levels 2-4 (DESIGN.md) as pure functions over run outputs; level 1 is in kernel_parity.py.

- tokens: greedy outputs of two runs, per request -> match rate, first divergence index;
- logits: target logits of two runs at the positions where both saw the same prefix -> max abs error,
  mean KL(ref || run), top-1 agreement;
- acceptance: tau and per-position acceptance of the run vs the (torch, torch) pair.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch


def first_divergence(a: Sequence[int], b: Sequence[int]) -> int | None:
    """Index of the first differing token (a length difference counts); None if identical."""
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def token_parity(run: Sequence[Sequence[int]], ref: Sequence[Sequence[int]]) -> dict:
    """Per-request token comparison of two runs over the same prompts.

    match_rate: matching positions / positions of the longer output, pooled over requests;
    exact_frac: fraction of requests with identical output; first_divergence: per request (None = same).
    """
    if len(run) != len(ref):
        raise ValueError(f"{len(run)} outputs vs {len(ref)} reference outputs")
    matches = total = exact = 0
    divs = []
    for a, b in zip(run, ref):
        n = max(len(a), len(b))
        matches += sum(x == y for x, y in zip(a, b))
        total += n
        d = first_divergence(a, b)
        divs.append(d)
        exact += d is None
    known = [d for d in divs if d is not None]
    return {
        "match_rate": matches / total if total else 1.0,
        "exact_frac": exact / len(run) if run else 1.0,
        "first_divergence": divs,
        "first_divergence_min": min(known) if known else None,
        "num_requests": len(run),
    }


def logits_parity(run: Sequence[torch.Tensor], ref: Sequence[torch.Tensor],
                  run_ids: Sequence[Sequence[int]], ref_ids: Sequence[Sequence[int]]) -> dict:
    """Compare logits rows [n_out, vocab] per request up to and including the first token divergence
    (later rows condition on different prefixes). KL is KL(ref || run) in nats, averaged over rows."""
    max_abs, kl_sum, top1, rows = 0.0, 0.0, 0, 0
    for a, b, ia, ib in zip(run, ref, run_ids, ref_ids):
        if a is None or b is None:
            continue
        d = first_divergence(ia, ib)
        n = min(a.shape[0], b.shape[0], (d + 1) if d is not None else max(a.shape[0], b.shape[0]))
        if n == 0:
            continue
        x, y = a[:n].float(), b[:n].float()
        max_abs = max(max_abs, (x - y).abs().max().item())
        lp, lq = torch.log_softmax(y, -1), torch.log_softmax(x, -1)
        kl_sum += (lp.exp() * (lp - lq)).sum(-1).clamp_min(0).sum().item()
        top1 += (x.argmax(-1) == y.argmax(-1)).sum().item()
        rows += n
    return {
        "max_abs_err": max_abs if rows else math.nan,
        "mean_kl": kl_sum / rows if rows else math.nan,
        "top1_agree": top1 / rows if rows else math.nan,
        "positions": rows,
    }


def acceptance_parity(run: dict, ref: dict) -> dict:
    """tau and accept_rate_pos{i} of the run (metrics dicts) vs the (torch, torch) reference pair."""
    out = {"accept_len_mean": run.get("accept_len_mean"), "accept_len_mean_ref": ref.get("accept_len_mean")}
    if out["accept_len_mean"] is not None and out["accept_len_mean_ref"] is not None:
        out["accept_len_delta"] = out["accept_len_mean"] - out["accept_len_mean_ref"]
    for key in sorted(k for k in run if k.startswith("accept_rate_pos")):
        if key in ref:
            out[f"{key}_delta"] = run[key] - ref[key]
    return out


# ---------------------------------------------------------------------------------------------------------
# divergence diagnostics: is a token mismatch rounding at a near-tie, or something else?

# Mantissa bits of each compute dtype (the LM head rounds every logit to it).
_MANTISSA_BITS = {"bf16": 7, "fp16": 10, "fp32": 23}


def default_near_tie_eps(dtype: str) -> float:
    """parity.near_tie_eps=null: two ulps of the target's compute dtype at a logit of 16.

    The LM head rounds every logit to the model dtype, and the top logits of chat LLMs lie around 15-30, where
    one bf16 ulp is 0.125: two logits closer than 2 ulps (0.25 in bf16, 1/32 in fp16, 2^-18 in fp32) can swap
    order after a single rounding difference upstream (a different reduction order in a GEMM or in attention).
    A wrong kernel moves logits by whole units, far beyond it. The margin is a log-odds (nats): p1 / p2 =
    exp(margin), so 0.25 is a 1.28 : 1 race between the two tokens."""
    return 2.0 * 2.0 ** (4 - _MANTISSA_BITS.get(dtype, 7))


def divergence_entry(logits: torch.Tensor, index: int, base_token: int, run_token: int, eps: float) -> dict:
    """One divergence, seen from the run whose logits decided ``base_token`` at output ``index``.

    logits: [V] that run's logits there. margin: its top-1 minus top-2 logit; gap: its top-1 minus the
    logit of ``run_token`` (the other run's choice), = margin when run_token is the runner-up, and the
    quantity a rounding difference must bridge. near_tie: gap < eps (so also margin < eps)."""
    row = logits.float()
    vals, ids = row.topk(2)
    top1, top2 = vals[0].item(), vals[1].item()
    run_logit = row[run_token].item()
    return {
        "index": index, "base_token": base_token, "run_token": run_token,
        "margin": top1 - top2, "gap": top1 - run_logit,
        "top1_logit": top1, "top2_logit": top2, "top2_token": int(ids[1]) if int(ids[0]) == base_token else int(ids[0]),
        "run_token_rank": int((row > run_logit).sum().item()) + 1,  # 1 = the winner, 2 = the runner-up
        "base_is_argmax": row[base_token].item() == top1,
        "near_tie": top1 - run_logit < eps,
    }


def length_entry(index: int) -> dict:
    """Outputs equal up to where one of them stops: no token was chosen differently, so no margin."""
    return {"index": index, "margin": None, "gap": None, "near_tie": False, "note": "one output ends here"}


def not_reproduced_entry(index: int, rerun_divergence: int) -> dict:
    """The untimed re-run of the base did not repeat the timed one up to the divergence: no margin to read."""
    return {"index": index, "margin": None, "gap": None, "near_tie": False,
            "note": f"the untimed re-run differed from the timed run at token {rerun_divergence} "
                    f"(run-to-run nondeterminism): no margin"}


def divergence_summary(entries: Sequence[dict | None], eps: float) -> dict:
    """"n divergences, n at near-ties (gap < eps), n unexplained" over per-request entries (None = identical).

    Unexplained: no rounding-size explanation, i.e. not a near-tie (a margin >= eps, or none could be read:
    ``not_reproduced`` counts those whose base run did not repeat itself)."""
    found = [e for e in entries if e is not None]
    near = sum(bool(e.get("near_tie")) for e in found)
    margins = [e["margin"] for e in found if e.get("margin") is not None]
    return {
        "divergences": len(found), "near_tie": near, "unexplained": len(found) - near,
        "not_reproduced": sum("re-run" in e.get("note", "") for e in found),
        "eps": eps, "margin_max": max(margins) if margins else None,
        "summary": f"{len(found)} divergences, {near} at near-ties (margin < {eps:g}), {len(found) - near} unexplained",
        "per_request": list(entries),
    }
