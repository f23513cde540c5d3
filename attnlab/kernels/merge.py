"""Second pass of split-KV attention: merge per-split partial outputs by their log-sum-exp.

``merge_splits`` is its own kernel launch after the attention kernel. ``merge_arrived`` does the same inside the
attention kernel (``fused_merge``): each program counts itself in on an int32 counter per (query block, kv head)
after writing its partial, and the program that arrives last merges every split of those rows and resets the
counter to 0 (so the next launch, or graph replay, finds it there). One launch less per layer and pass.

``set_merge_group(g)`` (off, 0, by default) makes the decode's fused merge two-level: the last of each group of ``g``
splits merges the group, and the last group merger merges the groups. The single-level merger reads every split's
partial through one SM after its atomic (Llama-8B's batch-1 4k decode: 32 splits x 4 heads x 128 x 4 B = 64 KB),
a tail the other SMs wait on; two levels trade it for g partials, a store and a second atomic, then n / g partials.
Measured, it is slower (bench arm ``+mgroup<g>``, attnlab.bench.kernels; H200, 2026-12-07,
experiments/fused-merge-auto/ call 5): groups of 4 / 8 took 1.08-1.18x one level's time at both shapes' batch-1 4k
decode (32 one-tile splits), PDL off and on, and 1.00x at 16k (64 splits). It stays an off switch, to reproduce that.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from attnlab.kernels.heuristics import next_pow2
from attnlab.kernels.pdl import launch_args, pdl_start
from attnlab.kernels.switches import scoped

MERGE_GROUP_MAX = 32  # splits per group, at most: past it a group merger's own tail is the one-level one
_merge_group = 0


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
    """out: [T, Hq, D]; o_part: [T, Hq, S, D] fp32; lse_part: [T, Hq, S] fp32 (log2 domain)."""
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


def merge_counters(programs: int, num_kv_heads: int, device, num_splits: int = 1) -> torch.Tensor:
    """The zeroed arrival counters ``merge_arrived`` needs for a grid of ``programs`` x ``num_kv_heads`` x
    ``num_splits``: one per (request or query block, kv head), and with several splits room for the two-level merge's
    group counters after them (``merge_counter_count``), so a plan's counters serve any ``merge_group``."""
    tickets = max(1, programs) * num_kv_heads
    return torch.zeros(merge_counter_count(tickets, num_splits), dtype=torch.int32, device=device)


def plan_counters(params, programs: int, num_kv_heads: int, device) -> torch.Tensor:
    """A fused plan's counters (``merge_counters``): room for the two-level merge's group counters only where it can
    run, a decode of several splits; the extend and invariant kernels merge in one level."""
    return merge_counters(programs, num_kv_heads, device, params.num_splits if params.kind == "decode" else 1)


def merge_counter_count(tickets: int, num_splits: int) -> int:
    """Counters for ``tickets`` (request or query block, kv head) pairs: ``tickets`` top counters at [0, tickets),
    then, with several splits, each ticket's group counters at tickets + ticket * num_splits + group (room for groups
    as small as one split, so any group size fits)."""
    return tickets * (1 + num_splits) if num_splits > 1 else tickets


def set_merge_group(g: int) -> None:
    """Splits per group of the decode's two-level fused merge (process-wide, like decode.set_kv_prefetch): 0, one
    level (the default); a power of two in 2..MERGE_GROUP_MAX. Read when a launch is made (``merge_group_for``)."""
    global _merge_group
    _merge_group = check_merge_group(g)


def check_merge_group(g) -> int:
    """``g`` if it is a valid merge group, else ValueError naming the rule."""
    if isinstance(g, bool) or not isinstance(g, int) or not (g == 0 or 2 <= g <= MERGE_GROUP_MAX and g & (g - 1) == 0):
        raise ValueError(f"fused merge group {g!r}: 0 (one level) or a power of two in 2..{MERGE_GROUP_MAX} "
                         "(splits per group)")
    return g


def merge_group() -> int:
    return _merge_group


def merge_grouping(g: int):
    """``set_merge_group(g)`` for a block (bench arms), restored after."""
    return scoped(merge_group, set_merge_group, g)


def merge_group_for(num_splits: int, counters: torch.Tensor | None, tickets: int) -> int:
    """``merge_arrived``'s GROUP for a launch of ``num_splits`` over ``tickets`` (query block, kv head) pairs under
    ``merge_group()``: 0 (one level) unless the launch fuses its merge (``counters`` given) and has more splits than
    a group; ValueError where the counters are too few for the group counters (a host-side size, no sync)."""
    g = _merge_group
    if counters is None or not num_splits > g > 0:
        return 0
    need = merge_counter_count(tickets, num_splits)
    if counters.numel() < need:
        raise ValueError(f"fused merge group {g}: {num_splits} splits over {tickets} (query block, kv head) pairs need "
                         f"{need} counters (merge.merge_counters(..., num_splits=...)), got {counters.numel()}")
    return g


@triton.jit
def _merge_one(lse_rows, part, s, stride_ps, row_mask, mask, m, acc, denom, total):
    """Split ``s``'s partial into the ordered merge's sums; a split a row does not reach (lse -inf) leaves them.
    ``total``: denom's value as a row vector (each column of denom holds it), for a group's LSE."""
    lse = tl.load(lse_rows + s, mask=row_mask, other=float("-inf"), cache_modifier=".cg")
    w = tl.math.exp2(lse - m)[:, None]
    o = tl.load(part + s * stride_ps, mask=mask, other=0.0, cache_modifier=".cg")
    seen = (lse > float("-inf"))[:, None]
    # total beside, not from w: the sums' operations stay as they were, and where total is unused it is compiled away
    total = tl.where(lse > float("-inf"), total + tl.math.exp2(lse - m), total)
    return tl.where(seen, acc + o * w, acc), tl.where(seen, denom + w, denom), total


@triton.jit
def merge_slots(lse_rows, part, first, count, stride_ps, row_mask, mask, zero, STRIDE: tl.constexpr,
                BOUND: tl.constexpr):
    """The ordered merge of ``count`` partials at slots first, first + STRIDE, ... (a slot s: LSE at lse_rows + s,
    partial at part + s * stride_ps) -> (m, acc, denom, total): the largest LSE (0 where none is finite), the
    weighted sums [R, D] and the weights' sum [R], a column of denom summed in the rows' own layout (tl.max of denom
    over D compiled, for Llama-8B's decode under Triton 3.6, to shared-memory round trips, five barriers and every
    LSE loaded four times); summed only where unrolled (0 with BOUND 0), the only form a group's merge takes. Slots
    in index order, one at a time, a slot a row does not reach (lse -inf) skipped: per element ``merge_ordered``'s
    operations. ``BOUND`` > 0 (a power of two >= count) unrolls both loops, slots past count
    masked off, so no load waits for another; 0 loops to the runtime count. ``zero``: 0 as a row tensor."""
    m = tl.full([row_mask.shape[0]], float("-inf"), tl.float32)
    if BOUND == 0:
        for i in range(count):
            s = first + i * STRIDE
            m = tl.maximum(m, tl.load(lse_rows + s, mask=row_mask, other=float("-inf"), cache_modifier=".cg"))
    else:
        for i in tl.static_range(BOUND):
            s = first + i * STRIDE
            m = tl.maximum(m, tl.load(lse_rows + s, mask=row_mask & (zero + i < count), other=float("-inf"),
                                      cache_modifier=".cg"))
    m = tl.where(m == float("-inf"), 0.0, m)
    acc = tl.zeros([row_mask.shape[0], mask.shape[1]], tl.float32)
    denom = tl.zeros([row_mask.shape[0], mask.shape[1]], tl.float32)
    total = tl.zeros([row_mask.shape[0]], tl.float32)  # unused by the one level: compiled away where unrolled
    if BOUND == 0:  # no total: a loop-carried value stays in the loop's code even unused
        for i in range(count):
            acc, denom, _ = _merge_one(lse_rows, part, first + i * STRIDE, stride_ps, row_mask, mask, m, acc, denom,
                                       total)
    else:
        for i in tl.static_range(BOUND):
            live = row_mask & (zero + i < count)
            acc, denom, total = _merge_one(lse_rows, part, first + i * STRIDE, stride_ps, live, mask & live[:, None],
                                           m, acc, denom, total)
    return m, acc, denom, total


@triton.jit
def _slot_zero(O_PART, LSE_PART, rows, heads, offs_d, stride_pt, stride_ph, stride_lt, stride_lh):
    """Slot 0 of these rows' LSEs [R] and partials [R, D] (slot s: + s and + s * stride_ps)."""
    lse_rows = LSE_PART + rows.to(tl.int64) * stride_lt + heads * stride_lh
    part = O_PART + (rows.to(tl.int64) * stride_pt + heads * stride_ph)[:, None] + offs_d[None, :]
    return lse_rows, part


@triton.jit
def _store_merged(O, acc, denom, rows, heads, offs_d, mask, stride_ot, stride_oh):
    out = acc / tl.where(denom > 0, denom, 1.0)
    dst = O + (rows.to(tl.int64) * stride_ot + heads * stride_oh)[:, None] + offs_d[None, :]
    tl.store(dst, out.to(O.dtype.element_ty), mask=mask)


@triton.jit
def merge_arrived(O, O_PART, LSE_PART, COUNTERS, ticket, num_splits, split, rows, heads, row_mask, offs_d, d_mask,
                  stride_ot, stride_oh, stride_pt, stride_ph, stride_ps, stride_lt, stride_lh,
                  MAX_SPLITS: tl.constexpr, GROUP: tl.constexpr = 0):
    """Called by every split program (``split``) of one (query block, kv head) after ``write_result`` (SPLIT) wrote
    its partial; the last to arrive on ``COUNTERS[ticket]`` merges rows x heads of O from all ``num_splits`` partials.

    The CTA barrier orders every thread's partial stores before the arrival, the acq_rel atomic publishes them
    (release) and, in the last program, makes the others' visible (acquire); its loads bypass L1 (.cg). The merge
    is the ordered one of attnlab.kernels.invariant (``merge_slots``: splits one at a time in index order, a split a
    row does not reach skipped): per element the same operations in the same order, so the same bits as
    ``merge_ordered`` and an invariant kernel stays invariant with it.

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
    5.99 -> 4.68 us; how many loads issue together is the compiler's choice: experiments/fused-merge/sass.py).

    ``GROUP`` > 0 (the decode's ``merge_group_for``; 0 is the one level above, its code and bits unchanged): two
    levels. A program arrives on its group's counter (group split // GROUP, at COUNTERS[T + ticket * num_splits +
    group], T the grid's (query block, kv head) count: ``merge_counter_count``); the group's last merges its GROUP
    splits (unrolled to GROUP) into a normalized partial and its LSE and writes them over the group's first slot
    (only this program reads the group's slots, and it has: the barrier first, as a value may be held by several
    threads, all of whose loads must have been performed), resets the group counter, then arrives on
    COUNTERS[ticket] as above; the last merges the groups' partials (slots 0, GROUP, ...; unrolled to MAX_SPLITS //
    GROUP). Not merge_ordered's bits: the sums are grouped."""
    tl.debug_barrier()
    if GROUP == 0:
        arrived = tl.atomic_add(COUNTERS + ticket, 1, sem="acq_rel")
        if arrived == num_splits - 1:
            lse_rows, part = _slot_zero(O_PART, LSE_PART, rows, heads, offs_d, stride_pt, stride_ph, stride_lt,
                                        stride_lh)
            mask = row_mask[:, None] & d_mask[None, :]
            _, acc, denom, _ = merge_slots(lse_rows, part, 0, num_splits, stride_ps, row_mask, mask, rows * 0, 1,
                                           MAX_SPLITS)
            _store_merged(O, acc, denom, rows, heads, offs_d, mask, stride_ot, stride_oh)
            tl.store(COUNTERS + ticket, 0)
    else:
        first = split // GROUP * GROUP
        count = tl.minimum(num_splits - first, GROUP)
        gate = COUNTERS + tl.num_programs(0) * tl.num_programs(1) + ticket * num_splits + split // GROUP
        arrived = tl.atomic_add(gate, 1, sem="acq_rel")
        if arrived == count - 1:
            lse_rows, part = _slot_zero(O_PART, LSE_PART, rows, heads, offs_d, stride_pt, stride_ph, stride_lt,
                                        stride_lh)
            mask = row_mask[:, None] & d_mask[None, :]
            zero = rows * 0
            m, acc, denom, total = merge_slots(lse_rows, part, first, count, stride_ps, row_mask, mask, zero, 1, GROUP)
            has = total > 0
            lse = tl.where(has, m + tl.math.log2(tl.where(has, total, 1.0)), float("-inf"))  # write_result's form
            o = acc / tl.where(denom > 0, denom, 1.0)
            tl.debug_barrier()  # every thread's loads of the first slot performed before it is written over
            tl.store(part + first * stride_ps, o, mask=mask)
            tl.store(lse_rows + first, lse, mask=row_mask)
            tl.store(gate, 0)
            tl.debug_barrier()
            groups = tl.cdiv(num_splits, GROUP)
            arrived = tl.atomic_add(COUNTERS + ticket, 1, sem="acq_rel")
            if arrived == groups - 1:
                _, acc, denom, _ = merge_slots(lse_rows, part, 0, groups, stride_ps, row_mask, mask, zero, GROUP,
                                               MAX_SPLITS // GROUP)
                _store_merged(O, acc, denom, rows, heads, offs_d, mask, stride_ot, stride_oh)
                tl.store(COUNTERS + ticket, 0)
