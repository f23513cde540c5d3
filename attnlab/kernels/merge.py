"""Second pass of split-KV attention: merge per-split partial outputs by their log-sum-exp.

``merge_splits`` is its own kernel launch after the attention kernel. ``merge_arrived`` does the same inside the
attention kernel (``fused_merge``): each program counts itself in on an int32 counter per (query block, kv head)
after writing its partial, and the program that arrives last merges every split of those rows and resets the
counter to 0 (so the next launch, or graph replay, finds it there). One launch less per layer and pass.

A two-level merge (the last of each group of splits merges the group, the last group merger the groups), to shorten
the tail in which one SM reads every split's partial after its atomic (Llama-8B's batch-1 4k decode: 64 KB), was
built and measured slower (H200, 2026-12-07, experiments/fused-merge-auto/ call 5: groups of 4 / 8 took 1.08-1.18x
one level's time at both shapes' batch-1 4k decode, PDL off and on; 1.00x at 16k), and removed: commit 79ca901 has
it (merge.set_merge_group, bench arm +mgroup<g>).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from attnlab.kernels.heuristics import next_pow2
from attnlab.kernels.pdl import launch_args, pdl_start


@triton.jit
def _merge_kernel(O, O_PART, LSE_PART, num_splits,
                  stride_ot, stride_oh, stride_pt, stride_ph, stride_ps, stride_lt, stride_lh,
                  HEAD_DIM: tl.constexpr, BLOCK_S: tl.constexpr, BLOCK_D: tl.constexpr, USE_PDL: tl.constexpr = False):
    pdl_start(USE_PDL)
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
    """out: [T, Hq, D]; o_part: [T, Hq, S, D] fp32 or out's dtype (read into fp32 sums); lse_part: [T, Hq, S] fp32
    (log2 domain)."""
    num_tokens, num_heads, num_splits, head_dim = o_part.shape
    if num_tokens == 0:
        return
    _merge_kernel[(num_tokens, num_heads)](
        out, o_part, lse_part, num_splits,
        out.stride(0), out.stride(1), *o_part.stride()[:3], lse_part.stride(0), lse_part.stride(1),
        HEAD_DIM=head_dim, BLOCK_S=max(2, next_pow2(num_splits)), BLOCK_D=max(16, next_pow2(head_dim)),
        num_warps=4 if head_dim >= 128 else 2, **launch_args(out))


def merge_bound(num_splits: int, fused: bool, unroll: bool = True) -> int:
    """``merge_arrived``'s MAX_SPLITS for a launch of ``num_splits``: the next power of two (each its own compiled
    variant: warmup compiles the plans' own counts; an eager pass in a new power-of-two bucket compiles mid-run),
    0 (``unroll`` False: the runtime loop, one variant), 1 where the kernel does not merge (no variant)."""
    if not fused or num_splits <= 1:
        return 1
    return next_pow2(num_splits) if unroll else 0


def check_fused_merge(option) -> bool | str:
    """``option`` if it is a value of the triton backend's ``fused_merge`` (a bool or "auto"), else ValueError."""
    if not isinstance(option, bool) and option != "auto":
        raise ValueError(f"fused_merge={option!r}: must be true, false or auto")
    return option


# The decode launch (BLOCK_D, BLOCK_N, warps, stages) whose fused splits of several tiles run under a register cap: the
# heuristic's 64-token tile of 4 warps and 3 stages at head dim 128 (Llama-8B's splits of several tiles). Fused, without
# PDL, ptxas gave it 155 registers a thread (3 programs a SM, not the heuristic's 4; 106 with the merge launch; 120 both
# with PDL): 1.10-1.14x the merge launch's time. Capped at 128 (no spills) it took 0.978-0.998x without PDL and
# 0.917-1.001x with (H100, 2026-12-07, experiments/fused-merge-auto/ call 4, batch 4-32 x 4k / 16k). At SmolLM2's
# tile the same cap made ptxas take all 128 registers (96 uncapped) and spill: not capped there, and auto keeps its
# merge launch. Auto fuses these loops only up to CAPPED_MAX_SPLITS splits: the cells measured held 2-16, and past 16
# the merge's unrolled loads spill under the cap (ptxas, triton 3.6, Llama-8B shapes: 4 bytes at 32 splits without PDL,
# 8-24 at 64; none at 2-16: fused-merge-auto/results/cpu-regs-{capped-rule,maxnreg128-past16}-triton3.6.txt).
CAPPED_TILE = (128, 64, 4, 3)
FUSED_MAXNREG = 128
CAPPED_MAX_SPLITS = 16


def capped_fused_tile(params) -> bool:
    """Whether ``params`` is a decode of CAPPED_TILE whose splits loop over several tiles (not ``one_tile``: those
    were measured uncapped, and with PDL run one stage): fused, up to CAPPED_MAX_SPLITS splits, it runs with
    ``maxnreg`` FUSED_MAXNREG. BLOCK_D 128 holds head dims 65-128 (measured at 128 only); a ``decode_tiles`` override
    of the same tile (64x4x3) matches too."""
    tile = (params.block_d, params.block_n, params.num_warps, params.num_stages)
    return params.kind == "decode" and not params.one_tile and tile == CAPPED_TILE


def fused_launch_args(params, fused: bool) -> dict:
    """The launch options a decode of ``params`` adds when it merges inside the kernel: the register cap at
    CAPPED_TILE up to CAPPED_MAX_SPLITS splits (what was measured), nothing elsewhere (fused_merge=true past it runs
    uncapped, as before)."""
    capped = fused and capped_fused_tile(params) and params.num_splits <= CAPPED_MAX_SPLITS
    return {"maxnreg": FUSED_MAXNREG} if capped else {}


def partials_dtype(option: str, params, dtype: torch.dtype) -> torch.dtype:
    """The split partial outputs' dtype of a launch of ``params`` (a LaunchParams) under the triton backend's
    ``decode_partials``: ``dtype`` (the backend's) for a decode under "out", fp32 otherwise (the extend and invariant
    kernels, and the default)."""
    return dtype if option == "out" and params.kind == "decode" else torch.float32


def fuses_merge(option: bool | str, params) -> bool:
    """Whether a launch of ``params`` (a LaunchParams) merges its splits inside the kernel (``merge_arrived``) under
    the triton backend's ``fused_merge``: true, every split launch (decode, extend, and the invariant kernel, which
    merges one split too); "auto", a split decode whose every split holds one KV tile (``params.one_tile``, the
    heuristic's) or that loops over CAPPED_TILE's tiles in at most CAPPED_MAX_SPLITS splits (launched under the
    register cap), the extend and invariant kernels keeping their merge launch; false, none."""
    if option == "auto":
        capped = capped_fused_tile(params) and params.num_splits <= CAPPED_MAX_SPLITS
        return params.kind == "decode" and params.num_splits > 1 and (params.one_tile or capped)
    return option is True and (params.kind == "invariant" or params.num_splits > 1)


def merge_counters(programs: int, num_kv_heads: int, device) -> torch.Tensor:
    """The zeroed arrival counters ``merge_arrived`` needs: one per (request or query block, kv head) of a grid
    of ``programs`` x ``num_kv_heads`` x splits."""
    return torch.zeros(max(1, programs) * num_kv_heads, dtype=torch.int32, device=device)


@triton.jit
def _merge_one(lse_rows, part, s, stride_ps, row_mask, mask, m, acc, denom):
    """Split ``s``'s partial into the ordered merge's sums; a split a row does not reach (lse -inf) leaves them."""
    lse = tl.load(lse_rows + s, mask=row_mask, other=float("-inf"), cache_modifier=".cg")
    w = tl.math.exp2(lse - m)[:, None]
    o = tl.load(part + s * stride_ps, mask=mask, other=0.0, cache_modifier=".cg")
    seen = (lse > float("-inf"))[:, None]
    return tl.where(seen, acc + o * w, acc), tl.where(seen, denom + w, denom)


@triton.jit
def merge_arrived(O, O_PART, LSE_PART, COUNTERS, ticket, num_splits, rows, heads, row_mask, offs_d, d_mask,
                  stride_ot, stride_oh, stride_pt, stride_ph, stride_ps, stride_lt, stride_lh,
                  MAX_SPLITS: tl.constexpr):
    """Called by every split program of one (query block, kv head) after ``write_result`` (SPLIT) wrote its partial;
    the last to arrive on ``COUNTERS[ticket]`` merges rows x heads of O from all ``num_splits`` partials.

    The CTA barrier orders every thread's partial stores before the arrival, the acq_rel atomic publishes them
    (release) and, in the last program, makes the others' visible (acquire); its loads bypass L1 (.cg). The merge
    is the ordered one of attnlab.kernels.invariant (splits one at a time in index order, a split a row does not
    reach skipped): per element the same operations in the same order, so the same bits as ``merge_ordered`` and
    an invariant kernel stays invariant with it.

    ``MAX_SPLITS`` (a power of two >= num_splits, ``merge_bound``) unrolls both loops, splits past num_splits masked
    off: no load depends on the sums, so the compiler issues them together. A loop bounded by the runtime split
    count waits for each load in turn, 2 x num_splits L2 round trips in one program after every other had finished
    (H200, 2026-12-02b: 0.025 ms against 0.007 for SmolLM2's batch-1 decode with the merge as its own launch;
    unrolled 0.008). ``MAX_SPLITS`` 0 keeps that runtime loop: one compiled variant for every split count, which the
    invariant kernel needs (its split count follows the context, up to 128 at 32k, and its warmup compiles three).
    Both give the same bits (the same operations in the same order).

    Each thread holds rows x D / threads values a split; the fewer, the more splits' loads the compiler keeps in flight
    at once. The decode passes its GQA group's real heads as ``rows`` (padded to a power of two), not its tile's M rows
    padded to 16 for tl.dot: at SmolLM2's batch-1 4k that is 4 x 64 x 32 values, not 16 x 64 x 32 (H100, 2026-12-06d:
    5.99 -> 4.68 us; how many loads issue together is the compiler's choice: experiments/fused-merge/sass.py)."""
    tl.debug_barrier()
    arrived = tl.atomic_add(COUNTERS + ticket, 1, sem="acq_rel")
    if arrived == num_splits - 1:
        out = merge_partials(O_PART, LSE_PART, num_splits, rows, heads, row_mask, offs_d, d_mask, stride_pt,
                             stride_ph, stride_ps, stride_lt, stride_lh, MAX_SPLITS)
        store_merged(O, COUNTERS, ticket, out, rows, heads, row_mask, offs_d, d_mask, stride_ot, stride_oh)


@triton.jit
def store_merged(O, COUNTERS, ticket, out, rows, heads, row_mask, offs_d, d_mask, stride_ot, stride_oh):
    """The merger's last step: its rows x D of O (``out``, fp32, in O's dtype) and its arrival counter back to 0."""
    dst = O + (rows.to(tl.int64) * stride_ot + heads * stride_oh)[:, None] + offs_d[None, :]
    tl.store(dst, out.to(O.dtype.element_ty), mask=row_mask[:, None] & d_mask[None, :])
    tl.store(COUNTERS + ticket, 0)


@triton.jit
def merge_partials(O_PART, LSE_PART, num_splits, rows, heads, row_mask, offs_d, d_mask, stride_pt, stride_ph,
                   stride_ps, stride_lt, stride_lh, MAX_SPLITS: tl.constexpr):
    """``merge_arrived``'s merge proper, once its program knows every partial is published: rows x D fp32 outputs
    from all ``num_splits`` partials, in split order (``MAX_SPLITS``: as there; experiments/decode-regcap/stamps.py
    times it from inside). A version with a compile-time split stride and no per-split bound mask (26% fewer sm_90a
    instructions after the add, the same bits) gained nothing (H100, 2026-12-07, experiments/decode-regcap/ call 4)
    and was removed: commit d2fbb55 has it (``SPLIT_STEP`` / ``ALL_SPLITS``, lean.py)."""
    lse_rows = LSE_PART + rows.to(tl.int64) * stride_lt + heads * stride_lh
    part = O_PART + (rows.to(tl.int64) * stride_pt + heads * stride_ph)[:, None] + offs_d[None, :]
    mask = row_mask[:, None] & d_mask[None, :]
    m = tl.full([row_mask.shape[0]], float("-inf"), tl.float32)
    zero = rows * 0  # a split index as a row tensor: num_splits may be a runtime value or a constant
    if MAX_SPLITS == 0:
        for s in range(num_splits):
            m = tl.maximum(m, tl.load(lse_rows + s, mask=row_mask, other=float("-inf"), cache_modifier=".cg"))
    else:
        for s in tl.static_range(MAX_SPLITS):
            live = row_mask & (zero + s < num_splits)
            m = tl.maximum(m, tl.load(lse_rows + s, mask=live, other=float("-inf"), cache_modifier=".cg"))
    m = tl.where(m == float("-inf"), 0.0, m)
    acc = tl.zeros([row_mask.shape[0], offs_d.shape[0]], tl.float32)
    denom = tl.zeros([row_mask.shape[0], offs_d.shape[0]], tl.float32)
    if MAX_SPLITS == 0:
        for s in range(num_splits):
            acc, denom = _merge_one(lse_rows, part, s, stride_ps, row_mask, mask, m, acc, denom)
    else:
        for s in tl.static_range(MAX_SPLITS):
            live = row_mask & (zero + s < num_splits)
            acc, denom = _merge_one(lse_rows, part, s, stride_ps, live, mask & live[:, None], m, acc, denom)
    return acc / tl.where(denom > 0, denom, 1.0)
