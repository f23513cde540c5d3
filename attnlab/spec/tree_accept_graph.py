"""Greedy tree acceptance and the target's rollback compaction as one CUDA graph replay per iteration.

Eagerly, ``tree_greedy_accept``, ``emitted_tokens`` and ``compact_target`` were about 200 small launches per
iteration (a walk of num_steps levels over the children table, then the move list): ~1.2-1.5 ms of host time on
an H200 for a 4x5 tree (experiments/h200-2026-12-02c), more than the verify pass itself (the acceptance is in closed
form now, ~25 launches, and these few dozen kernels replay from one graph). Their shapes depend only
on (batch bucket, T = N + 1, topk, num_steps) and the page window's width, so one graph per bucket holds them; the
host stages the requests' page windows (a few ints each) and copies the tree and the verify pass's argmax in.

Rows past the batch (the bucket's dummies) keep whatever tree a previous replay left (a valid one: the capture
starts from the root with every node its child) and move nothing: their accepted count is zeroed before the
compaction, so no page of a real request is touched through a stale row.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from dataclasses import dataclass

import torch

from attnlab.spec.tree import DraftTree
from attnlab.spec.tree_accept import emitted_tokens, tree_greedy_accept_top
from attnlab.spec.tree_rollback import window_lists
from attnlab.spec.tree_verify import target_compaction


def accept_and_compact(tokens, parents, mask, top, table, rel, real, topk: int, num_steps: int, pool):
    """The graph's body (or the same eagerly). tokens, parents, top [R, T] int64 (the tree and the target's argmax
    per node), mask [R, T, T] bool (the tree's ancestor-or-self mask), table [R, W] int64 page window, rel [R]
    int64 root position inside it, real [R] bool.
    -> (num_accepted [R], path [R, S + 1], next_token [R], emitted [R, S + 1]); the pool's accepted K/V moved."""
    tree = DraftTree(tokens, parents, None, None, None, None, topk, num_steps, mask)  # what acceptance reads
    n_acc, path, nxt = tree_greedy_accept_top(tree, top)
    emitted = emitted_tokens(tree, path, n_acc, nxt)
    src, dst, _ = target_compaction(path, torch.where(real, n_acc, 0), rel, table, pool.page_size)
    pool.copy_slots(src, dst)
    return n_acc, path, nxt, emitted


def window_width(num_nodes: int, page_size: int) -> int:
    """Pages a window of ``num_nodes`` positions can touch, wherever it starts."""
    return -(-(num_nodes - 1) // page_size) + 1


@dataclass
class _AcceptGraph:
    graph: torch.cuda.CUDAGraph
    inputs: tuple  # tokens, parents, mask, top, table, rel, real
    outputs: tuple


class AcceptGraphs:
    """The accept graphs of one tree shape on one target (``capture`` per bucket, ``run`` per iteration)."""

    def __init__(self, target, topk: int, num_steps: int, num_nodes: int):
        self.target, self.topk, self.num_steps, self.T = target, topk, num_steps, num_nodes
        self.width = window_width(num_nodes, target.allocator.page_size)
        self.graphs: dict[int, _AcceptGraph] = {}
        self.replays = 0

    def capture(self, buckets) -> int:
        """One graph per bucket (largest first, in the target's graph pool)."""
        r, T = self.target, self.T
        before = len(self.graphs)
        for bs in sorted(set(buckets), reverse=True):
            if bs in self.graphs:
                continue
            dev = r.device
            tokens = torch.zeros(bs, T, dtype=torch.long, device=dev)
            parents = torch.zeros(bs, T, dtype=torch.long, device=dev)
            parents[:, 0] = -1  # a valid tree: every node a child of the root
            mask = torch.eye(T, dtype=torch.bool, device=dev).expand(bs, T, T).clone()
            mask[:, :, 0] = True
            top = torch.zeros(bs, T, dtype=torch.long, device=dev)
            table = torch.full((bs, self.width), r.pool.num_pages, dtype=torch.long, device=dev)
            rel = torch.zeros(bs, dtype=torch.long, device=dev)
            real = torch.zeros(bs, dtype=torch.bool, device=dev)
            inputs = (tokens, parents, mask, top, table, rel, real)
            g, out = r.graphs.record(lambda x=inputs: accept_and_compact(*x, self.topk, self.num_steps, r.pool))
            self.graphs[bs] = _AcceptGraph(g, inputs, out)
        return len(self.graphs) - before

    def run(self, tree: DraftTree, top: torch.Tensor, reqs: Sequence[Hashable], root: Sequence[int]):
        """-> (num_accepted, path, next_token, emitted) of the batch's rows, the target's accepted K/V moved; None
        when no graph holds this batch (the caller runs the eager path). ``tree.mask`` must be set (tree_loop
        builds it once for the verify pass)."""
        from attnlab.engine.graphs import bucket_for

        B = len(reqs)
        bs = bucket_for(B, self.graphs) if self.graphs else None
        if bs is None:
            return None
        r, g = self.target, self.graphs[bs]
        rows, bases = window_lists(r.allocator, reqs, root, self.T, self.width)
        table, rel, is_real = r.staging.stage([([p for row in rows for p in row], torch.int64),
                                               ([f - b for f, b in zip(root, bases)], torch.int64),
                                               ([1] * B + [0] * (bs - B), torch.int64)])
        tokens, parents, mask, top_in, table_in, rel_in, real = g.inputs
        tokens[:B].copy_(tree.tokens)
        parents[:B].copy_(tree.parents)
        mask[:B].copy_(tree.mask)
        top_in[:B].copy_(top.view(B, self.T))
        table_in[:B].copy_(table.view(B, self.width))
        rel_in[:B].copy_(rel)
        real.copy_(is_real)
        g.graph.replay()
        self.replays += 1
        return tuple(t[:B] for t in g.outputs)
