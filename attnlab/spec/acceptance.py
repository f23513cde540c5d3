"""Verification as pure tensor math (no host sync): which draft tokens does the target accept?

Shapes: ``B`` requests, ``k`` draft tokens each, vocabulary ``V``.
- draft_tokens: [B, k] int64
- target logits / probs: [B, k + 1, V] (row j scores the token after draft prefix of length j)
- draft probs: [B, k, V] (the distribution each draft token was sampled from)

Both return ``(num_accepted [B], next_token [B])``: the first ``num_accepted`` draft tokens are kept and
``next_token`` follows them (the correction token on a rejection, the bonus token when all k pass), so
every request emits ``num_accepted + 1`` tokens (tau).
"""

from __future__ import annotations

import torch

from attnlab.engine.sampler import sample


def accepted_prefix_len(accept: torch.Tensor) -> torch.Tensor:
    """accept [B, k] bool -> length of the all-True prefix per row, [B] int64."""
    return torch.cumprod(accept.long(), dim=1).sum(dim=1)


def greedy_accept(draft_tokens: torch.Tensor, target_logits: torch.Tensor):
    """Accept the longest prefix where the target's argmax equals the draft token."""
    return greedy_accept_top(draft_tokens, target_logits.argmax(dim=-1))


def greedy_accept_top(draft_tokens: torch.Tensor, target_top: torch.Tensor):
    """``greedy_accept`` given the target's argmax tokens [B, k + 1] (computed inside a CUDA graph)."""
    k = draft_tokens.shape[1]
    n = accepted_prefix_len(target_top[:, :k] == draft_tokens)
    next_tok = target_top.gather(1, n[:, None]).squeeze(1)
    return n, next_tok


def rejection_accept(draft_tokens: torch.Tensor, draft_probs: torch.Tensor, target_probs: torch.Tensor,
                     generator: torch.Generator | None = None):
    """Lossless speculative sampling (Leviathan et al. 2023; Chen et al. 2023).

    Accept draft token j with probability min(1, p_j(x) / q_j(x)); at the first rejection sample from
    norm(max(p_j - q_j, 0)); if all k pass, sample the bonus token from p_k. The emitted tokens are then
    distributed exactly as sampling from the target alone.
    """
    B, k = draft_tokens.shape
    idx = draft_tokens[:, :, None]
    p_x = target_probs[:, :k].gather(2, idx).squeeze(2)  # [B, k]
    q_x = draft_probs.gather(2, idx).squeeze(2)
    u = torch.rand(p_x.shape, generator=generator, device=p_x.device)
    # u < p/q  <=>  u * q < p  (no division; q_x > 0 for a sampled token)
    n = accepted_prefix_len(u * q_x < p_x)
    # Residual distribution at the first rejected position (or p_k itself when all accepted).
    q_pad = torch.cat([draft_probs, target_probs.new_zeros(B, 1, target_probs.shape[-1])], dim=1)  # [B, k+1, V]
    rows = n[:, None, None].expand(B, 1, target_probs.shape[-1])
    p_n = target_probs.gather(1, rows).squeeze(1)
    q_n = q_pad.gather(1, rows).squeeze(1)
    resid = (p_n - q_n).clamp_min(0.0)
    mass = resid.sum(-1, keepdim=True)
    # p == q at that row leaves no residual mass; then any sample from p is correct (measure-zero case).
    resid = torch.where(mass > 0, resid / mass.clamp_min(1e-30), p_n)
    return n, sample(resid, generator)
