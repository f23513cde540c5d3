"""Paged decode (q_len <= 1 per request): split-KV flash-decoding, GQA-aware.

One program per (request, kv head, split). Its M rows are the GQA group of query heads that share the kv
head (padded to >= 16 rows for tl.dot), so each K/V tile is read once for the whole group. With
num_splits > 1 each program writes a partial output + log-sum-exp and ``merge_splits`` combines them, or, given
``counters`` (the triton backend's fused_merge; by default where each split is one tile, and merge.CAPPED_TILE's
loops), the split that finishes last does (``merge_arrived``).
Split boundaries are computed in the kernel from the request's own kv_len (a multiple of BLOCK_N per
split), so a plan's grid stays valid while lengths change (CUDA-graph replay).

With programmatic dependent launch (engine.pdl) each program reads its plan's metadata (qo / kv indptr, KV lengths,
page ids) and issues ``prefetch.global.L2`` for the K / V rows of its split's first ``KV_PREFETCH_TILES`` tiles
*before* its ``griddepcontrol.wait``, while the previous kernel (the layer's qkv projection or KV store) still runs:
the chain metadata -> page ids -> K / V is then mostly behind it. The outputs never depend on the early plan reads:
the program reads its plan again after the wait and computes only from values equal to that (the early tile's K / V,
below, are used only then). That the early values are
the right ones, so the prefetch stays inside this request's pages, rests on this: no launch directly before an
attention kernel writes a plan: plans are written by host copies, torch ops and step kernels that always have another
launch (the embedding, a projection) between them and the attention. The current token's own K / V row, which the
previous kernel may be storing, is safe to prefetch: L2 is the point of coherence, and the loads after the wait read
its final bits. ``set_kv_prefetch(0)`` restores the wait-first order (a bench arm's ``+kvpf0``) and turns the early
tile below off with it.

On a launch of one stage (a split of one tile where this early tile applies: ``early_launch``, decided per launch; or
a ``decode_tiles`` override) and a tile inside ``early_launch``'s gates, the early reads also give the split's first
tile (``EARLY_TILE``). Right after the wait, q and that tile's K / V loads go out at the early plan's
addresses, together with the plan's and the tile's page ids' re-reads: one round trip where the wait-first chain took
three (plan, page ids, K / V). The tile is used only if every re-read equals its early read, which the rule above
makes always; otherwise the split runs from its first tile on the re-read plan. Either way the same tiles and
operations in the same order: the same bits as PDL off (GPU tests, one of which breaks the rule on purpose). Those
early loads are real loads, issued before the check: should the rule ever break, the fallback is exact as long as the
early values are a plan the buffers held (in-bounds rows and page ids), which every plan write keeps, and (with the
preload below) the stale plan's rows are none the launch before writes.

That tile's K and V rows (its K only on tiles past 128 x 64: PRELOAD, ``set_early_preload``) are loaded into
registers before the wait, not prefetched into L2 and loaded after it: all but the current token's own row (position
kv_len - 1), which the launch before may be storing. That one row is loaded after the wait, over the early ones. Every
other row of the request was stored by an earlier pass, whose launches completed before the one directly before this
kernel began (every kernel waits before it lets the next launch). The early tile needs rows of whole L2 lines
(``early_launch``), so no line the early loads bring into L1 holds a byte of the current token's row: its load after
the wait misses L1 and reads L2, the point of coherence. Used under the same check as the early tile: the same bits
(CPU and GPU tests, one of which stores the current token's row late on purpose).
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from attnlab.kernels.heuristics import LaunchParams, fp32_dot
from attnlab.kernels.merge import fused_launch_args, merge_arrived, merge_bound, merge_splits
from attnlab.kernels.paged import attend_loaded, attend_tile, tile_slots, write_result
from attnlab.kernels.pdl import L2_LINE, launch_args, pdl_start, prefetch_l2
from attnlab.kernels.switches import scoped

LOG2E = 1.0 / math.log(2.0)
# With PDL: before its wait, each program reads its plan metadata and page ids and prefetches into L2 the K / V rows of
# its split's first KV_PREFETCH_TILES tiles (module docstring; not where that one tile is preloaded whole, PRELOAD 2). 0
# = the wait first, as every other kernel. 1, not the first version's 4 (H200 2026-12-03d, batch 1): on an H100,
# 2026-12-06h, 1 tile took 0.89-1.00x 4 tiles' time at batch 16 / 64 (but Llama-8B's 16 x 512, 0.95-1.04x), where 4 had
# made PDL on slower than c101f91 (SmolLM2's 16 x 4k: 26.1 against 24.3 us; 1 tile 23.4), and at batch 1 each split is
# one tile, so both prefetch the same bytes. The arms, 2 and 0 tiles and what is not understood:
# experiments/decode-early/ calls 14-15.
KV_PREFETCH_TILES = 1
_kv_prefetch = KV_PREFETCH_TILES
# The early first tile (EARLY_TILE) on one-stage launches of at most this many tile elements (BLOCK_N x BLOCK_D); past
# EARLY_TILE_SMALL_ELEMS (128 x 64, the whole gate until 2026-12-07, at any warps) only at EARLY_TILE_THREAD_ELEMS
# elements of K a thread or fewer: the two-tile rule's 128 x 128 tile of 8 warps, not 128 x 128 of 4 warps
# (decode_tiles=128x4x1, 128 a thread: 1.01-1.03x slower with the fused merge in four H100 calls). The rule's tile
# measured with it (bench arm +early16384, experiments/decode-early/, PDL on): Llama-8B's batch 1 x 4k 0.971-0.990x the
# time in three H200 rounds (fused-merge-auto/ calls 6-7, decode-early/ call 17) and 0.978-0.995x in five H100 rounds
# (decode-early/ calls 13 and 16; decode-vfirst/, with V first); unsplit batch 1-8 x 128 0.85-0.87x; unsplit batch 16
# x 128 (128 programs) 1.06x; with fused_merge=false 1.12x / 1.23x at batch 8 x 512 / 4 x 1k (the default fuses those
# splits: 0.97x / 1.01x; call 13). Against it: call 2 had 128x8x1 fused 1.01x slower with it, an A/B across two code
# trees (efbe5b5's and the early tile's). Not timed: fp8 KV at that tile. +early8192 is the old gate, launch for launch.
EARLY_TILE_MAX_ELEMS = 128 * 128
EARLY_TILE_SMALL_ELEMS = 128 * 64
EARLY_TILE_THREAD_ELEMS = 64
_early_max_elems = EARLY_TILE_MAX_ELEMS
# One-stage launches load a tile's K, then its V: Triton 3.6 issues V's loads only after K's data arrived (K's
# conversion to the dot's layout sits between them). V first (paged.attend_tile's V_FIRST, set_v_first(1), the bench arm
# +vfirst1) puts both in flight and was slower (H100, 2026-12-07, experiments/decode-vfirst/): Llama-8B's batch-1 4k
# decode 1.11-1.14x the time with PDL and 1.06-1.07x without, SmolLM2's 1.00-1.02x, every other cell 0.98-1.04x.
_v_first = 0
# How much of the early first tile is loaded into registers before the PDL wait, all rows but the current token's
# (module docstring): 2 its K and V on tiles of at most EARLY_TILE_SMALL_ELEMS (128 x 64), its K only past them
# (Llama-8B's 128 x 128 tile of 8 warps: K and V there held 128 registers with 16 spill bytes under triton 3.6, K only
# none). Measured (H100, 2026-12-07, experiments/decode-preload/, PDL on, against no preload): SmolLM2's batch-1 4k
# 0.91-0.92x the time (3.93-3.96 us, 1.600-1.607x c101f91's speed in three floor rounds), its other early-tile cells
# 0.85-0.96x; Llama-8B's 128-token unsplit cells with K only 0.72-0.99x (K and V, before the cap: 0.81-0.91x, but
# 1.07x at batch 32); its batch-1 4k 1.00x. set_early_preload(0 / 1) and the bench arms +preload0 / +preload1 cap it
# (none; K only everywhere).
EARLY_PRELOAD = 2
_preload = EARLY_PRELOAD


def set_kv_prefetch(tiles: int) -> None:
    """How many KV tiles of its split each decode program prefetches before its PDL wait (process-wide, like
    engine.gemm_prefetch; 0 = none, the metadata read after the wait too, and no early first tile). Nothing without
    PDL."""
    global _kv_prefetch
    _kv_prefetch = check_kv_prefetch(tiles)


def check_kv_prefetch(tiles: int) -> int:
    """``tiles`` if it is a valid KV prefetch, else ValueError naming the rule."""
    return _int_in(tiles, 8, "decode KV prefetch", "KV tiles")


def _int_in(value, most: int, what: str, unit: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= most:
        raise ValueError(f"{what} {value!r}: an int of {unit} in 0..{most}")
    return value


def kv_prefetch() -> int:
    return _kv_prefetch


def kv_prefetching(tiles: int):
    """``set_kv_prefetch(tiles)`` for a block (bench arms), restored after."""
    return scoped(kv_prefetch, set_kv_prefetch, tiles)


def set_v_first(on: int) -> None:
    """Whether one-stage decode launches load each tile's V before its K (process-wide, V_FIRST; a bench arm's
    ``+vfirst1``): 0 by default, K first, whose conversion to the dot's layout waits for K before V's load is issued;
    1 puts both in flight, measured slower (``_v_first``'s note). The same bits either way. An early tile loaded before
    the PDL wait (``set_early_preload``) keeps its own order."""
    global _v_first
    _v_first = check_v_first(on)


def _flag(value, what: str, off: str, on: str) -> int:
    """``value`` if it is a 0 / 1 switch (an int, not a bool), else ValueError naming both settings."""
    if isinstance(value, bool) or not isinstance(value, int) or value not in (0, 1):
        raise ValueError(f"{what} {value!r}: 0 ({off}) or 1 ({on})")
    return value


def check_v_first(on) -> int:
    """``on`` if it is a valid V-first switch (0 or 1), else ValueError naming the rule."""
    return _flag(on, "decode V-first order", "K's load first", "V's")


def v_first() -> int:
    return _v_first


def v_first_order(on: int):
    """``set_v_first(on)`` for a block (bench arms), restored after."""
    return scoped(v_first, set_v_first, on)


# The split loop's page ids one tile ahead (PAGE_AHEAD; set_page_ahead(1), the bench arm +ahead1; off by default):
# each tile's K / V slots come from a page-id load issued in the tile before, not in its own iteration. Compiled for
# sm_90a under triton 3.6 (experiments/decode-regcap/stages.py, Llama-8B's batch-1 16k loop of 64-token tiles), the
# default loop waits for all its async copies at each tile's start (cp.async.wait_group 0): one tile in flight a
# program, 3 and 4 stages the same PTX. With the page ids a tile ahead the pipeliner keeps 2 / 4 copy groups in flight
# at 3 / 4 stages (K and V apart: one / two tiles copied ahead of the one computing; 70 / 102 KiB of shared memory
# against 38). Every valid lane's slots, the loads and the sums are the same: the same bits. Untimed.
_page_ahead = 0


def set_page_ahead(on: int) -> None:
    """Whether the decode's split loop loads each tile's page ids in the tile before (process-wide, PAGE_AHEAD; a bench
    arm's ``+ahead1``): 0 by default; 1 lets Triton's pipeliner put several tiles' K / V copies in flight on launches
    of several stages (``_page_ahead``'s note). The same bits either way."""
    global _page_ahead
    _page_ahead = check_page_ahead(on)


def check_page_ahead(on) -> int:
    """``on`` if it is a valid page-ahead switch (0 or 1), else ValueError naming the rule."""
    return _flag(on, "decode page ids ahead", "each tile's in its own iteration", "a tile ahead")


def page_ahead() -> int:
    return _page_ahead


def page_ahead_order(on: int):
    """``set_page_ahead(on)`` for a block (bench arms), restored after."""
    return scoped(page_ahead, set_page_ahead, on)


def set_early_preload(level: int) -> None:
    """How much of the early first tile is loaded into registers before the PDL wait (process-wide, PRELOAD; a bench
    arm's ``+preload<level>``): 0 none (prefetched into L2, loaded after the wait), 1 its K rows, 2 (EARLY_PRELOAD, the
    default) its K and V rows on tiles of at most EARLY_TILE_SMALL_ELEMS, its K past them (``_preload``'s note). The
    current token's row, which the launch before may be storing, is loaded after the wait either way: the same bits."""
    global _preload
    _preload = check_early_preload(level)


def check_early_preload(level) -> int:
    """``level`` if it is a valid preload level (0, 1 or 2), else ValueError naming the rule."""
    if isinstance(level, bool) or not isinstance(level, int) or level not in (0, 1, 2):
        raise ValueError(f"decode early-tile preload {level!r}: 0 (none before the PDL wait), 1 (K) or 2 (K and V)")
    return level


def early_preload() -> int:
    return _preload


def early_preloading(level: int):
    """``set_early_preload(level)`` for a block (bench arms), restored after."""
    return scoped(early_preload, set_early_preload, level)


def set_early_tile_max(elems: int) -> None:
    """The early first tile's size gate in tile elements (BLOCK_N x BLOCK_D; process-wide, like the KV prefetch):
    EARLY_TILE_MAX_ELEMS (128 x 128) by default, 0 = no early tile (a one-tile split then keeps the heuristic's
    stages), 128 x 64 the gate before 2026-12-07, which left out Llama-8B's one-tile splits of 128 tokens (a bench arm's
    ``+early8192``). Past EARLY_TILE_SMALL_ELEMS a tile also needs at most EARLY_TILE_THREAD_ELEMS a thread; with at
    most 8 warps (decode_tiles' bound) no tile past 128 x 128 passes that."""
    global _early_max_elems
    _early_max_elems = check_early_tile_max(elems)


def check_early_tile_max(elems: int) -> int:
    """``elems`` if it is a valid early-tile gate, else ValueError naming the rule."""
    return _int_in(elems, 256 * 128, "decode early tile gate", "tile elements")


def early_tile_max() -> int:
    return _early_max_elems


def early_tile_limit(elems: int):
    """``set_early_tile_max(elems)`` for a block (bench arms), restored after."""
    return scoped(early_tile_max, set_early_tile_max, elems)


@triton.jit
def _prefetch_kv(K, V, KV_INDICES, page_base, lo, hi, head_off, stride_slot, PAGE_SIZE: tl.constexpr,
                 BLOCK_N: tl.constexpr, ROW: tl.constexpr, LINE: tl.constexpr, TILES: tl.constexpr):
    """L2 prefetch of the K and V rows (ROW elements, one prefetch per LINE) of the first TILES tiles of [lo, hi).
    Tiles past hi are skipped whole (their lanes, all pointed at one line, made an L2 hot spot: the H200's batch-1
    decode at 4k, one tile a split, lost 5.0 -> 5.6 us for SmolLM2, 12.0 -> 14.6 us for Llama-8B); a tile's lanes past
    hi prefetch page 0's rows (tile_slots' masked page id), valid memory spread over several lines."""
    offs_n = tl.arange(0, BLOCK_N)
    lines = tl.arange(0, ROW // LINE) * LINE
    for t in tl.static_range(TILES):
        start = lo + t * BLOCK_N
        if start < hi:
            slots = tile_slots(KV_INDICES, page_base, start, offs_n, start + offs_n < hi, PAGE_SIZE, BLOCK_N)
            off = slots[:, None] * stride_slot + head_off + lines[None, :]
            prefetch_l2(K + off)
            prefetch_l2(V + off)


@triton.jit
def _load_q(Q, row, row_mask, heads, offs_d, d_mask, stride_qt, stride_qh):
    """A program's q rows: [BLOCK_M, BLOCK_D], rows past the group (or all, for a padding request) zero."""
    return tl.load(Q + row.to(tl.int64) * stride_qt + heads[:, None] * stride_qh + offs_d[None, :],
                   mask=row_mask[:, None] & d_mask[None, :], other=0.0)


@triton.jit
def _decode_kernel(Q, K, V, O, O_PART, LSE_PART, COUNTERS, QO_INDPTR, KV_INDPTR, KV_INDICES, KV_LENS,
                   qk_scale, v_scale, num_splits,
                   stride_qt, stride_qh, stride_slot, stride_kh, stride_ot, stride_oh,
                   stride_pt, stride_ph, stride_ps, stride_lt, stride_lh,
                   GROUP: tl.constexpr, HEAD_DIM: tl.constexpr, PAGE_SIZE: tl.constexpr,
                   BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
                   SPLIT: tl.constexpr, FP32_DOT: tl.constexpr, FUSE_MERGE: tl.constexpr,
                   MERGE_SPLITS: tl.constexpr, BLOCK_G: tl.constexpr, PREFETCH: tl.constexpr = 0,
                   LINE: tl.constexpr = 64, EARLY_TILE: tl.constexpr = False, PRELOAD: tl.constexpr = 0,
                   V_FIRST: tl.constexpr = False, PAGE_AHEAD: tl.constexpr = False, USE_PDL: tl.constexpr = False):
    b = tl.program_id(0)
    kvh = tl.program_id(1)
    split = tl.program_id(2)
    offs_d = tl.arange(0, BLOCK_D)
    d_mask = offs_d < HEAD_DIM
    head_off = kvh * stride_kh
    if PREFETCH > 0:  # the plan's metadata and page ids, and (PDL) an L2 prefetch of the first K / V tiles, before the
        # wait (module docstring: the launch before an attention kernel never writes its plan)
        row_e = tl.load(QO_INDPTR + b)
        q_len_e = tl.load(QO_INDPTR + b + 1) - row_e
        kv_len_e = tl.load(KV_LENS + b) * q_len_e
        base_e = tl.load(KV_INDPTR + b)
        chunk_e = tl.cdiv(tl.cdiv(kv_len_e, num_splits), BLOCK_N) * BLOCK_N
        if USE_PDL and not (PRELOAD == 2 and PREFETCH == 1):  # (then the one tile prefetched is the one preloaded)
            _prefetch_kv(K, V, KV_INDICES, base_e, split * chunk_e, tl.minimum(split * chunk_e + chunk_e, kv_len_e),
                         head_off, stride_slot, PAGE_SIZE, BLOCK_N, HEAD_DIM, LINE, PREFETCH)
        if EARLY_TILE:  # the first tile's page ids too
            lo_e = split * chunk_e
            offs_e = tl.arange(0, BLOCK_N)
            n_mask_e = lo_e + offs_e < tl.minimum(lo_e + chunk_e, kv_len_e)
            slots_e = tile_slots(KV_INDICES, base_e, lo_e, offs_e, n_mask_e, PAGE_SIZE, BLOCK_N, True)
            kv_off = slots_e[:, None] * stride_slot + head_off + offs_d[None, :]
            kv_mask = n_mask_e[:, None] & d_mask[None, :]
            if PRELOAD > 0:  # and its K (PRELOAD 2: and V) rows into registers, all but the current token's (module
                # docstring)
                settled = kv_mask & (lo_e + offs_e < kv_len_e - 1)[:, None]
                k0 = tl.load(K + kv_off, mask=settled, other=0.0)
                if PRELOAD == 2:
                    v0 = tl.load(V + kv_off, mask=settled, other=0.0)
    pdl_start(USE_PDL)
    row = tl.load(QO_INDPTR + b)
    q_len = tl.load(QO_INDPTR + b + 1) - row  # 0 (padding: produces nothing) or 1
    kv_len = tl.load(KV_LENS + b) * q_len
    page_base = tl.load(KV_INDPTR + b)
    chunk = tl.cdiv(tl.cdiv(kv_len, num_splits), BLOCK_N) * BLOCK_N
    lo = split * chunk
    hi = tl.minimum(lo + chunk, kv_len)

    offs_m = tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    m_mask = offs_m < GROUP * q_len
    heads = kvh * GROUP + offs_m
    rows = row + offs_m * 0
    if PREFETCH > 0 and EARLY_TILE:  # q at the early row: no wait for the plan's re-read
        q = _load_q(Q, row_e, offs_m < GROUP * q_len_e, heads, offs_d, d_mask, stride_qt, stride_qh)
    else:
        q = _load_q(Q, row, m_mask, heads, offs_d, d_mask, stride_qt, stride_qh)

    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
    first = lo
    if PREFETCH > 0 and EARLY_TILE:
        # The first tile from the early plan: its K / V loads go out with the plan's re-reads after the wait, not
        # after them, and its page ids are read again at the early base in the same round trip. Taken only if every
        # value read after the wait equals its early read (always, by the docstring's rule); else the loop below
        # runs the split from its first tile: either way the same tiles and operations in the same order (kv_off,
        # kv_mask: the early tile's, from before the wait).
        if PRELOAD > 0:  # the current token's row, which the previous kernel may have been storing, over the early rows
            now = kv_mask & (lo_e + offs_e == kv_len_e - 1)[:, None]
            k0 = tl.load(K + kv_off, mask=now, other=k0)
            if PRELOAD == 2:
                v0 = tl.load(V + kv_off, mask=now, other=v0)
            else:
                v0 = tl.load(V + kv_off, mask=kv_mask, other=0.0)
        elif V_FIRST:  # both tiles in flight together (paged.attend_tile)
            v0 = tl.load(V + kv_off, mask=kv_mask, other=0.0)
            k0 = tl.load(K + kv_off, mask=kv_mask, other=0.0)
        else:
            k0 = tl.load(K + kv_off, mask=kv_mask, other=0.0)
            v0 = tl.load(V + kv_off, mask=kv_mask, other=0.0)
        slots_again = tile_slots(KV_INDICES, base_e, lo_e, offs_e, n_mask_e, PAGE_SIZE, BLOCK_N, True)
        moved = tl.sum(tl.where(n_mask_e & (slots_again != slots_e), 1, 0), 0)
        same = (row == row_e) & (q_len == q_len_e) & (kv_len == kv_len_e) & (page_base == base_e) & (moved == 0)
        if not same:  # never, by the rule: q from the plan read after the wait
            q = _load_q(Q, row, m_mask, heads, offs_d, d_mask, stride_qt, stride_qh)
        valid = (offs_m[:, None] >= 0) & n_mask_e[None, :]
        acc0, m0, l0 = attend_loaded(q, acc, m_i, l_i, k0, v0, valid, qk_scale, FP32_DOT)
        acc = tl.where(same, acc0, acc)
        m_i = tl.where(same, m0, m_i)
        l_i = tl.where(same, l0, l_i)
        first = tl.where(same, lo + BLOCK_N, lo)
    if PAGE_AHEAD:  # the first tile's page ids before the loop, each next tile's in the tile before (set_page_ahead)
        ahead = tile_slots(KV_INDICES, page_base, first, offs_n, first + offs_n < hi, PAGE_SIZE, BLOCK_N, True)
    for start in range(first, hi, BLOCK_N):
        n_mask = start + offs_n < hi
        if PAGE_AHEAD:
            slots = ahead
            ahead = tile_slots(KV_INDICES, page_base, start + BLOCK_N, offs_n, start + BLOCK_N + offs_n < hi, PAGE_SIZE,
                               BLOCK_N, True)
        else:
            slots = tile_slots(KV_INDICES, page_base, start, offs_n, n_mask, PAGE_SIZE, BLOCK_N)
        valid = (offs_m[:, None] >= 0) & n_mask[None, :]
        acc, m_i, l_i = attend_tile(q, acc, m_i, l_i, K, V, slots, head_off, offs_d, d_mask, n_mask, valid,
                                    qk_scale, stride_slot, FP32_DOT, True, False, V_FIRST)
    write_result(acc, m_i, l_i, O, O_PART, LSE_PART, rows, heads, split, offs_d, m_mask, d_mask, v_scale,
                 stride_ot, stride_oh, stride_pt, stride_ph, stride_ps, stride_lt, stride_lh, SPLIT)
    if SPLIT and FUSE_MERGE:  # its rows are the group's real heads (BLOCK_G), not the tile's padded BLOCK_M
        tl.static_assert(BLOCK_G >= GROUP, "BLOCK_G must hold the GQA group")
        offs_g = tl.arange(0, BLOCK_G)
        merge_arrived(O, O_PART, LSE_PART, COUNTERS, b * tl.num_programs(1) + kvh, num_splits, row + offs_g * 0,
                      kvh * GROUP + offs_g, offs_g < GROUP * q_len, offs_d, d_mask, stride_ot, stride_oh, stride_pt,
                      stride_ph, stride_ps, stride_lt, stride_lh, MERGE_SPLITS)


def paged_decode(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, out: torch.Tensor,
                 qo_indptr: torch.Tensor, kv_indptr: torch.Tensor, kv_indices: torch.Tensor,
                 kv_lens: torch.Tensor, *, page_size: int, scale: float, params: LaunchParams,
                 k_scale: float = 1.0, v_scale: float = 1.0, o_part: torch.Tensor | None = None,
                 lse_part: torch.Tensor | None = None, counters: torch.Tensor | None = None) -> torch.Tensor:
    """Decode attention over a paged pool; writes and returns ``out``.

    q, out:      [num_tokens, Hq, D] (q_len 0 or 1 per request)
    k/v_cache:   [num_slots, Hkv, D]  one layer's K or V, slot = page * page_size + offset (any dtype;
                 fp8 is dequantized by k_scale / v_scale)
    qo_indptr:   [batch + 1] int32;  kv_indptr: [batch + 1] int32;  kv_indices: [pages] int32;
    kv_lens:     [batch] int32
    o_part:      [num_tokens, Hq, num_splits, D] fp32 (or out's dtype: the triton backend's decode_partials) and
                 lse_part [num_tokens, Hq, num_splits] fp32 scratch, required when params.num_splits > 1
    counters:    int32 [>= batch * Hkv], all 0: split-KV partials merged inside the kernel by the last split of
                 each (request, kv head) (merge.merge_arrived), which leaves them 0 again; None: merge_splits after
    """
    batch = qo_indptr.shape[0] - 1
    num_heads, head_dim = q.shape[1], q.shape[2]
    num_kv_heads = k_cache.shape[1]
    split = params.num_splits > 1
    if split and (o_part is None or lse_part is None):
        raise ValueError("paged_decode: num_splits > 1 needs o_part and lse_part scratch")
    if batch == 0 or q.shape[0] == 0:
        return out
    part = o_part if split else out
    lse = lse_part if split else out
    fuse = split and counters is not None
    stages, early = early_launch(q, k_cache, params)
    _decode_kernel[(batch, num_kv_heads, params.num_splits)](
        q, k_cache, v_cache, out, part, lse, counters if fuse else qo_indptr, qo_indptr, kv_indptr, kv_indices, kv_lens,
        scale * k_scale * LOG2E, v_scale, params.num_splits,
        q.stride(0), q.stride(1), k_cache.stride(0), k_cache.stride(1), out.stride(0), out.stride(1),
        *(part.stride()[:3] if split else (0, 0, 0)), *(lse.stride()[:2] if split else (0, 0)),
        GROUP=num_heads // num_kv_heads, HEAD_DIM=head_dim, PAGE_SIZE=page_size,
        BLOCK_M=params.block_m, BLOCK_N=params.block_n, BLOCK_D=params.block_d,
        SPLIT=split, FP32_DOT=fp32_dot(q.dtype), FUSE_MERGE=fuse,
        MERGE_SPLITS=merge_bound(params.num_splits, fuse), BLOCK_G=triton.next_power_of_2(num_heads // num_kv_heads),
        V_FIRST=stages == 1 and _v_first == 1, PAGE_AHEAD=_page_ahead == 1, **early, num_warps=params.num_warps,
        num_stages=stages, **launch_args(q),
        **fused_launch_args(params, fuse))
    if split and not fuse:
        merge_splits(out, o_part, lse_part)
    return out


def early_launch(q: torch.Tensor, k_cache: torch.Tensor, params: LaunchParams) -> tuple[int, dict]:
    """This launch's stages and its early reads' constexprs, as PDL and the KV prefetch are set when it is made (a plan
    may outlive them: a graph bucket's, a bench's sides shared by arms). The early reads act with PDL on, the KV
    prefetch on and a power-of-two head dim of whole L2 lines; then a split of one tile (``params.one_tile``, the
    heuristic's) of at most ``early_tile_max()`` elements (EARLY_TILE_MAX_ELEMS unless set; past EARLY_TILE_SMALL_ELEMS
    only at EARLY_TILE_THREAD_ELEMS a thread or fewer) runs one stage and takes the early first tile, which any
    one-stage launch of that size does (a ``decode_tiles`` override too). A pipelined
    loop with it ran 1.08-1.22x slower at batch 16 (H100 2026-12-06e), and one stage without it 2-8% slower at
    SmolLM2's short contexts (2026-12-06f: experiments/decode-early/). That tile is preloaded (PRELOAD: its K and V
    before the wait on tiles of at most EARLY_TILE_SMALL_ELEMS, its K past them, as ``early_preload()`` allows)."""
    head_dim = k_cache.shape[2]
    row_bytes = head_dim * k_cache.element_size()
    if not (launch_args(q) and _kv_prefetch and head_dim & (head_dim - 1) == 0 and row_bytes % L2_LINE == 0):
        return params.num_stages, {}
    elems = params.block_n * params.block_d
    thin = elems <= EARLY_TILE_SMALL_ELEMS or elems <= EARLY_TILE_THREAD_ELEMS * 32 * params.num_warps
    fits = elems <= _early_max_elems and thin
    stages = 1 if params.one_tile and fits else params.num_stages
    early = stages == 1 and fits
    preload = min(_preload, 2 if elems <= EARLY_TILE_SMALL_ELEMS else 1) if early else 0
    return stages, {"PREFETCH": _kv_prefetch, "LINE": L2_LINE // k_cache.element_size(),
                    "EARLY_TILE": early, "PRELOAD": preload}
