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


def rows_layout(kv_lens: list[int], q_len: int, page_size: int,
                kv_indptr: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(rows' kv_indptr [R + 1], rows' last page lengths [R], gather [pages]) as host int tensors, R = len(kv_lens) x
    q_len: row ``r * q_len + i`` holds request r's first ``pages_needed(kv_lens[r] - q_len + 1 + i)`` pages, and
    ``gather`` indexes the request layout's page ids (``kv_indptr``: the requests' host kv_indptr) row by row, so the
    rows' page ids are ``layout.kv_indices[gather]``. Every request must hold its q_len new tokens (kv_len >= q_len)."""
    n = torch.tensor(kv_lens, dtype=torch.int64)
    if q_len < 1 or (len(kv_lens) and int(n.min()) < q_len):
        raise ValueError(f"flashinfer rows: kv lengths {kv_lens} must each hold the pass's {q_len} new tokens")
    lens = (n[:, None] - q_len + 1 + torch.arange(q_len)).reshape(-1)  # [R] tokens a row attends
    pages = (lens + page_size - 1) // page_size
    indptr = torch.zeros(lens.numel() + 1, dtype=torch.int64)
    torch.cumsum(pages, 0, out=indptr[1:])
    last = lens - (pages - 1) * page_size
    total = int(indptr[-1])
    first = kv_indptr.to(torch.int64)[:-1].repeat_interleave(q_len)  # [R] each row's request's first page id slot
    within = torch.arange(total) - indptr[:-1].repeat_interleave(pages, output_size=total)
    gather = first.repeat_interleave(pages, output_size=total) + within
    return indptr.to(torch.int32), last.to(torch.int32), gather
