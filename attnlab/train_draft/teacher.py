"""The target's side of training: its captured features and next-token distributions, by teacher forcing.

The same Decoder the engine runs (weights shared with the regeneration side), over a padded batch
[B, S] with dense causal attention (``torch.nn.functional.scaled_dot_product_attention``): no KV pool, no
pages, no backend. The features are the residual stream after the capture layers, exactly what the engine's
prefill and verify passes hand the drafter (``ctx.capture``), so a head trained on them reads the same inputs
at inference.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


class DenseCausalContext:
    """``AttnContext`` stand-in for a padded batch: attend(layer, q, k, v) with q [B*S, Hq, D]."""

    fused_ops = False

    def __init__(self, batch: int, seq: int, scale: float, capture: tuple[int, ...] | None = None):
        self.batch, self.seq, self.scale = batch, seq, scale
        self.capture = capture
        self.captured: torch.Tensor | None = None

    def attend(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        B, S = self.batch, self.seq
        qh, kh, vh = (x.view(B, S, x.shape[1], x.shape[2]).transpose(1, 2) for x in (q, k, v))
        group = qh.shape[1] // kh.shape[1]
        if group > 1:
            kh, vh = kh.repeat_interleave(group, dim=1), vh.repeat_interleave(group, dim=1)
        out = F.scaled_dot_product_attention(qh, kh, vh, is_causal=True, scale=self.scale)
        return out.transpose(1, 2).reshape(B * S, q.shape[1], q.shape[2])


@torch.no_grad()
def teacher_forward(target, ids: torch.Tensor, capture: tuple[int, ...],
                    rows: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """ids [B, S] -> (features [B, S, len(capture) * H] in the target's dtype, logits [B, S, V] fp32).
    Position t's logits predict token t + 1. With ``rows`` [B, S] bool, the second result is instead the final
    hidden states at those positions, [rows.sum(), H] (row-major), for loss.TargetDist to run the LM head on
    in chunks: the loss needs no distribution at prompt positions, and no [B, S, V] tensor."""
    B, S = ids.shape
    cfg = target.config
    ctx = DenseCausalContext(B, S, cfg.head_dim ** -0.5, tuple(capture))
    positions = torch.arange(S, device=ids.device).repeat(B)
    hidden = target(ids.reshape(-1), positions, ctx)
    if rows is not None:
        return ctx.captured.view(B, S, -1), hidden[rows.reshape(-1)]
    logits = target.compute_logits(hidden).view(B, S, -1)
    return ctx.captured.view(B, S, -1), logits
