"""Parity levels 2-4 (DESIGN.md) as pure functions over run outputs; level 1 is in kernel_parity.py.

- tokens: greedy outputs of two runs, per request -> match rate, first divergence index;
- logits: target logits of two runs at the positions where both saw the same prefix -> max abs error,
  mean KL(ref || run), top-1 agreement;
- acceptance: tau and per-position acceptance of the run vs the (torch, torch) pair;
- divergence diagnostics: the margin at a first divergence (near-tie or not), and whether rounding can explain
  how one output differs from a reference output (explain_vs_reference: the bf16 serving-vs-static test).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

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


def ulp(dtype: str, x: float) -> float:
    """The spacing of ``dtype``'s numbers at |x| (normal range): 2^(floor(log2 |x|) - mantissa bits)."""
    x = max(abs(float(x)), 2.0 ** -126)
    return 2.0 ** (math.floor(math.log2(x)) - _MANTISSA_BITS.get(dtype, 7))


# The near-tie bound, in ulps of the compute dtype at a row's own top logit. The LM head rounds every logit to the
# model dtype, so what decides a greedy choice is a top-2 difference that strays from the exact (fp32) one by at
# most ~2 ulps in each run (1.6 measured on CPU for bf16, tests/parity/test_served_vs_static.py): two runs of one
# prefix (verify vs decode pass shapes, another batch, another kernel's reduction order) disagree on it by at most
# ~4. A wrong kernel moves logits by whole nats, far beyond it. Relative to the row, not a fixed number of nats:
# one bf16 ulp is 1/32 at a top logit of 4-8 (tiny random models), 0.125 at 16-32, 0.25 at 32-64 (chat LLMs).
NEAR_TIE_ULPS = 4


def row_near_tie_eps(row: torch.Tensor, dtype: str, ulps: float) -> float:
    """``ulps`` ulps of ``dtype`` at the top logit of ``row`` [V]: a near-tie bound on the model's own logit scale."""
    return ulps * ulp(dtype, row.float().max().item())


def near_tie_rule(dtype: str, ulps: float = NEAR_TIE_ULPS,
                  eps: float | None = None) -> Callable[[torch.Tensor], float]:
    """-> eps_of(row [V]) in nats: a fixed ``eps`` where one is given (parity.near_tie_eps), else ``ulps`` ulps of
    ``dtype`` at the row's top logit (parity.near_tie_ulps; row_near_tie_eps)."""
    if eps is not None:
        return lambda row: eps
    return lambda row: row_near_tie_eps(row, dtype, ulps)


def describe_near_tie_rule(dtype: str, ulps: float = NEAR_TIE_ULPS, eps: float | None = None) -> str:
    """The rule near_tie_rule applies, in words: "gap < 4 bf16 ulps at the row's top logit" | "gap < 0.1 nats"."""
    return f"gap < {eps:g} nats" if eps is not None else f"gap < {ulps:g} {dtype} ulps at the row's top logit"


def divergence_entry(logits: torch.Tensor, index: int, base_token: int, run_token: int, eps: float) -> dict:
    """One divergence, seen from the run whose logits decided ``base_token`` at output ``index``.

    logits: [V] that run's logits there. margin: its top-1 minus top-2 logit; gap: its top-1 minus the
    logit of ``run_token`` (the other run's choice), = margin when run_token is the runner-up, and the
    quantity a rounding difference must bridge. near_tie: gap < eps (so also margin < eps); eps: the bound it was
    judged with (near_tie_rule of this row)."""
    row = logits.float()
    vals, ids = row.topk(2)
    top1, top2 = vals[0].item(), vals[1].item()
    run_logit, base_logit = row[run_token].item(), row[base_token].item()
    return {
        "index": index, "base_token": base_token, "run_token": run_token,
        "margin": top1 - top2, "gap": top1 - run_logit,
        "top1_logit": top1, "top2_logit": top2, "top2_token": int(ids[1]) if int(ids[0]) == base_token else int(ids[0]),
        "run_token_rank": int((row > run_logit).sum().item()) + 1,  # 1 = the winner, 2 = the runner-up
        "base_token_rank": int((row > base_logit).sum().item()) + 1,
        "base_is_argmax": base_logit == top1,
        "near_tie": top1 - run_logit < eps, "eps": eps,
    }


def length_entry(index: int) -> dict:
    """Outputs equal up to where one of them stops: no token was chosen differently, so no margin."""
    return {"index": index, "margin": None, "gap": None, "near_tie": False, "note": "one output ends here"}


def not_reproduced_entry(index: int, rerun_divergence: int) -> dict:
    """The untimed re-run of the base did not repeat the timed one up to the divergence: no margin to read."""
    return {"index": index, "margin": None, "gap": None, "near_tie": False,
            "note": f"the untimed re-run differed from the timed run at token {rerun_divergence} "
                    f"(run-to-run nondeterminism): no margin"}


def divergence_summary(entries: Sequence[dict | None], rule: str) -> dict:
    """"n divergences, n at near-ties (rule), n unexplained" over per-request entries (None = identical); ``rule``:
    describe_near_tie_rule (each entry holds the eps it was judged with).

    Unexplained: no rounding-size explanation, i.e. not a near-tie (a gap >= eps, or none could be read:
    ``not_reproduced`` counts those whose base run did not repeat itself). unexplained_margin_max: the largest
    margin among the unexplained entries that have one (None: none has)."""
    found = [e for e in entries if e is not None]
    near = sum(bool(e.get("near_tie")) for e in found)
    margins = [e["margin"] for e in found if e.get("margin") is not None]
    odd = [e["margin"] for e in found if not e.get("near_tie") and e.get("margin") is not None]
    return {
        "divergences": len(found), "near_tie": near, "unexplained": len(found) - near,
        "not_reproduced": sum("re-run" in e.get("note", "") for e in found),
        "rule": rule, "margin_max": max(margins) if margins else None,
        "unexplained_margin_max": max(odd) if odd else None,
        "summary": f"{len(found)} divergences, {near} at near-ties ({rule}), {len(found) - near} unexplained",
        "per_request": list(entries),
    }


def explain_vs_reference(run: Sequence[int], ref: Sequence[int], ref_logits: torch.Tensor,
                         eps_of: Callable[[torch.Tensor], float], run_logits: torch.Tensor | None = None) -> dict:
    """Can rounding explain how one request's greedy output ``run`` differs from the reference output ``ref`` of
    the same prompt? Only like this: identical up to a first divergence d, where ``run``'s token trails the
    reference's top-1 by less than eps in the logits that chose ref[d] (a near-tie, as divergence_entry reads
    it); after d the prefixes differ, so each later run token must be within eps of the top of the logits a
    reference model gives ``run``'s own prefix there.

    ref_logits: [len(ref), V], row t the logits that chose ref[t] (a ``record_logits`` decode); run_logits:
    [len(run), V] the reference model's logits for run's prefixes (teacher forcing; None: nothing after d is
    checked); eps_of(row) -> eps for that row (row_near_tie_eps, or a constant).
    -> {"divergence": the entry at d or None (identical), "unexplained": the first token rounding cannot
    explain (an entry with "why") or None}. A length difference is unexplained (equal budgets, no EOS)."""
    d = first_divergence(run, ref)
    if d is None:
        return {"divergence": None, "unexplained": None}
    if d >= len(run) or d >= len(ref):
        e = length_entry(d)
        return {"divergence": e, "unexplained": {**e, "why": f"lengths differ ({len(run)} vs {len(ref)} tokens)"}}
    div = divergence_entry(ref_logits[d], d, ref[d], run[d], eps_of(ref_logits[d]))
    if not div["near_tie"]:
        return {"divergence": div, "unexplained": {**div, "why": "first divergence, not at a near-tie"}}
    for t in range(d + 1, len(run) if run_logits is not None else 0):
        row = run_logits[t]
        top = int(row.argmax())
        if run[t] != top:
            e = divergence_entry(row, t, top, run[t], eps_of(row))
            if not e["near_tie"]:
                return {"divergence": div, "unexplained": {**e, "why": f"after a near-tie flip at {d}: not the "
                                                                        f"reference's choice on its own prefix"}}
    return {"divergence": div, "unexplained": None}


def format_unexplained(request: int, e: dict, base: str = "reference") -> str:
    """One line naming the request, position, tokens (ids and ranks in the logits that chose ``base``'s token),
    gap, margin, top-1 logit and eps of an unexplained token. ``e``: an entry of divergence_entry (a job's first
    divergence), explain_vs_reference (with its "why"), or length_entry / not_reproduced_entry (a "note")."""
    why = e.get("why") or e.get("note") or "first divergence, not at a near-tie"
    if e.get("gap") is None:
        return f"request {request}: output token {e['index']}: {why}"
    base_rank = f" (rank {e['base_token_rank']})" if "base_token_rank" in e else ""
    return (f"request {request}: output token {e['index']}: {why}: run token {e['run_token']} (rank "
            f"{e['run_token_rank']}) vs {base} {e['base_token']}{base_rank}: gap {e['gap']:.4g}, margin "
            f"{e['margin']:.4g} (top-1 logit {e['top1_logit']:.4g}) >= eps {e['eps']:.4g}{_rounding_text(e)}")


def _rounding_text(e: dict) -> str:
    if "rounding_share" not in e:
        return ""
    share = f"{100 * e['rounding_share']:.2g}% of its rows moved that much"
    if not e["within_rounding"]:
        return f"; beyond the reference's own rounding ({share})"
    return f"; within the reference's own rounding ({share})"


# An unexplained divergence is within the reference's own rounding when at least this share of the reference's rows
# moved their top-2 margin by its gap or more: a quantile (the 99th percentile), not the largest change, which grows
# with the number of rows measured and would let a longer run explain more
ROUNDING_SHARE = 0.01


def margin_changes(decoded: torch.Tensor, forced: torch.Tensor) -> torch.Tensor:
    """[n] how far each row's top-2 margin moved between two logits of one implementation at the same prefixes (its
    own decode, and its teacher-forced prefill of the tokens it decoded): what rounding alone does to a margin at this
    precision, an fp8 KV's requantization of other pass shapes' K / V included. Both [n, 2]: each row's top two
    columns of the decode's logits (in that order), read from each."""
    if decoded.shape != forced.shape or decoded.dim() != 2 or decoded.shape[1] != 2:
        raise ValueError(f"margin_changes: [n, 2] rows of both runs (the same n), got {tuple(decoded.shape)} and "
                         f"{tuple(forced.shape)}")
    x, y = decoded.float(), forced.float()
    return ((x[:, 0] - x[:, 1]) - (y[:, 0] - y[:, 1])).abs()


def rounding_scale(changes: Sequence[torch.Tensor]) -> tuple[dict, torch.Tensor | None]:
    """The reference's own rounding over all rows of ``changes`` (margin_changes of each request): -> ({rows, the
    median, 99th percentile and largest margin change in nats}, every change sorted; None where no row)."""
    c = torch.cat([x.float().flatten() for x in changes]) if changes else torch.zeros(0)
    if c.numel() == 0:
        return {"rows": 0, "margin_change_median": None, "margin_change_p99": None, "margin_change_max": None}, None
    srt = c.sort().values
    at = lambda q: srt[min(srt.numel() - 1, int(q * (srt.numel() - 1) + 0.5))].item()
    return ({"rows": int(srt.numel()), "margin_change_median": at(0.5), "margin_change_p99": at(0.99),
             "margin_change_max": srt[-1].item(), "within_share": ROUNDING_SHARE}, srt)


def mark_rounding(summary: dict, srt: torch.Tensor | None) -> None:
    """Judge ``summary``'s unexplained divergences (divergence_summary) against the reference's own rounding
    (rounding_scale's sorted changes ``srt``; None: not measured): each one with a gap gets ``rounding_share``, the
    share of the reference's rows whose margin moved by at least that gap, and ``within_rounding`` (that share at
    least ROUNDING_SHARE); the summary counts them (``unexplained_within_rounding``). The near-tie verdicts are not
    changed: this is a second, measured opinion, for precisions the ulps rule was not calibrated on (an fp8 KV)."""
    if srt is None:
        summary["unexplained_within_rounding"] = None
        return
    n = 0
    for e in summary["per_request"]:
        if e is None or e.get("near_tie") or e.get("gap") is None:
            continue
        below = torch.searchsorted(srt, srt.new_tensor(float(e["gap"])), right=False).item()  # rows < gap
        share = 1.0 - below / srt.numel()
        e["rounding_share"], e["within_rounding"] = share, share >= ROUNDING_SHARE
        n += e["within_rounding"]
    summary["unexplained_within_rounding"] = n
