"""Diagnostics, not backends: ``attnlab.bench.kernels`` with the triton decode's merge taken out, to see what the merge
costs the batch-1 4k decode with PDL (their outputs are wrong: nothing reads parity from them).

    python experiments/decode-regcap/nomerge.py [--arrive | --arrive-relaxed] [bench.kernels arguments]

Without ``--arrive``: the merge launch removed, so a ``fused_merge=false`` arm times the split decode alone (its
partials written, never merged); arms that merge inside the kernel are unchanged (the process's anchor). Eager calls
(the bench's warmup) zero the output instead, so its finiteness check reads zeros rather than uninitialized memory; the
captured graphs, which are what is timed, hold no merge at all.

``--arrive``: the fused merge (``merge.merge_arrived``, the default at one-tile splits) cut to its arrival: every
program still runs the CTA barrier and the acq_rel add and waits for its reply, and the last one stores zeros for its
rows (one store, as the merge's output) and resets the counter, but reads no partial. Against the default and the
merge-less decode it splits the merge's cost into the arrival and the merge proper.

``--arrive-relaxed``: ``--arrive`` with a relaxed add (no release fence before it: no wait for the partial stores'
acknowledgements; no acquire after it). Against ``--arrive`` it splits the arrival into its fence and its round trip.
"""

from __future__ import annotations

import sys

import torch
import triton
import triton.language as tl

from attnlab.bench import kernels
from attnlab.kernels import decode
from attnlab.kernels.merge import store_merged


@triton.jit
def _arrive(O, COUNTERS, ticket, num_splits, rows, heads, row_mask, offs_d, d_mask, stride_ot, stride_oh,
            SEM: tl.constexpr):
    tl.debug_barrier()
    arrived = tl.atomic_add(COUNTERS + ticket, 1, sem=SEM)
    if arrived == num_splits - 1:
        store_merged(O, COUNTERS, ticket, tl.zeros([row_mask.shape[0], offs_d.shape[0]], tl.float32), rows, heads,
                     row_mask, offs_d, d_mask, stride_ot, stride_oh)


@triton.jit
def _arrive_only(O, O_PART, LSE_PART, COUNTERS, ticket, num_splits, rows, heads, row_mask, offs_d, d_mask,
                 stride_ot, stride_oh, stride_pt, stride_ph, stride_ps, stride_lt, stride_lh, MAX_SPLITS: tl.constexpr):
    _arrive(O, COUNTERS, ticket, num_splits, rows, heads, row_mask, offs_d, d_mask, stride_ot, stride_oh, "acq_rel")


@triton.jit
def _arrive_relaxed(O, O_PART, LSE_PART, COUNTERS, ticket, num_splits, rows, heads, row_mask, offs_d, d_mask,
                    stride_ot, stride_oh, stride_pt, stride_ph, stride_ps, stride_lt, stride_lh,
                    MAX_SPLITS: tl.constexpr):
    _arrive(O, COUNTERS, ticket, num_splits, rows, heads, row_mask, offs_d, d_mask, stride_ot, stride_oh, "relaxed")


def _no_merge(out, o_part, lse_part) -> None:
    if not torch.cuda.is_current_stream_capturing():
        out.zero_()


def main(argv: list[str]) -> int:
    if argv[:1] == ["--arrive"]:
        decode.merge_arrived = _arrive_only
        print("nomerge.py --arrive: the fused merge cut to its arrival (no partial read)", flush=True)
        argv = argv[1:]
    elif argv[:1] == ["--arrive-relaxed"]:
        decode.merge_arrived = _arrive_relaxed
        print("nomerge.py --arrive-relaxed: the arrival with a relaxed add (no fence, no partial read)", flush=True)
        argv = argv[1:]
    else:
        decode.merge_splits = _no_merge
        print("nomerge.py: the decode's merge launch removed (fused_merge=false arms time the split decode alone)",
              flush=True)
    return kernels.main(argv)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
