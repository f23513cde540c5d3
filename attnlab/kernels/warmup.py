"""Compile ahead of timing: every kernel variant a run's shapes will select.

Triton compiles one binary per set of constexprs (block sizes, page size, head dim, split on/off, mask
on/off) and argument dtypes. ``warmup`` enumerates the launch parameters ``plan_params`` chooses for
each (batch size, q_len, kv_len) a run expects, and launches each distinct variant once on a tiny
dummy pool with the same page size, heads and dtypes — the launch compiles it into Triton's cache.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch

from attnlab.kernels.decode import paged_decode
from attnlab.kernels.extend import paged_extend, query_blocks
from attnlab.kernels.heuristics import PREFILL_MIN_Q_LEN, LaunchParams, plan_params, sm_count
from attnlab.kernels.merge import fuses_merge, merge_counters, partials_dtype
from attnlab.kernels.store_kv import store_kv
from attnlab.kvcache.layout import build_layout, pages_needed
from attnlab.kvcache.pool import KVPool


@dataclass(frozen=True)
class WarmupShape:
    """One model side's attention shapes. q_lens: 1 = decode / draft step, k+1 = verify, prompt lengths
    for prefill; kv_lens: the context lengths expected (the split count depends on them)."""

    num_q_heads: int
    num_kv_heads: int
    head_dim: int
    page_size: int
    dtype: torch.dtype
    kv_dtype: torch.dtype | None = None
    batch_sizes: tuple[int, ...] = (1,)
    q_lens: tuple[int, ...] = (1,)
    kv_lens: tuple[int, ...] = (1,)
    custom_mask: bool = False
    num_splits: int | None = None
    prefill_tiles: str | None = None  # the triton backend's option: the prefill launch it overrides
    fused_merge: bool | str = False  # the triton backend's option (merge.fuses_merge), which always passes it
    prefill_contig: bool = False  # the triton backend's option: prefills without a prefix on the contiguous kernel
    decode_tiles: str | None = None  # the triton backend's option: the decode launch it overrides
    decode_partials: str = "fp32"  # the triton backend's option: "out", a split decode's partials in ``dtype``


def _variants(shape: WarmupShape, sms: int) -> dict:
    """Distinct (launch params, has_mask) -> one example (batch, q_len, kv_len) that selects them."""
    out = {}
    group = shape.num_q_heads // shape.num_kv_heads
    for b in shape.batch_sizes:
        for q_len in shape.q_lens:
            for kv_len in shape.kv_lens:
                kv_len = max(kv_len, q_len)
                for mask in ({False, shape.custom_mask} if q_len > 1 or shape.custom_mask else {False}):
                    p = plan_params(q_lens=[q_len] * b, kv_lens=[kv_len] * b, num_kv_heads=shape.num_kv_heads,
                                    group=group, head_dim=shape.head_dim, has_mask=mask, sms=sms,
                                    num_splits=shape.num_splits, prefill_tiles=shape.prefill_tiles,
                                    decode_tiles=shape.decode_tiles)
                    out.setdefault((p, mask), (b, q_len, kv_len))
    return out


def warmup(shapes: list[WarmupShape], device: torch.device | str = "cuda") -> list[dict]:
    """Launch each distinct kernel variant once; returns one record per variant (params, seconds)."""
    device = torch.device(device)
    sms = sm_count(device.index or 0) if device.type == "cuda" else sm_count()
    records = []
    for shape in shapes:
        kv_dtype = shape.kv_dtype or shape.dtype
        ps = shape.page_size
        q_len_max = max(shape.q_lens)
        # A tiny pool: one request of up to a page + the largest q_len; values do not matter.
        kv_len = max(q_len_max, 1) + 1
        pages = pages_needed(kv_len, ps)
        pool = KVPool(1, pages, ps, shape.num_kv_heads, shape.head_dim, kv_dtype, device)
        layout = build_layout([list(range(pages))], [kv_len], ps, device)
        kv_new = torch.zeros(1, shape.num_kv_heads, shape.head_dim, dtype=shape.dtype, device=device)
        store_kv(pool, 0, kv_new, kv_new, torch.zeros(1, dtype=torch.int64, device=device))
        k_cache = pool.layer(0)[0].view(-1, shape.num_kv_heads, shape.head_dim)
        v_cache = pool.layer(0)[1].view(-1, shape.num_kv_heads, shape.head_dim)
        for (params, has_mask), example in _variants(shape, sms).items():
            t0 = time.perf_counter()
            q_len = 1 if params.kind == "decode" else example[1]
            q = torch.zeros(q_len, shape.num_q_heads, shape.head_dim, dtype=shape.dtype, device=device)
            out = torch.empty_like(q)
            qo = torch.tensor([0, q_len], dtype=torch.int32, device=device)
            scratch = {}
            if params.num_splits > 1:
                scratch = {
                    "o_part": torch.empty(q_len, shape.num_q_heads, params.num_splits, shape.head_dim,
                                          dtype=partials_dtype(shape.decode_partials, params, shape.dtype),
                                          device=device),
                    "lse_part": torch.empty(q_len, shape.num_q_heads, params.num_splits, dtype=torch.float32,
                                         device=device)}
                if fuses_merge(shape.fused_merge, params):
                    blocks = 1 if params.kind == "decode" else len(query_blocks([q_len], params.tokens_per_block)[0])
                    scratch["counters"] = merge_counters(blocks, shape.num_kv_heads, device)
            args = (q, k_cache, v_cache, out, qo, layout.kv_indptr, layout.kv_indices, layout.kv_lens)
            kw = dict(page_size=ps, scale=shape.head_dim ** -0.5, params=params, k_scale=pool.k_scale,
                      v_scale=pool.v_scale, **scratch)
            if params.kind == "decode":
                paged_decode(*args, **kw)
            else:
                reqs, starts = query_blocks([q_len], params.tokens_per_block)
                as_t = lambda x: torch.tensor(x, dtype=torch.int32, device=device)
                mask = torch.ones(q_len * kv_len, dtype=torch.uint8, device=device) if has_mask else None
                mask_indptr = torch.zeros(1, dtype=torch.int64, device=device) if has_mask else None
                paged_extend(*args, as_t(reqs), as_t(starts), mask=mask, mask_indptr=mask_indptr, **kw)
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            records.append({"params": params, "custom_mask": has_mask, "example": example,
                            "fused_merge": "counters" in scratch, "seconds": time.perf_counter() - t0})
        if shape.prefill_contig and q_len_max >= PREFILL_MIN_Q_LEN:
            records += _warm_contig(shape, device)
    return records


def _warm_contig(shape: WarmupShape, device: torch.device) -> list[dict]:
    """The contiguous prefill kernel's variant for this shape (triton's ``_contig`` rule), compiled on a one-token
    prefill; [] where the rule keeps the paged kernel."""
    from attnlab.kernels.prefill_contig import contig_config, prefill_contig

    cfg = contig_config(shape.head_dim, shape.dtype, shape.kv_dtype or shape.dtype, device)
    if cfg is None:
        return []
    t0 = time.perf_counter()
    q = torch.zeros(1, shape.num_q_heads, shape.head_dim, dtype=shape.dtype, device=device)
    kv = torch.zeros(1, shape.num_kv_heads, shape.head_dim, dtype=shape.dtype, device=device)
    zero = torch.zeros(1, dtype=torch.int32, device=device)
    prefill_contig(q, kv, kv, torch.tensor([0, 1], dtype=torch.int32, device=device), zero, zero,
                   scale=shape.head_dim ** -0.5, block_m=cfg[0], block_n=cfg[1], num_warps=cfg[2], num_stages=cfg[3])
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    bm, bn, warps, stages = cfg
    params = LaunchParams("contig", bm, bn, shape.head_dim, bm, 1, warps, stages)
    return [{"params": params, "custom_mask": False, "example": (1, 1, 1), "fused_merge": False,
             "seconds": time.perf_counter() - t0}]
