"""Invariant paged attention (``engine.invariant=true``): one code path for prefill, decode and verify, whose
result for a query row depends only on the model shape and that row's visible context length.

What makes the default kernels round differently for the same row: the decode kernel and the extend kernel
are different programs (GQA rows vs token x GQA rows, other tile sizes), and both cut a request's KV into
``num_splits`` equal chunks chosen per pass from the batch and the SM count, merged by a tree reduction
whose shape follows that count. Here, for every pass:

- one kernel, with launch parameters fixed by the model shape alone (``invariant_params``): BLOCK_M rows =
  up to INVARIANT_TOKENS query tokens x the GQA group (a decode pass fills one token's rows of it), a fixed
  KV tile BLOCK_N, and a fixed **split size in tokens** (``split_tokens``, a multiple of BLOCK_N): split s
  always covers KV positions [s * split_tokens, (s + 1) * split_tokens), so a row's splits, their tiles and
  the order of the tiles within a split depend on its context length only. The grid's split count (the
  longest request's, or the longest context a CUDA graph can see) only adds splits that a row does not
  reach: they write an empty partial (lse = -inf) and are skipped by the merge;
- tiles past a row's causal limit inside its program (another row of the block sees further) are fully
  masked for it: p = 0 exactly, alpha = 1 exactly, so its accumulators do not change;
- always split-KV, always merged (one split too): ``_merge_ordered_kernel`` combines a row's splits in
  index order, one at a time (max first, then the weighted sum), never as a tree.

Under the Triton interpreter (CPU tests) the two dots are elementwise products summed per output element
(``ROWWISE_DOT``): the interpreter's ``tl.dot`` is numpy's BLAS matmul, whose rows round differently by
their position in the tile (OpenBLAS' Haswell kernel: rows 0-5 and 6+ of a 16-row tile), which a GPU's
tensor-core MMA does not do. The GPU test runs the real ``tl.dot``.

New K/V are stored in the pool before attention (as for every backend), so cached and new tokens are read
the same way. Rows of other requests never share a program. A tree (custom) mask is not supported: tree
ancestors sit at tree slots, not at their positions (config refuses it).

Cost against the default kernels: the merge pass always runs, a verify of more than INVARIANT_TOKENS
tokens reads the KV once per block of them, and prefill runs in small query blocks (slow for long prompts).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from attnlab.kernels.decode import LOG2E
from attnlab.kernels.heuristics import LaunchParams, cdiv, fp32_dot, interpreter_on, next_pow2
from attnlab.kernels.merge import merge_arrived, merge_bound, merge_counters
from attnlab.kernels.paged import tile_slots, write_result
from attnlab.kernels.pdl import launch_args, pdl_start

INVARIANT_TOKENS = 8  # query tokens per program (x the GQA group = BLOCK_M rows, 16..64)
WARMUP_SPLITS = (1, 2, 16)  # grid split counts that compile the kernel's three int specializations (warmup_invariant)
DEFAULT_SPLIT_TOKENS = 256  # KV tokens per split


def invariant_params(*, group: int, head_dim: int, max_kv_len: int, split_tokens: int | None = None) -> LaunchParams:
    """Launch parameters of the invariant kernel: everything but the grid's split count is a function of
    (group, head_dim, split_tokens); num_splits = the splits ``max_kv_len`` needs (at least 1)."""
    block_d = max(16, next_pow2(head_dim))
    block_m = max(next_pow2(group), min(64, max(16, next_pow2(INVARIANT_TOKENS * group))))
    block_n = 64 if block_d <= 128 else 32
    if block_m >= 64 and block_d >= 128:  # large M x D fp32 accumulator: smaller KV tiles, as the extend kernel
        block_n = 32
    split = split_tokens or DEFAULT_SPLIT_TOKENS
    split = cdiv(split, block_n) * block_n  # whole tiles per split
    return LaunchParams("invariant", block_m, block_n, block_d, block_m // group, max(1, cdiv(max_kv_len, split)),
                        num_warps=4, num_stages=2 if block_d >= 256 else 3, split_tokens=split)


@triton.jit
def _dot(a, b, FP32_DOT: tl.constexpr, ROWWISE_DOT: tl.constexpr):
    """a [M, K] @ b [K, N] with an fp32 result; ROWWISE_DOT: each element summed on its own (interpreter)."""
    if ROWWISE_DOT:
        return tl.sum(a.to(tl.float32)[:, :, None] * b.to(tl.float32)[None, :, :], 1)
    if FP32_DOT:
        return tl.dot(a.to(tl.float32), b.to(tl.float32), input_precision="ieee")
    return tl.dot(a, b)


@triton.jit
def _attend_tile(q, acc, m_i, l_i, K, V, slots, head_off, offs_d, d_mask, n_mask, valid, qk_scale, stride_slot,
                 FP32_DOT: tl.constexpr, ROWWISE_DOT: tl.constexpr):
    """attnlab.kernels.paged.attend_tile with the dot of ``_dot``: one online-softmax step over a KV tile.
    A tile where a row sees nothing leaves its m_i, l_i and acc bitwise as they were (alpha = exp2(0) = 1,
    p = exp2(-inf) = 0)."""
    kv_off = slots[:, None] * stride_slot + head_off + offs_d[None, :]
    kv_mask = n_mask[:, None] & d_mask[None, :]
    k = tl.load(K + kv_off, mask=kv_mask, other=0.0).to(q.dtype)
    qk = _dot(q, tl.trans(k), FP32_DOT, ROWWISE_DOT)
    qk = tl.where(valid, qk * qk_scale, float("-inf"))
    m_new = tl.maximum(m_i, tl.max(qk, 1))
    m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
    alpha = tl.math.exp2(m_i - m_safe)
    p = tl.math.exp2(qk - m_safe[:, None])
    l_i = l_i * alpha + tl.sum(p, 1)
    v = tl.load(V + kv_off, mask=kv_mask, other=0.0).to(q.dtype)
    acc = acc * alpha[:, None] + _dot(p.to(q.dtype), v, FP32_DOT, ROWWISE_DOT)
    return acc, m_new, l_i


@triton.jit
def _invariant_kernel(Q, K, V, O, O_PART, LSE_PART, COUNTERS, QO_INDPTR, KV_INDPTR, KV_INDICES, KV_LENS, BLOCK_REQ,
                      BLOCK_QSTART, qk_scale, v_scale, num_splits,
                      stride_qt, stride_qh, stride_slot, stride_kh, stride_ot, stride_oh, stride_pt, stride_ph,
                      stride_ps, stride_lt, stride_lh,
                      GROUP: tl.constexpr, HEAD_DIM: tl.constexpr, PAGE_SIZE: tl.constexpr,
                      TOKENS_PER_BLOCK: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                      BLOCK_D: tl.constexpr, SPLIT_TOKENS: tl.constexpr, FP32_DOT: tl.constexpr,
                      ROWWISE_DOT: tl.constexpr, FUSE_MERGE: tl.constexpr, MERGE_SPLITS: tl.constexpr,
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

    row_limit = prefix + tok + 1  # causal: row sees positions < row_limit
    kv_hi = tl.minimum(kv_len, prefix + tl.minimum(q0 + TOKENS_PER_BLOCK, q_len))
    lo = split * SPLIT_TOKENS  # fixed boundaries: the same for every row, pass and grid
    hi = tl.minimum(lo + SPLIT_TOKENS, kv_hi)

    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
    head_off = kvh * stride_kh
    for start in range(lo, hi, BLOCK_N):
        pos = start + offs_n
        n_mask = pos < hi
        slots = tile_slots(KV_INDICES, page_base, start, offs_n, n_mask, PAGE_SIZE, BLOCK_N)
        valid = m_mask[:, None] & n_mask[None, :] & (pos[None, :] < row_limit[:, None])
        acc, m_i, l_i = _attend_tile(q, acc, m_i, l_i, K, V, slots, head_off, offs_d, d_mask, n_mask, valid,
                                     qk_scale, stride_slot, FP32_DOT, ROWWISE_DOT)
    write_result(acc, m_i, l_i, O_PART, O_PART, LSE_PART, rows, heads, split, offs_d, m_mask, d_mask, v_scale,
                 0, 0, stride_pt, stride_ph, stride_ps, stride_lt, stride_lh, True)
    if FUSE_MERGE:  # the ordered merge, by the last split to arrive: merge_ordered's bits, one launch less
        merge_arrived(O, O_PART, LSE_PART, COUNTERS, pid * tl.num_programs(1) + kvh, num_splits, rows, heads, m_mask,
                      offs_d, d_mask, stride_ot, stride_oh, stride_pt, stride_ph, stride_ps, stride_lt, stride_lh,
                      MERGE_SPLITS)


@triton.jit
def _merge_ordered_kernel(O, O_PART, LSE_PART, num_splits,
                          stride_ot, stride_oh, stride_pt, stride_ph, stride_ps, stride_lt, stride_lh,
                          HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, USE_PDL: tl.constexpr = False):
    pdl_start(USE_PDL)
    t = tl.program_id(0).to(tl.int64)
    h = tl.program_id(1)
    offs_d = tl.arange(0, BLOCK_D)
    d_mask = offs_d < HEAD_DIM
    lse_row = LSE_PART + t * stride_lt + h * stride_lh
    part_row = O_PART + t * stride_pt + h * stride_ph
    m = tl.full([BLOCK_D], float("-inf"), tl.float32)  # every lane holds the same value
    for s in range(num_splits):
        m = tl.maximum(m, tl.load(lse_row + s))
    m = tl.where(m == float("-inf"), 0.0, m)
    acc = tl.zeros([BLOCK_D], tl.float32)
    denom = tl.zeros([BLOCK_D], tl.float32)
    for s in range(num_splits):  # in split order, one at a time: the same sums for any grid
        lse = tl.load(lse_row + s)
        w = tl.math.exp2(lse - m)
        o = tl.load(part_row + s * stride_ps + offs_d, mask=d_mask, other=0.0)
        seen = lse > float("-inf")  # a split the row does not reach leaves its sums untouched
        acc = tl.where(seen, acc + o * w, acc)
        denom = tl.where(seen, denom + w, denom)
    out = acc / tl.where(denom > 0, denom, 1.0)
    tl.store(O + t * stride_ot + h * stride_oh + offs_d, out.to(O.dtype.element_ty), mask=d_mask)


def merge_ordered(out: torch.Tensor, o_part: torch.Tensor, lse_part: torch.Tensor) -> None:
    """out: [T, Hq, D]; o_part: [T, Hq, S, D] fp32 or out's dtype (read into fp32 sums); lse_part: [T, Hq, S] fp32
    (log2 domain)."""
    num_tokens, num_heads, num_splits, head_dim = o_part.shape
    if num_tokens == 0:
        return
    _merge_ordered_kernel[(num_tokens, num_heads)](
        out, o_part, lse_part, num_splits,
        out.stride(0), out.stride(1), *o_part.stride()[:3], lse_part.stride(0), lse_part.stride(1),
        HEAD_DIM=head_dim, BLOCK_D=max(16, next_pow2(head_dim)), num_warps=1, **launch_args(out))


def paged_invariant(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, out: torch.Tensor,
                    qo_indptr: torch.Tensor, kv_indptr: torch.Tensor, kv_indices: torch.Tensor,
                    kv_lens: torch.Tensor, block_req: torch.Tensor, block_qstart: torch.Tensor, *,
                    page_size: int, scale: float, params: LaunchParams, o_part: torch.Tensor,
                    lse_part: torch.Tensor, k_scale: float = 1.0, v_scale: float = 1.0,
                    counters: torch.Tensor | None = None) -> torch.Tensor:
    """Invariant attention over a paged pool (causal); writes and returns ``out``.

    Arguments as ``attnlab.kernels.extend.paged_extend`` (block_req / block_qstart from
    ``query_blocks(q_lens, params.tokens_per_block)``); o_part [T, Hq, params.num_splits, D] and lse_part
    [T, Hq, params.num_splits] fp32 scratch are always required (every pass merges). ``counters`` (int32
    [>= num_blocks * Hkv], all 0): the merge runs inside the kernel (merge.merge_arrived, the same bits)."""
    num_blocks = block_req.shape[0]
    num_heads, head_dim = q.shape[1], q.shape[2]
    num_kv_heads = k_cache.shape[1]
    if o_part.shape[2] != params.num_splits or lse_part.shape[2] != params.num_splits:
        raise ValueError(f"paged_invariant: scratch holds {o_part.shape[2]} splits, params {params.num_splits}")
    if num_blocks == 0:
        return out
    fuse = counters is not None
    _invariant_kernel[(num_blocks, num_kv_heads, params.num_splits)](
        q, k_cache, v_cache, out, o_part, lse_part, counters if fuse else block_req, qo_indptr, kv_indptr, kv_indices,
        kv_lens, block_req, block_qstart, scale * k_scale * LOG2E, v_scale, params.num_splits,
        q.stride(0), q.stride(1), k_cache.stride(0), k_cache.stride(1), out.stride(0), out.stride(1),
        *o_part.stride()[:3], lse_part.stride(0), lse_part.stride(1),
        GROUP=num_heads // num_kv_heads, HEAD_DIM=head_dim, PAGE_SIZE=page_size,
        TOKENS_PER_BLOCK=params.tokens_per_block, BLOCK_M=params.block_m, BLOCK_N=params.block_n,
        BLOCK_D=params.block_d, SPLIT_TOKENS=params.split_tokens, FP32_DOT=fp32_dot(q.dtype),
        ROWWISE_DOT=interpreter_on(), FUSE_MERGE=fuse,
        MERGE_SPLITS=merge_bound(params.num_splits, fuse, unroll=False),
        num_warps=params.num_warps, num_stages=params.num_stages,
        **launch_args(q))
    if not fuse:
        merge_ordered(out, o_part, lse_part)
    return out


def warmup_invariant(num_q_heads: int, num_kv_heads: int, head_dim: int, page_size: int, dtype: torch.dtype,
                     kv_dtype: torch.dtype, device, split_tokens: int | None = None,
                     fused_merge: bool = False) -> list[dict]:
    """Compile the invariant kernel and its merge by launches on a tiny dummy pool; -> one record per launch, as
    attnlab.kernels.warmup's. The split count is a runtime value, but Triton specializes an int argument that is
    1 (a constant) or a multiple of 16 (a divisibility hint), and the split count also sets the partials' split
    stride: ``WARMUP_SPLITS`` (1, 2, 16) launches one grid of each kind, so neither an eager pass over a long
    prompt nor a graph plan for the longest context (16 or 32 splits of 256 tokens) compiles mid-run. The splits
    past the dummy's one token are empty, as a graph's are."""
    import dataclasses
    import time

    from attnlab.kernels.extend import query_blocks
    from attnlab.kvcache import KVPool, build_layout

    device = torch.device(device)
    base = invariant_params(group=num_q_heads // num_kv_heads, head_dim=head_dim, max_kv_len=1,
                            split_tokens=split_tokens)
    pool = KVPool(1, 1, page_size, num_kv_heads, head_dim, kv_dtype, device)
    layout = build_layout([[0]], [1], page_size, device)
    k_cache = pool.layer(0)[0].view(-1, num_kv_heads, head_dim)
    v_cache = pool.layer(0)[1].view(-1, num_kv_heads, head_dim)
    q = torch.zeros(1, num_q_heads, head_dim, dtype=dtype, device=device)
    as_t = lambda x: torch.tensor(x, dtype=torch.int32, device=device)
    reqs, starts = query_blocks([1], base.tokens_per_block)
    records = []
    for splits in WARMUP_SPLITS:
        params = dataclasses.replace(base, num_splits=splits)
        t0 = time.perf_counter()
        paged_invariant(q, k_cache, v_cache, torch.empty_like(q), as_t([0, 1]), layout.kv_indptr, layout.kv_indices,
                        layout.kv_lens, as_t(reqs), as_t(starts), page_size=page_size, scale=head_dim ** -0.5,
                        params=params,
                        o_part=torch.empty(1, num_q_heads, splits, head_dim, dtype=torch.float32, device=device),
                        lse_part=torch.empty(1, num_q_heads, splits, dtype=torch.float32, device=device),
                        k_scale=pool.k_scale, v_scale=pool.v_scale,
                        counters=merge_counters(len(reqs), num_kv_heads, device) if fused_merge else None)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        records.append({"params": params, "custom_mask": False, "example": (1, 1, 1), "fused_merge": fused_merge,
                        "seconds": time.perf_counter() - t0})
    return records
