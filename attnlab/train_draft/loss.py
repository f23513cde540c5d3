"""The training-time-test loss (see ttt.py), computed without any [rows, vocab] tensor but one chunk's.

Forward KL to the target = cross-entropy against its distribution p (the entropy term is constant):

    CE_r = lse(h_r W^T) - p_r . (h_r W^T) = lse(h_r W^T) - h_r . (p_r W)
    dCE_r / dh_r = (softmax(h_r W^T) - p_r) W = softmax(h_r W^T) W - p_r W

so the target enters both only through PW_r = p_r W, an [H] vector per entry (W: the LM-head rows the head
scores; the target's distribution is renormalised over a reduced draft vocabulary, EAGLE-3's t2d).

- ``TargetDist`` is made once per batch, shared by every step (step j's entries are a subset of step 0's):
  the target's LM head runs only at the loss rows, in row chunks: logits -> argmax (top-1 statistics, target
  ids) and PW. Nothing [rows, vocab] outlives a chunk.
- ``_ChunkedCE`` (one autograd Function per step), per row chunk: the head's logits (matmul in the autocast
  dtype, as before), their softmax (in the logits' dtype; fp32 accumulation), argmax, the log-sum-exp read
  off the softmax at the argmax (lse = z_max - log softmax_max), the loss, and the gradient with respect to
  the head's normed hidden state, computed in the same pass (as a fused linear cross-entropy does); only
  [n, H] gradients are kept for backward. The LM head is the target's and is not trained.

Per step that is one [n, V'] matmul write, one softmax read + write and one argmax read (bf16 on GPU), where
the reference path (reference.py) moved about ten fp32 [n, V] tensors. Equal to it in fp32
(tests/train/test_loss.py); in bf16 the one difference is that softmax and p W are rounded separately
before the gradient matmul, where the reference rounded their difference.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from attnlab.train_draft.ttt import ATTENTION, StepStats, entry_mask, unroll


@dataclass
class TargetDist:
    """The target's side of one batch, at the N loss entries (row-major order of ``valid`` [B, S-1]):
    ``pw`` [N, H] fp32 (p W), ``argmax`` [N] (target ids, over the whole vocabulary); ``order`` [B, S-1]:
    each entry's row (-1 elsewhere)."""

    pw: torch.Tensor
    argmax: torch.Tensor
    valid: torch.Tensor
    order: torch.Tensor

    @classmethod
    @torch.no_grad()
    def build(cls, target, hidden: torch.Tensor, valid: torch.Tensor, weight: torch.Tensor,
              d2t: torch.Tensor | None = None, chunk_rows: int = 4096) -> TargetDist:
        """hidden [N, H]: the target's final hidden states at the positions whose distributions the entries of
        ``valid`` need (teacher_forward's ``rows``); weight [V', H]: the head's LM-head rows (loss weight)."""
        n = hidden.shape[0]
        pw = torch.empty(n, weight.shape[1], dtype=torch.float32, device=hidden.device)
        argmax = torch.empty(n, dtype=torch.long, device=hidden.device)
        for s in range(0, n, chunk_rows):
            t = target.compute_logits(hidden[s:s + chunk_rows])  # [c, V] fp32
            argmax[s:s + chunk_rows] = t.argmax(-1)
            p = torch.softmax(t if d2t is None else t[:, d2t], dim=-1)
            pw[s:s + chunk_rows] = (p.to(weight.dtype) @ weight).float()
        order = torch.full(valid.shape, -1, dtype=torch.long, device=valid.device)
        order[valid] = torch.arange(n, device=valid.device)
        return cls(pw, argmax, valid, order)


def loss_rows(answer: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """answer [B, S] -> (valid [B, S-1]: the loss entries, rows [B, S]: the teacher positions whose
    distributions they need: entry p's target is the target's distribution at position p + 1)."""
    valid = entry_mask(answer)
    rows = torch.zeros_like(answer)
    rows[:, 1:] = valid
    return valid, rows


class _ChunkedCE(torch.autograd.Function):
    """mean_r CE(p_r, softmax(h_r W^T)) over rows r, in chunks; -> (loss, argmax of the head's logits)."""

    @staticmethod
    def forward(ctx, h, weight, pw, rows, chunk_rows):
        n = h.shape[0]
        need_grad = ctx.needs_input_grad[0]
        total = torch.zeros((), dtype=torch.float32, device=h.device)
        arg = torch.empty(n, dtype=torch.long, device=h.device)
        grad = torch.empty_like(h) if need_grad else None
        with torch.autocast(h.device.type, enabled=False):  # explicit dtypes (autocast would make softmax fp32)
            for s in range(0, n, chunk_rows):
                e = min(n, s + chunk_rows)
                _ChunkedCE._chunk(h[s:e], weight, pw[rows[s:e]], n, arg[s:e], grad[s:e] if need_grad else None,
                                  total)
        ctx.mark_non_differentiable(arg)
        ctx.save_for_backward(grad if need_grad else h.new_empty(0))
        return total / n, arg

    @staticmethod
    def _chunk(hc, weight, pwc, n, arg, grad, total) -> None:
        """One row chunk: adds its summed CE to ``total``, writes its argmax and (if ``grad``) d mean CE / d h."""
        logits = hc @ weight.T  # [c, V'] in the matmul dtype (the autocast dtype on GPU)
        a = logits.argmax(-1)
        zmax = logits.gather(1, a[:, None]).squeeze(1).float()
        sm = torch.softmax(logits, dim=-1)  # fp32 accumulation, stored in the logits' dtype
        del logits
        lse = zmax - torch.log(sm.gather(1, a[:, None]).squeeze(1).float())  # softmax_max = e^(z_max - lse)
        total += (lse - (hc.float() * pwc).sum(-1)).sum()  # sum_r lse_r - h_r . (p_r W)
        arg.copy_(a)
        if grad is not None:
            grad.copy_((((sm @ weight).float() - pwc) / n).to(grad.dtype))

    @staticmethod
    def backward(ctx, g_loss, g_arg):
        (grad,) = ctx.saved_tensors
        return grad * g_loss.to(grad.dtype), None, None, None, None


def loss_weight(head, dtype: torch.dtype) -> torch.Tensor:
    """The LM-head rows the head scores (the draft vocabulary's, or the target's whole head), untrained."""
    w = head._rows if head.config.draft_vocab_size else head.shared[1].weight
    return w.detach().to(dtype)


def mm_dtype(h: torch.Tensor) -> torch.dtype:
    """The dtype the LM-head matmul runs in: autocast's, else h's (what nn.Linear under autocast does)."""
    dev = h.device.type
    return torch.get_autocast_dtype(dev) if torch.is_autocast_enabled(dev) else h.dtype


def ttt_loss(head, ids, feats, dist: TargetDist, steps: int, decay: float, chunk_rows: int = 4096,
             attention: str = "masked"):
    """-> (weighted mean loss (a tensor with grad), StepStats, per-step [B, S-1] top-1 match (bool, detached)).
    ``dist``: TargetDist.build at the loss rows, with loss_weight(head, ...); ``attention``: a ttt.ATTENTION key."""
    if chunk_rows < 1:
        raise ValueError(f"chunk_rows={chunk_rows}: must be >= 1")
    if attention not in ATTENTION:
        raise ValueError(f"attention={attention!r}: one of {sorted(ATTENTION)}")
    outs = unroll(head, ids, feats, steps, ATTENTION[attention])
    valid = dist.valid
    pos = torch.arange(valid.shape[1], device=ids.device)
    d2t = head.d2t if head.config.draft_vocab_size else None
    weight = None
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
        h = head.norm(a[vj])
        mm = mm_dtype(h)
        if weight is None:
            weight = loss_weight(head, mm)
        ce, arg = _ChunkedCE.apply(h.to(mm), weight, dist.pw, dist.order[vj], chunk_rows)
        w = decay ** j
        total = total + w * ce
        wsum += w
        drafted = arg if d2t is None else d2t[arg]
        hit = drafted == dist.argmax[dist.order[vj]]  # target ids: a target argmax outside the draft vocab misses
        match[vj] = hit
        matches.append(match.detach())
        stats.loss.append(float(ce.detach()))
        stats.top1.append(float(hit.float().mean()))
        stats.entries.append(n)
    return total / max(wsum, 1e-12), stats, matches
