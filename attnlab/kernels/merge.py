"""Second pass of split-KV attention: merge per-split partial outputs by their log-sum-exp."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from attnlab.kernels.heuristics import next_pow2


@triton.jit
def _merge_kernel(O, O_PART, LSE_PART, num_splits,
                  stride_ot, stride_oh, stride_pt, stride_ph, stride_ps, stride_lt, stride_lh,
                  HEAD_DIM: tl.constexpr, BLOCK_S: tl.constexpr, BLOCK_D: tl.constexpr):
    t = tl.program_id(0).to(tl.int64)
    h = tl.program_id(1)
    offs_s = tl.arange(0, BLOCK_S)
    offs_d = tl.arange(0, BLOCK_D)
    s_mask = offs_s < num_splits
    d_mask = offs_d < HEAD_DIM
    lse = tl.load(LSE_PART + t * stride_lt + h * stride_lh + offs_s, mask=s_mask, other=float("-inf"))
    m = tl.max(lse, 0)
    m = tl.where(m == float("-inf"), 0.0, m)
    w = tl.math.exp2(lse - m)  # empty splits (lse = -inf) weigh 0
    denom = tl.sum(w, 0)
    part = O_PART + t * stride_pt + h * stride_ph + offs_s[:, None] * stride_ps + offs_d[None, :]
    o = tl.load(part, mask=s_mask[:, None] & d_mask[None, :], other=0.0)
    out = tl.sum(o * w[:, None], 0) / tl.where(denom > 0, denom, 1.0)
    tl.store(O + t * stride_ot + h * stride_oh + offs_d, out.to(O.dtype.element_ty), mask=d_mask)


def merge_splits(out: torch.Tensor, o_part: torch.Tensor, lse_part: torch.Tensor) -> None:
    """out: [T, Hq, D]; o_part: [T, Hq, S, D] fp32; lse_part: [T, Hq, S] fp32 (log2 domain)."""
    num_tokens, num_heads, num_splits, head_dim = o_part.shape
    if num_tokens == 0:
        return
    _merge_kernel[(num_tokens, num_heads)](
        out, o_part, lse_part, num_splits,
        out.stride(0), out.stride(1), *o_part.stride()[:3], lse_part.stride(0), lse_part.stride(1),
        HEAD_DIM=head_dim, BLOCK_S=max(2, next_pow2(num_splits)), BLOCK_D=max(16, next_pow2(head_dim)),
        num_warps=4 if head_dim >= 128 else 2,
    )
