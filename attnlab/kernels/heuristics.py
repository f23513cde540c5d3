"""Launch parameters for every paged-attention kernel, chosen in one place.

The kernels are memory bound in decode and verify: the goal is to stream K/V at copy bandwidth, which
needs enough programs in flight (split-KV when batch * kv_heads is small next to the SM count) and
large KV tiles. Prefill is compute bound and never splits.
"""

from __future__ import annotations

import functools
import os
from dataclasses import dataclass

import torch

# Split-KV: with equal-length requests every program does the same work, so what matters is how the
# programs fill waves of the GPU. Measured on an H200 (bf16, page 16): decode is best with the largest
# split count that keeps batch * kv_heads * splits <= 4 programs per SM (e.g. Llama-8B shapes, batch 8 x
# 32k: 8 splits 102% of copy bandwidth, 9 splits 73%); the heavier extend programs (M rows x D fp32
# accumulators) like 8 per SM. No split once the programs without it already reach half that.
DECODE_PROGRAMS_PER_SM = 4
EXTEND_PROGRAMS_PER_SM = 8
# Small-batch decode (batch x kv_heads far below the SM count): the MIN_TOKENS_PER_SPLIT floor left e.g.
# SmolLM2 shapes at batch 1 x 4k with 3 x 16 = 48 programs on 132 SMs (36% of the SMs, 10% of copy
# bandwidth on an H200). Below this many programs per SM the split shrinks, down to one BLOCK_N tile.
DECODE_MIN_PROGRAMS_PER_SM = 2
# A split must hold at least this many KV tokens, or the second reduction pass costs more than it saves.
MIN_TOKENS_PER_SPLIT = 256
MAX_SPLITS = 64
# Passes with at least this many new tokens per request are prefills: compute bound, never split, their own
# launch (extend_params), and the ones the triton backend's ``prefill_tiles`` option overrides.
PREFILL_MIN_Q_LEN = 65
# SM count assumed off-GPU (interpreter): small, so tests exercise split-KV at short contexts.
INTERPRETER_SM_COUNT = 2


@dataclass(frozen=True)
class LaunchParams:
    """kind: "decode" | "extend" | "invariant" (attnlab.kernels.invariant) | "contig" (prefill_contig, warmup
    records only). block_m: query rows per program
    (decode: the GQA group padded to >= 16; extend: tokens_per_block * group padded); block_n: KV tokens per
    tile; split_tokens: the invariant kernel's fixed split size in KV tokens (0 elsewhere: splits are
    num_splits equal chunks of each request's KV)."""

    kind: str
    block_m: int
    block_n: int
    block_d: int
    tokens_per_block: int  # query tokens per program (1 in decode)
    num_splits: int
    num_warps: int
    num_stages: int
    split_tokens: int = 0
    # decode: every split holds at most one tile of the heuristic's own (no decode_tiles override): such a launch runs
    # one stage where the decode's early first tile applies as the launch is made (decode.early_launch), else these
    one_tile: bool = False

    def stages_text(self) -> str:
        """``stages=N`` for kernel tags; a one-tile decode of more adds that it takes one where its early tile applies
        (decided per launch by decode.early_launch, which may refuse the tile: fp8 rows, a tile past its size gates)."""
        extra = " (1 where the early tile applies)" if self.one_tile and self.num_stages > 1 else ""
        return f"stages={self.num_stages}{extra}"


def next_pow2(x: int) -> int:
    return 1 << max(0, int(x) - 1).bit_length()


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


def interpreter_on() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0") == "1"


def fp32_dot(dtype: torch.dtype) -> bool:
    """Dots in fp32 (IEEE) for fp32 inputs, and always under the interpreter, whose tl.dot gives wrong
    results for bf16 operands (Triton 3.9); on GPU bf16/fp16 dots accumulate in fp32 as usual."""
    return dtype == torch.float32 or interpreter_on()


# The SM count plans assume while attnlab.kernels.aot compiles for a GPU it does not have (aot.compile_only sets it
# to its target's): a CPU plan then splits as on that GPU, so the split decode and its fused merge get compiled too.
_target_sms: int | None = None


def sm_count(device_index: int = 0) -> int:
    if _target_sms is not None:
        return _target_sms
    return _device_sm_count(device_index)


@functools.cache
def _device_sm_count(device_index: int) -> int:
    if torch.cuda.is_available() and not interpreter_on():
        return torch.cuda.get_device_properties(device_index).multi_processor_count
    return INTERPRETER_SM_COUNT


def choose_num_splits(base_programs: int, max_kv_len: int, sms: int, block_n: int, per_sm: int,
                      min_per_sm: int = 0) -> int:
    """Largest split count with base_programs * splits <= per_sm * sms (never more than the KV holds
    MIN_TOKENS_PER_SPLIT-token pieces, nor MAX_SPLITS); 1 when base_programs >= per_sm * sms / 2.

    min_per_sm > 0 (decode): when that still leaves base_programs * splits < min_per_sm * sms, the split
    shrinks below MIN_TOKENS_PER_SPLIT (down to one block_n tile) until the programs reach min_per_sm per SM
    (a KV too short to split at all stays unsplit). Splits the kernel's chunking would leave empty (each split
    covers a multiple of block_n tokens) are dropped."""
    if base_programs <= 0 or max_kv_len <= 0 or 2 * base_programs >= per_sm * sms:
        return 1
    fit = (per_sm * sms) // base_programs
    most = max(1, cdiv(max_kv_len, max(MIN_TOKENS_PER_SPLIT, block_n)))
    splits = max(1, min(fit, most, MAX_SPLITS))
    if splits > 1 and base_programs * splits < min_per_sm * sms:
        want = cdiv(min_per_sm * sms, base_programs)
        splits = max(splits, min(want, cdiv(max_kv_len, block_n), fit, MAX_SPLITS))
    chunk = cdiv(cdiv(max_kv_len, splits), block_n) * block_n  # as the kernels split a request's KV
    return cdiv(max_kv_len, chunk)


def decode_params(*, batch: int, num_kv_heads: int, group: int, head_dim: int, max_kv_len: int, sms: int,
                  num_splits: int | None = None, tiles: str | None = None) -> LaunchParams:
    """q_len = 1 per request: one program per (request, kv head, split), the whole GQA group as M rows.
    ``tiles`` ("BLOCK_NxWARPSxSTAGES", the triton backend's ``decode_tiles``): the KV tile, warps and stages in place
    of the heuristic's (tuning sweeps); the split count then follows that tile."""
    block_d = max(16, next_pow2(head_dim))
    block_m = max(16, next_pow2(group))
    # ~16 KiB per K tile (128 x D64, 64 x D128, 32 x D256 in bf16). Pages that are a multiple of block_n
    # take the fast path (one page id per tile, contiguous rows); any other page size gathers per token.
    block_n = {16: 128, 32: 128, 64: 128, 128: 64}.get(block_d, 32)
    num_warps, num_stages = 4, 2 if block_d >= 256 else 3
    if tiles:
        block_n, num_warps, num_stages = parse_decode_tiles(tiles)
    splits = num_splits or choose_num_splits(batch * num_kv_heads, max_kv_len, sms, block_n,
                                             DECODE_PROGRAMS_PER_SM, DECODE_MIN_PROGRAMS_PER_SM)
    programs = batch * num_kv_heads * splits
    if (not tiles and not num_splits and head_dim == 128 and cdiv(cdiv(max_kv_len, splits), block_n) == 2
            and programs <= DECODE_MIN_PROGRAMS_PER_SM * sms):
        # A split of two 64-token tiles at head dim 128 (Llama-8B's batch-1 decode at 2-4k: 32 splits of 128 tokens)
        # runs as one 128-token tile of 8 warps in one stage, the same splits, where the programs fill at most
        # DECODE_MIN_PROGRAMS_PER_SM a SM. H100, 2026-12-06g (experiments/decode-early/ calls 9-11, page 16, bf16):
        # 0.88x / 0.91x the time with PDL off / on at batch 1 x 4k, 0.86-0.92x at batch 1-16 x 128, 0.87-1.01x at batch
        # 4 x 1k and 8 x 512. Past the bound it lost: batch 16 x 320 1.10x, 16 x 384 1.02x / 1.04x (384 programs, full
        # splits), while batch 1 x 2,200 (144 programs, a last split of 24 tokens) gained 0.96x: by these two cells
        # (which differ in batch too) the program count, not a partial split (2026-12-06h, call 13). Page 64 (one page
        # id a 64-token tile, a page id a token at 128) gained too, less: 0.96x at batch 1 x 4k, its one cell measured.
        # 128-token tiles also lost at batch 1 x 512 (half the splits, 1.15-1.31x) and where a split loops over several
        # (16k, batch 16 x 4k: 1.03-1.11x), not taken there. A forced split count (tuning sweeps) keeps the tile.
        block_n, num_warps, num_stages = 128, 8, 1
    # A split of one tile has no loop to pipeline: its launch runs one stage where it takes the decode's early first
    # tile (decode.early_launch, decided as each launch is made: PDL and the KV prefetch are process settings a plan
    # may outlive). H100, 2026-12-06e (experiments/decode-early/): SmolLM2's batch-1 4k decode 4.96-5.01 -> 4.60-4.63
    # us against efbe5b5 (3 stages, no early tile), batch 16 unchanged. Without the early tile one stage lost 2-8% at
    # SmolLM2's short contexts (batch 1 / 16 / 64 x 128, batch 1 / 16 x 512) and gained 2.6% / 4.3% at Llama-8B's
    # batch 1 / 4 x 512 (H100, 2026-12-06f, decode-early/ call 7): then the heuristic's stages.
    one_tile = not tiles and cdiv(max_kv_len, splits) <= block_n
    return LaunchParams("decode", block_m, block_n, block_d, 1, splits, num_warps=num_warps, num_stages=num_stages,
                        one_tile=one_tile)


def parse_decode_tiles(spec: str) -> tuple[int, int, int]:
    """``"BLOCK_NxWARPSxSTAGES"`` (e.g. ``"64x4x3"``) -> the three ints; ValueError naming the rule."""
    parts = str(spec).lower().split("x")
    try:
        bn, warps, stages = (int(p) for p in parts)
    except ValueError:
        raise ValueError(f"{spec!r}: want BLOCK_NxWARPSxSTAGES, e.g. 64x4x3") from None
    pow2 = all(v > 0 and v & (v - 1) == 0 for v in (bn, warps))
    if not pow2 or not 16 <= bn <= 256 or warps > 8 or not 1 <= stages <= 8:
        raise ValueError(f"{spec!r}: BLOCK_N a power of two in 16..256, WARPS a power of two <= 8, 1 <= STAGES <= 8")
    return bn, warps, stages


def extend_params(*, num_q_blocks_fn, num_kv_heads: int, group: int, head_dim: int, max_q_len: int,
                  max_kv_len: int, sms: int, num_splits: int | None = None,
                  prefill_tiles: str | None = None) -> LaunchParams:
    """q_len >= 1 (verify, prefill): a program owns tokens_per_block query tokens x the GQA group.

    num_q_blocks_fn(tokens_per_block) -> number of (request, query block) programs, for the split choice.
    """
    block_d = max(16, next_pow2(head_dim))
    rows = max(1, max_q_len) * group
    # Verify (few tokens): pack every token of a request with its heads; prefill: 64/128 rows per program.
    block_m = min(max(16, next_pow2(rows)), 128 if block_d <= 128 else 64)
    if block_m == 128 and max_q_len * group < 512:
        block_m = 64
    tokens_per_block = max(1, block_m // group)
    block_n = 64 if block_d <= 128 else 32
    if block_m >= 64 and block_d >= 128:  # large M x D fp32 accumulator: smaller KV tiles (H200: 1.25x)
        block_n = 32
    num_warps = 8 if block_m >= 128 else 4
    num_stages = 2 if block_d >= 256 or block_m >= 128 else 3
    if max_q_len >= PREFILL_MIN_Q_LEN and (prefill_tiles or block_d <= 128):
        # Prefill launch, from the H200 sweep of 2026-12-01 (experiments/h200-2026-12-01e, bf16, page 16, 4k
        # context, tiles below the causal band unmasked): head_dim 128 (Llama-8B) 64 x 64 tiles, 4 warps, 3 stages,
        # 324 TF/s against 227 for the previous 128 x 32, 8 warps, 2 stages; head_dim 64 (SmolLM2) 128 x 64,
        # 8 warps, 3 stages (323 against 312 TF/s at batch 16). ``prefill_tiles`` replaces them (sweeps).
        if prefill_tiles:
            block_m, block_n, num_warps, num_stages = parse_tiles(prefill_tiles)
        else:
            block_m, block_n, num_warps, num_stages = (64, 64, 4, 3) if block_d == 128 else (128, 64, 8, 3)
        block_m = max(block_m, next_pow2(group))  # a program's rows hold at least one token's whole GQA group
        tokens_per_block = block_m // group
    base = num_q_blocks_fn(tokens_per_block) * num_kv_heads
    # Long prefills are compute bound with plenty of programs; only short-query passes split the KV.
    splits = num_splits or (choose_num_splits(base, max_kv_len, sms, block_n, EXTEND_PROGRAMS_PER_SM)
                            if max_q_len < PREFILL_MIN_Q_LEN else 1)
    return LaunchParams("extend", block_m, block_n, block_d, tokens_per_block, splits, num_warps, num_stages)


# The contiguous prefill kernel's launch per head dim (kernels/prefill_contig.py), from the H200 sweep of 2026-12-03b
# (experiments/prefill-contig: head_dim 128 465-533 TF/s, 1.44-1.59x the paged kernel; head_dim 64 388-392 TF/s,
# 1.23-1.26x); other head dims keep the paged extend kernel.
CONTIG_TILES = {128: (128, 128, 8, 3), 64: (64, 64, 4, 3)}


def contig_tiles(head_dim: int) -> tuple[int, int, int, int] | None:
    """(BLOCK_M, BLOCK_N, warps, stages) of the contiguous prefill kernel for this head dim, or None."""
    return CONTIG_TILES.get(head_dim)


def parse_tiles(spec: str) -> tuple[int, int, int, int]:
    """``"BLOCK_MxBLOCK_NxWARPSxSTAGES"`` (e.g. ``"128x64x8x3"``) -> the four ints; ValueError naming the rule."""
    parts = str(spec).lower().split("x")
    try:
        bm, bn, warps, stages = (int(p) for p in parts)
    except ValueError:
        raise ValueError(f"{spec!r}: want BLOCK_MxBLOCK_NxWARPSxSTAGES, e.g. 128x64x8x3") from None
    pow2 = all(v > 0 and v & (v - 1) == 0 for v in (bm, bn, warps))
    if not pow2 or bm < 16 or bn < 16 or not 1 <= stages <= 8:
        raise ValueError(f"{spec!r}: BLOCK_M, BLOCK_N >= 16 and WARPS must be powers of two, 1 <= STAGES <= 8")
    return bm, bn, warps, stages


def plan_params(*, q_lens: list[int], kv_lens: list[int], num_kv_heads: int, group: int, head_dim: int,
                has_mask: bool, sms: int, num_splits: int | None = None,
                prefill_tiles: str | None = None, decode_tiles: str | None = None) -> LaunchParams:
    """The one entry point: decode kernel when every request has q_len <= 1 and no custom mask, else the
    extend kernel; its block sizes, split count and warps. Used by the backend's plan and by warmup.
    ``prefill_tiles`` ("BMxBNxWxS", the triton backend's option of that name): the extend kernel's tiles, warps
    and stages for prefills (q_len >= PREFILL_MIN_Q_LEN), in place of the heuristic (tuning sweeps); ``decode_tiles``
    ("BNxWxS", that backend's option too): the decode kernel's KV tile, warps and stages."""
    max_q = max(q_lens, default=0)
    max_kv = max(kv_lens, default=0)
    if max_q <= 1 and not has_mask:
        return decode_params(batch=len(q_lens), num_kv_heads=num_kv_heads, group=group, head_dim=head_dim,
                             max_kv_len=max_kv, sms=sms, num_splits=num_splits, tiles=decode_tiles)
    return extend_params(num_q_blocks_fn=lambda tpb: sum(cdiv(n, tpb) for n in q_lens),
                         num_kv_heads=num_kv_heads, group=group, head_dim=head_dim, max_q_len=max_q,
                         max_kv_len=max_kv, sms=sms, num_splits=num_splits, prefill_tiles=prefill_tiles)
