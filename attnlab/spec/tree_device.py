"""Device-planned tree drafting: a greedy tree draft's S - 1 frontier passes and the tree's construction as one
launch (one CUDA graph replay per iteration), on a backend that plans masked steps on the device
(``AttentionBackend.supports_device_trees``: triton).

Why: the per-step path (attnlab.spec.tree_draft) prepares and plans every frontier pass on the host and runs the
tree math between the passes from Python, about 130 launches per frontier step. On an H200 that was ~1.2 ms of
host time per step (experiments/h200-2026-12-02c: a 4x5 tree's draft took 5.2-6.4 ms, the chain's one
device-planned replay 0.55 ms), so every tree row lost to target-only in tok/s whatever its tau.

Here the host allocates the tree slots' pages and stages one int32 buffer per iteration; each frontier pass's
positions, pool slots, KV lengths and dense tree mask are computed from it on the device, between the passes and
the expansions (one kernel a pass, attnlab.kernels.tree_meta), and ``select_tree`` ends the launch. Same passes,
same masks, same math as the per-step path, except the attention's split count (planned for the longest KV a pass
can have, as graph plans are): in fp32 the two give the same tree, scores within rounding
(tests/spec/test_tree_device.py).

Buffer (``tree_steps_layout``), per row (a graph bucket's rows: the requests, then dummies), each section starting
on a 16-byte boundary (Triton specializes kernels on pointer alignment):
  kv_start:  KV position of tree slot 0; everything before it is the prefix every branch reads
  rope_root: RoPE position of the root (frontier pass s feeds rope_root + s)
  root_pos:  the target's root position (TreeState.root_pos)
  real:      1 for a request, 0 for a dummy (slots -1: it writes nothing; it reads the scratch page)
  kv_indptr [rows + 1], kv_indices: every row's pages up to its last tree slot
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from dataclasses import dataclass

import torch

from attnlab.spec.tree import DraftTree, draw_children, select_tree, tree_start, tree_step
from attnlab.spec.tree_verify import verify_mask


def _up4(n: int) -> int:
    return -(-n // 4) * 4


def tree_steps_layout(rows: int) -> tuple[int, int, int, int, int, int]:
    """Offsets (int32 entries) of kv_start, rope_root, root_pos, real, kv_indptr, kv_indices for ``rows`` rows."""
    r4 = _up4(rows)
    return 0, r4, 2 * r4, 3 * r4, 4 * r4, 4 * r4 + _up4(rows + 1)


def tree_steps_values(kv_start, rope_root, root_pos, indptr, indices, rows: int) -> list[int]:
    """Host values of the buffer: len(kv_start) requests, then dummies up to ``rows`` (all zero, not real)."""
    b = len(kv_start)
    r4 = _up4(rows)
    out: list[int] = []
    for section in (kv_start, rope_root, root_pos, [1] * b):
        out += [*section, *[0] * (r4 - len(section))]
    return [*out, *indptr, *[0] * (_up4(rows + 1) - len(indptr)), *indices]


@dataclass
class TreeStepBuffers:
    """What the frontier passes' device plans read, rewritten on the device before each pass. Row j = pass j + 1.

    kv_lens [n, rows] int32; mask_indptr [n, rows] int64; masks [n, cap] uint8 (cap = rows * K * width + a dump
    entry, padded to 16 bytes; width = the longest KV a pass can have: the runner's max_context for a graph, this
    launch's longest for an eager one)."""

    kv_lens: torch.Tensor
    mask_indptr: torch.Tensor
    masks: torch.Tensor
    width: int

    @classmethod
    def empty(cls, rows: int, topk: int, n: int, width: int, device) -> TreeStepBuffers:
        cap = -(-(rows * topk * width + 1) // 16) * 16
        return cls(torch.zeros(n, _up4(rows), dtype=torch.int32, device=device)[:, :rows],
                   torch.zeros(n, -(-rows // 2) * 2, dtype=torch.int64, device=device)[:, :rows],
                   torch.ones(n, cap, dtype=torch.uint8, device=device), width)


def meta_views(meta: torch.Tensor, rows: int):
    """(kv_start, rope_root, root_pos, real as int64 [rows]; kv_indptr [rows + 1], kv_indices int32 views)."""
    o = tree_steps_layout(rows)
    cols = [meta[o[i]:o[i] + rows].long() for i in range(4)]
    return (*cols, meta[o[4]:o[4] + rows + 1], meta[o[5]:])


def stage_tree_steps(r, reqs: Sequence[Hashable], kv_start: Sequence[int], rope_root: Sequence[int],
                     root_pos: Sequence[int], topk: int, num_steps: int, pad_to: int | None = None):
    """The host half: pages for the (S - 1) * K tree slots after ``kv_start[i]`` of request i, and the staged
    buffer over ``rows = pad_to or len(reqs)`` rows. -> (device buffer, rows)."""
    from attnlab.kvcache import pages_needed
    from attnlab.kvcache.layout import layout_lists

    span = (num_steps - 1) * topk
    ends = [s + span for s in kv_start]
    tables = r.allocate(reqs, ends)
    rows = pad_to or len(reqs)
    pad = rows - len(reqs)
    ps = r.allocator.page_size
    indptr, indices, _ = layout_lists(tables + [[r.pool.num_pages] * pages_needed(max(1, span), ps)] * pad,
                                      ends + [max(1, span)] * pad, ps)
    values = tree_steps_values(list(kv_start), list(rope_root), list(root_pos), indptr, indices, rows)
    return r.staging.stage([(values, torch.int32)])[0], rows


def dummy_tree_steps_meta(rows: int, topk: int, num_steps: int, page_size: int, scratch_page: int, num_pages: int,
                          device) -> torch.Tensor:
    """A buffer of ``rows`` dummy rows (each on the scratch page), with room for the page ids of any later layout
    (every page, a scratch page per row): what a tree-draft graph is captured over."""
    from attnlab.kvcache import pages_needed

    per = pages_needed(max(1, (num_steps - 1) * topk), page_size)
    values = tree_steps_values([], [], [], [i * per for i in range(rows + 1)], [scratch_page] * (rows * per), rows)
    meta = torch.zeros(len(values) + num_pages, dtype=torch.int32)
    meta[:len(values)] = torch.tensor(values, dtype=torch.int32)
    return meta.to(device)


def tree_draft_body(r, meta: torch.Tensor, rows: int, topk: int, num_steps: int, num_draft_tokens: int,
                    root_logits: torch.Tensor, last: torch.Tensor, features: torch.Tensor | None,
                    bufs: TreeStepBuffers) -> tuple[torch.Tensor, ...]:
    """The launch (captured into a graph, or run eagerly) under the device plans of slots 1 .. S - 1
    (``backend.device_tree_plans`` over ``bufs``). root_logits [rows, V]: the root's draft logits;
    last [rows] int64: the root tokens; features [rows, F]: an EAGLE head's root feature (None: a plain
    drafter). -> the DraftTree's (tokens, parents, depth, logp, draft_slot) and its verify mask (ancestor-or-self,
    [rows, T, T]) over all rows (greedy: top-k children, EAGLE-2)."""
    from attnlab.kernels.tree_meta import tree_step_meta

    K = topk
    root_pos = meta_views(meta, rows)[2]
    st = tree_start(*draw_children(torch.softmax(root_logits.float(), dim=-1), K, False), root_pos)
    feat = None if features is None else features[:, None].expand(rows, K, features.shape[-1])
    for s in range(1, num_steps):
        r.use_step(s - 1)
        positions, slots = tree_step_meta(meta, rows, K, s, r.allocator.page_size, st.frontier_anc,
                                          bufs.kv_lens[s - 1], bufs.mask_indptr[s - 1], bufs.masks[s - 1], bufs.width)
        ctx = r.context(slots)
        extra = {} if feat is None else {"features": feat.reshape(rows * K, -1)}
        logits = r.logits(r.model(st.frontier_tokens.reshape(-1), positions, ctx, **extra))
        st = tree_step(st, *draw_children(torch.softmax(logits.float(), dim=-1).view(rows, K, -1), K, False))
        if feat is not None:
            out = ctx.captured.view(rows, K, -1)  # this pass's pre-norm output per branch: its children's feature
            feat = out.gather(1, st.frontier_parent[:, :, None].expand(rows, K, out.shape[-1]))
    tree = select_tree(st, last, num_draft_tokens)
    return tree.tokens, tree.parents, tree.depth, tree.logp, tree.draft_slot, verify_mask(tree)


def as_tree(outputs: Sequence[torch.Tensor], batch: int, topk: int, num_steps: int) -> DraftTree:
    """The first ``batch`` rows of ``tree_draft_body``'s outputs as a DraftTree (greedy: no draft rows), with its
    verify mask."""
    tokens, parents, depth, logp, slot, mask = (t[:batch] for t in outputs)
    return DraftTree(tokens, parents, depth, logp, slot, None, topk, num_steps, mask)


def device_tree_draft(r, reqs, kv_start, rope_root, root_pos, shape, root_logits: torch.Tensor, last: torch.Tensor,
                      features: torch.Tensor | None = None) -> DraftTree:
    """A greedy tree draft as one launch: the graph of the batch's bucket when captured, else the same code
    eagerly (planned for this batch). kv_start, rope_root, root_pos: host ints per request (module doc);
    root_logits [B, V]: the root's draft logits; last [B]: the root tokens; features [B, F]: an EAGLE head's root
    feature. The caller checked ``r.backend.supports_device_trees()`` and that the tree has frontier passes."""
    K, S, N, B = shape.topk, shape.num_steps, shape.num_draft_tokens, len(reqs)
    if S < 2 or not r.backend.supports_device_trees():
        raise ValueError(f"device_tree_draft: {K}x{S} on {r.backend.name}: no frontier pass planned on the device")
    g = r.graphs
    if g is not None:
        from attnlab.engine.graphs import bucket_for

        bs = bucket_for(B, g.buckets)
        fdim = None if features is None else features.shape[1]
        if bs is not None and g.has_tree_steps(bs, shape, fdim):
            meta, _ = stage_tree_steps(r, reqs, kv_start, rope_root, root_pos, K, S, pad_to=bs)
            return as_tree(g.replay_tree_steps(bs, shape, meta, root_logits, last, features), B, K, S)
    meta, rows = stage_tree_steps(r, reqs, kv_start, rope_root, root_pos, K, S)
    # eager: masks and launch parameters for this launch's longest KV, not the side's whole context
    bufs = TreeStepBuffers.empty(rows, K, S - 1, max(kv_start) + (S - 1) * K, r.device)
    _, _, _, _, indptr, indices = meta_views(meta, rows)
    r.backend.device_tree_plans(rows, K, S - 1, indptr, indices, bufs)
    return as_tree(tree_draft_body(r, meta, rows, K, S, N, root_logits, last, features, bufs), B, K, S)
