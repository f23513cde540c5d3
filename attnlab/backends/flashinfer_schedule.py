"""FlashInfer's CUDA-core decode schedule in CUDA-graph mode, as a function of the page counts: what lets one
launch plan serve draft steps that cross a page boundary, and a kept plan serve new page counts.

FlashInfer 0.7's ``DecodePlan`` (``include/flashinfer/attention/scheduler.cuh``) splits each request's KV into
chunks of whole pages. In graph mode the schedule it writes (request / tile indices, the output indptr, the
valid-block mask, the chunk size) depends on the page counts only through

- ``split``: whether ``rows x kv_heads < max_grid`` (fixed for a wrapper: its row count is fixed);
- the chunk size in pages, the smallest in ``[max(128 // page_size, 1), max pages]`` whose tiles fit in
  ``max_grid // kv_heads`` rows (a binary search);
- each request's tile count, ``ceil(max(pages, 1) / chunk)``.

Its kernel reads a request's length as ``(pages - 1) x page_size + last_page_len`` when it runs, from buffers
attnlab rewrites on the device. So a plan made on the launch's last-step layout (every page the launch will
write) serves every step whose page counts give the same schedule: the steps before a crossing then run with a
last-page length <= 0 (one page or more ahead), the same length, the same tiles, the same bits as their own plan would
give. Were the schedules to differ, a step could meet a tile that starts past its length (the kernel's chunk size
underflows): ``decode_schedule`` equality is the condition. The backend checks this model against every real plan
it makes (``planned``) and uses it only for a row count it has checked, switching it off at the first
disagreement (another FlashInfer version).
"""

from __future__ import annotations

import itertools

import torch


def page_counts(kv_indptr: list[int]) -> list[int]:
    """Each request's page count, from a host kv_indptr."""
    return [b - a for a, b in itertools.pairwise(kv_indptr)]


def decode_schedule(pages: list[int], page_size: int, split: bool, grid_rows: int | None) -> tuple:
    """The schedule FlashInfer plans for these page counts (one per row, padded rows included), on a wrapper
    whose ``split`` and ``grid_rows`` (= max_grid // kv_heads, its padded batch when split) were read from a plan
    (``learned``): ``(False,)`` without split (one tile a row, whatever the lengths), else
    ``(True, chunk pages, tiles per row)``."""
    if not split:
        return (False,)
    low, high = max(128 // page_size, 1), max(pages, default=0)
    while low < high:  # scheduler.cuh, PartitionPagedKVCacheBinarySearchMinNumPagePerBatch
        mid = (low + high) // 2
        if sum(-(-p // mid) for p in pages) > grid_rows:  # new_batch_size x gdy > max_grid_size
            low = mid + 1
        else:
            high = mid
    return (True, low, tuple(-(-max(p, 1) // low) for p in pages))


def learned(wrapper) -> tuple[bool, int | None] | None:
    """(split, grid rows) of a planned CUDA-core decode wrapper in graph mode, from its plan info (DecodePlanInfo:
    padded_batch_size first, split_kv last); None where it cannot be read."""
    try:
        info = [int(v) for v in wrapper._plan_info]
    except (AttributeError, TypeError, ValueError):
        return None
    if len(info) != 10 or not info[8]:  # enable_cuda_graph
        return None
    return (True, info[0]) if info[9] else (False, None)


def planned(wrapper, rows: int, page_size: int) -> tuple | None:
    """The schedule a real plan wrote (its page-locked host copy: the chunk size, the output indptr), in
    ``decode_schedule``'s form; None where it cannot be read. Host memory only: no device sync."""
    try:
        info = [int(v) for v in wrapper._plan_info]
        pinned = wrapper._pin_memory_int_workspace_buffer
    except (AttributeError, TypeError, ValueError):
        return None
    if len(info) != 10:
        return None
    if not info[9]:
        return (False,)

    def ints(offset: int, count: int) -> list[int]:
        return pinned[offset:offset + 4 * count].clone().view(torch.int32).tolist()

    chunk_tokens = ints(info[7], 1)[0]
    o_indptr = ints(info[5], rows + 1)
    return (True, chunk_tokens // page_size, tuple(b - a for a, b in itertools.pairwise(o_indptr)))


# -- fa2 paged prefill (verify, draft-extend) in graph mode with uniform_q_len ---------------------------------------
# FlashInfer 0.7's ``PrefillSplitQOKVIndptr`` schedules a batch from qo_indptr and the *page* counts of kv_indptr only
# (the kv lengths in tokens reach the planner and are ignored): with CUDA graphs and ``uniform_q_len`` the query tile
# (``cta_tile_q``) and the padded work count are fixed for a wrapper, and what the plan writes (request / tile
# indices, merge and output indptr, the chunk size, the valid-block mask) is a function of
#
# - the chunk size in pages, the smallest in ``[max(128 // page_size, 1), max(max pages, 1)]`` whose work items
#   ``sum_i tiles_q x ceil(max(pages_i, 1) / chunk)`` fit in the planner's ``max_batch_size_if_split`` (a binary
#   search, PrefillBinarySearchKVChunkSize);
# - each request's chunk count ``ceil(max(pages_i, 1) / chunk)``.
#
# So a wrapper whose plan has the schedule a new layout would get can keep it: only the layout buffers it reads
# (kv_indptr, page ids, last page lengths) change. Where ``max_batch_size_if_split`` exceeds the padded work count it
# is the plan's padded batch size; where it does not, no split fits and both give one chunk of the longest request
# (``padded`` serves as the bound either way).


def prefill_schedule(pages: list[int], page_size: int, tiles_q: int, grid_rows: int) -> tuple:
    """(chunk pages, chunks per request) that a graph-mode fa2 plan of these page counts writes, on a wrapper
    whose ``tiles_q`` (query tiles a request) and ``grid_rows`` (its padded work count) came from a plan
    (``prefill_learned``)."""
    low, high = max(128 // page_size, 1), max([1, *pages])
    while low < high:
        mid = (low + high) // 2
        if sum(tiles_q * -(-max(p, 1) // mid) for p in pages) > grid_rows:
            low = mid + 1
        else:
            high = mid
    return (low, tuple(-(-max(p, 1) // low) for p in pages))


def fa2_cta_tile_q(packed_rows: int, head_dim: int) -> int:
    """The query tile (rows) FlashInfer 0.7's fa2 planner picks for ``packed_rows`` = q_len x GQA group rows a request
    (``FA2DetermineCtaTileQ`` in ``include/flashinfer/utils.cuh``, sm80 and newer, head_dim < 512)."""
    if packed_rows > 64 and head_dim < 256:
        return 128
    return 64 if packed_rows > 16 else 16


def prefill_learned(wrapper, q_len: int, group: int) -> tuple[int, int] | None:
    """(query tiles a request, padded work count) of a planned graph-mode fa2 prefill wrapper of uniform ``q_len``,
    from its plan info (PrefillPlanInfo: padded_batch_size first, cta_tile_q fourth, enable_cuda_graph and split_kv
    last); None where it cannot be read or is not a graph-mode split plan."""
    try:
        info = [int(v) for v in wrapper._plan_info]
    except (AttributeError, TypeError, ValueError):
        return None
    if len(info) != 15 or not info[13] or not info[14] or info[3] < 1:
        return None
    return (-(-q_len * group // info[3]), info[0])


def prefill_planned(wrapper, rows: int, q_len: int, page_size: int) -> tuple | None:
    """The schedule a real fa2 plan wrote (its page-locked host copy: the chunk size, the output indptr of q_len x
    chunks per request), in ``prefill_schedule``'s form; None where it cannot be read. Host memory only."""
    try:
        info = [int(v) for v in wrapper._plan_info]
        pinned = wrapper._pin_memory_int_workspace_buffer
    except (AttributeError, TypeError, ValueError):
        return None
    if len(info) != 15 or q_len < 1:
        return None

    def ints(offset: int, count: int) -> list[int]:
        return pinned[offset:offset + 4 * count].clone().view(torch.int32).tolist()

    chunk_tokens = ints(info[9], 1)[0]
    o_indptr = ints(info[8], rows + 1)
    diffs = [b - a for a, b in itertools.pairwise(o_indptr)]
    if chunk_tokens % page_size or any(d % q_len for d in diffs):
        return None
    return (chunk_tokens // page_size, tuple(d // q_len for d in diffs))
