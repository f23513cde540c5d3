"""Paged extend attention: q_len >= 1 new tokens per request over a paged prefix (prefill and verify).

One program per (query block, kv head, split). A query block is up to TOKENS_PER_BLOCK consecutive new
tokens of one request; its M rows are (token, query head of the GQA group) pairs, token-major, so a
verify pass (k+1 tokens x group) fits one program and every K/V tile is read once per kv head. The
host plan lists the blocks (``block_req``, ``block_qstart``). Masking: causal per the rule in
``attnlab.backends.base`` (row j of a request sees positions < kv_len - q_len + j + 1; tiles past the
block's last visible position are skipped), or a custom bool mask [q_len, kv_len] per request (uint8
here, starting at ``mask_indptr[req]``). Split-KV (short queries over long prefixes) reuses the
decode kernels' partial-output format and ``merge_splits``.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from attnlab.kernels.decode import LOG2E
from attnlab.kernels.heuristics import LaunchParams, fp32_dot
from attnlab.kernels.merge import merge_arrived, merge_bound, merge_splits
from attnlab.kernels.paged import attend_tile, tile_slots, write_result
from attnlab.kernels.pdl import launch_args, pdl_start


@triton.jit
def _extend_kernel(Q, K, V, O, O_PART, LSE_PART, COUNTERS, QO_INDPTR, KV_INDPTR, KV_INDICES, KV_LENS,
                   BLOCK_REQ, BLOCK_QSTART, MASK, MASK_INDPTR,
                   qk_scale, v_scale, num_splits,
                   stride_qt, stride_qh, stride_slot, stride_kh, stride_ot, stride_oh,
                   stride_pt, stride_ph, stride_ps, stride_lt, stride_lh,
                   GROUP: tl.constexpr, HEAD_DIM: tl.constexpr, PAGE_SIZE: tl.constexpr,
                   TOKENS_PER_BLOCK: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                   BLOCK_D: tl.constexpr, HAS_MASK: tl.constexpr, SPLIT: tl.constexpr,
                   FP32_DOT: tl.constexpr, FUSE_MERGE: tl.constexpr, MERGE_SPLITS: tl.constexpr,
                   USE_PDL: tl.constexpr = False):
    pdl_start(USE_PDL)
    pid = tl.program_id(0)
    kvh = tl.program_id(1)
    split = tl.program_id(2)
    req = tl.load(BLOCK_REQ + pid)
    q0 = tl.load(BLOCK_QSTART + pid)
    row0 = tl.load(QO_INDPTR + req)
    q_len = tl.load(QO_INDPTR + req + 1) - row0
    kv_len = tl.load(KV_LENS + req)
    page_base = tl.load(KV_INDPTR + req)
    prefix = kv_len - q_len

    offs_m = tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_D)
    tok = q0 + offs_m // GROUP
    heads = kvh * GROUP + offs_m % GROUP
    m_mask = (offs_m < TOKENS_PER_BLOCK * GROUP) & (tok < q_len)
    d_mask = offs_d < HEAD_DIM
    rows = row0 + tok
    q = tl.load(Q + rows.to(tl.int64)[:, None] * stride_qt + heads[:, None] * stride_qh + offs_d[None, :],
                mask=m_mask[:, None] & d_mask[None, :], other=0.0)

    if HAS_MASK:
        kv_hi = kv_len
        mask_row = MASK + tl.load(MASK_INDPTR + req) + tok.to(tl.int64) * kv_len
    else:
        kv_hi = tl.minimum(kv_len, prefix + tl.minimum(q0 + TOKENS_PER_BLOCK, q_len))
    row_limit = prefix + tok + 1  # causal: row sees positions < row_limit
    chunk = tl.cdiv(tl.cdiv(kv_hi, num_splits), BLOCK_N) * BLOCK_N
    lo = split * chunk
    hi = tl.minimum(lo + chunk, kv_hi)

    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
    head_off = kvh * stride_kh
    if HAS_MASK:
        full_hi = lo
    else:
        # Tiles wholly below the block's causal band (every row, the first one included, sees positions
        # < prefix + q0 + 1) and inside [lo, hi): no mask to build or apply. Only the band's tiles are masked.
        full_hi = lo + tl.maximum(tl.minimum(hi, prefix + q0 + 1) - lo, 0) // BLOCK_N * BLOCK_N
    all_n = offs_n < BLOCK_N
    for start in range(lo, full_hi, BLOCK_N):
        slots = tile_slots(KV_INDICES, page_base, start, offs_n, all_n, PAGE_SIZE, BLOCK_N)
        acc, m_i, l_i = attend_tile(q, acc, m_i, l_i, K, V, slots, head_off, offs_d, d_mask, all_n, all_n[None, :],
                                    qk_scale, stride_slot, FP32_DOT, False, BLOCK_D == HEAD_DIM)
    for start in range(full_hi, hi, BLOCK_N):
        pos = start + offs_n
        n_mask = pos < hi
        slots = tile_slots(KV_INDICES, page_base, start, offs_n, n_mask, PAGE_SIZE, BLOCK_N)
        valid = m_mask[:, None] & n_mask[None, :]
        if HAS_MASK:
            bits = tl.load(mask_row[:, None] + pos[None, :], mask=valid, other=0)
            valid = valid & (bits != 0)
        else:
            valid = valid & (pos[None, :] < row_limit[:, None])
        acc, m_i, l_i = attend_tile(q, acc, m_i, l_i, K, V, slots, head_off, offs_d, d_mask, n_mask, valid,
                                    qk_scale, stride_slot, FP32_DOT, True, False)
    write_result(acc, m_i, l_i, O, O_PART, LSE_PART, rows, heads, split, offs_d, m_mask, d_mask, v_scale,
                 stride_ot, stride_oh, stride_pt, stride_ph, stride_ps, stride_lt, stride_lh, SPLIT)
    if SPLIT and FUSE_MERGE:
        merge_arrived(O, O_PART, LSE_PART, COUNTERS, pid * tl.num_programs(1) + kvh, num_splits, rows, heads,
                      m_mask, offs_d, d_mask, stride_ot, stride_oh, stride_pt, stride_ph, stride_ps, stride_lt,
                      stride_lh, MERGE_SPLITS)


def query_blocks(q_lens: list[int], tokens_per_block: int,
                 kv_lens: list[int] | None = None) -> tuple[list[int], list[int]]:
    """Host: (request, first new token) of every query block; q_len 0 requests get none.

    With ``kv_lens``, the blocks come heaviest first (the most KV positions to read: prefix + the block's last
    token), so a causal prefill's long diagonal-end blocks start in the first wave and the short ones fill the
    tail (longest-processing-time order); any order gives the same outputs."""
    reqs, starts = [], []
    for i, n in enumerate(q_lens):
        for s in range(0, n, tokens_per_block):
            reqs.append(i)
            starts.append(s)
    if kv_lens is not None and len(reqs) > 1:
        def work(b: int) -> int:
            i = reqs[b]
            return kv_lens[i] - q_lens[i] + min(starts[b] + tokens_per_block, q_lens[i])

        order = sorted(range(len(reqs)), key=work, reverse=True)
        reqs, starts = [reqs[b] for b in order], [starts[b] for b in order]
    return reqs, starts


def paged_extend(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, out: torch.Tensor,
                 qo_indptr: torch.Tensor, kv_indptr: torch.Tensor, kv_indices: torch.Tensor,
                 kv_lens: torch.Tensor, block_req: torch.Tensor, block_qstart: torch.Tensor, *,
                 page_size: int, scale: float, params: LaunchParams, k_scale: float = 1.0,
                 v_scale: float = 1.0, mask: torch.Tensor | None = None,
                 mask_indptr: torch.Tensor | None = None,
                 o_part: torch.Tensor | None = None, lse_part: torch.Tensor | None = None,
                 counters: torch.Tensor | None = None) -> torch.Tensor:
    """Extend attention over a paged pool; writes and returns ``out``.

    q, out:       [num_tokens, Hq, D]; k/v_cache: [num_slots, Hkv, D] (see paged_decode)
    qo_indptr, kv_indptr: [batch + 1] int32; kv_indices: [pages] int32; kv_lens: [batch] int32
    block_req, block_qstart: [num_blocks] int32 from ``query_blocks(q_lens, params.tokens_per_block)``
    mask:         optional [sum(q_len_i * kv_len_i)] uint8 (1 = attend), mask_indptr: [batch] int64 offsets
    o_part, lse_part: split-KV scratch as in paged_decode, required when params.num_splits > 1
    counters:     int32 [>= num_blocks * Hkv], all 0: the splits merged inside the kernel (as in paged_decode)
    """
    num_blocks = block_req.shape[0]
    num_heads, head_dim = q.shape[1], q.shape[2]
    num_kv_heads = k_cache.shape[1]
    split = params.num_splits > 1
    if split and (o_part is None or lse_part is None):
        raise ValueError("paged_extend: num_splits > 1 needs o_part and lse_part scratch")
    if num_blocks == 0:
        return out
    part = o_part if split else out
    lse = lse_part if split else out
    has_mask = mask is not None
    fuse = split and counters is not None
    _extend_kernel[(num_blocks, num_kv_heads, params.num_splits)](
        q, k_cache, v_cache, out, part, lse, counters if fuse else block_req, qo_indptr, kv_indptr, kv_indices,
        kv_lens,
        block_req, block_qstart, mask if has_mask else block_req, mask_indptr if has_mask else block_req,
        scale * k_scale * LOG2E, v_scale, params.num_splits,
        q.stride(0), q.stride(1), k_cache.stride(0), k_cache.stride(1), out.stride(0), out.stride(1),
        *(part.stride()[:3] if split else (0, 0, 0)), *(lse.stride()[:2] if split else (0, 0)),
        GROUP=num_heads // num_kv_heads, HEAD_DIM=head_dim, PAGE_SIZE=page_size,
        TOKENS_PER_BLOCK=params.tokens_per_block, BLOCK_M=params.block_m, BLOCK_N=params.block_n,
        BLOCK_D=params.block_d, HAS_MASK=has_mask, SPLIT=split, FP32_DOT=fp32_dot(q.dtype),
        FUSE_MERGE=fuse, MERGE_SPLITS=merge_bound(params.num_splits, fuse),
        num_warps=params.num_warps, num_stages=params.num_stages, **launch_args(q))
    if split and not fuse:
        merge_splits(out, o_part, lse_part)
    return out
