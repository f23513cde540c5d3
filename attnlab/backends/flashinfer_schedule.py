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
