"""Tree verify inputs and rollback as index math (no host sync): what the target pass and the pools apply.

Verify feeds the ``T = N + 1`` tree tokens of each request (root first, nodes in tree order) at KV positions
``root_pos .. root_pos + N`` (storage order), with RoPE positions ``root_pos + depth`` and an ancestor mask:
prefix columns (the ``root_pos`` committed tokens before the root) all True, tree columns ancestor-or-self.

Rollback keeps the accepted path's KV only: node ``path[j]`` (depth j) moves from its storage position to the
chain position ``root_pos + j``, on the target side (tree storage order) and on the draft side (the tree slots
of ``attnlab.spec.tree``); then each side truncates to its returned length. Apply a move list as one indexed
copy per layer, ``flat[dst] = flat[src]`` (all reads before all writes), or one move at a time with j
ascending: a destination is never a later move's source (``path[j] >= j`` and paths increase). Never with j
descending. Slots of -1 are "skip" (the pool sends them to its scratch page).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from attnlab.spec.tree import DraftTree


def verify_inputs(tree: DraftTree, root_pos: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """-> (input_ids [B, T] int64, positions [B, T] int64 = root_pos + depth). Flatten both row-major for the
    runner (q_len T per request)."""
    return tree.tokens, root_pos[:, None] + tree.depth


def ancestor_mask(parents: torch.Tensor, max_depth: int) -> torch.Tensor:
    """parents [B, T] (-1 = root, every node within ``max_depth`` of node 0) -> [B, T, T] bool,
    ``[b, i, j]`` = node j is an ancestor of node i or i itself."""
    B, T = parents.shape
    cur = torch.arange(T, device=parents.device).expand(B, T)
    mask = torch.zeros(B, T, T, dtype=torch.bool, device=parents.device).scatter_(2, cur[:, :, None], True)
    up = parents.clamp_min(0)  # the root is its own parent: walks stop there
    for _ in range(max_depth):
        cur = up.gather(1, cur)
        mask.scatter_(2, cur[:, :, None], True)
    return mask


def verify_mask(tree: DraftTree) -> torch.Tensor:
    """[B, T, T] bool tree part of the verify mask (ancestor-or-self)."""
    return ancestor_mask(tree.parents, tree.num_steps)


def custom_mask_index(num_rows: int, width: int, prefix_lens: Sequence[int], device=None) -> tuple[int, torch.Tensor]:
    """Where the tree columns sit in AttnMeta's flat custom mask: request by request a block
    [num_rows, prefix_len + width] row-major, the tree columns after the prefix. -> (total entries, [B * num_rows *
    width] int64 flat positions, request-, row-, column-major). Plan-time work (the size follows the lengths)."""
    B, Q, W = len(prefix_lens), num_rows, width
    rows = [Q * (p + W) for p in prefix_lens]
    starts = [sum(rows[:i]) for i in range(B)]
    host = torch.tensor([starts, list(prefix_lens)], dtype=torch.long).reshape(2, B).to(device, non_blocking=True)
    start, pre = host[0][:, None, None], host[1][:, None, None]
    r = torch.arange(Q, device=device)[None, :, None]
    c = torch.arange(W, device=device)[None, None, :]
    return sum(rows), (start + r * (pre + W) + pre + c).reshape(-1)


def flatten_custom_mask(tree_mask: torch.Tensor, prefix_lens: Sequence[int]) -> torch.Tensor:
    """tree_mask [B, Q, W] bool, prefix_lens host ints -> AttnMeta.custom_mask: flat bool, request by request,
    block [Q, prefix_len + W] row-major, prefix columns True. Plan-time work (the size follows the lengths)."""
    _, Q, W = tree_mask.shape
    total, index = custom_mask_index(Q, W, prefix_lens, tree_mask.device)
    out = torch.ones(total, dtype=torch.bool, device=tree_mask.device)
    out[index] = tree_mask.reshape(-1)
    return out


def mask_bits(tree_mask: torch.Tensor) -> torch.Tensor:
    """tree_mask [B, Q, W] bool (W <= 64) -> [B, Q] int64 bitfield, bit j = column j (the tree columns only;
    the prefix is all True). W = 64 uses the sign bit."""
    W = tree_mask.shape[-1]
    if W > 64:
        raise ValueError(f"mask_bits packs at most 64 columns, got {W}")
    shifts = torch.arange(W, device=tree_mask.device)
    return (tree_mask.long() << shifts).sum(-1)


def kv_slots(page_table: torch.Tensor, pos: torch.Tensor, page_size: int) -> torch.Tensor:
    """page_table [B, P] int (page ids, padded), pos [B, L] int64 token positions (-1 = none) -> [B, L] int64
    flat pool slots (-1 kept), as attnlab.kvcache.layout.slot_mapping."""
    p = pos.clamp_min(0)
    page = page_table.gather(1, (p // page_size).clamp_max(page_table.shape[1] - 1)).long()
    return torch.where(pos >= 0, page * page_size + p % page_size, -1)


def _moves(src_pos, dst_pos, valid, page_table, page_size):
    src = kv_slots(page_table, torch.where(valid, src_pos, -1), page_size)
    dst = kv_slots(page_table, torch.where(valid, dst_pos, -1), page_size)
    return src, dst


def target_compaction(path: torch.Tensor, num_accepted: torch.Tensor, root_pos: torch.Tensor,
                      page_table: torch.Tensor, page_size: int):
    """Target side. path [B, S + 1] (acceptance output: root 0, the accepted nodes, -1), num_accepted [B],
    root_pos [B], page_table [B, P] -> (src [B, S], dst [B, S] int64 pool slots, -1 = no move; keep_len [B]:
    truncate the target KV to it, root_pos + 1 + num_accepted)."""
    j = torch.arange(1, path.shape[1], device=path.device)
    node = path[:, 1:]
    valid = (j <= num_accepted[:, None]) & (node != j)
    src, dst = _moves(root_pos[:, None] + node, root_pos[:, None] + j, valid, page_table, page_size)
    return src, dst, root_pos + 1 + num_accepted


def draft_compaction(tree: DraftTree, path: torch.Tensor, num_accepted: torch.Tensor, root_pos: torch.Tensor,
                     page_table: torch.Tensor, page_size: int):
    """Draft side: the accepted nodes that a draft pass fed (a prefix of the path) move from position
    root_pos + 1 + draft_slot to root_pos + j. -> (src, dst [B, S], keep_len [B] = root_pos + 1 + that count);
    the draft catch-up then feeds what the draft KV lacks, as for chains."""
    j = torch.arange(1, path.shape[1], device=path.device)
    slot = tree.draft_slot.gather(1, path[:, 1:].clamp_min(0))
    fed = (j <= num_accepted[:, None]) & (slot >= 0)
    src_pos = root_pos[:, None] + 1 + slot
    dst_pos = root_pos[:, None] + j
    src, dst = _moves(src_pos, dst_pos, fed & (src_pos != dst_pos), page_table, page_size)
    return src, dst, root_pos + 1 + fed.sum(1)
