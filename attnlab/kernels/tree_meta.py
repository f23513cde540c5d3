"""One frontier pass's device metadata in one launch (attnlab.spec.tree_device): the K branch rows' pool slots and
RoPE positions, each request's KV length and mask offset, and the dense custom mask the extend kernel reads.

The torch version of the same (tests/spec/test_tree_device.py's reference, with ``tree.draft_step_mask``) is about
30 launches a pass, by count, inside a pass that took ~0.25 ms of device time on the H200 (experiments/h200-2026-12-03c);
this kernel replaces them with one (what that saves is still to be measured). It reads the staged buffer (``tree_device.tree_steps_layout``) and the frontier's
ancestor ranks (``TreeState.frontier_anc`` [rows, K, s]: tree column d K + anc[d] is branch row r's ancestor at
depth d + 1), so a column c of row r is visible iff c < kv_start (the prefix) or anc[(c - kv_start) // K] ==
(c - kv_start) % K.

Grid (rows, K, column blocks): every program writes one block of one branch row's mask; the block-0 programs also
write the row's slot and position, and those of branch 0 the request's KV length and mask offset (the exclusive
prefix sum of K x kv_len over the rows before it, summed in the program: rows <= a graph bucket).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from attnlab.kernels.heuristics import next_pow2
from attnlab.kernels.pdl import launch_args, pdl_start

BLOCK = 1024  # mask columns per program


@triton.jit
def _tree_meta_kernel(META, ANC, SLOTS, POS, KV_LENS, MASK_INDPTR, MASK, rows, s, stride_ab, stride_ar,
                      O_ROPE, O_REAL, O_INDPTR, O_INDICES,
                      K: tl.constexpr, PAGE_SIZE: tl.constexpr, BLOCK: tl.constexpr, ROWS_P2: tl.constexpr,
                      USE_PDL: tl.constexpr = False):
    pdl_start(USE_PDL)
    b = tl.program_id(0)
    r = tl.program_id(1)
    blk = tl.program_id(2)
    offs_rows = tl.arange(0, ROWS_P2)
    starts = tl.load(META + offs_rows, mask=offs_rows < rows, other=0).to(tl.int64)
    sizes = K * (starts + s * K)
    base = tl.sum(tl.where(offs_rows < b, sizes, 0), axis=0)  # this request's block in the flat mask
    kv_start = tl.load(META + b).to(tl.int64)
    kv_len = kv_start + s * K
    cols = blk * BLOCK + tl.arange(0, BLOCK)
    inside = cols < kv_len
    rel = cols - kv_start
    tree = inside & (rel >= 0)
    anc = tl.load(ANC + b * stride_ab + r * stride_ar + tl.where(tree, rel // K, 0), mask=tree, other=-1)
    visible = (rel < 0) | (anc == rel % K)
    tl.store(MASK + base + r * kv_len + cols, visible.to(tl.uint8), mask=inside)
    if blk == 0:
        pos = kv_start + (s - 1) * K + r
        real = tl.load(META + O_REAL + b)
        page = tl.load(META + O_INDICES + tl.load(META + O_INDPTR + b) + pos // PAGE_SIZE).to(tl.int64)
        slot = tl.where(real > 0, page * PAGE_SIZE + pos % PAGE_SIZE, -1)
        tl.store(SLOTS + b * K + r, slot)
        tl.store(POS + b * K + r, tl.load(META + O_ROPE + b).to(tl.int64) + s)
        if r == 0:
            tl.store(KV_LENS + b, kv_len.to(tl.int32))
            tl.store(MASK_INDPTR + b, base)


def tree_step_meta(meta: torch.Tensor, rows: int, topk: int, s: int, page_size: int, frontier_anc: torch.Tensor,
                   kv_lens: torch.Tensor, mask_indptr: torch.Tensor, mask: torch.Tensor, width: int):
    """Frontier pass s (1 .. S - 1) of a device-planned tree draft. meta: the staged int32 buffer over ``rows``
    rows; frontier_anc [rows, K, s] int64. Writes kv_lens [rows] int32, mask_indptr [rows] int64 and the mask's
    blocks (uint8; columns up to ``width``, the longest KV a pass can have). -> (positions, slots) [rows * K]
    int64."""
    from attnlab.spec.tree_device import tree_steps_layout

    K = topk
    if frontier_anc.shape != (rows, K, s) or frontier_anc.stride(2) != 1:
        raise ValueError(f"tree_step_meta: frontier_anc {tuple(frontier_anc.shape)} (stride {frontier_anc.stride()}), "
                         f"want ({rows}, {K}, {s}) with its last dim contiguous")
    _, o_rope, _, o_real, o_indptr, o_indices = tree_steps_layout(rows)
    positions = torch.empty(rows * K, dtype=torch.int64, device=meta.device)
    slots = torch.empty(rows * K, dtype=torch.int64, device=meta.device)
    grid = (rows, K, triton.cdiv(width, BLOCK))
    _tree_meta_kernel[grid](meta, frontier_anc, slots, positions, kv_lens, mask_indptr, mask, rows, s,
                            frontier_anc.stride(0), frontier_anc.stride(1), o_rope, o_real, o_indptr, o_indices,
                            K=K, PAGE_SIZE=page_size, BLOCK=BLOCK, ROWS_P2=max(2, next_pow2(rows)), num_warps=4,
                            **launch_args(meta))
    return positions, slots
