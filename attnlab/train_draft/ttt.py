"""The head unrolled over draft steps as it runs at inference ("training-time test", EAGLE-3), and its loss.

Entries: over a sequence x_0 .. x_{S-1}, entry p (p = 0 .. S-2, RoPE position p) reads token x_{p+1} and
predicts x_{p+2}, whose target distribution is the target's softmax at position p + 1.

- Step 0 reads the target's features g_p (fused by fc): the head's real entries, as prefill and draft-extend
  make them. Its queries see the step-0 keys at positions <= p (causal).
- Step j > 0 reads the head's own step j - 1 output at entry p - 1 (the feature a draft step gets). A query
  of step j at entry p sees what the same query sees at inference, where step j runs at position p after
  j - 1 earlier draft steps: the real entries at positions <= p - j, and the step-i entry at position
  p - j + i for i = 1 .. j (each earlier step's own key and value, one per step: a diagonal).

The loss of step j is the forward KL from the target distribution (cross-entropy against the soft target;
the entropy term is constant), over entries whose predicted token is an answer token and that have j
predecessors, weighted step_decay ** j.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from attnlab.models import rope


def _shift(x: torch.Tensor, n: int) -> torch.Tensor:
    """x [B, L, ...] -> y with y[:, p] = x[:, p - n] (zeros for p < n)."""
    if n == 0:
        return x
    return torch.cat([x.new_zeros(x.shape[0], n, *x.shape[2:]), x[:, :-n]], dim=1)


def ttt_attention(q: torch.Tensor, ks: list[torch.Tensor], vs: list[torch.Tensor], scale: float) -> torch.Tensor:
    """Step j = len(ks) - 1. q [B, L, Hq, D]; ks, vs: per step [B, L, Hkv, D] -> [B, L, Hq, D]."""
    j = len(ks) - 1
    B, L, Hq, D = q.shape
    Hkv = ks[0].shape[2]
    g = Hq // Hkv
    qg = q.view(B, L, Hkv, g, D)
    s0 = torch.einsum("bphgd,bkhd->bhgpk", qg, ks[0]).float() * scale  # [B, Hkv, g, L, L]
    pos = torch.arange(L, device=q.device)
    s0 = s0.masked_fill(~(pos[None, :] <= pos[:, None] - j), float("-inf"))
    diag_k = [_shift(ks[i], j - i) for i in range(1, j + 1)]
    diag_v = [_shift(vs[i], j - i) for i in range(1, j + 1)]
    if diag_k:
        sd = torch.stack([torch.einsum("bphgd,bphd->bhgp", qg, k).float() for k in diag_k], dim=-1) * scale
        valid = torch.stack([pos >= j - i for i in range(1, j + 1)], dim=-1)  # [L, j]: the key exists
        sd = sd.masked_fill(~valid, float("-inf"))
        scores = torch.cat([s0, sd], dim=-1)
    else:
        scores = s0
    # every row sees at least its own step's key (the last diagonal, shift 0), or for step 0 itself
    w = torch.softmax(scores, dim=-1)
    out = torch.einsum("bhgpk,bkhd->bphgd", w[..., :L].to(vs[0].dtype), vs[0])
    for i, v in enumerate(diag_v):
        out = out + w[..., L + i].permute(0, 3, 1, 2)[..., None].to(v.dtype) * v[:, :, :, None, :]
    return out.reshape(B, L, Hq, D)


def unroll(head, ids: torch.Tensor, feats: torch.Tensor, steps: int) -> list[torch.Tensor]:
    """ids [B, S], feats [B, S, F] (target features) -> the pre-norm outputs a_j [B, S-1, H], j < steps."""
    L = ids.shape[1] - 1
    tok = ids[:, 1:]
    f = head.fuse(feats[:, :L].to(head.fc.weight.dtype))
    cos, sin = rope.cos_sin(torch.arange(L, device=ids.device), head.inv_freq, f.dtype)
    scale = head.config.head_dim ** -0.5
    ks, vs, outs = [], [], []
    for _ in range(steps):
        q, k, v = head.pre_attention(tok, f, cos, sin)
        ks.append(k)
        vs.append(v)
        a = head.post_attention(f, ttt_attention(q, ks, vs, scale))
        outs.append(a)
        f = _shift(a, 1)  # step j + 1 at entry p reads this step's output at entry p - 1
    return outs


@dataclass
class StepStats:
    loss: list[float]  # per step
    top1: list[float]  # per step: head argmax == target argmax, over the step's loss entries
    entries: list[int]


def entry_mask(answer: torch.Tensor, lengths_ok: torch.Tensor | None = None) -> torch.Tensor:
    """answer [B, S] bool (answer tokens) -> [B, S-1]: entry p predicts x_{p+2}, an answer token (an entry
    at the last position predicts past the sequence: excluded)."""
    m = torch.zeros_like(answer[:, 1:])
    m[:, :-1] = answer[:, 2:]
    return m


def ttt_loss(head, ids, feats, target_logits, answer, steps: int, decay: float):
    """-> (weighted mean loss (a tensor with grad), StepStats, per-step [B, S-1] top-1 match (bool, detached))."""
    outs = unroll(head, ids, feats, steps)
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


def simulated_tau(matches: list[torch.Tensor], valid: torch.Tensor, k: int) -> tuple[float, int]:
    """Expected tokens per verify pass of greedy chain drafting with k drafts, from teacher-forced matches:
    starting at entry e, draft j (1..k) comes from step j - 1 at entry e + j - 1 and is accepted if it and
    every earlier draft matched. Starts whose k entries are all answer entries count. -> (mean tau, starts)."""
    if k > len(matches):
        raise ValueError(f"simulated tau at k={k} needs >= {k} unrolled steps (have {len(matches)})")
    B, L = valid.shape
    if L < k:
        return float("nan"), 0
    E = L - k + 1
    ok = torch.ones(B, E, dtype=torch.bool, device=valid.device)
    ok_start = torch.ones(B, E, dtype=torch.bool, device=valid.device)
    accepted = torch.zeros(B, E, dtype=torch.long, device=valid.device)
    for j in range(1, k + 1):
        ok = ok & matches[j - 1][:, j - 1:j - 1 + E]
        ok_start = ok_start & valid[:, j - 1:j - 1 + E]
        accepted += ok.long()
    n = int(ok_start.sum())
    if n == 0:
        return float("nan"), 0
    return 1.0 + float(accepted[ok_start].float().mean()), n
