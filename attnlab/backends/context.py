"""What a model layer sees of a forward pass: store this pass's K/V, then attend through the backend; which
layer outputs the caller wants back (EAGLE features); whether the layers run attnlab's fused kernels."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from attnlab.backends.base import AttentionBackend
from attnlab.kvcache.pool import KVPool


@dataclass
class AttnContext:
    """Per forward pass. slots: [num_tokens] int64 pool slots of the new tokens (-1 = skip).

    fused_ops: the layers run attnlab.kernels.fused and the K/V store is the Triton kernel (engine.fused_ops,
    a property of the model side, not of the shared weights); the string "gemm" (engine.gemm=triton) also
    runs the GEMMs of passes of <= 16 tokens on attnlab.kernels.gemm (attnlab.models.gemm_path). invariant: the
    layers' GEMMs go through attnlab.models.linear.invariant_linear (engine.invariant; the side is fused and its
    backend invariant). capture: layer indices whose output (the
    residual stream) the model concatenates into ``captured`` [num_tokens, len(capture) * hidden]; a draft
    head leaves its pre-norm output there instead. rope_table: the side's RoPE (cos, sin) [positions, head_dim]
    over every position its passes reach (ModelRunner.rope_table; gemm path only), else None.
    """

    backend: AttentionBackend
    pool: KVPool
    slots: torch.Tensor
    fused_ops: bool | str = False
    invariant: bool = False
    capture: tuple[int, ...] | None = None
    captured: torch.Tensor | None = None
    rope_table: tuple[torch.Tensor, torch.Tensor] | None = None

    def __post_init__(self):
        # once per pass; every layer's torch store goes through it
        self.index = None if self.fused_ops else self.pool.store_index(self.slots)

    def _store(self, layer: int, k: torch.Tensor, v: torch.Tensor) -> None:
        if self.fused_ops:
            from attnlab.kernels.store_kv import store_kv

            store_kv(self.pool, layer, k, v, self.slots)
        else:
            self.pool.store(layer, k, v, self.slots, self.index)

    def kv_store_target(self, layer: int, dtype: torch.dtype) -> tuple | None:
        """(k_cache, v_cache, slots) for a kernel that writes this pass's K/V into the pool itself (the gemm
        path's qkv epilogue, the fused paths' RoPE kernel), then ``attend(..., stored=True)``; None on the unfused
        path and where the pool needs the Triton store's quantization (fp8 KV) or holds another dtype than the
        activations."""
        if not self.fused_ops or self.pool.is_fp8 or self.pool.dtype != dtype:
            return None
        k_cache, v_cache = self.pool.slots_view(layer)
        return k_cache, v_cache, self.slots

    def attend(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
               stored: bool = False) -> torch.Tensor:
        """q: [T, Hq, D], k/v: [T, Hkv, D] (RoPE applied) -> [T, Hq, D]. ``stored``: the caller already wrote k / v
        into their slots (``kv_store_target``)."""
        if not stored:
            self._store(layer, k, v)
        return self.backend.run_new(q, k, v, layer)
