"""One speculative iteration with a draft tree (spec.topk > 1): draft a tree, verify it in one target pass,
accept a root-to-node path, roll both sides back to it, draft-extend; all device work before the loop's one sync.

Per request, with n committed tokens (the root is the last one, at position n - 1; the target KV holds n - 1):
- draft: ``Drafter.draft_tree``: ``propose_tree`` (EAGLE-2 construction, attnlab.spec.tree / tree_draft), then
  ``select_tree`` keeps the N best nodes; a greedy model drafter on a backend with device-planned tree passes
  runs the frontier passes and the selection as one launch after its root pass (attnlab.spec.tree_device);
- verify: the T = N + 1 tree tokens at KV positions n - 1 .. n - 1 + N (node order), RoPE positions
  n - 1 + depth, ancestor mask (prefix all True), through ``ModelRunner.prepare(custom_mask=...)``;
- accept: ``tree_greedy_accept``, or ``tree_rejection_accept`` with the proposal this shape's drafting makes
  lossless (``tree.sampling_proposal``: top-k drafting + "onehot" for pruned trees, EAGLE-2's scheme; sampled
  drafting + "without_replacement" where nothing is pruned: full trees);
- rollback: the accepted path's K/V moves to chain positions on the target (``compact_target``) and on a model
  drafter's side (``Drafter.rollback_tree``); the loop truncates both after the sync exactly as for chains;
- draft-extend: EAGLE feeds the accepted path with the target's features of its nodes (``extend_tree``).

The loop gets back what a chain iteration leaves (emitted tokens [B, S + 1], num_accepted, next token, the
target's rows along the path for recorded logits), so its commit code is the chain's.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from attnlab.backends.base import Mode
from attnlab.engine.sampler import SamplingParams, probs_from_logits
from attnlab.errors import ConfigError
from attnlab.spec.tree import check_tree_shape, sampling_proposal
from attnlab.spec.tree_accept import emitted_tokens, tree_greedy_accept_top, tree_rejection_accept
from attnlab.spec.tree_draft import TreeShape
from attnlab.spec.tree_rollback import compact_target
from attnlab.spec.tree_verify import flatten_custom_mask, verify_inputs, verify_mask


def tree_shape(topk: int, num_steps: int | None, num_draft_tokens: int) -> TreeShape:
    return TreeShape(topk, check_tree_shape(topk, num_steps, num_draft_tokens), num_draft_tokens)


class TreeIteration:
    """The tree path of SpeculativeDecoder: ``step`` replaces a chain iteration's propose .. extend."""

    def __init__(self, target, drafter, shape: TreeShape, sp: SamplingParams):
        if not drafter.drafts_trees:
            raise ConfigError(f"spec.topk={shape.topk}: draft={drafter.kind} drafts chains only (use spec.topk=1, "
                              f"or draft=self|model|eagle for trees)")
        self.target, self.drafter, self.shape = target, drafter, shape
        full = sampling_proposal(shape.topk, shape.num_steps, shape.num_draft_tokens)
        # Greedy: EAGLE-2's top-k drafting. Sampling: the drafting whose acceptance rule is lossless here.
        self.proposal = full
        self.sampled = not sp.greedy and full == "without_replacement"
        # greedy acceptance and the target's compaction as one replay where the target captured it
        # (capture_tree_graphs); False: eagerly (the previous path, kept to measure against)
        self.accept_graph = True

    def fits(self, n_before: Sequence[int]) -> bool:
        """Whether every request has room for a whole tree: the target stores N + 1 tokens from n - 1, a model
        drafter (S - 1) * K tree slots from n. Near the context end the loop drafts a chain instead."""
        need = max(self.shape.num_draft_tokens, self.shape.tree_slots)
        limit = self.target.max_context
        if self.drafter.runner is not None:
            limit = min(limit, self.drafter.runner.max_context)
        return all(n + need <= limit for n in n_before)

    def step(self, reqs, seqs, n_before: Sequence[int], last: torch.Tensor, sp: SamplingParams, gen, timer,
             record_logits: bool = False):
        """-> (emitted [B, S + 1], num_accepted [B], next_token [B], logits [B, S + 1, V] of the target at the
        root and each accepted node, or None unless record_logits). The caller marked "draft" on ``timer``."""
        tgt, drafter, shape = self.target, self.drafter, self.shape
        dev, B, T = tgt.device, len(reqs), shape.num_nodes
        root = [n - 1 for n in n_before]
        root_pos = torch.tensor(root, dtype=torch.int64).to(dev, non_blocking=True)
        tree = drafter.draft_tree(reqs, seqs, shape, sp, gen, self.sampled, root_pos, last)

        timer.mark("verify")
        ids, pos = verify_inputs(tree, root_pos)
        if tree.mask is None:  # built once: the verify pass and the acceptance both read it
            tree.mask = verify_mask(tree)
        mask = flatten_custom_mask(tree.mask, root)
        p = tgt.prepare(reqs, root, [T] * B, Mode.VERIFY, custom_mask=mask, positions=pos.reshape(-1))
        tgt.plan(p)
        if sp.greedy:  # the argmax comes out of the verify graph
            logits, top = tgt.forward_greedy(p, ids.reshape(-1))
            logits = logits.view(B, T, -1)
        else:
            logits = tgt.forward(p, ids.reshape(-1)).view(B, T, -1)

        timer.mark("accept")
        graphs = None
        if sp.greedy and self.accept_graph and tgt.graphs is not None:
            graphs = tgt.graphs.tree_accept.get(accept_key(shape))
        done = graphs.run(tree, top, reqs, root) if graphs is not None else None
        if done is not None:  # acceptance and the target's compaction: one replay (spec/tree_accept_graph.py)
            n_acc, path, nxt, emitted = done
            nxt = nxt.clone()  # the next iteration's root tokens outlive this graph's next replay
        else:
            if sp.greedy:
                n_acc, path, nxt = tree_greedy_accept_top(tree, top.view(B, T))
            else:
                n_acc, path, nxt = tree_rejection_accept(tree, probs_from_logits(logits, sp), gen, self.proposal)
            emitted = emitted_tokens(tree, path, n_acc, nxt)
            compact_target(tgt, reqs, root, T, path, n_acc)
        drafter.rollback_tree(reqs, n_before, tree, path, n_acc)

        timer.mark("draft_extend")  # EAGLE: the head reads the accepted path, before the sync
        nodes = path.clamp_min(0)  # rows past the path: the root's (garbage rows of a uniform shape)
        feats = None
        if tgt.aux is not None:
            rows = (torch.arange(B, device=dev)[:, None] * T + nodes).reshape(-1)
            feats = tgt.aux[rows]
        drafter.extend_tree(reqs, n_before, emitted, n_acc, feats)
        path_logits = logits.gather(1, nodes[:, :, None].expand(-1, -1, logits.shape[-1])) if record_logits else None
        return emitted, n_acc, nxt, path_logits


def accept_key(shape: TreeShape) -> tuple[int, int, int]:
    return shape.topk, shape.num_steps, shape.num_nodes


def capture_tree_graphs(target, drafter, shape: TreeShape) -> int:
    """CUDA graphs of a tree run: the target's decode (q_len 1: the target-only baseline), its tree verify (q_len
    N + 1, masked, with the drafter's captured layers), its greedy acceptance and compaction
    (spec/tree_accept_graph.py), then the drafter's tree passes. Tree-masked passes are captured only where the
    side's backend replays them (caps.cuda_graph_mask); else they run eagerly."""
    from attnlab.spec.tree_accept_graph import AcceptGraphs

    n = target.capture_graphs(q_lens=(1,), num_slots=1, keep=True)  # keep: a bench adds these to chain graphs
    if target.backend.capabilities().cuda_graph_mask:
        target.capture_layers = drafter.capture_layers
        try:
            n += target.capture_graphs(q_lens=(shape.num_nodes,), num_slots=1, keep=True, masked=True)
        finally:
            target.capture_layers = None
    acc = target.graphs.tree_accept.setdefault(accept_key(shape), AcceptGraphs(target, *accept_key(shape)))
    n += acc.capture(target.graphs.buckets)
    runner = drafter.runner
    masked = runner is not None and runner.backend.capabilities().cuda_graph_mask
    return n + drafter.capture_tree_graphs(target, shape, masked)
