"""Small-M GEMM (M <= 16 rows: decode, verify) with fused prologue / epilogue, row-invariant by construction.

    linear(x [M, K], w [N, K]) -> [M, N]          (the stable entry point; attnlab.diagnostics builds on it)
    gemm(x, w, ..., norm_weight=, epilogue=...)    (the fused variants the decoder's gemm path uses)

Layout: swap-AB. A program owns BLOCK_N output columns and all BLOCK_M = 16 (padded) rows, 8 for passes of at most 8
rows on loops of fewer than 4 warps (``batch_tile``), and computes
``acc[BLOCK_N, BLOCK_M] = W[cols, k] @ x[:, k].T`` with fp32 accumulation (tensor cores at any M <= 16; the weight
tile [BLOCK_N, BLOCK_K] is contiguous along K, so its loads are 16-byte vectors). Weight bound at these M:
the goal is to stream W at copy bandwidth and to swallow the small kernels around the GEMM.

Row invariance: every output element is reduced over K in an order that depends on (K, the tile config, a paired
loop's dots a step (``pair_dots``), the split count) only, and the split count is a function of (N, K, the weight dtype, the tile config, the split
mode and, for fp8 weights, their split target), never of M. Padded rows are zeros and no row's arithmetic reads another's. Split-K partials go to an
fp32 workspace and are summed in split order, then the epilogue runs. So a row computed at M = 1 (decode) is
bit-identical to the same row inside M = 5, 9 or 16 (verify). The 8-row batch tile is the one place M picks a kernel
variant: it only runs where both tiles take the same MMA instructions per element (``batch_tile``; the H200 tests
compare the two tiles bit for bit). Under the interpreter (numpy's matmul, whose summation order may follow the
shape) rows are bit-identical within a tile only.

Split modes (``engine.gemm_split``, process-wide: ``set_split_mode`` / ``splitting``), ``<policy>/<reduce>``:
- policy ``fill``: split K until the programs about fill an H200 (132; fp8 weights from LONG_K twice that,
  ``fp8_programs``); ``lean``: as fill, but a K of at most
  ``LEAN_MAX_K`` (8 chunks of 128) runs unsplit (alone, SmolLM2's qkv takes 2.8 us unsplit vs 3.4 split; in a
  PDL-chained decode step fill's shorter loops won: 1110 vs 1006 tok/s, experiments/h200-2026-12-02d); ``wave``:
  as lean for short K, else the power-of-two split whose programs best fill whole waves of 132 (``wave_efficiency``)
  net of its partials' traffic, for bandwidth-bound weights where a last wave of a few programs idles most SMs
  (Llama-3.1-8B's qkv: 192 programs under fill, 1.45 waves; gate_up: 448 unsplit, 3.4 waves; wave splits them
  4x / 2x: 384 / 896 programs, 0.97 of whole waves);
- by role (``policy_for``): under ``fill``, DEFAULT_ROLE_POLICIES' measured exceptions (o_proj and gate_up as
  ``lean``); a bench arm's ``+<role>.<policy>`` sets one role's policy under any mode;
- reduce ``pass``: a second tiny launch sums the partials; ``ticket``: each split program, after writing its
  partial, takes a ticket on its column tile (an acq_rel atomic), and the last to arrive sums all partials in
  split order and runs the epilogue, then resets the ticket (one launch per GEMM; the same sums in the same
  order as ``pass``, so the same bits). Tickets live in one per-device buffer: GEMMs on one device must not
  run concurrently on two streams (attnlab's engine runs one stream). Default ``fill/ticket``.

Prologue ``norm_weight``: HF RMSNorm of each x row (sum of squares over all of K in SS_BLOCK chunks, fixed
order; normalize in fp32, round to the model dtype, scale, round), as RMSNorm then F.linear does. Each program
normalizes its own K range once, unrolled, into a scratch [M, K] (the programs of a split write the same bits),
and its K loop then streams the scratch as it would stream x: pipelined. (Normalizing each chunk inside the loop
kept x in registers and waited on every chunk: Llama-3.2-1B's qkv took 13.2 us against 9.6 this way.)
Weights may be float8_e4m3fn with per-output-row fp32 scales (``w_scale``): dequantized inside (e4m3 -> the
activation dtype is exact), the scale applied to the fp32 sum; fp8 mode ``half`` (arm ``+f8half``) instead converts
the weights to f16 and the bf16 activations to f16 (saturated), for an f16 MMA (``_bf16_to_f16``). Epilogues (``epilogue=``):
- ``none``:     y = round(acc (+ bias))
- ``residual``: y = round(round(acc) + residual)                      (o_proj, down_proj: h + proj(x))
- ``silu_mul``: w = [gate; up] [2I, K] -> y [M, I] = round(round(silu(gate)) * up)   (gate_up_proj)
- ``rope``:     w = qkv_proj; RoPE (rotate-half) on the first ``rope_cols`` columns (q and k), per head of
                ``head_dim``; v untouched (qkv_proj; rounding as attnlab.models.rope in the model dtype)
- ``argmax``:   y [M] int64 = the first maximal column of round(acc (+ bias)) (an LM head's greedy tokens,
                ``argmax_linear``): tile maxima, then one ticket over all tiles; the last program reduces them in
                column order. Where K would be split (a small N), the argmax of the split logits instead.
The paired epilogues (silu_mul, rope) give a program both columns of each pair it needs: for a group size G
(I for silu_mul, head_dim / 2 for rope), logical column j maps to c1 = (j // G) * 2G + j % G and c2 = c1 + G;
a paired program covers BLOCK_N / 2 logical columns, so it streams as many weight rows as a plain one.
Weight prefetch (``engine.gemm_prefetch``, with PDL): before its ``griddepcontrol.wait`` each program issues
``prefetch.global.L2`` for the first chunks of its own weight rows, so they stream in while the previous kernel
still runs; only on weights of at most PREFETCH_MAX_WEIGHT_BYTES (latency-bound GEMMs). A hint: the sums are unchanged.
Tail norm (``tail_norm=(weight, eps)``, residual epilogue only; the gemm path's default for streams of at most
TAIL_AUTO_MAX_N columns, ``gemm.norm_place``): after
its tile's epilogue each program (a split GEMM: the tile's last split) takes one ticket over all column tiles; the
last to arrive reads the whole new stream h back (every tile stored it before its acq_rel arrival; .cg loads) and
writes the next RMSNorm of it, ``rmsnorm(h) * weight`` as ``add_rmsnorm`` rounds it, into a second output: the norm
that followed o_proj / down_proj as its own launch now ends that GEMM. Its rows go TAIL_ROWS at a time through a
[TAIL_ROWS, next_pow2(N)] tile, both functions of N only, so a row's sum of squares has the same order whatever M.
``kv_store`` (rope): the qkv epilogue also writes k (rotated) and v into their KV-pool slots (the gemm path's
layer then launches no store kernel). The epilogue's other inputs (residual, cos / sin, slots) load before the K
loop, their latency under the weight stream.
"""

from __future__ import annotations

import re
from contextlib import contextmanager
from typing import NamedTuple

import torch
import triton
import triton.language as tl

from attnlab.kernels import pdl
from attnlab.kernels.heuristics import fp32_dot, interpreter_on
from attnlab.kernels.pdl import launch_args, pdl_start, prefetch_l2
from attnlab.kernels.switches import scoped

MAX_M = 16  # rows per launch; larger M belongs to cuBLAS (callers fall back)
BLOCK_M = 16  # rows padded to one tensor-core tile (the batch tile; ``batch_tile``)
# The batch tile of a pass of at most SMALL_BLOCK_M rows under ``small_tile`` (arm +bm8; the default): x padded to 8
# rows, not 16. The dot is W [BLOCK_N, BLOCK_K] @ x.T [BLOCK_K, BLOCK_M], so the batch tile is the MMA's N: one n8
# column block of mma.sync m16n8k16 instead of two. Each output element is then the same instructions' sum of the same
# operands, in the K loop's order (the tile config's), so a row keeps its bits whichever tile its pass took: only on
# K loops of fewer than 4 warps, where both tiles lower to mma.sync (Triton 3.6). At 4 warps the 16-row tile takes the
# warp-group MMA and the 8-row one mma.sync, and their sums differed on the H200 (e4m3 at SmolLM2's down shape,
# 576 x 1536, rows of M = 8; experiments/h200-2026-12-04f); bf16's 4-warp loops also lost with it (1B 1,063 -> 1,006 tok/s,
# 8B 233 -> 215). So today it acts on fp8 weights' 2-warp loop (FP8_LONG_LOOP), where it halves the MMAs and, in fp8
# mode half, the activations' conversions: 1B gate_up alone 12.7 -> 12.2 us, down 9.4 -> 9.0. A prologue norm keeps
# 16: its sum of squares is a tl.sum over a [SS_BLOCK, BLOCK_M] tile whose layout (and so fp32 order) the tile sets.
SMALL_BLOCK_M = 8
DEFAULT_SMALL_TILE = True
_small_tile = DEFAULT_SMALL_TILE
# Split-K target: about one program per SM of an H200 (132 SMs). A constant, not the device's SM count, so
# the reduction order (and so every bit of the output) is the same on every GPU and under the interpreter.
TARGET_PROGRAMS = 132
MAX_SPLIT_K = 16
EPILOGUES = ("none", "residual", "silu_mul", "rope", "argmax")
_EPI = {name: i for i, name in enumerate(EPILOGUES)}
SPLIT_MODES = ("fill/pass", "fill/ticket", "lean/pass", "lean/ticket", "wave/pass", "wave/ticket")
DEFAULT_SPLIT_MODE = "fill/ticket"
LEAN_MAX_K = 1024  # lean / wave: a K of at most this many elements runs unsplit (8 chunks of 128; whatever BLOCK_K)
# wave: a split's cost is 1 / wave_efficiency plus its fp32 partials' traffic (written and read back: BLOCK_M padded
# rows x 4 bytes x 2 per column) relative to a column's bf16 weights (2 K bytes); the smallest split within
# WAVE_SLACK of the cheapest wins
PARTIAL_BYTES_PER_COLUMN = BLOCK_M * 4 * 2
WAVE_SLACK = 0.01
WAVE_MAX_TILES = 4 * TARGET_PROGRAMS  # wave: at least this many column tiles never split (LM heads: their argmax
# epilogue needs whole sums, and their partials would be tens of MiB)
MAX_TICKETS = 4096  # column tiles with a ticket (fill splits below 2 x TARGET_PROGRAMS tiles, wave below WAVE_MAX_TILES)
ARGMAX_TICKET = MAX_TICKETS - 1  # the argmax epilogue's one ticket over all its column tiles
NORM_TICKET = MAX_TICKETS - 2  # the tail norm's one ticket over all column tiles of its GEMM
ARGMAX_BLOCK = 256  # column tiles' partial maxima the argmax's last program reduces at a time
TAIL_ELEMS = 8192  # the tail norm's tile: TAIL_ROWS = TAIL_ELEMS // next_pow2(N) rows (1..16) of a whole row each
MAX_TAIL_N = TAIL_ELEMS  # a wider stream takes its norm as its own launch (gemm_path)
SS_BLOCK = 512  # exact RMSNorm prologue: columns of x per unrolled sum-of-squares chunk
MAX_PREFETCH = 16  # engine.gemm_prefetch: BLOCK_K chunks of its weight rows a program may prefetch
DEFAULT_PREFETCH = 16  # as many as the program has (SmolLM2's layer GEMMs have <= 5)
# Only GEMMs whose whole weight is at most this prefetch: latency-bound ones (SmolLM2's layer GEMMs, 0.7-3.5 MB).
# On bandwidth-bound weights the prefetch competes with the previous kernel's own stream and lost on the H200
# (Llama-3.2-1B, 8-67 MB: 870 -> 825 tok/s at 4 chunks; experiments/h200-2026-12-02e).
PREFETCH_MAX_WEIGHT_BYTES = 4 << 20  # the default cap; a bench arm's +pfcap<MiB> sets another (``prefetch_cap``)
MAX_PREFETCH_CAP_MIB = 1024
_prefetch_cap = PREFETCH_MAX_WEIGHT_BYTES
_role_policies: dict[str, str] = {}  # a role -> its split policy (fill / lean / wave), a bench arm's +<role>.<policy>
# Measured exceptions to the ``fill`` policy by role (the split mode's policy ``fill`` only; an arm's +<role>.<policy>
# overrides): o_proj and gate_up run a K of at most LEAN_MAX_K unsplit (``lean``; above it lean is fill, so only
# SmolLM2-sized layers see it). bench.pdl, SmolLM2 shapes, batch 1, PDL on (experiments/h200-2026-12-04c): 1,473
# (1,403-1,485) -> 1,529 (1,521-1,550) tok/s; alone (bench.gemm_fused, M = 1) o 2.9 -> 2.5 us, gate_up 4.6 -> 4.2: a
# split's ticket and reduction cost more than its shorter K loop saves on 5 chunks. qkv stays split (alone 3.6 us split,
# 4.1 unsplit; the whole lean mode lost end to end, 1,451).
DEFAULT_ROLE_POLICIES = {"o": "lean", "gate_up": "lean"}
_split_mode = DEFAULT_SPLIT_MODE
_prefetch = DEFAULT_PREFETCH
# Greedy tokens of a gemm-path side from the LM head's argmax epilogue (True) or from its logits (this GEMM) and torch's
# argmax (False, the default: the epilogue did not pay on the H200, SmolLM2 1,330 vs 1,370 tok/s, 1B 851 vs 855;
# experiments/h200-2026-12-03). Both give the same tokens.
DEFAULT_ARGMAX_HEAD = False
_argmax_head = DEFAULT_ARGMAX_HEAD
# A gemm-path side's RoPE: cos / sin tables over every position of the side, built once by its runner, which the
# qkv epilogue indexes by position (True: no per-pass torch ops), or cos / sin computed by torch every pass (False,
# as before 2026-12-03d: ~7 small launches a pass, outside the PDL chain). Same bits (the tables are the same ops).
DEFAULT_ROPE_TABLE = True
_rope_table = DEFAULT_ROPE_TABLE
# Where the gemm path's RMSNorms run: ``pro``, the qkv / gate_up prologue (arm +normpro: 5 launches a layer), or
# ``sep``, their own add_rmsnorm launch before a prologue-free GEMM (arm +normsep: 7; the default before 12-04c; the same roundings, the sum of
# squares in another fp32 order). Two launches more a layer won on the H200 (experiments/h200-2026-12-04, bench.pdl,
# batch 1, PDL on): Llama-3.1-8B shapes 202-203 -> 220-222 tok/s, Llama-3.2-1B 909-946 -> 1,002-1,017, SmolLM2 +1-3%:
# every program of a prologued GEMM first sums the squares of all of x and writes its normalized K range to a
# scratch before its K loop can start. ``tail`` (arm +normtail): each norm ends the GEMM before it (o_proj's, the
# previous layer's down_proj's; the tail norm, module docstring): 5 launches a layer, no program waits on a sum of
# squares before its K loop. Measured (bench.pdl, batch 1, PDL on, experiments/h200-2026-12-04c, five calls): the tail
# won at SmolLM2's 576-wide stream (+0.7 to +4.6%, 1,495 -> 1,505 and 1,529 -> 1,545 tok/s with o / gate_up unsplit)
# and lost at Llama-3.2-1B's 2,048 (-6%) and -3.1-8B's 4,096 (-2 to -3%): a tail costs its GEMM ~1.1-1.3 us (bench.gemm_fused),
# and a norm launch behind a wide GEMM's draining programs hides under PDL (a 1B layer's two: ~1 us together) where a
# narrow one's does not (SmolLM2's: ~2.9). So ``auto`` (the default, arm +normauto): the tail for a stream of at most
# TAIL_AUTO_MAX_N columns, else the norm's own launch.
NORM_PLACES = ("sep", "pro", "tail", "auto")
DEFAULT_NORM_PLACE = "auto"
TAIL_AUTO_MAX_N = 1024
_norm_place = DEFAULT_NORM_PLACE
# The paired epilogues' (rope, silu_mul) K loop: one dot over both halves' rows (a [2 x BLOCK_N, BLOCK_K] weight tile), or
# one dot per half (the old loop, arm +pair2). Under Triton 3.6 a [32, BLOCK_K] x [BLOCK_K, 16] dot takes mma.sync with
# its 4 warps as 4 x 16 rows, so each half's rows were loaded (and, for fp8, converted) by two warps; the joined
# [64, BLOCK_K] dot is one warp group's wgmma, as the unpaired GEMMs (o, down) always had (the sm_90 PTX of 1B gate_up,
# fp8: 128 prmt a K step against 64). Rows stay M-invariant either way (a function of K and the tile config).
PAIR_DOTS = (1, 2)
DEFAULT_PAIR_DOTS = 1
_pair_dots = DEFAULT_PAIR_DOTS
# The K loop of 16-bit / fp8 weights: BLOCK_K 256 from K >= LONG_K, else 128; 3 stages, 4 warps (a function of K, so
# rows stay M-invariant). Measured end to end (bench.pdl, gemm engine, batch 1, PDL on; experiments/h200-2026-12-04):
# BLOCK_K 256 for every GEMM took Llama-3.1-8B shapes (K 4,096 / 14,336) from 222-223 to 232-233 tok/s and
# Llama-3.2-1B (K 2,048 / 8,192) from 986 to 1,014, and SmolLM2 (K 576 / 1,536) from 1,419 down to 1,280; 4 stages,
# 8 warps and 64 lost. ``DEFAULT_ROLE_LOOPS``: measured exceptions by the GEMM's role in the layer (``ROLES``; the
# caller names it) from K >= LONG_K, a function of the call site, never of M (experiments/h200-2026-12-04b):
# - qkv at BLOCK_K 128, 4 stages (80 KiB of shared memory: 2 programs an SM, where 256 x 3 stages' 120 KiB fit one,
#   and Llama-3.1-8B's qkv has 192 programs): alone 18.5 -> 15.2 us at 8B (0.84x -> 1.02x of cuBLAS); end to end
#   8B 232 -> 233 tok/s, 1B 1,017 -> 1,060;
# - gate_up at 128 x 5 stages: alone 8B 0.92-1.02x -> 0.97-1.07x of cuBLAS (M 1-16); end to end 0.6-1.3% slower, inside
#   the rounds' spread (8B 232 -> 229, 1B 1,041 -> 1,035); at 128 x 4 it lost 9% at 8B (210), at 256 x 4 4% (222).
# A bench arm's +k<BK>s<S>w<W> forces one loop on every GEMM, +<role>.k<BK>s<S>w<W> on one role's (``loop_config``).
LONG_K = 2048
ROLES = ("qkv", "o", "gate_up", "down", "lm_head")
DEFAULT_ROLE_LOOPS: dict[str, tuple[int, int, int]] = {"qkv": (128, 4, 4), "gate_up": (128, 5, 4)}
# fp8 weights from LONG_K: BLOCK_K 128 x 4 stages at 2 warps for every role, and K split towards FP8_LONG_PROGRAMS x
# TARGET_PROGRAMS programs. At 2 warps the [64, BLOCK_K] tile's dot takes mma.sync with warpsPerCTA [2, 1] (Triton 3.6,
# sm_90): each warp its own 32 rows, converted from e4m3 in the MMA's register layout, where 4 warps take the warp-group
# MMA, which stores the converted bf16 tile back to shared memory and reads it again (16 st.shared and 9 barriers a K
# step; experiments/h200-2026-12-04d/ptx_loop.py). 36 KiB of shared memory a program. Measured end to end (bench.pdl,
# batch 1, PDL; experiments/h200-2026-12-04e) against 256 x 4 at 4 warps: Llama-3.2-1B fp8w 1,024-1,065 -> 1,171-1,187
# tok/s, fp8 layers and LM head (fp8wh) 1,037-1,060 -> 1,235-1,252; Llama-3.1-8B fp8w 258 -> 312, fp8wh 265 -> 322.
# 1 warp, 3 or 6 stages, BLOCK_K 64 / 256 at 2 warps and 3 or 4 x the split target all lost. Before (12-04b): 256 x 4
# at 4 warps against 128 x 3: 1B 910 -> 991, and the doubled split 973 -> 1,046. SmolLM2 (K < LONG_K) lost with
# either loop forced onto it (13% at 256 x 4 x 4; 1,236 -> 1,166 at 128 x 4 x 2) and 6% with the split, so it keeps
# 128 x 3 x 4 and the bf16 split.
FP8_LONG_LOOP = (128, 4, 2)
FP8_LONG_PROGRAMS = 2
_loops: dict[str, tuple[int, int, int]] = {}  # "all" or a role -> (BLOCK_K, stages, warps)
_tickets: dict = {}


def set_split_mode(mode: str) -> None:
    """The process-wide split mode (module docstring); ``engine.gemm_split`` sets it before the sides are built
    (graphs record the launches of their capture)."""
    global _split_mode
    if mode not in SPLIT_MODES:
        raise ValueError(f"gemm split mode {mode!r}: choose from {', '.join(SPLIT_MODES)}")
    _split_mode = mode


def split_mode() -> str:
    return _split_mode


def splitting(mode: str):
    """``set_split_mode(mode)`` for a block (benches comparing modes in one process), restored after."""
    return scoped(split_mode, set_split_mode, mode)


def set_prefetch(chunks: int) -> None:
    """How many BLOCK_K chunks of its weight rows each program prefetches into L2 before its PDL wait (module
    docstring; process-wide, like the split mode; nothing without engine.pdl, nor on weights above
    PREFETCH_MAX_WEIGHT_BYTES)."""
    global _prefetch
    if isinstance(chunks, bool) or not isinstance(chunks, int) or not 0 <= chunks <= MAX_PREFETCH:
        raise ValueError(f"gemm prefetch {chunks!r}: an int of BLOCK_K chunks in 0..{MAX_PREFETCH}")
    _prefetch = chunks


def prefetch_chunks() -> int:
    return _prefetch


def prefetching(chunks: int):
    """``set_prefetch(chunks)`` for a block, restored after."""
    return scoped(prefetch_chunks, set_prefetch, chunks)


def prefetch_cap() -> int:
    """The largest weight (bytes) a GEMM prefetches into L2 before its PDL wait (PREFETCH_MAX_WEIGHT_BYTES unless an
    arm's +pfcap<MiB> says otherwise)."""
    return _prefetch_cap


def _set_prefetch_cap(nbytes: int) -> None:
    global _prefetch_cap
    _prefetch_cap = int(nbytes)


def role_policies() -> tuple[tuple[str, str], ...]:
    """The split policies a bench arm forces on single roles ((role, policy), sorted); empty: the split mode's, and
    under ``fill`` DEFAULT_ROLE_POLICIES (``policy_for``)."""
    return tuple(sorted(_role_policies.items()))


def policy_for(role: str | None) -> str:
    """The split policy of a GEMM at call site ``role`` (``_policy``). A function of the call site, never of M."""
    return _policy(role, _split_mode.split("/")[0], _role_policies)


def _policy(role: str | None, mode_policy: str, forced: dict) -> str:
    """An arm's policy for ``role``, else under the split mode's ``fill`` DEFAULT_ROLE_POLICIES' for it, else the
    split mode's."""
    if role in forced:
        return forced[role]
    return DEFAULT_ROLE_POLICIES.get(role, mode_policy) if mode_policy == "fill" else mode_policy


def _set_role_policies(pairs) -> None:
    global _role_policies
    _role_policies = dict(pairs or ())


def arm_policies(a: Arm) -> dict:
    """The split policy each call site (ROLES, and None: a role-less call) takes under arm ``a`` (``policy_for``'s
    rules): two arms with equal maps split every GEMM alike."""
    mode, forced = a.split_mode.split("/")[0], dict(a.role_policies)
    return {r: _policy(r, mode, forced) for r in (*ROLES, None)}


def sums_key(a: Arm, fp8: bool = False) -> tuple:
    """What sets the fp32 summation order of this GEMM's rows under arm ``a``: the split policy at each call site,
    the forced K loops' BLOCK_K and warps (stages sum alike), the paired loop's dots a step, and for ``fp8``
    weights their split target and whether the fp8 mode is ``half`` (f16 operands: other products). Two arms with
    equal keys give the same bits (the reduction, ticket or pass, never changes them); the norms' places are the
    caller's to compare. The batch tile (+bm8 / +bm16) is left out: it changes no bit (``batch_tile``), so a bench
    cell's token comparison between such arms checks it."""
    loops = tuple((key, (bk, w)) for key, (bk, _, w) in a.loops)
    return (tuple(arm_policies(a).items()), loops, a.pair_dots, a.fp8_programs if fp8 else None,
            fp8 and a.fp8_mode == "half")


def argmax_head() -> bool:
    """Whether a gemm-path side takes its greedy tokens from the LM head's argmax epilogue (``argmax_linear``)."""
    return _argmax_head


def _set_argmax_head(on: bool) -> None:
    global _argmax_head
    _argmax_head = bool(on)


def rope_table() -> bool:
    """Whether a gemm-path side's qkv epilogue reads RoPE's cos / sin from its runner's position tables (else the
    pass's own, from torch)."""
    return _rope_table


def _set_rope_table(on: bool) -> None:
    global _rope_table
    _rope_table = bool(on)


def norm_place() -> str:
    """Where the gemm path's RMSNorms run (NORM_PLACES): ``sep`` an add_rmsnorm launch before qkv / gate_up, ``pro``
    their prologue, ``tail`` the tail of the GEMM before them (o_proj, down_proj), ``auto`` the tail for streams of
    at most TAIL_AUTO_MAX_N columns, else sep (``norm_tail``)."""
    return _norm_place


def norm_prologue() -> bool:
    """Whether the gemm path normalizes in the qkv / gate_up prologue."""
    return _norm_place == "pro"


def norm_tail(n: int) -> bool:
    """Whether the gemm path's norm of an ``n``-wide stream ends the o_proj / down_proj GEMM before it
    (``tail_norm``): under ``tail`` for n <= MAX_TAIL_N, under ``auto`` for n <= TAIL_AUTO_MAX_N."""
    return n <= {"tail": MAX_TAIL_N, "auto": TAIL_AUTO_MAX_N}.get(_norm_place, -1)


def small_tile() -> bool:
    """Whether a pass of at most SMALL_BLOCK_M rows pads x to SMALL_BLOCK_M rows instead of BLOCK_M (``batch_tile``)."""
    return _small_tile


def _set_small_tile(on: bool) -> None:
    global _small_tile
    _small_tile = bool(on)


def batch_tile(m: int, x_dtype: torch.dtype, warps: int, norm: bool = False) -> int:
    """The padded rows (the MMA's N) of a pass of ``m`` rows on a K loop of ``warps`` warps: SMALL_BLOCK_M under
    ``small_tile`` for m <= SMALL_BLOCK_M of 16-bit activations on fewer than 4 warps (mma.sync at either tile) without
    a prologue norm, else BLOCK_M (fp32's dot is no MMA: CUDA cores, numpy under the interpreter). A function of the
    tile config and m; rows keep their bits across the two tiles (module constants above)."""
    small = _small_tile and m <= SMALL_BLOCK_M and warps < 4 and not norm and x_dtype != torch.float32
    return SMALL_BLOCK_M if small else BLOCK_M


def pair_dots() -> int:
    """Dots a paired GEMM's K loop takes a step (PAIR_DOTS): 1, both halves' rows in one tile; 2, a dot per half."""
    return _pair_dots


def _set_pair_dots(n: int) -> None:
    global _pair_dots
    if n not in PAIR_DOTS:
        raise ValueError(f"pair dots {n!r}: choose from {PAIR_DOTS}")
    _pair_dots = int(n)


def set_norm_place(place: str) -> None:
    global _norm_place
    if place not in NORM_PLACES:
        raise ValueError(f"norm place {place!r}: choose from {', '.join(NORM_PLACES)}")
    _norm_place = place


class Arm(NamedTuple):
    """A bench arm's settings (``parse_arm``)."""

    split_mode: str
    prefetch: int
    argmax_head: bool
    rope_table: bool
    kv_prefetch: int
    rows_argmax: bool
    rope_store: bool
    norm_place: str  # NORM_PLACES
    loops: tuple[tuple[str, tuple[int, int, int]], ...]  # ("all" or a role, (BLOCK_K, stages, warps)), sorted
    fp8_mode: str
    fp8_programs: int | None  # fp8 weights' split target, in TARGET_PROGRAMS (1..4; None: by K)
    prefetch_cap: int  # bytes: the largest weight that prefetches (PREFETCH_MAX_WEIGHT_BYTES unless +pfcap<MiB>)
    role_policies: tuple[tuple[str, str], ...]  # (role, split policy), sorted: +<role>.fill / .lean / .wave
    pair_dots: int = DEFAULT_PAIR_DOTS  # PAIR_DOTS: +pair1 / +pair2
    small_tile: bool = DEFAULT_SMALL_TILE  # +bm8 / +bm16: the batch tile of passes of <= SMALL_BLOCK_M rows


@contextmanager
def arm(text: str):
    """A bench arm ``<split mode>[+pf<chunks>][+lmargmax|+lmlogits][+ropetable|+ropecalc][+kvpf<tiles>][+amtorch]
    [+kvsep][+normsep|+normpro|+normtail|+normauto][+k<BK>s<S>w<W>][+<role>.k<BK>s<S>w<W>...]`` (``fill/ticket``, ``fill/ticket+pf0``,
    ``fill/ticket+qkv.k128s4w4``), for a block, everything restored after; a bare arm is the engine's defaults. The split mode; ``+pf``: the weight prefetch (DEFAULT_PREFETCH chunks unless
    given); the greedy tokens' LM head (``+lmargmax`` its argmax epilogue; ``+lmlogits``, the default, the side's
    logits from this GEMM, ``ModelRunner.logits``, then their argmax); ``+ropetable`` (default) / ``+ropecalc``:
    RoPE's cos / sin from the runner's position tables or from torch every pass; ``+kvpf<tiles>``: the decode
    attention's KV prefetch before its PDL wait (attnlab.kernels.decode); ``+amtorch``: greedy tokens by torch's
    argmax instead of attnlab.kernels.argmax; ``+kvsep``: the fused paths store K / V by their own kernel, not from
    the RoPE launch (attnlab.kernels.fused.rope_store); ``+normsep`` / ``+normpro`` / ``+normtail`` / ``+normauto``: the gemm
    path's RMSNorms as their own launches, as the qkv / gate_up prologue, as the tail of the GEMM before them, or the
    tail for narrow streams only (``norm_place``; the default DEFAULT_NORM_PLACE); ``+k<BK>s<S>w<W>``: the K loop's BLOCK_K, stages
    and warps for every GEMM, ``+<role>.k<BK>s<S>w<W>`` for one role's (``ROLES``; ``loop_for``, ``loop_config``);
    ``+f8cast`` / ``+f8ptx`` / ``+f8wide``: how fp8 weights convert to bf16 (``set_fp8_mode``; the same bits), ``+f8half``:
    weights and activations to f16 (``_bf16_to_f16``: other sums); ``+f8x1`` ..
    ``+f8x4``: fp8 weights split K towards 1..4 x TARGET_PROGRAMS programs at every K (``fp8_programs``);
    ``+pfcap<MiB>``: the largest weight that prefetches (``prefetch_cap``); ``+<role>.fill`` / ``.lean`` / ``.wave``: one
    role's split policy (``role_policies``; the reduction stays the split mode's); ``+pair1`` / ``+pair2``: a paired
    GEMM's (qkv with RoPE, gate_up) K loop as one dot over both halves or a dot per half (``pair_dots``); ``+bm8`` /
    ``+bm16``: passes of at most SMALL_BLOCK_M rows on loops of fewer than 4 warps pad x to 8 rows or to 16
    (``batch_tile``; the same bits).
    Split, prefetch, RoPE-table, norm, loop and fp8 parts act on this GEMM's launches only: gemm-path sides, and the
    small-M passes of weight-only FP8Linear in any engine."""
    from attnlab.kernels import argmax, decode, fused

    a = parse_arm(text)
    with splitting(a.split_mode), prefetching(a.prefetch), scoped(argmax_head, _set_argmax_head, a.argmax_head), \
            scoped(rope_table, _set_rope_table, a.rope_table), decode.kv_prefetching(a.kv_prefetch), \
            scoped(argmax.enabled, argmax.set_enabled, a.rows_argmax), \
            scoped(fused.rope_store, fused.set_rope_store, a.rope_store), \
            scoped(norm_place, set_norm_place, a.norm_place), \
            scoped(loop_config, _set_loop_config, a.loops), scoped(fp8_mode, set_fp8_mode, a.fp8_mode), \
            scoped(fp8_programs, _set_fp8_programs, a.fp8_programs), \
            scoped(prefetch_cap, _set_prefetch_cap, a.prefetch_cap), \
            scoped(role_policies, _set_role_policies, a.role_policies), \
            scoped(pair_dots, _set_pair_dots, a.pair_dots), scoped(small_tile, _set_small_tile, a.small_tile):
        yield


_NORM_ARMS = tuple(f"norm{p}" for p in NORM_PLACES)
# how e4m3 weights meet the activations (``set_fp8_mode``): cast / ptx / wide convert them to bf16 (the same bits);
# half takes both to f16 (the weights exactly, by cvt.rn.f16x2.e4m3x2; the bf16 activations by _bf16_to_f16) for an f16
# MMA: on the H200 it halves the 2-warp loop's instructions and buys 1.07-1.17x end to end (experiments/h200-2026-12-04e);
# the default since 12-04f (DEFAULT_FP8_MODE)
FP8_MODES = ("cast", "ptx", "wide", "half")
_FP8_ARMS = {f"f8{m}" for m in FP8_MODES}
_FP8_SPLIT_ARMS = ("f8x1", "f8x2", "f8x3", "f8x4")  # fp8 weights' split target (``fp8_programs``)
_PAIR_ARMS = tuple(f"pair{n}" for n in PAIR_DOTS)
_ONE_OF = ({"lmargmax", "lmlogits"}, {"ropetable", "ropecalc"}, set(_NORM_ARMS), _FP8_ARMS, set(_FP8_SPLIT_ARMS),
           set(_PAIR_ARMS), {"bm8", "bm16"})
_POLICY_ARM = re.compile(r"(" + "|".join(ROLES) + r")\.(fill|lean|wave)")  # +<role>.<split policy>
SMEM_BYTES = 232448  # sm_90's shared memory a block may have: a forced K loop must fit it (``loop_smem``)


def loop_smem(block_k: int, stages: int) -> int:
    """Bytes of shared memory a forced K loop's stages take at 16-bit weights (the largest: fp8 halves the weight
    tile): 64 weight rows (a paired GEMM's one tile too) and the 16 padded rows of x, BLOCK_K wide, one buffer a
    stage (the warp-group MMA's pipeline; sm_90 compiles of gate_up and o / down, Triton 3.6). The H200 refused
    +k512s3w4 / +k512s3w8 at launch with exactly this figure, 245,760 B (experiments/h200-2026-12-04b, loops.log)."""
    return stages * block_k * (64 + BLOCK_M) * 2


_LOOP_ARM = re.compile(r"(?:(" + "|".join(ROLES) + r")\.)?k(32|64|128|256|512)s([1-6])w([1248])")  # +[<role>.]k<BK>s<S>w<W>


def parse_arm(text: str) -> Arm:
    """An arm's text (``arm``) -> its settings, the defaults where it says nothing; ValueError if malformed."""
    from attnlab.kernels.argmax import DEFAULT_ON
    from attnlab.kernels.decode import KV_PREFETCH_TILES

    mode, *extras = text.split("+")
    chunks, fused_argmax, table = DEFAULT_PREFETCH, DEFAULT_ARGMAX_HEAD, DEFAULT_ROPE_TABLE  # bare: the defaults
    kv_tiles, rows_argmax, rope_store, place = KV_PREFETCH_TILES, DEFAULT_ON, True, DEFAULT_NORM_PLACE
    loops = {}  # forced loops: none by default (the rules of loop_for)
    f8, f8x = DEFAULT_FP8_MODE, DEFAULT_FP8_PROGRAMS
    cap, policies, pairs, tile8 = PREFETCH_MAX_WEIGHT_BYTES, {}, DEFAULT_PAIR_DOTS, DEFAULT_SMALL_TILE
    keys = [_key(e) for e in extras]  # at most one part a key: each set of _ONE_OF, each prefix, each role's loop / policy
    ok = mode in SPLIT_MODES and len(set(keys)) == len(keys)
    for e in extras:
        if e.startswith("pfcap") and _digits(e[5:]) and int(e[5:]) <= MAX_PREFETCH_CAP_MIB:
            cap = int(e[5:]) << 20
        elif _POLICY_ARM.fullmatch(e):
            role, policy = _POLICY_ARM.fullmatch(e).groups()
            policies[role] = policy
        elif e.startswith("pf") and _digits(e[2:]) and int(e[2:]) <= MAX_PREFETCH:
            chunks = int(e[2:])
        elif e.startswith("kvpf") and _digits(e[4:]) and int(e[4:]) <= 8:
            kv_tiles = int(e[4:])
        elif e == "amtorch":
            rows_argmax = False
        elif e == "kvsep":
            rope_store = False
        elif e in _NORM_ARMS:
            place = e[4:]
        elif _LOOP_ARM.fullmatch(e):
            role, block_k, stages, warps = _LOOP_ARM.fullmatch(e).groups()
            loops[role or "all"] = (int(block_k), int(stages), int(warps))
            if (smem := loop_smem(int(block_k), int(stages))) > SMEM_BYTES:
                raise ValueError(f"gemm arm {text!r}: +{e} needs {smem:,} B of shared memory at 16-bit weights, "
                                 f"above sm_90's {SMEM_BYTES:,} (fewer stages or a smaller BLOCK_K)")
        elif e in ("lmargmax", "lmlogits"):
            fused_argmax = e == "lmargmax"
        elif e in ("ropetable", "ropecalc"):
            table = e == "ropetable"
        elif e in _FP8_ARMS:
            f8 = e[2:]
        elif e in _FP8_SPLIT_ARMS:
            f8x = int(e[3])
        elif e in _PAIR_ARMS:
            pairs = int(e[4:])
        elif e in ("bm8", "bm16"):
            tile8 = e == "bm8"
        else:
            ok = False
    if not ok:
        raise ValueError(f"gemm arm {text!r}: <split mode>[+pf<chunks>][+lmargmax|+lmlogits][+ropetable|+ropecalc]"
                         f"[+kvpf<tiles>][+amtorch][+kvsep][+normsep|+normpro|+normtail|+normauto][+[<role>.]k<BK>s<S>w<W>][+f8cast|+f8ptx|+f8wide|+f8half][+f8x1..4]"
                         f"[+pfcap<MiB>][+<role>.fill|lean|wave][+pair1|+pair2][+bm8|+bm16], split modes "
                         f"{', '.join(SPLIT_MODES)}, chunks 0..{MAX_PREFETCH}, MiB 0..{MAX_PREFETCH_CAP_MIB}, tiles 0..8, BK 32 / 64 / 128 / 256 / 512, S 1..6, "
                         f"W 1 / 2 / 4 / 8, at most one loop per role (roles {', '.join(ROLES)}: +<role>.k<BK>s<S>w<W>)")
    return Arm(mode, chunks, fused_argmax, table, kv_tiles, rows_argmax, rope_store, place,
               tuple(sorted(loops.items())), f8, f8x, cap, tuple(sorted(policies.items())), pairs, tile8)


def _key(e: str) -> str:
    """The setting an arm's part sets: two parts of one key conflict (``parse_arm``)."""
    for i, group in enumerate(_ONE_OF):
        if e in group:
            return f"one-of {i}"
    if m := _LOOP_ARM.fullmatch(e):
        return f"loop {m.group(1) or 'all'}"
    if m := _POLICY_ARM.fullmatch(e):
        return f"policy {m.group(1)}"
    return next((p for p in ("pfcap", "kvpf", "pf") if e.startswith(p)), e)


def _digits(text: str) -> bool:
    return text.isascii() and text.isdigit()


def parse_split_modes(text: str) -> list[str]:
    """``"fill/pass, lean/ticket+pf4"`` -> the bench arms (``arm``), in order, without repeats; ValueError names
    the bad ones."""
    modes = list(dict.fromkeys(m.strip() for m in text.split(",") if m.strip()))
    bad, why = [], ""
    for m in modes:
        try:
            parse_arm(m)
        except ValueError as e:
            bad.append(m)
            why = why or f" ({e})"
    if bad or not modes:
        raise ValueError(f"split mode(s) {', '.join(bad) or repr(text)}: choose from {', '.join(SPLIT_MODES)}, "
                         f"each optionally +pf<chunks> (0..{MAX_PREFETCH}: engine.gemm_prefetch), +lmargmax or "
                         f"+lmlogits (the greedy tokens' LM head), +ropetable or +ropecalc (RoPE's cos / sin) and "
                         f"+kvpf<tiles> (the decode's KV prefetch, 0..8), +amtorch (torch's argmax), +kvsep (the fused "
                         f"paths' KV store as its own kernel), +normsep, +normpro, +normtail or +normauto (the gemm path's "
                         f"norms as their own launches, GEMM prologues, the previous GEMM's tail, or the tail for narrow "
                         f"streams), +[<role>.]k<BK>s<S>w<W> (a K loop), "
                         f"+f8cast / +f8ptx / +f8wide / +f8half and +f8x1..+f8x4 (fp8 weights), +pfcap<MiB> (the largest weight that "
                         f"prefetches), +<role>.fill / .lean / .wave (one role's split policy), +pair1 / +pair2 (a paired GEMM's "
                         f"dots a K step), +bm8 / +bm16 (the batch tile of passes of <= {SMALL_BLOCK_M} rows){why}")
    return modes


def prepare(device) -> None:
    """Create the device's ticket counters now (the engine calls it before capturing graphs): created inside a
    capture, their zero fill would belong to the graph and eager launches before its first replay would read
    uninitialized counters."""
    _ticket_buffer(torch.device(device))


def _ticket_buffer(device: torch.device) -> torch.Tensor:
    """The per-device ticket counters (zero between launches: the last program of a tile resets its own)."""
    key = (device.type, device.index if device.index is not None else
           (torch.cuda.current_device() if device.type == "cuda" else 0))
    buf = _tickets.get(key)
    if buf is None:
        if device.type == "cuda" and torch.cuda.is_current_stream_capturing():
            raise RuntimeError("attnlab.kernels.gemm: the ticket counters must exist before a CUDA graph capture "
                               "(call gemm.prepare(device) first)")
        buf = _tickets[key] = torch.zeros(MAX_TICKETS, dtype=torch.int32, device=device)
    return buf


def loop_for(w_dtype: torch.dtype, x_dtype: torch.dtype, k: int, role: str | None = None) -> tuple[int, int, int, int]:
    """(BLOCK_N, BLOCK_K, num_stages, num_warps) of a GEMM's K loop: for 16-bit / fp8 weights an arm's forced loop
    for ``role`` (else for every GEMM), else ``DEFAULT_ROLE_LOOPS[role]``, else 64 x 256 from K >= LONG_K, 64 x 128
    below (16 KiB of bf16 per stage), 3 stages, 4 warps; fp8 weights FP8_LONG_LOOP from LONG_K (every role), else
    128 x 3 x 4 (``DEFAULT_ROLE_LOOPS`` are bf16 / fp16 measurements and do not apply); fp32 64 x 64, 3 stages, 4
    warps, whatever is forced."""
    if torch.float32 in (w_dtype, x_dtype):
        return 64, 64, 3, 4
    forced = _loops.get(role) or _loops.get("all")
    if forced or k < LONG_K:
        return (64, *(forced or (128, 3, 4)))
    if w_dtype == torch.float8_e4m3fn:  # FP8_LONG_LOOP (2 warps: mma.sync, no trip through shared memory), any role
        return (64, *FP8_LONG_LOOP)
    return (64, *DEFAULT_ROLE_LOOPS.get(role, (256, 3, 4)))


def loop_config() -> tuple[tuple[str, tuple[int, int, int]], ...]:
    """The K loops a bench arm forces on 16-bit / fp8 GEMMs: (("all" or a role, (BLOCK_K, stages, warps)), ...);
    empty: the default (``loop_for``)."""
    return tuple(sorted(_loops.items()))


def _set_loop_config(loops) -> None:
    global _loops
    _loops = {key: tuple(loop) for key, loop in (loops or ())}


def wave_efficiency(programs: int) -> float:
    """The share of TARGET_PROGRAMS-wide waves that ``programs`` equal programs keep busy (1.0: whole waves)."""
    return programs / (TARGET_PROGRAMS * triton.cdiv(programs, TARGET_PROGRAMS))


def split_k(n_tiles: int, k: int, block_k: int, policy: str = "fill", target: int = TARGET_PROGRAMS) -> tuple[int, int]:
    """(splits, k_per_split): split K only while the N tiles alone leave SMs idle (``fill``: until about ``target``
    programs); ``lean``: and only where K is longer than LEAN_MAX_K; ``wave``: as lean for short K, else the power of
    two of least cost: idle SMs of the last wave (``wave_efficiency``) plus the partials' traffic (the smallest within
    WAVE_SLACK; ``target`` does not act there). A function of (N tiles, K, BLOCK_K, the policy, the target) only — never of M — so rows stay
    bit-identical across M."""
    if policy not in ("fill", "lean", "wave"):
        raise ValueError(f"split_k: policy {policy!r} is not fill, lean or wave")
    chunks = triton.cdiv(k, block_k)
    want = min(triton.cdiv(target, n_tiles), chunks, MAX_SPLIT_K)
    if policy != "fill" and k <= LEAN_MAX_K:
        want = 1
    elif policy == "wave":
        def real(c: int) -> int:  # the splits a power of two c becomes once K is cut into whole chunks
            return triton.cdiv(k, triton.cdiv(chunks, c) * block_k)

        def cost(c: int) -> float:
            s = real(c)
            return 1 / wave_efficiency(n_tiles * s) + (s > 1) * s * PARTIAL_BYTES_PER_COLUMN / (2 * k)

        cands = [1 << i for i in range(MAX_SPLIT_K.bit_length()) if 1 << i <= min(chunks, MAX_SPLIT_K)]
        least = min(map(cost, cands))
        want = 1 if n_tiles >= WAVE_MAX_TILES else min(c for c in cands if cost(c) <= least * (1 + WAVE_SLACK))
    splits = 1 << (want.bit_length() - 1)  # a power of two below the target
    per = triton.cdiv(chunks, splits) * block_k
    return triton.cdiv(k, per), per


@triton.jit
def _columns(j, PAIRED: tl.constexpr, G):
    c1 = j
    c2 = j
    if PAIRED:
        c1 = (j // G) * (2 * G) + j % G
        c2 = c1 + G
    return c1, c2


@triton.jit
def _side_inputs(offs_m, j, m_mask, n_mask, RES, COS, SIN, SLOTS, POS, stride_rm, stride_cm, G, ROPE_COLS,
                 EPI: tl.constexpr, PAIRED: tl.constexpr, KV_STORE: tl.constexpr, ROPE_POS: tl.constexpr,
                 LOAD: tl.constexpr = True):
    """What the epilogue reads besides the sums (the residual tile, RoPE's cos / sin, the pool slots), loaded
    before the K loop so their latency hides under the weight stream instead of following it. ROPE_POS: COS / SIN
    are tables over positions, row i reading the row of its position POS[i]; else row i's own cos / sin."""
    c1, _ = _columns(j, PAIRED, G)
    rows = offs_m[None, :]
    mask = n_mask[:, None] & m_mask[None, :]
    r = tl.zeros([j.shape[0], offs_m.shape[0]], dtype=tl.float32)
    c = tl.zeros([j.shape[0], offs_m.shape[0]], dtype=tl.float32)
    s = tl.zeros([j.shape[0], offs_m.shape[0]], dtype=tl.float32)
    slot = tl.zeros([offs_m.shape[0]], dtype=tl.int64)
    if LOAD and EPI == 1:
        r = tl.load(RES + rows * stride_rm + c1[:, None], mask=mask, other=0.0).to(tl.float32)
    if LOAD and EPI == 3:  # cos = cat(f, f): index the first half
        cm = (n_mask & (c1 < ROPE_COLS))[:, None] & m_mask[None, :]
        crow = rows.to(tl.int64)
        if ROPE_POS:
            crow = tl.load(POS + offs_m, mask=m_mask, other=0).to(tl.int64)[None, :]
        c = tl.load(COS + crow * stride_cm + (j % G)[:, None], mask=cm, other=1.0).to(tl.float32)
        s = tl.load(SIN + crow * stride_cm + (j % G)[:, None], mask=cm, other=0.0).to(tl.float32)
        if KV_STORE:
            slot = tl.load(SLOTS + offs_m, mask=m_mask, other=-1).to(tl.int64)
    return r, c, s, slot


@triton.jit
def _epilogue(a1, a2, offs_m, j, m_mask, n_mask, OUT, SCALE, BIAS, KC, VC, res, cos, sin, slot, stride_om,
              stride_slot, G, ROPE_COLS, Q_COLS, FP8: tl.constexpr, HAS_BIAS: tl.constexpr,
              EPI: tl.constexpr, PAIRED: tl.constexpr, KV_STORE: tl.constexpr):
    # a1, a2: [BLOCK_N, BLOCK_M] fp32 sums of logical columns j (and their pair columns when PAIRED);
    # res, cos, sin, slot: _side_inputs
    c1, c2 = _columns(j, PAIRED, G)
    mask = n_mask[:, None] & m_mask[None, :]
    ty = OUT.dtype.element_ty
    if FP8:  # per-output-row weight scale on the fp32 sum
        a1 = a1 * tl.load(SCALE + c1, mask=n_mask, other=0.0)[:, None]
        if PAIRED:
            a2 = a2 * tl.load(SCALE + c2, mask=n_mask, other=0.0)[:, None]
    if HAS_BIAS:
        a1 = a1 + tl.load(BIAS + c1, mask=n_mask, other=0.0).to(tl.float32)[:, None]
        if PAIRED:
            a2 = a2 + tl.load(BIAS + c2, mask=n_mask, other=0.0).to(tl.float32)[:, None]
    y1 = a1.to(ty)
    rows = offs_m[None, :]
    if EPI == 0:
        tl.store(OUT + rows * stride_om + c1[:, None], y1, mask=mask)
    elif EPI == 1:  # residual add: h + round(proj)
        tl.store(OUT + rows * stride_om + c1[:, None], (y1.to(tl.float32) + res).to(ty), mask=mask)
    elif EPI == 2:  # SiLU(gate) * up -> [M, I], F.silu rounded to the model dtype first
        g = y1.to(tl.float32)
        act = (g / (1.0 + tl.exp(-g))).to(ty)
        y = (act.to(tl.float32) * a2.to(ty).to(tl.float32)).to(ty)
        tl.store(OUT + rows * stride_om + j[:, None], y, mask=mask)
    else:  # RoPE on pairs (x1, x2) = (c1, c2) of each q / k head
        y2 = a2.to(ty)
        cm = (n_mask & (c1 < ROPE_COLS))[:, None] & m_mask[None, :]
        c, s = cos, sin
        x1, x2 = y1.to(tl.float32), y2.to(tl.float32)
        o1 = ((x1 * c).to(ty).to(tl.float32) + (-x2 * s).to(ty).to(tl.float32)).to(ty)
        o2 = ((x2 * c).to(ty).to(tl.float32) + (x1 * s).to(ty).to(tl.float32)).to(ty)
        o1 = tl.where(cm, o1, y1)
        o2 = tl.where(cm, o2, y2)
        tl.store(OUT + rows * stride_om + c1[:, None], o1, mask=mask)
        tl.store(OUT + rows * stride_om + c2[:, None], o2, mask=mask)
        if KV_STORE:  # k (rotated) and v straight into their pool slots; slot -1: a padded row, not stored
            keep = mask & (slot >= 0)[None, :]
            dst = slot[None, :] * stride_slot
            kt = KC.dtype.element_ty
            is_k1, is_k2 = (c1 >= Q_COLS) & (c1 < ROPE_COLS), (c2 >= Q_COLS) & (c2 < ROPE_COLS)
            tl.store(KC + dst + (c1 - Q_COLS)[:, None], o1.to(kt), mask=keep & is_k1[:, None])
            tl.store(KC + dst + (c2 - Q_COLS)[:, None], o2.to(kt), mask=keep & is_k2[:, None])
            tl.store(VC + dst + (c1 - ROPE_COLS)[:, None], o1.to(kt), mask=keep & (c1 >= ROPE_COLS)[:, None])
            tl.store(VC + dst + (c2 - ROPE_COLS)[:, None], o2.to(kt), mask=keep & (c2 >= ROPE_COLS)[:, None])


@triton.jit
def _argmax_tail(acc, offs_m, j, m_mask, n_mask, OUT, PART, TICKET, SCALE, BIAS, pid_n, x_dt, FP8: tl.constexpr,
                 HAS_BIAS: tl.constexpr, BLOCK_M: tl.constexpr, RED: tl.constexpr):
    """The argmax epilogue (an LM head's greedy tokens): each column tile's first maximal column per row, of the
    logits rounded as F.linear rounds them and compared in fp32 (as ``F.linear(x, w).float().argmax(-1)``), into
    PART [2, tiles, BLOCK_M] (maxima, then columns as exact fp32); then one ticket over all tiles, and the last
    program to arrive reduces the tiles in column order, a later tile winning only with a strictly larger max:
    the first maximal column overall, whatever M (row-invariant: a row's logits never depend on the others)."""
    if FP8:
        acc = acc * tl.load(SCALE + j, mask=n_mask, other=0.0)[:, None]
    if HAS_BIAS:
        acc = acc + tl.load(BIAS + j, mask=n_mask, other=0.0).to(tl.float32)[:, None]
    y = tl.where(n_mask[:, None], acc.to(x_dt).to(tl.float32), float("-inf"))
    tiles = tl.num_programs(0)
    tl.store(PART + pid_n * BLOCK_M + offs_m, tl.max(y, axis=0))
    tl.store(PART + (tiles + pid_n) * BLOCK_M + offs_m, (pid_n * j.shape[0] + tl.argmax(y, axis=0)).to(tl.float32))
    tl.debug_barrier()  # every thread's partial before the arrival
    if tl.atomic_add(TICKET, 1, sem="acq_rel") == tiles - 1:
        best = tl.full([BLOCK_M], float("-inf"), tl.float32)
        col = tl.zeros([BLOCK_M], dtype=tl.int32)
        for t0 in range(0, tiles, RED):
            t = t0 + tl.arange(0, RED)
            tm = (t < tiles)[:, None]
            v = tl.load(PART + t[:, None] * BLOCK_M + offs_m[None, :], mask=tm, other=float("-inf"),
                        cache_modifier=".cg")
            c = tl.load(PART + (tiles + t[:, None]) * BLOCK_M + offs_m[None, :], mask=tm, other=0.0,
                        cache_modifier=".cg")
            at = tl.argmax(v, axis=0)  # the block's first tile holding its max
            bc = tl.sum(tl.where(tl.arange(0, RED)[:, None] == at[None, :], c, 0.0), axis=0)
            bv = tl.max(v, axis=0)
            take = bv > best
            best = tl.where(take, bv, best)
            col = tl.where(take, bc.to(tl.int32), col)
        tl.store(OUT + offs_m, col.to(tl.int64), mask=m_mask)
        tl.store(TICKET, 0)  # ready for the next launch


@triton.jit
def _norm_tail(OUT, XO, NW, TICKET, M, N, stride_om, stride_xo, eps, tiles, NB: tl.constexpr, ROWS: tl.constexpr):
    """The tail norm (module docstring): this program's tile of OUT is stored; one arrival on the GEMM's ticket over
    its ``tiles`` column tiles, and the last to arrive writes rmsnorm(OUT rows) * NW into XO (HF's roundings, as
    fused.add_rmsnorm: normalize in fp32, round, scale, round), ROWS rows at a time, then resets the ticket."""
    tl.debug_barrier()  # every thread's stores of this tile before the arrival
    if tl.atomic_add(TICKET, 1, sem="acq_rel") == tiles - 1:
        ty = XO.dtype.element_ty
        offs = tl.arange(0, NB)
        cmask = offs < N
        w = tl.load(NW + offs, mask=cmask, other=0.0).to(tl.float32)
        rows = tl.arange(0, ROWS)
        for m0 in range(0, M, ROWS):
            r = m0 + rows
            mask = (r < M)[:, None] & cmask[None, :]
            h = tl.load(OUT + r[:, None] * stride_om + offs[None, :], mask=mask, other=0.0,
                        cache_modifier=".cg").to(tl.float32)  # other tiles' stores: past L1
            rstd = tl.math.rsqrt(tl.sum(h * h, axis=1) / N + eps)
            y = (w[None, :] * (h * rstd[:, None]).to(ty).to(tl.float32)).to(ty)
            tl.store(XO + r[:, None] * stride_xo + offs[None, :], y, mask=mask)
        tl.store(TICKET, 0)  # ready for the next launch


@triton.jit
def _sum_partials(base, pmask, num_splits, N_LOG, BLOCK_N: tl.constexpr, BLOCK_M: tl.constexpr,
                  PAIRED: tl.constexpr):
    """The partials [splits, 2 (pair), BLOCK_M, N_LOG] of one column tile summed in split order (0, 1, ...): the
    one order both reductions use (the ticket's last program, _reduce_kernel), so they give the same bits. The
    loads bypass L1 (.cg): the ticket's reducer reads other programs' stores."""
    a1 = tl.zeros([BLOCK_N, BLOCK_M], dtype=tl.float32)
    a2 = tl.zeros([BLOCK_N, BLOCK_M], dtype=tl.float32)
    for sp in range(num_splits):
        a1 += tl.load(base + sp * 2 * BLOCK_M * N_LOG, mask=pmask, other=0.0, cache_modifier=".cg")
        if PAIRED:
            a2 += tl.load(base + sp * 2 * BLOCK_M * N_LOG + BLOCK_M * N_LOG, mask=pmask, other=0.0,
                          cache_modifier=".cg")
    return a1, a2


# e4m3 x4 (one 32-bit register, byte i the i-th value) -> bf16 x4 (two bf16x2 registers, lo then hi), exactly: each
# byte s.eeee.mmm to the top byte of a 16-bit lane (prmt), its eeee.mmm shifted down into a bf16's low exponent and
# high mantissa bits, the sign kept (lop3s): the bf16 bits of the value times 2^-120 (bf16's bias 127 against e4m3's
# 7), normal or subnormal alike; one bf16x2 FMA by 2^120 (0x7b80) and -0 gives the value. The NaN bytes (0x7f, 0xff,
# which quantize_rows never writes) come out as +-480. The operands: IN, OUT_LO, OUT_HI.
_E4M3X4_PTX = """
        .reg .b32 lo, hi, k, z, s;
        mov.b32 k, 0x7B807B80;
        mov.b32 z, 0x80008000;
        prmt.b32 lo, IN, 0, 0x1404;
        prmt.b32 hi, IN, 0, 0x3424;
        shr.b32 s, lo, 4;
        and.b32 s, s, 0x07F007F0;
        and.b32 lo, lo, 0x80008000;
        or.b32 lo, lo, s;
        fma.rn.bf16x2 OUT_LO, lo, k, z;
        shr.b32 s, hi, 4;
        and.b32 s, s, 0x07F007F0;
        and.b32 hi, hi, 0x80008000;
        or.b32 hi, hi, s;
        fma.rn.bf16x2 OUT_HI, hi, k, z;
"""
# the two uses: 4 values packed by Triton (pack=4, two bf16x2 out), and one int32 in, four bf16 out
_PTX_PACKED = tl.constexpr("{" + _E4M3X4_PTX.replace("OUT_LO", "$0").replace("OUT_HI", "$1").replace("IN", "$2") + "}")
_PTX_WIDE = tl.constexpr("{" + _E4M3X4_PTX.replace("OUT_LO", "lo").replace("OUT_HI", "hi").replace("IN", "$4")
                         + "        mov.b32 {$0, $1}, lo;\n        mov.b32 {$2, $3}, hi;\n}")
_PTX_MODE, _WIDE = tl.constexpr(FP8_MODES.index("ptx")), tl.constexpr(FP8_MODES.index("wide"))  # in the kernel
_HALF = tl.constexpr(FP8_MODES.index("half"))


@triton.jit
def _e4m3_to_bf16(w):
    """float8_e4m3fn -> bfloat16, exact, by _E4M3X4_PTX on 4 values at a time (fp8 mode ``ptx``). Triton's own cast
    (mode ``cast``) goes e4m3x2 -> f16x2 -> two cvt.bf16.f16, which run on the conversion units (a sixteenth of the
    ALUs' rate) and set the pace of an fp8-weight GEMM's K loop."""
    return tl.inline_asm_elementwise(
        asm=_PTX_PACKED, constraints="=r,=r,r", args=[w.to(tl.uint8, bitcast=True)], dtype=tl.bfloat16, is_pure=True, pack=4)


@triton.jit
def _bf16_to_f16(x, PTX: tl.constexpr):
    """bf16 -> f16 for fp8 mode ``half``, rounded to nearest and saturated: exact for |x| in [2^-17, 65504] (and 0),
    the f16 subnormal grid (2^-24) below, +-65504 above and for +-inf, NaN kept. Two values at a time
    (cvt.rn.satfinite.f16x2.f32) where PTX runs, Triton ops otherwise: the same values for every bf16 (a CPU test runs
    all 65,536)."""
    if PTX:
        return tl.inline_asm_elementwise(
            asm="{ .reg .b32 lo, hi; shl.b32 lo, $1, 16; and.b32 hi, $1, 0xFFFF0000; "
                "cvt.rn.satfinite.f16x2.f32 $0, hi, lo; }",
            constraints="=r,r", args=[x], dtype=tl.float16, is_pure=True, pack=2)
    return tl.clamp(x.to(tl.float32), -65504.0, 65504.0, propagate_nan=tl.PropagateNan.ALL).to(tl.float16)


@triton.jit
def _byte_to_bf16(b):
    """One e4m3 byte (int32, 0..255) -> bf16 by _E4M3X4_PTX's recipe in Triton ops, through fp32 bits (the
    interpreter's path; it mishandles bf16 subnormals): the value times 2^-120, times 2^120, both exact."""
    bits = ((b & 0x80) << 24) | ((b & 0x7F) << 20)
    return (bits.to(tl.float32, bitcast=True) * 1.329227995784916e36).to(tl.bfloat16)  # 2^120


@triton.jit
def _e4m3x4_to_bf16(w4, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, PTX: tl.constexpr):
    """fp8 mode ``wide``: w4 [BLOCK_N, BLOCK_K // 4] int32, 4 e4m3 weights each (byte i: column 4c + i) ->
    [BLOCK_N, BLOCK_K] bf16, converted where they were loaded (16-byte vectors of 16 weights a thread), then joined
    along K, so the tile reaches the dot as bf16. Under Triton 3.6 (the H200's) a dot on mma.sync reads the words from
    shared memory straight in the MMA's register layout and converts them there; a dot on the warp-group MMA (every
    fp8 GEMM since pair_dots 1) stores the converted bf16 tile back to shared memory for it (docs/kernels.md)."""
    if PTX:
        o0, o1, o2, o3 = tl.inline_asm_elementwise(
            asm=_PTX_WIDE, constraints="=h,=h,=h,=h,r", args=[w4], dtype=(tl.bfloat16, tl.bfloat16, tl.bfloat16, tl.bfloat16),
            is_pure=True, pack=1)
    else:
        o0 = _byte_to_bf16(w4 & 0xFF)
        o1 = _byte_to_bf16((w4 >> 8) & 0xFF)
        o2 = _byte_to_bf16((w4 >> 16) & 0xFF)
        o3 = _byte_to_bf16((w4 >> 24) & 0xFF)
    # join(join(o0, o2), join(o1, o3))[..., i, s] is o_{2i + s}: flattened row-major, o0, o1, o2, o3 along K
    return tl.reshape(tl.join(tl.join(o0, o2), tl.join(o1, o3)), [BLOCK_N, BLOCK_K])


@triton.jit
def _weights(W, W4, c, n_mask, offs_k, k_mask, k0, K, stride_wn, stride_w4, x_dt: tl.constexpr, FP8: tl.constexpr,
             FP8_MODE: tl.constexpr, PTX: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    """The [BLOCK_N, BLOCK_K] weight tile of rows ``c`` at K offset k0, in the activation dtype (fp8: exactly; the
    row scale comes after the sum)."""
    if FP8 and FP8_MODE == _WIDE:
        offs_k4 = k0 // 4 + tl.arange(0, BLOCK_K // 4)
        w4 = tl.load(W4 + c[:, None].to(tl.int64) * stride_w4 + offs_k4[None, :],
                     mask=n_mask[:, None] & (offs_k4 < K // 4)[None, :], other=0)
        return _e4m3x4_to_bf16(w4, BLOCK_N, BLOCK_K, PTX)
    w = tl.load(W + c[:, None].to(tl.int64) * stride_wn + offs_k[None, :],
                mask=n_mask[:, None] & k_mask[None, :], other=0.0)
    if FP8 and FP8_MODE == _HALF:
        w = w.to(tl.float16)
    elif FP8 and FP8_MODE == _PTX_MODE:  # _fp8_launch picks it only where PTX runs
        w = _e4m3_to_bf16(w)
    elif FP8:
        w = w.to(x_dt)
    return w


@triton.jit
def _dot(w, xt, acc, IEEE: tl.constexpr):
    """acc + w @ xt. IEEE: fp32 inputs, or the interpreter (its bf16 tl.dot is wrong in Triton 3.9; bf16 products are
    exact in fp32, so only the summation order differs from the GPU's tensor cores)."""
    if IEEE:
        return tl.dot(w.to(tl.float32), xt.to(tl.float32), acc, input_precision="ieee")
    return tl.dot(w, xt, acc)


@triton.jit
def _prefetch_weights(W, c1, c2, n_mask, k_lo, k_hi, stride_wn, PAIRED: tl.constexpr, CHUNKS: tl.constexpr,
                      BLOCK_K: tl.constexpr, LINE: tl.constexpr):
    """The first CHUNKS BLOCK_K chunks of this program's weight rows into L2, one prefetch per ``LINE`` elements
    (128 bytes): issued before the PDL wait, so they stream while the previous kernel still runs. The weights are
    no kernel's output, so reading them early is safe; the K loop's loads, and so the sums, are unchanged."""
    lines = tl.arange(0, BLOCK_K // LINE) * LINE
    for c in tl.static_range(CHUNKS):
        offs = k_lo + c * BLOCK_K + lines
        mask = n_mask[:, None] & (offs[None, :] < k_hi)
        prefetch_l2(tl.where(mask, W + c1[:, None].to(tl.int64) * stride_wn + offs[None, :], W))
        if PAIRED:
            prefetch_l2(tl.where(mask, W + c2[:, None].to(tl.int64) * stride_wn + offs[None, :], W))


@triton.jit
def _gemm_kernel(X, XN, W, W4, OUT, PART, TICKETS, SCALE, BIAS, NORM_W, RES, COS, SIN, KC, VC, SLOTS, POS, XO, TAIL_W,
                 TAIL_TICKET, stride_xo, tail_eps, M, N_LOG, K,
                 k_per_split, stride_xm, stride_wn, stride_w4, stride_om, stride_rm, stride_cm, stride_slot, eps, G, ROPE_COLS,
                 Q_COLS, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, SPLIT: tl.constexpr,
                 NORM: tl.constexpr, SS_BLOCK: tl.constexpr, SS_ITERS: tl.constexpr, NRM_ITERS: tl.constexpr,
                 FP8: tl.constexpr, HAS_BIAS: tl.constexpr, EPI: tl.constexpr, PAIRED: tl.constexpr,
                 KV_STORE: tl.constexpr, IEEE: tl.constexpr, ROPE_POS: tl.constexpr = False,
                 PREFETCH: tl.constexpr = 0, LINE: tl.constexpr = 64,
                 ARGMAX_RED: tl.constexpr = 256, FP8_MODE: tl.constexpr = 0, PTX: tl.constexpr = False,
                 TAIL: tl.constexpr = False, TAIL_NB: tl.constexpr = 16, TAIL_ROWS: tl.constexpr = 1,
                 JOIN: tl.constexpr = False, USE_PDL: tl.constexpr = False):
    # SPLIT: 0 one program per column tile; 1 partials for _reduce_kernel; 2 partials, the last program reduces
    # JOIN (PAIRED only): one dot a K step over both halves' rows (pair_dots)
    # TAIL: the tail norm of OUT into XO (_norm_tail), after the epilogue (SPLIT 1: _reduce_kernel's)
    # FP8_MODE: the index of the fp8 mode (FP8_MODES) e4m3 weights convert by (W4: W as int32, mode wide);
    # PTX: inline PTX may run (a GPU; the interpreter runs Triton ops)
    pid_n = tl.program_id(0)
    pid_k = tl.program_id(1)
    j = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    n_mask = j < N_LOG
    c1, c2 = _columns(j, PAIRED, G)
    k_lo = pid_k * k_per_split
    k_hi = tl.minimum(k_lo + k_per_split, K)
    if USE_PDL and PREFETCH > 0:  # engine.gemm_prefetch: weights only, before the wait
        _prefetch_weights(W, c1, c2, n_mask, k_lo, k_hi, stride_wn, PAIRED, PREFETCH, BLOCK_K, LINE)
    pdl_start(USE_PDL)
    offs_m = tl.arange(0, BLOCK_M)
    m_mask = offs_m < M
    x_dt = X.dtype.element_ty
    res, cos, sin, slot = _side_inputs(offs_m, j, m_mask, n_mask, RES, COS, SIN, SLOTS, POS, stride_rm, stride_cm,
                                       G, ROPE_COLS, EPI, PAIRED, KV_STORE, ROPE_POS,
                                       SPLIT != 1)  # pass: _reduce_kernel's
    if NORM:  # sum of squares of each row over all of K, chunk by chunk (the same order for every row and M);
        # unrolled, so the chunks' loads are in flight together instead of one latency per chunk
        ss = tl.zeros([BLOCK_M], dtype=tl.float32)
        for c in tl.static_range(SS_ITERS):
            offs_s = c * SS_BLOCK + tl.arange(0, SS_BLOCK)
            xv = tl.load(X + offs_m[None, :] * stride_xm + offs_s[:, None],
                         mask=m_mask[None, :] & (offs_s[:, None] < K), other=0.0).to(tl.float32)
            ss += tl.sum(xv * xv, axis=0)
        rstd = tl.math.rsqrt(ss / K + eps)
    acc1 = tl.zeros([BLOCK_N, BLOCK_M], dtype=tl.float32)
    acc2 = tl.zeros([BLOCK_N, BLOCK_M], dtype=tl.float32)
    src = X
    src_stride = stride_xm
    if NORM:  # HF RMSNorm (normalize in fp32, round, scale, round) of this program's K range, once, into the
        # XN scratch [M, K], unrolled (the loads in flight together); the K loop then streams XN as it streams x,
        # pipelined, instead of waiting on each chunk of x in registers. Programs of one split write the same bits.
        for c in tl.static_range(NRM_ITERS):
            offs_s = k_lo + c * SS_BLOCK + tl.arange(0, SS_BLOCK)
            smask = m_mask[None, :] & (offs_s[:, None] < k_hi)
            xv = tl.load(X + offs_m[None, :] * stride_xm + offs_s[:, None], mask=smask, other=0.0)
            nw = tl.load(NORM_W + offs_s, mask=offs_s < k_hi, other=0.0).to(tl.float32)
            xn = (nw[:, None] * (xv.to(tl.float32) * rstd[None, :]).to(x_dt).to(tl.float32)).to(x_dt)
            tl.store(XN + offs_m[None, :] * K + offs_s[:, None], xn, mask=smask)
        tl.debug_barrier()  # the CTA's stores before its loads of XN
        src = XN
        src_stride = K
    if JOIN:  # one [2 BLOCK_N, BLOCK_K] tile a step: rows 0..BLOCK_N-1 are _columns' c1, the rest its c2
        i2 = tl.arange(0, 2 * BLOCK_N)
        j12 = pid_n * BLOCK_N + i2 % BLOCK_N
        j1, j2 = _columns(j12, PAIRED, G)
        c12, n12 = tl.where(i2 < BLOCK_N, j1, j2), j12 < N_LOG
        acc12 = tl.zeros([2 * BLOCK_N, BLOCK_M], dtype=tl.float32)
    for k0 in range(k_lo, k_hi, BLOCK_K):
        offs_k = k0 + tl.arange(0, BLOCK_K)
        k_mask = offs_k < K
        xt = tl.load(src + offs_m[None, :] * src_stride + offs_k[:, None], mask=m_mask[None, :] & k_mask[:, None],
                     other=0.0)  # [BLOCK_K, BLOCK_M]
        if FP8 and FP8_MODE == _HALF:
            xt = _bf16_to_f16(xt, PTX)
        if JOIN:
            acc12 = _dot(_weights(W, W4, c12, n12, offs_k, k_mask, k0, K, stride_wn, stride_w4, x_dt, FP8, FP8_MODE,
                                  PTX, 2 * BLOCK_N, BLOCK_K), xt, acc12, IEEE)
        else:
            acc1 = _dot(_weights(W, W4, c1, n_mask, offs_k, k_mask, k0, K, stride_wn, stride_w4, x_dt, FP8, FP8_MODE,
                                 PTX, BLOCK_N, BLOCK_K), xt, acc1, IEEE)
            if PAIRED:
                acc2 = _dot(_weights(W, W4, c2, n_mask, offs_k, k_mask, k0, K, stride_wn, stride_w4, x_dt, FP8,
                                     FP8_MODE, PTX, BLOCK_N, BLOCK_K), xt, acc2, IEEE)
    if JOIN:  # the two halves' sums back apart: [2, BLOCK_N, BLOCK_M] -> [BLOCK_N, BLOCK_M, 2] -> two
        acc1, acc2 = tl.split(tl.permute(tl.reshape(acc12, [2, BLOCK_N, BLOCK_M]), [1, 2, 0]))
    if EPI == 4:  # argmax (never split: gemm() keeps it unsplit)
        _argmax_tail(acc1, offs_m, j, m_mask, n_mask, OUT, PART, TICKETS, SCALE, BIAS, pid_n, x_dt, FP8, HAS_BIAS,
                     BLOCK_M, ARGMAX_RED)
    elif SPLIT == 0:
        _epilogue(acc1, acc2, offs_m, j, m_mask, n_mask, OUT, SCALE, BIAS, KC, VC, res, cos, sin, slot, stride_om,
                  stride_slot, G, ROPE_COLS, Q_COLS, FP8, HAS_BIAS, EPI, PAIRED, KV_STORE)
        if TAIL:
            _norm_tail(OUT, XO, TAIL_W, TAIL_TICKET, M, N_LOG, stride_om, stride_xo, tail_eps, tl.num_programs(0),
                       TAIL_NB, TAIL_ROWS)
    else:  # partials [splits, 2 (pair), BLOCK_M, N_LOG] fp32, summed in split order
        base0 = PART + offs_m[None, :] * N_LOG + j[:, None]
        pmask = n_mask[:, None] & m_mask[None, :]
        tl.store(base0 + pid_k * 2 * BLOCK_M * N_LOG, acc1, mask=pmask)
        if PAIRED:
            tl.store(base0 + pid_k * 2 * BLOCK_M * N_LOG + BLOCK_M * N_LOG, acc2, mask=pmask)
        if SPLIT == 2:  # the ticket: every thread's partial stores before the arrival (barrier), published by the
            # acq_rel atomic; the last program to arrive sees all partials (its loads bypass L1) and reduces
            tl.debug_barrier()
            num_splits = tl.num_programs(1)
            arrived = tl.atomic_add(TICKETS + pid_n, 1, sem="acq_rel")
            if arrived == num_splits - 1:
                a1, a2 = _sum_partials(base0, pmask, num_splits, N_LOG, BLOCK_N, BLOCK_M, PAIRED)
                _epilogue(a1, a2, offs_m, j, m_mask, n_mask, OUT, SCALE, BIAS, KC, VC, res, cos, sin, slot,
                          stride_om, stride_slot, G, ROPE_COLS, Q_COLS, FP8, HAS_BIAS, EPI, PAIRED, KV_STORE)
                tl.store(TICKETS + pid_n, 0)  # ready for the next launch
                if TAIL:  # the tile's last split arrives for it
                    _norm_tail(OUT, XO, TAIL_W, TAIL_TICKET, M, N_LOG, stride_om, stride_xo, tail_eps,
                               tl.num_programs(0), TAIL_NB, TAIL_ROWS)


@triton.jit
def _reduce_kernel(PART, OUT, SCALE, BIAS, RES, COS, SIN, KC, VC, SLOTS, POS, XO, TAIL_W, TAIL_TICKET, stride_xo,
                   tail_eps, M, N_LOG, stride_om, stride_rm,
                   stride_cm, stride_slot, G, ROPE_COLS, Q_COLS, num_splits, BLOCK_M: tl.constexpr,
                   BLOCK_N: tl.constexpr, FP8: tl.constexpr, HAS_BIAS: tl.constexpr, EPI: tl.constexpr,
                   PAIRED: tl.constexpr, KV_STORE: tl.constexpr, ROPE_POS: tl.constexpr = False,
                   TAIL: tl.constexpr = False, TAIL_NB: tl.constexpr = 16, TAIL_ROWS: tl.constexpr = 1,
                   USE_PDL: tl.constexpr = False):
    pdl_start(USE_PDL)
    offs_m = tl.arange(0, BLOCK_M)
    m_mask = offs_m < M
    j = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    n_mask = j < N_LOG
    pmask = n_mask[:, None] & m_mask[None, :]
    res, cos, sin, slot = _side_inputs(offs_m, j, m_mask, n_mask, RES, COS, SIN, SLOTS, POS, stride_rm, stride_cm,
                                       G, ROPE_COLS, EPI, PAIRED, KV_STORE, ROPE_POS)
    a1, a2 = _sum_partials(PART + offs_m[None, :] * N_LOG + j[:, None], pmask, num_splits, N_LOG, BLOCK_N, BLOCK_M,
                           PAIRED)
    _epilogue(a1, a2, offs_m, j, m_mask, n_mask, OUT, SCALE, BIAS, KC, VC, res, cos, sin, slot, stride_om,
              stride_slot, G, ROPE_COLS, Q_COLS, FP8, HAS_BIAS, EPI, PAIRED, KV_STORE)
    if TAIL:
        _norm_tail(OUT, XO, TAIL_W, TAIL_TICKET, M, N_LOG, stride_om, stride_xo, tail_eps, tl.num_programs(0),
                   TAIL_NB, TAIL_ROWS)


# The fp8 mode of e4m3 weights against bf16 activations (FP8_MODES): ``cast`` Triton's (the fp8 tile read from shared
# memory in the MMA's register layout 2 bytes a thread, converted there on the conversion units), ``ptx`` the same tile
# converted by _E4M3X4_PTX, ``wide`` (EXACT_FP8_MODE: the fastest of the three, precision.fp8_mma=bf16) 4 weights a
# 32-bit load, converted by _E4M3X4_PTX (under Triton 3.6 where _e4m3x4_to_bf16 says): these three give the same bits,
# the dequantized weights' sums. Measured (bench.pdl --weights fp8w, gemm engine, batch 1, PDL on;
# experiments/h200-2026-12-04b): Llama-3.2-1B shapes cast 741, ptx 835-838, wide 910 tok/s; SmolLM2 cast 1,193, ptx
# 1,236-1,242, wide 1,297. Alone (bench.gemm, 8B gate_up, M = 1): 57.6 / 54.1 / 50.8 us. ``half`` (the default since
# 12-04f; precision.fp8_mma=f16, which precision.fp8_mma=auto picks for weight-only fp8 draft weights) sums f16
# activations against the weights in f16: bench.pdl, batch 1, PDL, the 8-row batch tile (experiments/h200-2026-12-04f):
# 1B fp8w 1,188 -> 1,305 tok/s (bf16 1,063), fp8 with the LM head 1,266 -> 1,402; 8B fp8wh 330 -> 374 (bf16 233);
# SmolLM2 fp8w 1,256 -> 1,463. On SmolLM2's real text (bench.fp8_agree, 2,781 positions) an fp8 copy of the target
# proposes the target's token as often with half as with wide (93.74% both; tau at k = 4: 4.39 / 4.40).
DEFAULT_FP8_MODE = "half"
EXACT_FP8_MODE = "wide"
_fp8_mode = DEFAULT_FP8_MODE
DEFAULT_FP8_PROGRAMS = None  # fp8 weights' split target in TARGET_PROGRAMS: by K (arms +f8x1 .. +f8x4 force one)
_fp8_programs = DEFAULT_FP8_PROGRAMS
_compile_only = False  # attnlab.kernels.aot: launches compile for a GPU and never run


def fp8_mode() -> str:
    return _fp8_mode


def set_fp8_mode(mode: str) -> None:
    """The process-wide fp8 mode (FP8_MODES); bench arms ``+f8cast`` / ``+f8ptx`` / ``+f8wide`` / ``+f8half``."""
    global _fp8_mode
    if mode not in FP8_MODES:
        raise ValueError(f"fp8 mode {mode!r}: choose from {', '.join(FP8_MODES)}")
    _fp8_mode = mode


def fp8_programs(k: int | None = None) -> int | None:
    """fp8 weights' split target, in TARGET_PROGRAMS, for a GEMM of ``k``: an arm's (+f8x1 .. +f8x4), else
    FP8_LONG_PROGRAMS from LONG_K and 1 below; without ``k``, the arm's setting (None: by K)."""
    if k is None or _fp8_programs is not None:
        return _fp8_programs
    return FP8_LONG_PROGRAMS if k >= LONG_K else 1


def _set_fp8_programs(n: int | None) -> None:
    global _fp8_programs
    _fp8_programs = None if n is None else int(n)


def _fp8_launch(x: torch.Tensor, w: torch.Tensor) -> dict:
    """The kernel's FP8_MODE, PTX and W4 / stride_w4 for weights ``w`` against ``x``: a mode other than cast only
    with bf16 activations; ptx only where PTX runs (an NVIDIA GPU or an AOT compile; else cast); wide only where K
    and the row stride are multiples of 4 and the weights 16-byte aligned (32-bit loads; else ptx, or cast), and
    without PTX (the interpreter, ROCm) by Triton ops. cast / ptx / wide give the same bits; half (bf16 activations
    only) sums f16 activations, exact only for |x| in [2^-17, 65504] (``_bf16_to_f16``)."""
    if w.dtype != torch.float8_e4m3fn:  # 16-bit / fp32 weights: nothing to convert, the variant they always had
        return {"FP8_MODE": 0, "PTX": False, "W4": w, "stride_w4": w.stride(0)}
    gpu = ((x.device.type == "cuda" and not torch.version.hip) or _compile_only) and not interpreter_on()  # PTX runs
    mode = _fp8_mode if x.dtype == torch.bfloat16 else "cast"
    if mode == "ptx" and not gpu:
        mode = "cast"  # the interpreter runs no PTX; the wide mode has a Triton-ops path
    if mode == "wide" and (w.shape[1] % 4 or w.stride(0) % 4 or w.data_ptr() % 16):
        mode = "ptx" if gpu else "cast"
    w4 = w.view(torch.int32) if mode == "wide" else w
    return {"FP8_MODE": FP8_MODES.index(mode), "PTX": gpu, "W4": w4, "stride_w4": w4.stride(0)}


def _rowmajor(t: torch.Tensor | None) -> torch.Tensor | None:
    return t if t is None or t.stride(-1) == 1 else t.contiguous()


def gemm(x: torch.Tensor, w: torch.Tensor, bias: torch.Tensor | None = None, *, w_scale: torch.Tensor | None = None,
         norm_weight: torch.Tensor | None = None, eps: float = 1e-6, epilogue: str = "none",
         residual: torch.Tensor | None = None, cos: torch.Tensor | None = None, sin: torch.Tensor | None = None,
         head_dim: int = 0, rope_cols: int = 0, kv_store: tuple | None = None,
         positions: torch.Tensor | None = None, role: str | None = None,
         tail_norm: tuple[torch.Tensor, float] | None = None) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """x [M, K] (fp32 / fp16 / bf16, M <= 16), w [N, K] (x's dtype, or float8_e4m3fn with w_scale [N] fp32),
    bias [N] or None -> [M, N] in x's dtype ([M, N / 2] for silu_mul, [M] int64 for argmax). See the module
    docstring for norm_weight [K] (RMSNorm prologue, eps) and the epilogues: residual [M, N]; rope: cos / sin
    [M, head_dim] (or [M, 1, head_dim]), rotating columns [0, rope_cols) (q and k) per head; with ``positions``
    [M] int (rope only), cos / sin are tables [P, head_dim] over positions and row i takes row ``positions[i]``
    (the caller keeps every position below P: nothing checks it on the device). ``kv_store`` (rope only):
    (k_cache, v_cache, slots), caches [num_slots, kv_heads, head_dim] of x's dtype with each slot's heads
    contiguous, slots [M] int (-1: not stored): the k (rotated) and v columns of each row also go to its slot.
    ``role`` (one of ROLES, or None): the GEMM's place in the layer, which picks its K loop (``loop_for``).
    ``tail_norm`` (weight [N], eps), residual epilogue only, N <= MAX_TAIL_N: the tail norm (module docstring); returns
    (out, rmsnorm(out) * weight) then."""
    m, k = x.shape
    n, kw = w.shape
    if m > MAX_M:
        raise ValueError(f"attnlab.kernels.gemm: M={m} rows > {MAX_M} (use cuBLAS for large M)")
    if kw != k:
        raise ValueError(f"attnlab.kernels.gemm: x has K={k}, w has K={kw}")
    if epilogue not in _EPI:
        raise ValueError(f"epilogue={epilogue!r}: choose from {', '.join(EPILOGUES)}")
    if role is not None and role not in ROLES:
        raise ValueError(f"role={role!r}: choose from {', '.join(ROLES)} (or None)")
    fp8 = w.dtype == torch.float8_e4m3fn
    if fp8 != (w_scale is not None):
        raise ValueError("float8_e4m3fn weights need w_scale [N] fp32, and only they take one")
    if not fp8 and w.dtype != x.dtype:
        raise ValueError(f"w is {w.dtype}, x is {x.dtype}: same dtype (or fp8 weights with w_scale)")
    paired = epilogue in ("silu_mul", "rope")
    group = {"silu_mul": n // 2, "rope": head_dim // 2}.get(epilogue, 1)
    if paired and (n % 2 or group < 1 or (epilogue == "rope" and n % head_dim)):
        raise ValueError(f"epilogue={epilogue!r}: N={n} must be even (rope: a multiple of head_dim={head_dim})")
    kc = vc = slots = None
    if kv_store is not None:
        kc, vc, slots = kv_store
        kv_cols = n - rope_cols
        if epilogue != "rope" or kv_cols <= 0 or 2 * rope_cols - n < 0:
            raise ValueError("kv_store needs epilogue='rope' with rope_cols = q + k columns (v after them)")
        if (kc.shape != vc.shape or kc.stride() != vc.stride() or kc.dim() != 3 or kc.dtype != x.dtype
                or vc.dtype != x.dtype or kc.shape[1] * kc.shape[2] != kv_cols or kc.stride(1) != kc.shape[2]
                or kc.stride(2) != 1):
            raise ValueError(f"kv_store: caches must be [slots, kv_heads, head_dim] of {x.dtype} with {kv_cols} "
                             f"contiguous columns per slot, got {tuple(kc.shape)} {kc.dtype} / {vc.dtype} strides "
                             f"{kc.stride()}")
        if slots.shape != (m,) or slots.dtype not in (torch.int32, torch.int64) or (m > 1 and slots.stride(0) != 1):
            raise ValueError(f"kv_store: slots must be a contiguous [{m}] int32 / int64 tensor, got "
                             f"{tuple(slots.shape)} {slots.dtype} stride {slots.stride()}")
        if not (kc.device == vc.device == slots.device == x.device):
            raise ValueError(f"kv_store: caches and slots must be on {x.device}")
    if tail_norm is not None:
        tw, _ = tail_norm
        if epilogue != "residual":
            raise ValueError(f"tail_norm goes with epilogue='residual' (the stream it normalizes), not {epilogue!r}")
        if n > MAX_TAIL_N or tw.shape != (n,) or tw.device != x.device or not tw.is_floating_point():
            raise ValueError(f"tail_norm: weight must be a float [{n}] tensor on {x.device} and N <= {MAX_TAIL_N}, got "
                             f"{tuple(tw.shape)} {tw.dtype} on {tw.device}")
        tail_norm = (tw.contiguous(), tail_norm[1])  # the kernel reads it as a contiguous row
    n_log = n // 2 if paired else n
    if epilogue == "argmax":
        if n >= 1 << 24:
            raise ValueError(f"epilogue='argmax': N={n} columns (the partials hold them as exact fp32, < 2^24)")
        out = torch.empty(m, dtype=torch.int64, device=x.device)
    else:
        out = torch.empty(m, n_log if epilogue == "silu_mul" else n, dtype=x.dtype, device=x.device)
    normed = torch.empty_like(out) if tail_norm is not None else None
    if m == 0:
        return out if normed is None else (out, normed)
    x, w = _rowmajor(x), _rowmajor(w)
    if epilogue == "residual":
        if residual is None or residual.shape != out.shape:
            raise ValueError(f"epilogue='residual' needs residual of shape {tuple(out.shape)}")
        residual = _rowmajor(residual)
    if positions is not None:
        if epilogue != "rope":
            raise ValueError("positions (cos / sin tables over positions) go with epilogue='rope' only")
        if (positions.shape != (m,) or positions.dtype not in (torch.int32, torch.int64)
                or positions.device != x.device or (m > 1 and positions.stride(0) != 1)):
            raise ValueError(f"positions must be a contiguous [{m}] int32 / int64 tensor on {x.device}, got "
                             f"{tuple(positions.shape)} {positions.dtype} on {positions.device}")
        if cos is None or sin is None or cos.dim() != 2 or cos.shape != sin.shape or cos.shape[1] != head_dim:
            shapes = [None if t is None else tuple(t.shape) for t in (cos, sin)]
            raise ValueError(f"with positions, cos / sin are tables [P, head_dim={head_dim}], got {shapes}")
    if epilogue == "rope":
        if positions is None:
            cos, sin = cos.reshape(m, head_dim), sin.reshape(m, head_dim)
        cos, sin = _rowmajor(cos), _rowmajor(sin)
        if sin.stride(0) != cos.stride(0):
            sin = sin.contiguous()
            cos = cos.contiguous()
    block_n, block_k, stages, warps = loop_for(w.dtype, x.dtype, k, role)
    if paired:  # a program streams both halves of each pair: half the columns, as many weight rows
        block_n //= 2
    n_tiles = triton.cdiv(n_log, block_n)
    policy, reduce = policy_for(role), _split_mode.split("/")[1]
    splits, per = split_k(n_tiles, k, block_k, policy, TARGET_PROGRAMS * (fp8_programs(k) if fp8 else 1))
    if epilogue == "argmax" and splits > 1:  # the tiles' maxima need whole sums: linear's (split) logits' argmax
        return gemm(x, w, bias, w_scale=w_scale, norm_weight=norm_weight, eps=eps, role=role).float().argmax(-1)
    split = 0 if splits == 1 else 2 if reduce == "ticket" else 1
    assert split != 2 or n_tiles < NORM_TICKET, "a split GEMM's column tiles each need a ticket below the tail's"
    norm = norm_weight is not None
    block_m = batch_tile(m, x.dtype, warps, norm)
    part = torch.empty(splits, 2, block_m, n_log, dtype=torch.float32, device=x.device) if split else out
    tickets = _ticket_buffer(x.device) if split == 2 else out
    if epilogue == "argmax":  # tile maxima and columns; the one ticket over all tiles
        part = torch.empty(2, n_tiles, block_m, dtype=torch.float32, device=x.device)
        tickets = _ticket_buffer(x.device)[ARGMAX_TICKET:]
    ss_block = min(SS_BLOCK, max(16, triton.next_power_of_2(k)))
    dummy = out
    args = {"M": m, "N_LOG": n_log, "stride_om": out.stride(0),
            "stride_rm": residual.stride(0) if residual is not None else 0,
            "stride_cm": cos.stride(0) if epilogue == "rope" else 0,
            "stride_slot": kc.stride(0) if kc is not None else 0, "G": group, "ROPE_COLS": rope_cols,
            "Q_COLS": 2 * rope_cols - n if kc is not None else 0, "BLOCK_M": block_m, "BLOCK_N": block_n,
            "FP8": fp8, "HAS_BIAS": bias is not None, "EPI": _EPI[epilogue], "PAIRED": paired,
            "KV_STORE": kc is not None, "ROPE_POS": positions is not None, "XO": dummy, "TAIL_W": dummy,
            "TAIL_TICKET": dummy, "stride_xo": 0, "tail_eps": 0.0}
    if normed is not None:  # the tail norm: its output, weight, ticket and tile (functions of N only)
        nb = triton.next_power_of_2(n)
        args.update(XO=normed, TAIL_W=tail_norm[0], TAIL_TICKET=_ticket_buffer(x.device)[NORM_TICKET:],
                    stride_xo=normed.stride(0), tail_eps=float(tail_norm[1]), TAIL_NB=nb,
                    TAIL_ROWS=max(1, min(BLOCK_M, TAIL_ELEMS // nb)))  # BLOCK_M, not the batch tile: a function of N
    ptrs = {"SCALE": w_scale if fp8 else dummy, "BIAS": bias if bias is not None else dummy,
            "RES": residual if residual is not None else dummy, "COS": cos if cos is not None else dummy,
            "SIN": sin if sin is not None else dummy, "KC": kc if kc is not None else dummy,
            "VC": vc if vc is not None else dummy, "SLOTS": slots if slots is not None else dummy,
            "POS": positions if positions is not None else dummy}
    xn = torch.empty(m, k, dtype=x.dtype, device=x.device) if norm else x  # the normalized rows (scratch)
    prefetch = {}
    if launch_args(x) and _prefetch and w.numel() * w.element_size() <= _prefetch_cap:
        # a prefetch only where the launch overlaps the previous kernel (PDL) and the GEMM is latency-bound
        prefetch = {"PREFETCH": min(_prefetch, per // block_k), "LINE": min(block_k, pdl.L2_LINE // w.element_size())}
    try:
        _gemm_kernel[(n_tiles, splits)](
            x, xn, w, OUT=out, PART=part, TICKETS=tickets, NORM_W=norm_weight if norm_weight is not None else dummy, K=k,
            k_per_split=per, stride_xm=x.stride(0), stride_wn=w.stride(0), eps=eps, BLOCK_K=block_k, SPLIT=split,
            NORM=norm, SS_BLOCK=ss_block, SS_ITERS=triton.cdiv(k, ss_block) if norm else 0,
            NRM_ITERS=triton.cdiv(min(per, k), ss_block) if norm else 0,
            IEEE=fp32_dot(x.dtype), ARGMAX_RED=ARGMAX_BLOCK, **_fp8_launch(x, w), num_warps=warps, num_stages=stages, **ptrs, **args, **prefetch,
            TAIL=normed is not None and split != 1, JOIN=paired and _pair_dots == 1, **launch_args(x))
        if split == 1:
            # the GEMM's warps: a tail's sum of squares has the order of its tile's layout, which the warp count
            # sets, so pass and ticket give the same bits (the split sum and epilogue are elementwise)
            _reduce_kernel[(n_tiles,)](part, out, **ptrs, num_splits=splits, num_warps=warps, **args,
                                       TAIL=normed is not None, **launch_args(part))
    except BaseException:
        if split == 2 or epilogue == "argmax" or normed is not None:  # a launch cut short may leave tickets taken:
            _ticket_buffer(x.device).zero_()  # every later GEMM on them would be wrong
        raise
    return out if normed is None else (out, normed)


def argmax_linear(x: torch.Tensor, w: torch.Tensor, bias: torch.Tensor | None = None,
                  w_scale: torch.Tensor | None = None, role: str | None = None) -> torch.Tensor:
    """``linear(x, w, bias).float().argmax(-1)`` for x [M <= 16, K] -> [M] int64 (the first maximal column of this
    GEMM's logits, bit for bit: its sums are linear's), in one launch where linear runs unsplit (an LM head: its
    column tiles fill the GPU), without the [M, vocab] logits; elsewhere (a small vocabulary whose K linear
    splits) through linear's logits. A NaN logit is skipped, where torch's argmax would return it."""
    return gemm(x, w, bias, w_scale=w_scale, epilogue="argmax", role=role)


def linear(x: torch.Tensor, w: torch.Tensor, bias: torch.Tensor | None = None,
           w_scale: torch.Tensor | None = None, role: str | None = None) -> torch.Tensor:
    """``F.linear(x, w, bias)`` for x [M <= 16, K], w [N, K] -> [M, N]; rows bit-identical whatever M (``role``:
    ``gemm``'s)."""
    return gemm(x, w, bias, w_scale=w_scale, role=role)
