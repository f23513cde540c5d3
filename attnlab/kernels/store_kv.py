"""KV store: write new tokens' K/V into their pool slots (slot -1 = skip), a Triton ``KVPool.store``."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from attnlab.kernels.heuristics import next_pow2
from attnlab.kernels.pdl import launch_args, pdl_start
from attnlab.kvcache.pool import KVPool


@triton.jit
def _store_kv_kernel(K, V, K_CACHE, V_CACHE, SLOTS, inv_k_scale, inv_v_scale,
                     stride_kt, stride_kh, stride_vt, stride_vh, stride_slot, stride_ch,
                     NUM_HEADS: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_H: tl.constexpr,
                     BLOCK_D: tl.constexpr, QUANT: tl.constexpr, USE_PDL: tl.constexpr = False):
    pdl_start(USE_PDL)
    t = tl.program_id(0).to(tl.int64)
    slot = tl.load(SLOTS + t).to(tl.int64)
    offs_h = tl.arange(0, BLOCK_H)
    offs_d = tl.arange(0, BLOCK_D)
    heads = tl.where(slot >= 0, NUM_HEADS, 0)  # no heads at all for a skipped token
    mask = (offs_h[:, None] < heads) & (offs_d[None, :] < HEAD_DIM)
    k = tl.load(K + t * stride_kt + offs_h[:, None] * stride_kh + offs_d[None, :], mask=mask, other=0.0)
    v = tl.load(V + t * stride_vt + offs_h[:, None] * stride_vh + offs_d[None, :], mask=mask, other=0.0)
    if QUANT:  # fp8 pool: stored = value / scale
        k = k.to(tl.float32) * inv_k_scale
        v = v.to(tl.float32) * inv_v_scale
    dst = slot * stride_slot + offs_h[:, None] * stride_ch + offs_d[None, :]
    tl.store(K_CACHE + dst, k.to(K_CACHE.dtype.element_ty), mask=mask)
    tl.store(V_CACHE + dst, v.to(V_CACHE.dtype.element_ty), mask=mask)


def store_kv(pool: KVPool, layer: int, k: torch.Tensor, v: torch.Tensor, slots: torch.Tensor) -> None:
    """k, v: [num_tokens, kv_heads, head_dim] (last dim contiguous); slots: [num_tokens] int32/int64
    flat pool slots (page * page_size + offset), -1 = skip (nothing written, not even the scratch page)."""
    num_tokens = k.shape[0]
    if num_tokens == 0:
        return
    if k.stride(-1) != 1 or v.stride(-1) != 1:
        k, v = k.contiguous(), v.contiguous()
    lay = pool.slots_view(layer)
    k_cache, v_cache = lay[0], lay[1]
    _store_kv_kernel[(num_tokens,)](
        k, v, k_cache, v_cache, slots, 1.0 / pool.k_scale, 1.0 / pool.v_scale,
        k.stride(0), k.stride(1), v.stride(0), v.stride(1), k_cache.stride(0), k_cache.stride(1),
        NUM_HEADS=pool.num_kv_heads, HEAD_DIM=pool.head_dim, BLOCK_H=next_pow2(pool.num_kv_heads),
        BLOCK_D=max(16, next_pow2(pool.head_dim)), QUANT=pool.is_fp8, num_warps=4, **launch_args(k))
