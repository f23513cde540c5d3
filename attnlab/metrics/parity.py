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
