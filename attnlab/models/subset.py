"""A view of a Decoder that runs only some of its layers (self-speculation with a layer subset).

The view shares the parent's modules (no weight copy); its KV pool has one layer per kept layer, so the
attention context is remapped from the parent's layer index to the pool's.
"""

from __future__ import annotations

import torch
from torch import nn


class _RemappedContext:
    """The pass's context with layer indices mapped to the subset's pool layers; everything else
    (fused_ops, capture, captured) is the wrapped context's."""

    def __init__(self, ctx, index: dict[int, int]):
        object.__setattr__(self, "_ctx", ctx)
        object.__setattr__(self, "_index", index)

    def attend(self, layer, q, k, v, stored=False):
        return self._ctx.attend(self._index[layer], q, k, v, stored=stored)

    def kv_store_target(self, layer, dtype):
        return self._ctx.kv_store_target(self._index[layer], dtype)

    def __getattr__(self, name):
        return getattr(self._ctx, name)

    def __setattr__(self, name, value):
        setattr(self._ctx, name, value)


class LayerSubset(nn.Module):
    def __init__(self, parent: nn.Module, layers: list[int]):
        super().__init__()
        n = len(parent.layers)
        if not layers or any(not 0 <= i < n for i in layers) or len(set(layers)) != len(layers):
            raise ValueError(f"layer subset {layers} must be distinct indices in 0..{n - 1}")
        self.parent = parent
        self.config = parent.config
        self.keep = sorted(layers)
        self._index = {parent.layers[i].self_attn.layer_idx: j for j, i in enumerate(self.keep)}

    @property
    def num_layers(self) -> int:
        return len(self.keep)

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, ctx) -> torch.Tensor:
        return self.parent.run_layers(self.keep, input_ids, positions, _RemappedContext(ctx, self._index))

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.parent.compute_logits(hidden)

    def rope_tables(self, num_positions: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.parent.rope_tables(num_positions)
