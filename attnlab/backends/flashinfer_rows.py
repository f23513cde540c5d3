"""A causal verify as FlashInfer decode rows (``verify_as_decode=true``): the layout of one decode request a query row.

A chain verify of ``q`` tokens a request attends bottom-right causally: its row ``i`` (0-based) sees the request's
first ``kv_len - q + 1 + i`` tokens. That is exactly a decode of that many tokens, so the whole pass is a
``BatchDecodeWithPagedKVCacheWrapper`` pass over ``batch x q`` rows, each a prefix of its request's page list (the
pages are shared, not copied: the rows' page ids repeat the request's). No mask, no merge of the query tile, and the
decode kernel's own split-KV; a row's KV is read once per row (at small batch and short KV from L2; at large batch x
long KV that is ``q`` times the fa2 plan's traffic, which reads it once per GQA-packed tile).

The query and output rows are already in this order (request-major, ``meta.qo_indptr``): ``run`` takes the verify's
``[batch x q, Hq, D]`` as a decode's ``[rows, Hq, D]``.
"""

from __future__ import annotations

import torch

# Up to this many row page ids the layout is built in Python lists (batch 1 x 512 tokens: ~50 us against ~170 for the
# tensor ops, whose per-op cost dominates small passes); past it as host tensor ops (batch 64 x q 16 x 4k at page 1,
# 2.3M ids: ~25 ms against seconds in lists).
LIST_MAX_IDS = 16384


def rows_layout(kv_lens: list[int], q_len: int, page_size: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(rows' kv_indptr [R + 1], rows' last page lengths [R], gather [pages]) as host int tensors, R = len(kv_lens) x
    q_len: row ``r * q_len + i`` holds request r's first ``pages_needed(kv_lens[r] - q_len + 1 + i)`` pages, and
    ``gather`` indexes the requests' page ids (a layout whose request r starts at the sum of the page counts before
    it, as ``build_layout`` and ``host_csr`` lay them out) row by row: the rows' page ids are
    ``layout.kv_indices[gather]``. Every request must hold its q_len new tokens (kv_len >= q_len)."""
    if q_len < 1 or any(n < q_len for n in kv_lens):
        raise ValueError(f"flashinfer rows: kv lengths {kv_lens} must each hold the pass's {q_len} new tokens")
    ps = page_size
    if q_len * sum(kv_lens) <= LIST_MAX_IDS * ps:
        return _rows_lists(kv_lens, q_len, ps)
    n = torch.tensor(kv_lens, dtype=torch.int64)
    first = torch.cumsum((n + ps - 1) // ps, 0) - (n + ps - 1) // ps  # each request's first page id slot
    lens = (n[:, None] - q_len + 1 + torch.arange(q_len)).reshape(-1)  # [R] tokens a row attends
    pages = (lens + ps - 1) // ps
    indptr = torch.zeros(lens.numel() + 1, dtype=torch.int64)
    torch.cumsum(pages, 0, out=indptr[1:])
    total = int(indptr[-1])
    within = torch.arange(total) - indptr[:-1].repeat_interleave(pages, output_size=total)
    gather = first.repeat_interleave(q_len).repeat_interleave(pages, output_size=total) + within
    return indptr.to(torch.int32), (lens - (pages - 1) * ps).to(torch.int32), gather


def _rows_lists(kv_lens: list[int], q_len: int, ps: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    indptr, last, gather, base = [0], [], [], 0
    for n in kv_lens:
        for length in range(n - q_len + 1, n + 1):
            p = -(-length // ps)
            gather.extend(range(base, base + p))
            indptr.append(indptr[-1] + p)
            last.append(length - (p - 1) * ps)
        base += -(-n // ps)
    return (torch.tensor(indptr, dtype=torch.int32), torch.tensor(last, dtype=torch.int32),
            torch.tensor(gather, dtype=torch.int64))
