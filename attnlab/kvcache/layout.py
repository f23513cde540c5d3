"""Pure layout functions: page tables -> the index tensors every paged attention kernel reads.

Conventions (FlashInfer's paged-KV API uses the same ones):
- a request of ``kv_len`` tokens owns ``ceil(kv_len / page_size)`` pages, listed in its page table;
- token ``t`` of a request lives in slot ``page_table[t // page_size] * page_size + t % page_size``
  of the pool's flattened ``[num_pages * page_size]`` token axis;
- ``kv_last_page_len`` is the number of valid tokens in the last page (``page_size`` when full, 0 when
  the request has no KV at all).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch


def pages_needed(num_tokens: int, page_size: int) -> int:
    """Number of pages that hold ``num_tokens`` tokens."""
    if page_size < 1:
        raise ValueError(f"page_size must be >= 1, got {page_size}")
    return -(-num_tokens // page_size)


@dataclass(frozen=True)
class PagedLayout:
    """Index tensors for one batch over a paged KV pool (all int32, on the target device).

    kv_indptr:        [batch + 1]  offsets into kv_indices
    kv_indices:       [sum(num_pages_i)]  page ids, request after request
    kv_last_page_len: [batch]  valid tokens in each request's last page
    kv_lens:          [batch]  tokens of KV per request (including tokens written this pass)
    """

    kv_indptr: torch.Tensor
    kv_indices: torch.Tensor
    kv_last_page_len: torch.Tensor
    kv_lens: torch.Tensor


def build_layout(
    page_tables: Sequence[Sequence[int]],
    kv_lens: Sequence[int],
    page_size: int,
    device: torch.device | str = "cpu",
) -> PagedLayout:
    """Page tables (one per request, possibly longer than needed) -> indptr / indices / last_page_len."""
    indptr, indices, last = layout_lists(page_tables, kv_lens, page_size)

    def as_t(x: list[int]) -> torch.Tensor:
        return torch.tensor(x, dtype=torch.int32).to(device, non_blocking=True)

    return PagedLayout(as_t(indptr), as_t(indices), as_t(last), as_t(list(kv_lens)))


def layout_lists(page_tables: Sequence[Sequence[int]], kv_lens: Sequence[int],
                 page_size: int) -> tuple[list[int], list[int], list[int]]:
    """The host values of ``build_layout``: (kv_indptr, kv_indices, kv_last_page_len) as lists."""
    if len(page_tables) != len(kv_lens):
        raise ValueError(f"{len(page_tables)} page tables for {len(kv_lens)} lengths")
    indptr = [0]
    indices: list[int] = []
    last = []
    for table, n in zip(page_tables, kv_lens):
        need = pages_needed(n, page_size)
        if need > len(table):
            raise ValueError(f"kv_len {n} needs {need} pages, page table has {len(table)}")
        indices.extend(table[:need])
        indptr.append(len(indices))
        last.append(n - (need - 1) * page_size if need else 0)
    return indptr, indices, last


def slot_mapping(page_table: Sequence[int], start: int, end: int, page_size: int) -> list[int]:
    """Flat pool slots of token positions ``start .. end-1`` of one request."""
    return [page_table[t // page_size] * page_size + t % page_size for t in range(start, end)]
