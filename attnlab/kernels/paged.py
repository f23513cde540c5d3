"""Triton building blocks shared by the decode and extend kernels: paged KV tile addressing, one
online-softmax step over a KV tile, and writing a (possibly partial, split-KV) result.

Pool layout per layer (KVPool.layer): ``[2, num_pages + 1, page_size, kv_heads, head_dim]``; K and V are
passed as the two ``[num_slots, kv_heads, head_dim]`` halves, token slot = page * page_size + offset.
Scores live in the log2 domain (scale folded with log2(e)) so the kernels use exp2.
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def tile_slots(KV_INDICES, page_base, start, offs_n, n_mask, PAGE_SIZE: tl.constexpr, BLOCK_N: tl.constexpr,
               MASKED: tl.constexpr = False):
    """Pool slots (int64) of KV positions start + offs_n of a request whose pages start at page_base.

    Where a tile fits a page, its one page id is loaded unmasked: callers pass only tiles that start inside the
    request (start < its length). ``MASKED``: every lane's page id under ``n_mask`` instead, for a tile that may lie
    wholly past the request (the decode's early first tile of an empty split: its page id would lie past the table)."""
    if PAGE_SIZE % BLOCK_N == 0 and not MASKED:
        # A tile never crosses a page (tiles start at multiples of BLOCK_N): one page id, contiguous slots.
        page = tl.load(KV_INDICES + page_base + start // PAGE_SIZE).to(tl.int64)
        slots = page * PAGE_SIZE + (start % PAGE_SIZE) + offs_n
    else:
        pos = start + offs_n
        page = tl.load(KV_INDICES + page_base + pos // PAGE_SIZE, mask=n_mask, other=0).to(tl.int64)
        slots = page * PAGE_SIZE + pos % PAGE_SIZE
    return slots


@triton.jit
def attend_tile(q, acc, m_i, l_i, K, V, slots, head_off, offs_d, d_mask, n_mask, valid, qk_scale,
                stride_slot, FP32_DOT: tl.constexpr, MASKED: tl.constexpr, EVEN_D: tl.constexpr,
                V_FIRST: tl.constexpr = False):
    """One online-softmax step. q: [M, D]; acc: [M, D] fp32; m_i, l_i: [M] fp32 (log2 domain);
    valid: [M, N] bool (False = masked). Rows with nothing valid so far keep m_i = -inf, acc = 0.

    MASKED False: a tile wholly inside every row's window and the KV bounds (the extend kernel's tiles below the
    causal band): no ``valid`` select and no load mask but the head-dim one (none when EVEN_D, BLOCK_D == D).

    ``V_FIRST`` (MASKED only): V's load before K's in program order, for loops of one stage (nothing pipelines their
    loads; decode.set_v_first, off by default). Triton 3.6 places K's conversion to the dot's layout (shared-memory
    stores, which wait for K's data) right after K's load, and V's load after that: K then V, one round trip after the
    other. V first puts both in flight together, and measured slower (experiments/decode-vfirst/). The same values and
    operations: the same bits."""
    kv_off = slots[:, None] * stride_slot + head_off + offs_d[None, :]
    kv_mask = (n_mask[:, None] & d_mask[None, :]) if MASKED else d_mask[None, :]
    if V_FIRST:
        tl.static_assert(MASKED, "V_FIRST is for masked tiles")
        v = tl.load(V + kv_off, mask=kv_mask, other=0.0)
    if EVEN_D and not MASKED:
        k = tl.load(K + kv_off)
    else:
        k = tl.load(K + kv_off, mask=kv_mask, other=0.0)
    p, alpha, m_new, l_i = softmax_step(q, k, m_i, l_i, valid, qk_scale, FP32_DOT, MASKED)
    if EVEN_D and not MASKED:  # V's load after the scores in program order (the compiler may hoist it)
        v = tl.load(V + kv_off)
    elif not V_FIRST:
        v = tl.load(V + kv_off, mask=kv_mask, other=0.0)
    return accumulate(acc, alpha, p, v, q, FP32_DOT), m_new, l_i


@triton.jit
def attend_loaded(q, acc, m_i, l_i, k, v, valid, qk_scale, FP32_DOT: tl.constexpr):
    """``attend_tile`` (MASKED) over K / V tiles the caller loaded: the same operations in the same order."""
    p, alpha, m_new, l_i = softmax_step(q, k, m_i, l_i, valid, qk_scale, FP32_DOT, True)
    return accumulate(acc, alpha, p, v, q, FP32_DOT), m_new, l_i


@triton.jit
def softmax_step(q, k, m_i, l_i, valid, qk_scale, FP32_DOT: tl.constexpr, MASKED: tl.constexpr):
    """The scores of a K tile and the online softmax's update: (p, alpha, m_new, l_i)."""
    if FP32_DOT:  # fp32 inputs, or the interpreter (its bf16 tl.dot is wrong in Triton 3.9)
        qk = tl.dot(q.to(tl.float32), tl.trans(k.to(tl.float32)), input_precision="ieee")
    else:
        qk = tl.dot(q, tl.trans(k.to(q.dtype)))
    if MASKED:
        qk = tl.where(valid, qk * qk_scale, float("-inf"))
    else:
        qk = qk * qk_scale
    m_new = tl.maximum(m_i, tl.max(qk, 1))
    m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
    alpha = tl.math.exp2(m_i - m_safe)
    p = tl.math.exp2(qk - m_safe[:, None])
    return p, alpha, m_new, l_i * alpha + tl.sum(p, 1)


@triton.jit
def accumulate(acc, alpha, p, v, q, FP32_DOT: tl.constexpr):
    """acc rescaled by alpha plus p @ v (fp32; p and v in q's dtype unless FP32_DOT)."""
    if FP32_DOT:
        acc = acc * alpha[:, None] + tl.dot(p, v.to(tl.float32), input_precision="ieee")
    else:
        acc = acc * alpha[:, None] + tl.dot(p.to(q.dtype), v.to(q.dtype))
    return acc


@triton.jit
def write_result(acc, m_i, l_i, O, O_PART, LSE_PART, rows, heads, split, offs_d, row_mask, d_mask, v_scale,
                 stride_ot, stride_oh, stride_pt, stride_ph, stride_ps, stride_lt, stride_lh,
                 SPLIT: tl.constexpr):
    """Final output (SPLIT False) or this split's normalized partial output and log2-sum-exp.

    O: [T, Hq, D]; O_PART: [T, Hq, S, D] fp32 (or the output's dtype: the triton backend's decode_partials);
    LSE_PART: [T, Hq, S] fp32 (split stride 1)."""
    has = l_i > 0
    o = acc / tl.where(has, l_i, 1.0)[:, None] * v_scale
    mask = row_mask[:, None] & d_mask[None, :]
    if SPLIT:
        part = rows.to(tl.int64) * stride_pt + heads * stride_ph + split * stride_ps
        tl.store(O_PART + part[:, None] + offs_d[None, :], o.to(O_PART.dtype.element_ty), mask=mask)
        lse = tl.where(has, m_i + tl.math.log2(tl.where(has, l_i, 1.0)), float("-inf"))
        tl.store(LSE_PART + rows.to(tl.int64) * stride_lt + heads * stride_lh + split, lse, mask=row_mask)
    else:
        out = rows.to(tl.int64) * stride_ot + heads * stride_oh
        tl.store(O + out[:, None] + offs_d[None, :], o.to(O.dtype.element_ty), mask=mask)
