"""Tree rollback on a model side: the accepted path's K/V moves to chain positions, before the iteration's sync.

``attnlab.spec.tree_verify`` computes the moves as pool slots from a page table; ``KVPool.copy_slots`` applies
them in every layer (one gather, one scatter: device work only). The allocator is truncated after the sync, by
the loop, as for chains (the target to ``n + a``, a model drafter to ``min(kv_len, n + a)``).

Only the tail of each request's page table matters: the moves stay between the root and the last tree slot.
``page_window`` ships just those pages to the device, with the position of their first slot, so the host work
per iteration is a few ints per request whatever the context length.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence

import torch

from attnlab.spec.tree import DraftTree
from attnlab.spec.tree_verify import draft_compaction, target_compaction


def window_lists(allocator, reqs: Sequence[Hashable], first: Sequence[int], span: int, width: int | None = None):
    """``page_window``'s host values: (rows of page ids, each padded with its last page to the widest or to
    ``width``; the position of each window's first slot)."""
    ps = allocator.page_size
    rows, bases = [], []
    for r, f in zip(reqs, first):
        table = allocator.page_tables[r]
        lo, hi = f // ps, (f + span - 1) // ps
        if hi >= len(table):
            raise ValueError(f"page_window: request {r!r} holds {len(table)} pages, positions up to {f + span - 1} "
                             f"need {hi + 1}")
        rows.append(table[lo:hi + 1])
        bases.append(lo * ps)
    width = width or max(len(x) for x in rows)
    if any(len(x) > width for x in rows):
        raise ValueError(f"window_lists: a window spans more than {width} pages")
    return [x + [x[-1]] * (width - len(x)) for x in rows], bases


def page_window(allocator, reqs: Sequence[Hashable], first: Sequence[int], span: int, device):
    """Pages holding positions ``first[i] .. first[i] + span - 1`` of each request (they must be allocated).
    -> (table [B, P] int64 on device, padded with the request's last page; base [B] int64 on device: the
    position of the window's first slot, subtract it from positions before ``tree_verify.kv_slots``)."""
    rows, bases = window_lists(allocator, reqs, first, span)
    host = torch.tensor(rows, dtype=torch.int64)
    return host.to(device, non_blocking=True), torch.tensor(bases, dtype=torch.int64).to(device, non_blocking=True)


def compact_target(runner, reqs, root_pos: Sequence[int], num_nodes: int, path: torch.Tensor,
                   num_accepted: torch.Tensor) -> None:
    """Target side after a tree verify that stored node i at root_pos + i (num_nodes = N + 1 of them): node
    path[j] moves to root_pos + j. root_pos: host ints (n - 1 per request); path [B, S + 1], num_accepted [B]."""
    table, base = page_window(runner.allocator, reqs, root_pos, num_nodes, runner.device)
    rel = _to_device(root_pos, runner.device) - base
    src, dst, _ = target_compaction(path, num_accepted, rel, table, runner.allocator.page_size)
    runner.pool.copy_slots(src, dst)


def compact_draft(runner, reqs, root_pos: Sequence[int], tree: DraftTree, path: torch.Tensor,
                  num_accepted: torch.Tensor) -> None:
    """Draft side of a model drafter whose tree passes stored tree slot t at root_pos + 1 + t (attnlab.spec.tree):
    the accepted nodes a draft pass fed move to root_pos + j. root_pos: host ints (n - 1, the root's position)."""
    slots = max(0, (tree.num_steps - 1) * tree.topk)
    table, base = page_window(runner.allocator, reqs, root_pos, 1 + slots, runner.device)
    rel = _to_device(root_pos, runner.device) - base
    src, dst, _ = draft_compaction(tree, path, num_accepted, rel, table, runner.allocator.page_size)
    runner.pool.copy_slots(src, dst)


def _to_device(values: Sequence[int], device) -> torch.Tensor:
    return torch.tensor(list(values), dtype=torch.int64).to(device, non_blocking=True)
