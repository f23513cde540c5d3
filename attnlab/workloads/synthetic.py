"""Random token prompts of given lengths: long-context and kernel-scaling studies (no text involved)."""

from __future__ import annotations

import torch

from attnlab.workloads.prompt import Prompt


def synthetic_prompts(lengths: list[int], num_prompts: int, vocab_size: int, seed: int,
                      exclude: set[int] | frozenset = frozenset()) -> list[Prompt]:
    """Prompt i has ``lengths[i % len(lengths)]`` tokens drawn uniformly from the vocabulary minus
    ``exclude`` (special tokens, so that no prompt contains an EOS)."""
    allowed = torch.tensor([t for t in range(vocab_size) if t not in exclude], dtype=torch.long)
    g = torch.Generator().manual_seed(seed)
    out = []
    for i in range(num_prompts):
        n = lengths[i % len(lengths)]
        ids = allowed[torch.randint(len(allowed), (n,), generator=g)].tolist()
        out.append(Prompt(f"synthetic-{i}", f"len{n}", None, ids))
    return out
