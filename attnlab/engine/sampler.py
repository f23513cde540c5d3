"""Logits -> probabilities -> tokens, on device and without host sync.

Sampling uses ``argmax(probs / Exponential(1))`` (the Gumbel-max trick in exponential form, as in
gpt-fast): one kernel, no ``multinomial`` sync, reproducible with a ``torch.Generator``.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class SamplingParams:
    temperature: float = 0.0  # 0 = greedy
    top_k: int = 0  # 0 = off
    top_p: float = 1.0  # 1 = off

    @property
    def greedy(self) -> bool:
        return self.temperature <= 0.0


def probs_from_logits(logits: torch.Tensor, sp: SamplingParams) -> torch.Tensor:
    """logits [..., V] -> probs [..., V] fp32 after temperature, top-k and top-p (the same transform is
    applied to draft and target, so rejection sampling stays lossless w.r.t. the processed target)."""
    x = logits.float() / max(sp.temperature, 1e-6)
    if sp.top_k > 0 and sp.top_k < x.shape[-1]:
        kth = torch.topk(x, sp.top_k, dim=-1).values[..., -1:]
        x = x.masked_fill(x < kth, float("-inf"))
    probs = torch.softmax(x, dim=-1)
    if sp.top_p < 1.0:
        sorted_p, idx = torch.sort(probs, dim=-1, descending=True)
        # drop a token when the mass strictly before it already reaches top_p (the top token always stays)
        drop_sorted = (torch.cumsum(sorted_p, dim=-1) - sorted_p) >= sp.top_p
        drop = torch.zeros_like(drop_sorted).scatter(-1, idx, drop_sorted)
        probs = probs.masked_fill(drop, 0.0)
        probs = probs / probs.sum(-1, keepdim=True)
    return probs


def sample(probs: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
    """probs [..., V] -> token ids [...] (int64)."""
    e = torch.empty_like(probs).exponential_(1.0, generator=generator)
    return torch.argmax(probs / e, dim=-1)


def next_tokens(logits: torch.Tensor, sp: SamplingParams, generator: torch.Generator | None = None):
    """logits [..., V] -> (tokens [...], probs [..., V] or None when greedy)."""
    if sp.greedy:
        return torch.argmax(logits, dim=-1), None
    probs = probs_from_logits(logits, sp)
    return sample(probs, generator), probs
