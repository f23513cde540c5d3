"""What a device-planned FlashInfer draft step writes before its attention (backends/flashinfer.py, _DeviceStep),
inside the draft's CUDA graph: each row's last-page length from its KV length and the launch's layout, and at
step 0 the launch's kv_indptr and page ids into the wrapper's buffers (shared by every slot-1 wrapper, so every
launch writes its own). One launch a step, where torch ops took four at step 0 and two host-launched copies."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from attnlab.kernels.heuristics import interpreter_on
from attnlab.kernels.pdl import launch_args, pdl_start

BLOCK_I = 1024  # page ids copied per program


@triton.jit
def _step_meta_kernel(KV_LENS, KV_INDPTR, LAST, SRC_IDX, DST_INDPTR, DST_IDX, rows, n_idx, page_size,
                      COPY: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_I: tl.constexpr, USE_PDL: tl.constexpr = False):
    pdl_start(USE_PDL)
    pid = tl.program_id(0)
    if pid == 0:
        r = tl.arange(0, BLOCK_R)
        m = r < rows
        lo = tl.load(KV_INDPTR + r, mask=m, other=0)
        hi = tl.load(KV_INDPTR + r + 1, mask=m, other=0)
        n = tl.load(KV_LENS + r, mask=m, other=0)
        tl.store(LAST + r, n - (hi - lo - 1) * page_size, mask=m)
        if COPY:
            m1 = r < rows + 1
            tl.store(DST_INDPTR + r, tl.load(KV_INDPTR + r, mask=m1, other=0), mask=m1)
    if COPY:  # the launch's page ids only (kv_indptr[rows] of them), not the buffer's capacity
        used = tl.minimum(tl.load(KV_INDPTR + rows), n_idx)
        if pid * BLOCK_I < used:
            i = pid * BLOCK_I + tl.arange(0, BLOCK_I)
            mi = i < used
            tl.store(DST_IDX + i, tl.load(SRC_IDX + i, mask=mi, other=0), mask=mi)


def write_step_meta(kv_lens: torch.Tensor, kv_indptr: torch.Tensor, last_page_len: torch.Tensor, page_size: int,
                    copy: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None) -> None:
    """last_page_len[i] = kv_lens[i] - page_size x (pages of row i - 1) over the layout ``kv_indptr`` [rows + 1]
    (int32, rows = len(kv_lens)); a value <= 0 is a step before its row's last page (FlashInfer's kernel reads the
    length as (pages - 1) x page_size + last). ``copy`` = (dst_indptr [rows + 1], src_indices, dst_indices): also
    copy the layout: kv_indptr, and the kv_indptr[rows] page ids it uses (read on the device; the grid covers
    src_indices, which dst_indices must hold)."""
    rows = kv_lens.shape[0]
    if copy and copy[2].numel() < copy[1].numel():
        raise ValueError(f"write_step_meta: {copy[1].numel()} page ids do not fit the {copy[2].numel()}-id buffer")
    n_idx = copy[1].numel() if copy else 0
    src_idx, dst_indptr, dst_idx = (copy[1], copy[0], copy[2]) if copy else (kv_lens, kv_lens, kv_lens)
    if kv_lens.device.type != "cuda" and not interpreter_on() and torch.cuda.is_available():
        # CPU tensors where Triton compiles for this machine's GPU (a fake backend's tests): the same in torch. (A
        # machine with no GPU and no interpreter is attnlab.kernels.aot's compile-only run: the kernel, compiled.)
        _step_meta_torch(kv_lens, kv_indptr, last_page_len, page_size, copy)
        return
    grid = (max(1, triton.cdiv(n_idx, BLOCK_I)),)
    _step_meta_kernel[grid](kv_lens, kv_indptr, last_page_len, src_idx, dst_indptr, dst_idx, rows, n_idx, page_size,
                            COPY=copy is not None, BLOCK_R=triton.next_power_of_2(rows + 1), BLOCK_I=BLOCK_I,
                            num_warps=4, **launch_args(kv_lens))


def _step_meta_torch(kv_lens, kv_indptr, last_page_len, page_size, copy) -> None:
    """write_step_meta for CPU tensors where Triton compiles for the GPU (a fake backend's tests on a GPU machine)."""
    rows = kv_lens.shape[0]
    pages = kv_indptr[1:rows + 1] - kv_indptr[:rows]
    last_page_len.copy_(kv_lens - (pages - 1) * page_size)
    if copy:
        dst_indptr, src_idx, dst_idx = copy
        dst_indptr[:rows + 1] = kv_indptr[:rows + 1]
        used = min(int(kv_indptr[rows]), src_idx.numel())
        dst_idx[:used] = src_idx[:used]
