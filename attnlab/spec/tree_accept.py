"""Tree acceptance as pure tensor math (no host sync): which root-to-node path does the target accept?

Inputs: a :class:`~attnlab.spec.tree.DraftTree` (T = N + 1 nodes, root 0) and the target's verify output
over the tree tokens, target_logits / target_probs [B, T, V] (row i scores the token after node i's path).
Both rules return ``(num_accepted [B], path [B, S + 1], next_token [B])``: path holds node 0, then the
accepted node at depth 1..num_accepted, then -1; ``next_token`` follows the last accepted node (correction
or bonus), so a request emits ``num_accepted + 1`` tokens, as acceptance.greedy_accept / rejection_accept.

Lossless sampling (``tree_rejection_accept``), recursive rejection over siblings (SpecInfer; Jeon et al.
2024, recursive speculative decoding). At the current node v with target row p_1 = p_v, try the children
x_1..x_m in order, x_j drawn from the proposal q_j (the draft's conditional of the j-th child given the earlier
ones): accept x_j with probability min(1, p_j(x_j) / q_j(x_j)) and move to it, else p_{j+1} = norm(max(p_j -
q_j, 0)); after m rejections sample from p_{m+1}; at a node without children sample the bonus from p_v.
Why it is lossless, by induction from the leaves: suppose the walk from any child emits continuations with
the target's law given that child, whatever happened elsewhere. One rejection step with proposal q_j and
target p_j emits x with probability min(p_j, q_j)(x) + (1 - sum min(p_j, q_j)) * r(x), where r is the law of
what follows a rejection; if r = norm(max(p_j - q_j, 0)) this is p_j(x), since sum max(p - q, 0) = 1 - sum
min(p, q). What follows rejection j is the same step with target p_{j+1} = that residual and proposal q_{j+1}
(valid for any q_{j+1}, which may depend on x_1..x_j), down to "sample from p_{m+1}". So the first token
is exactly p_v-distributed, and the rest by the induction hypothesis. Two proposals:

- "onehot": q_j = one-hot(x_j). Accepting x_j with p_j(x_j) and zeroing it in the residual is "draw y ~ p_v;
  go to the child whose token is y, if any". Lossless for *any* child set chosen without the target's coins:
  top-k of q (EAGLE-2, which drafts deterministically), EAGLE-2's score pruning, any sampled drafts.
- "without_replacement": children drawn in order without replacement from the node's draft row q
  (``draw_children(sampled=True)``), q_j = q with x_1..x_{j-1} removed, renormalized. It needs the kept
  children of every expanded node to be all of its draws, in draw order: true for chains and for full trees
  (N = M, see ``tree.sampling_proposal``); EAGLE-2's score-based frontier choice is fine (it decides whether a
  node has children, never what they are). With topk = 1 it is exactly acceptance.rejection_accept.
  A child with q_j(x_j) = 0 (the draft ran out of mass) is treated as absent.
"""

from __future__ import annotations

import torch

from attnlab.engine.sampler import sample
from attnlab.spec.tree import DraftTree

PROPOSALS = ("onehot", "without_replacement")


def children_table(parents: torch.Tensor, topk: int) -> torch.Tensor:
    """parents [B, T] -> [B, T, topk] int64 children of each node in increasing index order, -1 padded
    (a node has at most topk children in a draft tree; later ones would be dropped)."""
    B, T = parents.shape
    ar = torch.arange(T, device=parents.device)
    earlier = ar[None, :] < ar[:, None]  # [c, c']: c' before c
    rank = ((parents[:, :, None] == parents[:, None, :]) & earlier).sum(-1)  # among its siblings, [B, T]
    ok = (parents >= 0) & (rank < topk)
    at = torch.where(ok, parents * topk + rank, T * topk)  # [B, T]; row T catches the root and overflow
    table = torch.full((B, (T + 1) * topk), -1, dtype=torch.long, device=parents.device)
    table.scatter_(1, at, torch.where(ok, ar, -1).expand(B, T).contiguous())
    return table[:, :T * topk].view(B, T, topk)


def _walk_rows(ch: torch.Tensor, cur: torch.Tensor) -> torch.Tensor:
    """children rows of the current nodes: ch [B, T, K], cur [B] -> [B, K]."""
    return ch.gather(1, cur[:, None, None].expand(-1, 1, ch.shape[2])).squeeze(1)


def _row(x: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
    """x [B, T, V], idx [B] -> x[b, idx[b]] [B, V]."""
    return x.gather(1, idx[:, None, None].expand(-1, 1, x.shape[2])).squeeze(1)


def tree_greedy_accept(tree: DraftTree, target_logits: torch.Tensor):
    """From the root, move to the first child whose token is the target's argmax at the current node."""
    return tree_greedy_accept_top(tree, target_logits.argmax(dim=-1))


def tree_greedy_accept_top(tree: DraftTree, top: torch.Tensor):
    """``tree_greedy_accept`` from the target's argmax per node, top [B, T] int64 (a verify graph computes it).

    In closed form, not as a walk of num_steps levels (about 25 launches whatever the depth, where the walk took
    ~10 a level): node i is chosen when its token is the target's argmax at its parent and no earlier sibling's
    is (the walk takes the first hit); it is on the accepted path when it and every ancestor are chosen. At most
    one node per depth is, so the path is those nodes by depth. Reads tree.tokens, tree.parents, tree.num_steps
    and tree.mask (the ancestor-or-self mask, built here when absent)."""
    from attnlab.spec.tree_verify import ancestor_mask

    parents, tokens = tree.parents, tree.tokens
    B, T = tokens.shape
    ar = torch.arange(T, device=tokens.device)
    matched = (parents >= 0) & (tokens == top.gather(1, parents.clamp_min(0)))
    earlier_hit = ((parents[:, :, None] == parents[:, None, :]) & (ar[None, :] < ar[:, None]) & matched[:, None, :])
    chosen = (matched & ~earlier_hit.any(dim=2)) | (ar == 0)  # the root is where every path starts
    anc = tree.mask if tree.mask is not None else ancestor_mask(parents, tree.num_steps)
    on_path = (~anc | chosen[:, None, :]).all(dim=2)
    S = tree.num_steps
    depth = torch.where(on_path, anc.sum(dim=2) - 1, S + 1)  # column S + 1: nodes off the path
    path = torch.full((B, S + 2), -1, dtype=torch.long, device=tokens.device).scatter_(1, depth, ar.expand(B, T))
    path = path[:, :S + 1]
    num_accepted = on_path.sum(dim=1) - 1
    return num_accepted, path, top.gather(1, path.gather(1, num_accepted[:, None])).squeeze(1)


def _residual(p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """norm(max(p - q, 0)), p itself where no mass is left (then p == q: any sample from p is correct).
    The same ops as acceptance.rejection_accept, so chains agree bit for bit."""
    resid = (p - q).clamp_min(0.0)
    mass = resid.sum(-1, keepdim=True)
    return torch.where(mass > 0, resid / mass.clamp_min(1e-30), p)


def tree_rejection_accept(tree: DraftTree, target_probs: torch.Tensor, generator: torch.Generator | None = None,
                          proposal: str = "onehot"):
    """Lossless multi-draft rejection sampling over the tree (module doc). target_probs [B, T, V] fp32;
    ``tree.draft_probs`` is needed for proposal "without_replacement". One uniform per node ([B, N], drawn
    first, as rejection_accept) and one sample at the end."""
    if proposal not in PROPOSALS:
        raise ValueError(f"proposal={proposal!r} (choose from: {', '.join(PROPOSALS)})")
    sampled = proposal == "without_replacement"
    if sampled and tree.draft_probs is None:
        raise ValueError("proposal 'without_replacement' needs tree.draft_probs (pass q rows to every tree step)")
    B, T = target_probs.shape[:2]
    dev = target_probs.device
    u = torch.rand((B, T - 1), generator=generator, device=dev)
    u = torch.cat([u.new_zeros(B, 1), u], dim=1)  # coin of node i at column i
    ch = children_table(tree.parents, tree.topk)
    cur = torch.zeros(B, dtype=torch.long, device=dev)
    active = torch.ones(B, dtype=torch.bool, device=dev)
    rejected = torch.zeros(B, dtype=torch.bool, device=dev)  # p is already a residual of the current node
    p = target_probs[:, 0]
    q = tree.draft_probs[:, 0] if sampled else None
    path = [cur]
    for _ in range(tree.num_steps):
        c_row = _walk_rows(ch, cur)
        moved = torch.zeros(B, dtype=torch.bool, device=dev)
        for j in range(c_row.shape[1]):
            c = c_row[:, j].clamp_min(0)
            x = tree.tokens.gather(1, c[:, None])
            px = p.gather(1, x).squeeze(1)
            qrow = q if sampled else torch.zeros_like(p).scatter_(1, x, 1.0)  # one-hot(x)
            qx = qrow.gather(1, x).squeeze(1)
            tried = active & ~moved & (c_row[:, j] >= 0) & (qx > 0)
            acc = tried & (u.gather(1, c[:, None]).squeeze(1) * qx < px)  # u < p/q without a division
            rej = (tried & ~acc)[:, None]
            p = torch.where(acc[:, None], _row(target_probs, c), torch.where(rej, _residual(p, qrow), p))
            if sampled:  # the next sibling was drawn from q without this token
                rest = q.scatter(1, x, 0.0)
                rest = rest / rest.sum(-1, keepdim=True).clamp_min(1e-30)
                q = torch.where(acc[:, None], _row(tree.draft_probs, c), torch.where(rej, rest, q))
            rejected = (rejected | rej[:, 0]) & ~acc
            cur = torch.where(acc, c, cur)
            moved = moved | acc
        active = moved
        path.append(torch.where(moved, cur, -1))
    # Stop at cur: sample from the residual left by its rejected children, or (none rejected, e.g. a leaf)
    # from its target row, normalized as rejection_accept does.
    final = torch.where(rejected[:, None], p, _residual(p, torch.zeros_like(p)))
    path = torch.stack(path, dim=1)
    return (path[:, 1:] >= 0).sum(dim=1), path, sample(final, generator)


def emitted_tokens(tree: DraftTree, path: torch.Tensor, num_accepted: torch.Tensor,
                   next_token: torch.Tensor) -> torch.Tensor:
    """-> [B, S + 1] int64: the accepted nodes' tokens, next_token at column num_accepted, zeros after."""
    out = torch.where(path[:, 1:] >= 0, tree.tokens.gather(1, path[:, 1:].clamp_min(0)), 0)
    out = torch.cat([out, out.new_zeros(out.shape[0], 1)], dim=1)
    return out.scatter(1, num_accepted[:, None], next_token[:, None])
