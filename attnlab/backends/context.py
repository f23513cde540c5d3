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
    triton_store: bool = False  # store with the Triton kernel (one launch, slot -1 skipped) instead of torch

    def __post_init__(self):
        # once per pass; every layer's torch store goes through it
        self.index = None if self.triton_store else self.pool.store_index(self.slots)

    def attend(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """q: [T, Hq, D], k/v: [T, Hkv, D] (RoPE applied) -> [T, Hq, D]."""
        if self.triton_store:
            from attnlab.kernels.store_kv import store_kv

            store_kv(self.pool, layer, k, v, self.slots)
        else:
            self.pool.store(layer, k, v, self.slots, self.index)
        return self.backend.run(q, layer)
