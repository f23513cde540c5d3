"""The KV pool of one model side: one tensor allocated once, sliced per layer.

Layout ``[layers, 2, num_pages + 1, page_size, kv_heads, head_dim]`` (K at index 0, V at 1): per layer
this is FlashInfer's ``NHD`` paged layout, read by every backend in place. The extra last page is a
scratch page: a slot of -1 ("skip", used by padded CUDA-graph rows) is redirected there, so stores need
no host-side filtering and no sync.
"""

from __future__ import annotations

import torch

from attnlab.kvcache.budget import check_fits, pool_bytes

FP8_DTYPES = (torch.float8_e4m3fn, torch.float8_e5m2)


class KVPool:
    def __init__(
        self,
        num_layers: int,
        num_pages: int,
        page_size: int,
        num_kv_heads: int,
        head_dim: int,
        dtype: torch.dtype,
        device: torch.device | str,
        k_scale: float = 1.0,
        v_scale: float = 1.0,
    ):
        self.num_layers = num_layers
        self.num_pages = num_pages
        self.page_size = page_size
        self.num_kv_heads = num_kv_heads
        self.head_dim = head_dim
        self.dtype = dtype
        self.device = torch.device(device)
        # Dequantization scales for fp8 KV (stored = value / scale); 1.0 for other dtypes.
        self.k_scale = float(k_scale)
        self.v_scale = float(v_scale)
        shape = (num_layers, 2, num_pages + 1, page_size, num_kv_heads, head_dim)
        check_fits(pool_bytes(num_layers, num_pages, page_size, num_kv_heads, head_dim, dtype), self.device,
                   f"a KV pool of shape {list(shape)} {str(dtype).removeprefix('torch.')}")
        self.kv = torch.zeros(
            num_layers, 2, num_pages + 1, page_size, num_kv_heads, head_dim, dtype=dtype, device=self.device
        )
        self.scratch_slot = num_pages * page_size
        if not self.is_fp8 and (self.k_scale != 1.0 or self.v_scale != 1.0):
            raise ValueError(f"KV scales apply to fp8 pools only (dtype {dtype})")

    @property
    def is_fp8(self) -> bool:
        return self.dtype in FP8_DTYPES

    def layer(self, layer: int) -> torch.Tensor:
        """``[2, num_pages + 1, page_size, kv_heads, head_dim]`` view of one layer."""
        return self.kv[layer]

    def slots_view(self, layer: int) -> torch.Tensor:
        """``[2, num_slots, kv_heads, head_dim]`` view of one layer: K / V by flat slot (page * page_size + offset),
        each slot's heads contiguous (the scratch page's slots last)."""
        return self.kv[layer].view(2, -1, self.num_kv_heads, self.head_dim)

    def bytes_per_token(self) -> int:
        return self.num_layers * 2 * self.num_kv_heads * self.head_dim * self.kv.element_size()

    def capacity_tokens(self) -> int:
        return self.num_pages * self.page_size

    def store_index(self, slots: torch.Tensor) -> torch.Tensor:
        """slots [T] (-1 = skip) -> int64 row indices into the flat token axis, -1 sent to the scratch page.
        Computed once per pass (AttnContext), not once per layer."""
        return torch.where(slots < 0, torch.full_like(slots, self.scratch_slot), slots).long()

    def store(self, layer: int, k: torch.Tensor, v: torch.Tensor, slots: torch.Tensor,
              index: torch.Tensor | None = None) -> None:
        """Write new tokens' K/V. k, v: [num_tokens, kv_heads, head_dim]; slots: [num_tokens] int (-1 = skip);
        index: ``store_index(slots)`` when the caller already has it."""
        flat = self.slots_view(layer)
        idx = self.store_index(slots) if index is None else index
        if self.is_fp8:
            k = (k.float() / self.k_scale).to(self.dtype)
            v = (v.float() / self.v_scale).to(self.dtype)
        k, v = k.to(self.dtype), v.to(self.dtype)
        if self.is_fp8:  # index_copy_ has no fp8 kernel on every device: copy the bytes
            flat, k, v = flat.view(torch.uint8), k.view(torch.uint8), v.view(torch.uint8)
        flat[0].index_copy_(0, idx, k)
        flat[1].index_copy_(0, idx, v)

    def copy_slots(self, src: torch.Tensor, dst: torch.Tensor) -> None:
        """Move K/V between token slots in every layer: ``slot[dst[i]] = slot[src[i]]`` (rollback compaction of a
        tree's accepted path). src, dst: same shape, int64 flat slots; -1 = no move (src reads and dst writes
        the scratch page) wherever either side is -1. All reads happen before any write (one gather, then one
        scatter), so a slot may be both a source and a destination. Real destinations must be distinct. Device
        work only."""
        src, dst = src.reshape(-1), dst.reshape(-1)
        skip = (src < 0) | (dst < 0)
        s, d = self.store_index(src.masked_fill(skip, -1)), self.store_index(dst.masked_fill(skip, -1))
        flat = self.kv.view(self.num_layers, 2, -1, self.num_kv_heads, self.head_dim)
        if self.is_fp8:  # indexing has no fp8 kernel on every device: move the bytes
            flat = flat.view(torch.uint8)
        flat[:, :, d] = flat[:, :, s]

    def gather(self, layer: int, page_table: list[int], length: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Dequantized K, V of one request: [length, kv_heads, head_dim] each (tests and debugging)."""
        lay = self.kv[layer]
        pages = torch.tensor(page_table, dtype=torch.long, device=self.device)
        k = lay[0, pages].reshape(-1, self.num_kv_heads, self.head_dim)[:length].float() * self.k_scale
        v = lay[1, pages].reshape(-1, self.num_kv_heads, self.head_dim)[:length].float() * self.v_scale
        return k, v
