"""XQA's page table in one launch (backends/flashinfer_xqa.py, ``flashinfer`` with ``verify_backend=xqa``): row r of a
[batch, width] int32 table holds request r's page ids from the CSR layout (kv_indptr, kv_indices), the scratch page
past them.

The torch ops it replaces were about a dozen launches a verify pass, issued by the host before the verify graph's
replay while the GPU waits for them: on an H200 (2026-12-05f, experiments/xqa-verify) XQA's verify phase took 0.12-0.38
ms an iteration more than fa2's, whose kept plans write three buffers, and its host time in that phase was 0.05-0.26 ms
more. What this kernel saves is to be measured (experiments/xqa-verify/run.sh 4).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from attnlab.kernels.pdl import launch_args, pdl_start

BLOCK = 256  # table columns per program


@triton.jit(do_not_specialize=["width", "pad_page"])  # one variant whatever the width (eager passes grow it)
def _page_table_kernel(INDPTR, INDICES, TABLE, LENS_SRC, LENS_DST, width, pad_page, HAS_PAGES: tl.constexpr,
                       COPY_LENS: tl.constexpr, BLOCK: tl.constexpr, USE_PDL: tl.constexpr = False):
    pdl_start(USE_PDL)
    r = tl.program_id(0)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    start = tl.load(INDPTR + r)
    inside = cols < tl.load(INDPTR + r + 1) - start
    if HAS_PAGES:
        ids = tl.load(INDICES + start + cols, mask=inside, other=0)
    else:  # no page in the whole pass (kv_indices empty): nothing to read
        ids = tl.zeros([BLOCK], dtype=tl.int32)
    tl.store(TABLE + r * width + cols, tl.where(inside, ids, pad_page).to(tl.int32), mask=cols < width)
    if COPY_LENS:  # by the row's first program
        first = tl.program_id(1) == 0
        tl.store(LENS_DST + r, tl.load(LENS_SRC + r, mask=first, other=0), mask=first)


def write_page_table(kv_indptr: torch.Tensor, kv_indices: torch.Tensor, out: torch.Tensor, pad_page: int,
                     lens: tuple[torch.Tensor, torch.Tensor] | None = None) -> None:
    """Fill ``out`` [batch, width] int32 (row-contiguous) with each request's page ids, ``pad_page`` past them, and
    with ``lens`` = (src, dst) copy the requests' KV lengths (a graph slot's buffer) in the same launch. The caller
    checks that no request holds more than ``width`` pages (it knows the longest on the host)."""
    batch, width = out.shape
    if kv_indptr.shape != (batch + 1,) or out.dtype != torch.int32 or out.stride() != (width, 1):
        raise ValueError(f"write_page_table: kv_indptr {tuple(kv_indptr.shape)} for a table {tuple(out.shape)} "
                         f"{out.dtype} of strides {out.stride()}; want kv_indptr ({batch + 1},), int32, row-contiguous")
    if lens is not None and not (lens[0].numel() == lens[1].numel() == batch and lens[1].is_contiguous()):
        raise ValueError(f"write_page_table: lens of {lens[0].numel()} / {lens[1].numel()} for a batch of {batch}")
    if {t.device for t in (kv_indptr, kv_indices, *(lens or ()))} != {out.device}:
        raise ValueError(f"write_page_table: inputs on {kv_indptr.device} / {kv_indices.device}, the table on "
                         f"{out.device}")
    # the kernel reads its inputs at unit stride: a strided view is copied (a no-op for the staged layouts)
    kv_indptr, kv_indices = kv_indptr.contiguous(), kv_indices.contiguous()
    if batch == 0 or width == 0:
        if lens is not None:
            lens[1].copy_(lens[0])
        return
    src, dst = (lens[0].contiguous(), lens[1]) if lens is not None else (kv_indptr, kv_indptr)  # unread without lens
    _page_table_kernel[(batch, triton.cdiv(width, BLOCK))](
        kv_indptr, kv_indices if kv_indices.numel() else kv_indptr, out, src, dst, width, pad_page,
        HAS_PAGES=kv_indices.numel() > 0, COPY_LENS=lens is not None, BLOCK=BLOCK, num_warps=1, **launch_args(out))
