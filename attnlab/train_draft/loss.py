"""The training-time-test loss (see ttt.py), computed so the [rows, vocab] tensors never all live at once.

- The target side is made once per batch (``TargetDist``): the teacher's LM head runs only at the rows that
  are loss entries, their distributions are softmaxed once (over the draft vocabulary when there is one:
  the target's distribution renormalised over it, EAGLE-3's t2d), and shared by every step (step j's entries
  are a subset of step 0's).
- Each step's cross-entropy against that soft target runs in row chunks of ``chunk_rows`` inside one autograd
  Function (``_ChunkedCE``): per chunk the head's logits, their log-sum-exp, the loss and the gradient with
  respect to the head's normed hidden state ((softmax - p) W / n, computed in the same pass, as a fused
  linear cross-entropy does); only [n, H] gradients are kept for backward. The LM head is the target's and
  is not trained. The math equals reference.ttt_loss (tests/train/test_loss.py).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from attnlab.train_draft.ttt import StepStats, entry_mask, unroll


@dataclass
class TargetDist:
    """The target's side of one batch: ``probs`` [N, V'] fp32 (V' = the draft vocabulary's size when there
    is one) and ``argmax`` [N] (target ids, over the whole vocabulary) at the N loss entries, in the
    row-major order of ``valid`` [B, S-1]; ``order`` [B, S-1]: each entry's row (-1 elsewhere)."""

    probs: torch.Tensor
    argmax: torch.Tensor
    valid: torch.Tensor
    order: torch.Tensor

    @classmethod
    def from_logits(cls, logits: torch.Tensor, valid: torch.Tensor, d2t: torch.Tensor | None = None,
                    chunk_rows: int = 4096) -> TargetDist:
        """logits [N, V] (fp32, the target's at the entries of ``valid``, row-major) -> the distributions,
        softmaxed in row chunks (the [N, V] logits may be freed afterwards)."""
        n = logits.shape[0]
        V = logits.shape[1] if d2t is None else d2t.numel()
        probs = torch.empty(n, V, dtype=torch.float32, device=logits.device)
        argmax = torch.empty(n, dtype=torch.long, device=logits.device)
        for s in range(0, n, chunk_rows):
            t = logits[s:s + chunk_rows].float()
            argmax[s:s + chunk_rows] = t.argmax(-1)
            probs[s:s + chunk_rows] = torch.softmax(t if d2t is None else t[:, d2t], dim=-1)
        order = torch.full(valid.shape, -1, dtype=torch.long, device=valid.device)
        order[valid] = torch.arange(n, device=valid.device)
        return cls(probs, argmax, valid, order)


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
    def forward(ctx, h, weight, probs, rows, chunk_rows):
        n = h.shape[0]
        need_grad = ctx.needs_input_grad[0]
        total = torch.zeros((), dtype=torch.float32, device=h.device)
        arg = torch.empty(n, dtype=torch.long, device=h.device)
        grad = torch.empty_like(h) if need_grad else None
        for s in range(0, n, chunk_rows):
            e = min(n, s + chunk_rows)
            logits = (h[s:e] @ weight.T).float()  # [c, V'], matmul in h's dtype (the autocast dtype on GPU)
            lse = torch.logsumexp(logits, dim=-1)
            p = probs[rows[s:e]]
            # -sum p log q = lse * sum p - <p, logits>
            total += (lse * p.sum(-1) - (p * logits).sum(-1)).sum()
            arg[s:e] = logits.argmax(-1)
            if need_grad:
                d = torch.exp(logits.sub_(lse[:, None])).sub_(p).div_(n)  # (softmax - p) / n, in place
                grad[s:e] = (d.to(weight.dtype) @ weight).to(h.dtype)
        ctx.mark_non_differentiable(arg)
        ctx.save_for_backward(grad if need_grad else h.new_empty(0))
        return total / n, arg

    @staticmethod
    def backward(ctx, g_loss, g_arg):
        (grad,) = ctx.saved_tensors
        return grad * g_loss.to(grad.dtype), None, None, None, None


def _lm_weight(head, dtype: torch.dtype) -> torch.Tensor:
    """The LM-head rows the head scores (the draft vocabulary's, or the target's whole head), untrained."""
    w = head._rows if head.config.draft_vocab_size else head.shared[1].weight
    return w.detach().to(dtype)


def _mm_dtype(h: torch.Tensor) -> torch.dtype:
    dev = h.device.type
    return torch.get_autocast_dtype(dev) if torch.is_autocast_enabled(dev) else h.dtype


def ttt_loss(head, ids, feats, dist: TargetDist, steps: int, decay: float, chunk_rows: int = 4096):
    """-> (weighted mean loss (a tensor with grad), StepStats, per-step [B, S-1] top-1 match (bool, detached)).
    ``dist``: TargetDist.from_logits over the teacher's logits at the loss rows."""
    if chunk_rows < 1:
        raise ValueError(f"chunk_rows={chunk_rows}: must be >= 1")
    outs = unroll(head, ids, feats, steps)
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
        mm = _mm_dtype(h)
        if weight is None:
            weight = _lm_weight(head, mm)
        ce, arg = _ChunkedCE.apply(h.to(mm), weight, dist.probs, dist.order[vj], chunk_rows)
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
