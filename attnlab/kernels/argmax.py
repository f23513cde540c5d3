"""Greedy tokens of a few rows of logits in one launch: ``argmax_rows(x [M <= 16, V]) == x.argmax(-1)``.

torch's argmax gives each row to one thread block: 13 us for SmolLM2's 49,152-entry vocabulary and 27-36 us for
Llama-3's 128,256 on an H200 (bench.profile, experiments/h200-2026-12-03d), a step's single longest small kernel.
Here the vocabulary is split over column tiles of ``BLOCK`` (one program each, every row of the tile at once); each
program writes its tiles' maxima and first maximal columns, takes one ticket, and the program that arrives last
reduces the tiles in column order, a later tile winning only with a strictly larger maximum: the first maximal
column, as torch's (the LM head's argmax epilogue, ``gemm._argmax_tail``, is the same reduction). Values compare in
fp32, an exact widening of any input dtype, so a bf16 row gives the index its fp32 copy would. A NaN is skipped
where torch would return its index. Row-invariant: a row's answer never depends on the others.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from attnlab.kernels import gemm
from attnlab.kernels.pdl import launch_args, pdl_start

BLOCK = 512  # columns per program: 96 programs at SmolLM2's vocabulary, 251 at Llama-3's
MAX_ROWS = gemm.MAX_M
# Whether the engine takes a CUDA side's greedy tokens here (True) or from torch's argmax (False: a bench arm's
# ``+amtorch``, the before of this kernel). Process-wide, like attnlab.kernels.gemm's switches.
DEFAULT_ON = True
_on = DEFAULT_ON


def enabled() -> bool:
    return _on


def set_enabled(on: bool) -> None:
    global _on
    _on = bool(on)


def greedy(logits: torch.Tensor) -> torch.Tensor:
    """``logits.argmax(-1)`` for [R, V] logits: through ``argmax_rows`` on a CUDA tensor of at most MAX_ROWS rows
    (when enabled), else torch's. The one difference: a row holding a NaN gets its largest number's column here,
    the NaN's from torch."""
    if _on and logits.is_cuda and logits.dim() == 2 and 0 < logits.shape[0] <= MAX_ROWS and logits.shape[1] > 0:
        return argmax_rows(logits)
    return logits.argmax(dim=-1)


@triton.jit
def _argmax_rows_kernel(X, OUT, PART, TICKET, M, N, stride_xm, BLOCK_N: tl.constexpr, BLOCK_M: tl.constexpr,
                        RED: tl.constexpr, USE_PDL: tl.constexpr = False):
    pdl_start(USE_PDL)
    pid_n = tl.program_id(0)
    j = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_m = tl.arange(0, BLOCK_M)
    n_mask = j < N
    m_mask = offs_m < M
    x = tl.load(X + offs_m[None, :].to(tl.int64) * stride_xm + j[:, None], mask=n_mask[:, None] & m_mask[None, :],
                other=float("-inf")).to(tl.float32)  # [BLOCK_N, BLOCK_M]: the epilogue's layout
    gemm._argmax_tail(x, offs_m, j, m_mask, n_mask, OUT, PART, TICKET, X, X, pid_n, X.dtype.element_ty, False, False,
                      BLOCK_M, RED)


def argmax_rows(x: torch.Tensor) -> torch.Tensor:
    """x [M <= 16, V] (fp32 / fp16 / bf16) -> [M] int64, the first maximal column of each row (``x.argmax(-1)``)."""
    if x.dim() != 2 or x.shape[0] > MAX_ROWS:
        raise ValueError(f"argmax_rows: x must be [M <= {MAX_ROWS}, V], got {tuple(x.shape)}")
    if x.dtype not in (torch.float32, torch.float16, torch.bfloat16):
        raise ValueError(f"argmax_rows: x is {x.dtype}; fp32 / fp16 / bf16")
    m, n = x.shape
    if n == 0 or n >= 1 << 24:
        raise ValueError(f"argmax_rows: V={n} columns (1 .. 2^24 - 1: the partials hold columns as exact fp32)")
    out = torch.empty(m, dtype=torch.int64, device=x.device)
    if m == 0:
        return out
    if x.stride(-1) != 1:
        x = x.contiguous()
    tiles = triton.cdiv(n, BLOCK)
    part = torch.empty(2, tiles, gemm.BLOCK_M, dtype=torch.float32, device=x.device)
    ticket = gemm._ticket_buffer(x.device)[gemm.ARGMAX_TICKET:]  # the LM head epilogue's: one stream, never both at once
    try:
        _argmax_rows_kernel[(tiles,)](x, out, part, ticket, m, n, x.stride(0), BLOCK_N=BLOCK, BLOCK_M=gemm.BLOCK_M,
                                      RED=gemm.ARGMAX_BLOCK, num_warps=4, **launch_args(x))
    except BaseException:
        ticket[:1].zero_()  # a launch cut short may leave the ticket taken
        raise
    return out
