"""Backend test cases: attnlab.backends.cases.random_paged_case wrapped with the head counts and the torch
reference, plus the GPU grid shared by the library backends' tests."""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch

from attnlab.backends.base import AttnMeta, Mode
from attnlab.backends.cases import random_paged_case
from attnlab.backends.torch_ref import TorchBackend
from attnlab.kvcache import KVPool

# GPU parity grids of the library backends (flashinfer, fa) share these points and tolerances.
# bf16 keeps 8 mantissa bits: one rounding of an output of magnitude <~1.5 is <~6e-3, and the kernel rounds P
# to bf16 before P@V; 2e-2 is well above that and far below what a wrong mask or page (O(0.1-1)) gives.
# fp16 has 11 bits, so 1e-2 leaves the same margin.
GPU_TOL = {torch.bfloat16: 2e-2, torch.float16: 1e-2}
GPU_SHAPES = {  # kv lengths per request
    "b1_short": [5],
    "b1_32k": [32768],
    "b4_mixed": [17, 1000, 4096, 33],
    "b64": [int(x) for x in torch.randint(4, 2049, (64,), generator=torch.Generator().manual_seed(1))],
}
GPU_K = 3  # draft tokens: verify q_len = k + 1
GPU_FULL_GRID = os.environ.get("ATTNLAB_GPU_GRID", "") == "full"


@dataclass
class Case:
    pool: KVPool
    meta: AttnMeta
    q: torch.Tensor  # [num_tokens, Hq, D]
    num_q_heads: int
    num_kv_heads: int
    head_dim: int
    scale: float

    def backend(self, cls, dtype=None):
        return cls(self.pool, self.num_q_heads, self.num_kv_heads, self.head_dim, self.scale,
                   dtype or self.q.dtype)

    def reference(self) -> torch.Tensor:
        ref = self.backend(TorchBackend)
        ref.plan(self.meta)
        return torch.stack([ref.run(self.q.float(), layer) for layer in range(self.pool.num_layers)])


def make_case(
    *, kv_lens: list[int], q_lens: list[int], page_size: int, num_kv_heads: int, gqa: int, head_dim: int,
    dtype: torch.dtype, device: str = "cpu", kv_dtype: torch.dtype | None = None, mode: Mode | None = None,
    tree_mask: bool = False, num_layers: int = 1, seed: int = 0, spare_pages: int = 3,
) -> Case:
    """kv_lens[i] includes the q_lens[i] new tokens (their K/V are already in the pool)."""
    pool, meta, q = random_paged_case(
        kv_lens=kv_lens, q_lens=q_lens, page_size=page_size, num_q_heads=num_kv_heads * gqa,
        num_kv_heads=num_kv_heads, head_dim=head_dim, dtype=dtype, kv_dtype=kv_dtype, device=device, mode=mode,
        tree_mask=tree_mask, num_layers=num_layers, seed=seed, spare_pages=spare_pages)
    return Case(pool, meta, q, num_kv_heads * gqa, num_kv_heads, head_dim, head_dim ** -0.5)
