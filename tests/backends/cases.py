"""Random paged-attention cases shared by every backend's tests (and the kernel benchmark).

A case is a KV pool holding random K/V for a batch of requests at given lengths, with pages shuffled
(so a backend that assumes contiguous pages fails), plus the AttnMeta of one pass and the query.
"""

from __future__ import annotations

import os
import random
from dataclasses import dataclass

import torch

from attnlab.backends.base import AttnMeta, Mode
from attnlab.backends.torch_ref import TorchBackend, causal_mask
from attnlab.kvcache import KVPool, build_layout, pages_needed

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
    assert all(kv >= q for kv, q in zip(kv_lens, q_lens)), (kv_lens, q_lens)
    g = torch.Generator().manual_seed(seed)
    rng = random.Random(seed)
    need = [pages_needed(n, page_size) for n in kv_lens]
    num_pages = sum(need) + spare_pages
    perm = list(range(num_pages))
    rng.shuffle(perm)
    tables, off = [], 0
    for n in need:
        tables.append(perm[off:off + n])
        off += n
    kv_dtype = kv_dtype or dtype
    pool = KVPool(num_layers, num_pages, page_size, num_kv_heads, head_dim, kv_dtype, device)
    pool.kv.copy_((torch.randn(pool.kv.shape, generator=g) * 0.5).to(kv_dtype))
    layout = build_layout(tables, kv_lens, page_size, device)
    qo = [0]
    for n in q_lens:
        qo.append(qo[-1] + n)
    mask = None
    if tree_mask:  # a random tree-like mask: causal, and each new token drops a random subset of the new ones
        blocks = []
        for q_len, kv_len in zip(q_lens, kv_lens):
            m = causal_mask(q_len, kv_len)
            drop = torch.rand(q_len, q_len, generator=g) < 0.4
            drop.fill_diagonal_(False)
            m[:, kv_len - q_len:] &= ~drop
            blocks.append(m.reshape(-1))
        mask = torch.cat(blocks).to(device) if blocks else torch.zeros(0, dtype=torch.bool, device=device)
    if mode is None:
        mode = Mode.DECODE if all(q == 1 for q in q_lens) else Mode.VERIFY
    meta = AttnMeta(mode=mode, qo_indptr=torch.tensor(qo, dtype=torch.int32, device=device), layout=layout,
                    q_lens=list(q_lens), kv_lens_host=list(kv_lens), page_size=page_size, custom_mask=mask)
    q = (torch.randn(sum(q_lens), num_kv_heads * gqa, head_dim, generator=g)).to(dtype).to(device)
    return Case(pool, meta, q, num_kv_heads * gqa, num_kv_heads, head_dim, head_dim ** -0.5)
