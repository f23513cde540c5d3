"""What a model layer sees of attention: store this pass's K/V, then attend through the backend."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from attnlab.backends.base import AttentionBackend
from attnlab.kvcache.pool import KVPool


@dataclass
class AttnContext:
    """Per forward pass. slots: [num_tokens] int64 pool slots of the new tokens (-1 = skip)."""

    backend: AttentionBackend
    pool: KVPool
    slots: torch.Tensor

    def __post_init__(self):
        self.index = self.pool.store_index(self.slots)  # once per pass; every layer stores through it

    def attend(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """q: [T, Hq, D], k/v: [T, Hkv, D] (RoPE applied) -> [T, Hq, D]."""
        self.pool.store(layer, k, v, self.slots, self.index)
        return self.backend.run(q, layer)
