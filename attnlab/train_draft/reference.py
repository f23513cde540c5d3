"""The trainer's original per-step path, kept as the reference the new one is tested and benchmarked against.

Not used by training. Per step it gathers the target's [n, V] fp32 logits, softmaxes them again and keeps the
head's [n, V] log-probabilities for backward, and the attention (ttt.ttt_attention) keeps [B, Hkv, g, L, L]
fp32 scores: loss.ttt_loss computes the same loss and gradients without either.
"""

from __future__ import annotations

import torch

from attnlab.train_draft.ttt import StepStats, entry_mask, ttt_attention, unroll


def ttt_loss(head, ids, feats, target_logits, answer, steps: int, decay: float):
    """target_logits [B, S, V] (every position) -> (weighted mean loss, StepStats, per-step top-1 matches)."""
    outs = unroll(head, ids, feats, steps, attention=ttt_attention)
    valid = entry_mask(answer)
    pos = torch.arange(valid.shape[1], device=ids.device)
    tgt = target_logits[:, 1:].float()  # entry p's target: the target's distribution at position p + 1
    total, wsum = 0.0, 0.0
    stats = StepStats([], [], [])
    matches = []
    for j, a in enumerate(outs):
        vj = valid & (pos >= j)[None, :]
        n = int(vj.sum())
        match = torch.zeros_like(vj)
        if n == 0:
            stats.loss.append(float("nan"))
            stats.top1.append(float("nan"))
            stats.entries.append(0)
            matches.append(match)
            continue
        logits = head.draft_logits(head.norm(a[vj]))  # [n, V or draft vocab] fp32
        logq = torch.log_softmax(logits, dim=-1)
        t = tgt[vj]
        d2t = getattr(head, "d2t", None)
        # a reduced draft vocabulary: the target's distribution renormalized over it (EAGLE-3's t2d)
        pt = torch.softmax(t if d2t is None else t[:, d2t], dim=-1)
        ce = -(pt * logq).sum(-1).mean()
        w = decay ** j
        total = total + w * ce
        wsum += w
        drafted = logits.argmax(-1) if d2t is None else d2t[logits.argmax(-1)]
        hit = drafted == t.argmax(-1)  # in target ids: a target argmax outside the draft vocabulary is a miss
        match[vj] = hit
        matches.append(match.detach())
        stats.loss.append(float(ce.detach()))
        stats.top1.append(float(hit.float().mean()))
        stats.entries.append(n)
    return total / max(wsum, 1e-12), stats, matches
