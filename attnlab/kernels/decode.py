"""Paged decode (q_len <= 1 per request): split-KV flash-decoding, GQA-aware.

One program per (request, kv head, split). Its M rows are the GQA group of query heads that share the kv
head (padded to >= 16 rows for tl.dot), so each K/V tile is read once for the whole group. With
num_splits > 1 each program writes a partial output + log-sum-exp and ``merge_splits`` combines them.
Split boundaries are computed in the kernel from the request's own kv_len (a multiple of BLOCK_N per
split), so a plan's grid stays valid while lengths change (CUDA-graph replay).
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from attnlab.kernels.heuristics import LaunchParams, fp32_dot
from attnlab.kernels.merge import merge_arrived, merge_bound, merge_splits
from attnlab.kernels.paged import attend_tile, tile_slots, write_result
from attnlab.kernels.pdl import launch_args, pdl_start

LOG2E = 1.0 / math.log(2.0)


@triton.jit
def _decode_kernel(Q, K, V, O, O_PART, LSE_PART, COUNTERS, QO_INDPTR, KV_INDPTR, KV_INDICES, KV_LENS,
                   qk_scale, v_scale, num_splits,
                   stride_qt, stride_qh, stride_slot, stride_kh, stride_ot, stride_oh,
                   stride_pt, stride_ph, stride_ps, stride_lt, stride_lh,
                   GROUP: tl.constexpr, HEAD_DIM: tl.constexpr, PAGE_SIZE: tl.constexpr,
                   BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
                   SPLIT: tl.constexpr, FP32_DOT: tl.constexpr, FUSE_MERGE: tl.constexpr,
                   MERGE_SPLITS: tl.constexpr,
                   USE_PDL: tl.constexpr = False):
    pdl_start(USE_PDL)
    b = tl.program_id(0)
    kvh = tl.program_id(1)
    split = tl.program_id(2)
    row = tl.load(QO_INDPTR + b)
    q_len = tl.load(QO_INDPTR + b + 1) - row  # 0 (padding: produces nothing) or 1
    kv_len = tl.load(KV_LENS + b) * q_len
    page_base = tl.load(KV_INDPTR + b)
    chunk = tl.cdiv(tl.cdiv(kv_len, num_splits), BLOCK_N) * BLOCK_N
    lo = split * chunk
    hi = tl.minimum(lo + chunk, kv_len)

    offs_m = tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_D)
    m_mask = offs_m < GROUP * q_len
    d_mask = offs_d < HEAD_DIM
    heads = kvh * GROUP + offs_m
    rows = row + offs_m * 0
    q = tl.load(Q + row.to(tl.int64) * stride_qt + heads[:, None] * stride_qh + offs_d[None, :],
                mask=m_mask[:, None] & d_mask[None, :], other=0.0)

    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
    head_off = kvh * stride_kh
    for start in range(lo, hi, BLOCK_N):
        n_mask = start + offs_n < hi
        slots = tile_slots(KV_INDICES, page_base, start, offs_n, n_mask, PAGE_SIZE, BLOCK_N)
        valid = (offs_m[:, None] >= 0) & n_mask[None, :]
        acc, m_i, l_i = attend_tile(q, acc, m_i, l_i, K, V, slots, head_off, offs_d, d_mask, n_mask, valid,
                                    qk_scale, stride_slot, FP32_DOT, True, False)
    write_result(acc, m_i, l_i, O, O_PART, LSE_PART, rows, heads, split, offs_d, m_mask, d_mask, v_scale,
                 stride_ot, stride_oh, stride_pt, stride_ph, stride_ps, stride_lt, stride_lh, SPLIT)
    if SPLIT and FUSE_MERGE:
        merge_arrived(O, O_PART, LSE_PART, COUNTERS, b * tl.num_programs(1) + kvh, num_splits, rows, heads, m_mask,
                      offs_d, d_mask, stride_ot, stride_oh, stride_pt, stride_ph, stride_ps, stride_lt, stride_lh,
                      MERGE_SPLITS)


def paged_decode(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, out: torch.Tensor,
                 qo_indptr: torch.Tensor, kv_indptr: torch.Tensor, kv_indices: torch.Tensor,
                 kv_lens: torch.Tensor, *, page_size: int, scale: float, params: LaunchParams,
                 k_scale: float = 1.0, v_scale: float = 1.0, o_part: torch.Tensor | None = None,
                 lse_part: torch.Tensor | None = None, counters: torch.Tensor | None = None) -> torch.Tensor:
    """Decode attention over a paged pool; writes and returns ``out``.

    q, out:      [num_tokens, Hq, D] (q_len 0 or 1 per request)
    k/v_cache:   [num_slots, Hkv, D]  one layer's K or V, slot = page * page_size + offset (any dtype;
                 fp8 is dequantized by k_scale / v_scale)
    qo_indptr:   [batch + 1] int32;  kv_indptr: [batch + 1] int32;  kv_indices: [pages] int32;
    kv_lens:     [batch] int32
    o_part:      [num_tokens, Hq, num_splits, D] fp32 and lse_part [num_tokens, Hq, num_splits] fp32
                 scratch, required when params.num_splits > 1
    counters:    int32 [>= batch * Hkv], all 0: split-KV partials merged inside the kernel by the last split of
                 each (request, kv head) (merge.merge_arrived), which leaves them 0 again; None: merge_splits after
    """
    batch = qo_indptr.shape[0] - 1
    num_heads, head_dim = q.shape[1], q.shape[2]
    num_kv_heads = k_cache.shape[1]
    split = params.num_splits > 1
    if split and (o_part is None or lse_part is None):
        raise ValueError("paged_decode: num_splits > 1 needs o_part and lse_part scratch")
    if batch == 0 or q.shape[0] == 0:
        return out
    part = o_part if split else out
    lse = lse_part if split else out
    fuse = split and counters is not None
    _decode_kernel[(batch, num_kv_heads, params.num_splits)](
        q, k_cache, v_cache, out, part, lse, counters if fuse else qo_indptr, qo_indptr, kv_indptr, kv_indices, kv_lens,
        scale * k_scale * LOG2E, v_scale, params.num_splits,
        q.stride(0), q.stride(1), k_cache.stride(0), k_cache.stride(1), out.stride(0), out.stride(1),
        *(part.stride()[:3] if split else (0, 0, 0)), *(lse.stride()[:2] if split else (0, 0)),
        GROUP=num_heads // num_kv_heads, HEAD_DIM=head_dim, PAGE_SIZE=page_size,
        BLOCK_M=params.block_m, BLOCK_N=params.block_n, BLOCK_D=params.block_d,
        SPLIT=split, FP32_DOT=fp32_dot(q.dtype), FUSE_MERGE=fuse,
        MERGE_SPLITS=merge_bound(params.num_splits, fuse),
        num_warps=params.num_warps, num_stages=params.num_stages, **launch_args(q))
    if split and not fuse:
        merge_splits(out, o_part, lse_part)
    return out
