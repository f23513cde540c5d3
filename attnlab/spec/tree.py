"""Draft trees (spec.topk > 1) as pure tensor math: EAGLE-2-style dynamic construction, no host sync.

Knobs (SGLang's): ``K = topk`` branches per step, ``S = num_steps`` (depth), ``N = num_draft_tokens`` (the
nodes one verify pass checks, root excluded). The chain is ``K = 1, S = N``. Every tensor is batched over
``B`` requests and its shape depends only on (K, S, N, V), so the whole draft loop can live in a CUDA graph.

Construction (the root is the last committed token; it sits at position ``root_pos``):
- step 1, ``tree_start``: the root's draft distribution (the catch-up / draft-extend pass) gives K children,
  candidates ``0..K-1``; all K are the frontier, fed to draft pass 1.
- step s = 2..S, ``tree_step``: draft pass s-1 fed the K frontier nodes (depth s-1) and gives K children each:
  K*K candidates at depth s, ``score = parent score + log q(child)``. The K best by score are the next frontier.
- ``select_tree``: the N best candidates by score. Ancestors are closed: a child's score is <= its parent's
  (log q <= 0 and float addition is monotone) and ties go to the lower candidate id (a stable sort), which is
  the parent, since candidates are numbered in creation order (depth-major, then frontier row, then child rank).
  There are ``M = K + (S - 1) * K^2`` candidates in all.

Draft KV layout these functions assume (``draft_slot``): the frontier fed at draft pass s (depth s, s = 1..S-1)
writes its K tokens to tree slots ``(s - 1) * K + rank``, which follow the root in the request's draft KV
(positions ``root_pos + 1 + slot``); pass s attends to the prefix (root included) and, in the tree region, to
its own ancestors only (``draft_step_mask``). Depth-S nodes are never fed, as the chain's last draft.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from attnlab.errors import ConfigError


def max_tree_nodes(topk: int, num_steps: int) -> int:
    """Candidates one tree can hold: K children of the root, then K*K per later step."""
    return topk + (num_steps - 1) * topk * topk


def check_tree_shape(topk: int, num_steps: int | None, num_draft_tokens: int) -> int:
    """Resolve ``spec.num_steps`` (None = num_draft_tokens, chains only) and refuse shapes no tree has."""
    if topk < 1:
        raise ConfigError(f"spec.topk={topk}: must be >= 1 (1 = chain drafting)")
    if num_draft_tokens < 1:
        raise ConfigError(f"spec.num_draft_tokens={num_draft_tokens}: must be >= 1")
    if num_steps is None:
        if topk == 1:
            return num_draft_tokens
        raise ConfigError(f"spec.num_steps=null: set the tree depth with spec.topk={topk} > 1 "
                          f"(null means num_draft_tokens, for chains only)")
    if num_steps < 1:
        raise ConfigError(f"spec.num_steps={num_steps}: must be >= 1 or null (auto, chains only)")
    if num_steps > num_draft_tokens:
        raise ConfigError(f"spec.num_steps={num_steps} > spec.num_draft_tokens={num_draft_tokens}: a node at depth d "
                          f"needs its d - 1 ancestors among the verified nodes (use num_steps <= num_draft_tokens)")
    most = max_tree_nodes(topk, num_steps)
    if num_draft_tokens > most:
        raise ConfigError(f"spec.num_draft_tokens={num_draft_tokens} > {most}: topk={topk}, num_steps={num_steps} "
                          f"drafts topk + (num_steps - 1) * topk^2 = {most} nodes (raise num_steps or topk)")
    return num_steps


def sampling_proposal(topk: int, num_steps: int, num_draft_tokens: int) -> str:
    """The drafting scheme (and ``tree_rejection_accept`` proposal) that is lossless for this shape.

    "without_replacement" (siblings drawn in order without replacement from q, the q-ratio rule) needs every
    expanded node to keep all its drawn children, i.e. no score-based final pruning: chains, and full trees
    (N = M). Otherwise the final top-N selection keeps children *because of* their drawn values, and only
    "onehot" (siblings = top-k of q, or any choice independent of the target) stays lossless.
    """
    full = topk == 1 or num_draft_tokens == max_tree_nodes(topk, num_steps)
    return "without_replacement" if full else "onehot"


def candidate_depth(topk: int, num_candidates: int, device=None) -> torch.Tensor:
    """[M] int64 depth of each candidate id (1 for the root's children)."""
    c = torch.arange(num_candidates, device=device)
    return torch.where(c < topk, 1, 2 + (c - topk).clamp_min(0) // (topk * topk))


def draw_children(probs: torch.Tensor, topk: int, sampled: bool, generator: torch.Generator | None = None):
    """probs [..., V] fp32 draft rows of the expanded nodes -> (logp [..., K] fp32, tokens [..., K] int64).

    sampled=False: the K most likely tokens (EAGLE-2). sampled=True: K draws without replacement, in draw
    order (Gumbel-top-k in sampler.sample's exponential form: K = 1 is exactly ``sample(probs)``).
    """
    keys = probs / torch.empty_like(probs).exponential_(1.0, generator=generator) if sampled else probs
    tokens = keys.topk(topk, dim=-1).indices
    return probs.gather(-1, tokens).log(), tokens


@dataclass
class TreeState:
    """The tree while it is drafted, after ``step`` steps (``M_s = K + (step - 1) * K^2`` candidates so far).

    tokens, parents, scores: [B, M_s] candidate token ids (int64), parent candidate ids (int64, -1 = root),
        cumulative draft log-probs (fp32)
    frontier:        [B, K] int64 candidate ids of the frontier: the next draft pass's inputs
    frontier_tokens: [B, K] int64 their token ids (the next pass's input_ids, branch-major)
    frontier_parent: [B, K] int64 row of the previous frontier each descends from (0 = the root at step 1):
        EAGLE routes the parent's hidden state to the child's row with it
    frontier_anc:    [B, K, step] int64 frontier rank of each one's ancestor at depths 1..step (last = own rank)
    positions:       [B, K] int64 ``root_pos + step``: the next pass's positions
    expanded:        [B, E] int64 candidate ids of the nodes expanded so far (-1 = root), E = 1 + (step - 1) * K
    q_rows:          [B, E, V] fp32 their draft distributions (None unless every step passed them)
    root_pos:        [B] int64
    """

    tokens: torch.Tensor
    parents: torch.Tensor
    scores: torch.Tensor
    frontier: torch.Tensor
    frontier_tokens: torch.Tensor
    frontier_parent: torch.Tensor
    frontier_anc: torch.Tensor
    positions: torch.Tensor
    expanded: torch.Tensor
    q_rows: torch.Tensor | None
    root_pos: torch.Tensor
    topk: int
    step: int


def tree_start(logp: torch.Tensor, tokens: torch.Tensor, root_pos: torch.Tensor,
               q_root: torch.Tensor | None = None) -> TreeState:
    """Step 1. logp [B, K], tokens [B, K]: the root's children (``draw_children``); root_pos [B] int64;
    q_root [B, V]: the root's draft row (sampling acceptance with proposal "without_replacement" needs it)."""
    B, K = tokens.shape
    frontier = torch.arange(K, device=tokens.device).expand(B, K)
    return TreeState(
        tokens=tokens, parents=torch.full_like(tokens, -1), scores=logp.float(), frontier=frontier,
        frontier_tokens=tokens, frontier_parent=torch.zeros_like(tokens), frontier_anc=frontier[:, :, None],
        positions=(root_pos[:, None] + 1).expand(B, K), expanded=torch.full_like(tokens[:, :1], -1),
        q_rows=None if q_root is None else q_root[:, None].float(), root_pos=root_pos, topk=K, step=1)


def tree_step(state: TreeState, logp: torch.Tensor, tokens: torch.Tensor,
              q_rows: torch.Tensor | None = None) -> TreeState:
    """Steps 2..S. logp [B, K, K], tokens [B, K, K]: the children of each frontier row (the draft pass fed
    ``state.frontier_tokens``); q_rows [B, K, V]: the draft rows they were drawn from."""
    B, K = state.frontier.shape
    ar = torch.arange(K, device=tokens.device)
    scores = (state.scores.gather(1, state.frontier)[:, :, None] + logp.float()).reshape(B, K * K)
    off = state.tokens.shape[1]
    # The K best; a stable sort breaks ties toward the lower id (deterministic on every device).
    best = torch.sort(scores, dim=1, descending=True, stable=True).indices[:, :K]
    row = best // K
    anc = state.frontier_anc.gather(1, row[:, :, None].expand(B, K, state.step))
    q = None if state.q_rows is None or q_rows is None else torch.cat([state.q_rows, q_rows.float()], dim=1)
    return TreeState(
        tokens=torch.cat([state.tokens, tokens.reshape(B, K * K)], dim=1),
        parents=torch.cat([state.parents, state.frontier.repeat_interleave(K, dim=1)], dim=1),
        scores=torch.cat([state.scores, scores], dim=1),
        frontier=off + best, frontier_tokens=tokens.reshape(B, K * K).gather(1, best), frontier_parent=row,
        frontier_anc=torch.cat([anc, ar.expand(B, K)[:, :, None]], dim=2),
        positions=state.positions + 1, expanded=torch.cat([state.expanded, state.frontier], dim=1),
        q_rows=q, root_pos=state.root_pos, topk=K, step=state.step + 1)


def draft_step_mask(state: TreeState, width: int | None = None) -> torch.Tensor:
    """[B, K, width] bool: the tree-region mask of the next draft pass (the frontier at depth ``step``, which
    writes slots (step - 1) * K + rank): True on each branch's ancestors and itself. width defaults to
    ``step * K`` (the slots written so far); a larger one (e.g. (S - 1) * K, fixed for all passes) pads False.
    The prefix columns before the tree region are all True (``flatten_custom_mask``)."""
    B, K, s = state.frontier_anc.shape
    width = s * K if width is None else width
    if width < s * K:
        raise ValueError(f"draft_step_mask: width {width} < {s * K} tree slots written by step {s}")
    cols = state.frontier_anc + K * torch.arange(s, device=state.frontier_anc.device)
    return torch.zeros(B, K, width, dtype=torch.bool, device=cols.device).scatter_(2, cols, True)


@dataclass
class DraftTree:
    """One verify pass's tree per request: node 0 is the root, nodes 1..N the drafts, each parent before its
    children (creation order: depth-major, siblings in draw order).

    tokens:      [B, N + 1] int64 (column 0: the root = the last committed token)
    parents:     [B, N + 1] int64 node index of the parent (-1 for the root)
    depth:       [B, N + 1] int64 (root 0): verify positions are root_pos + depth
    logp:        [B, N + 1] fp32 cumulative draft log-probability (root 0)
    draft_slot:  [B, N + 1] int64 tree slot of the node's draft KV (module doc), -1 if no draft pass fed it
    draft_probs: [B, N + 1, V] fp32 or None: the draft row each node's children were drawn from (zero rows for
                 nodes never expanded)
    mask:        [B, N + 1, N + 1] bool or None: the verify pass's ancestor-or-self mask (tree_verify.verify_mask),
                 when the drafting already built it (attnlab.spec.tree_device, inside its launch)
    """

    tokens: torch.Tensor
    parents: torch.Tensor
    depth: torch.Tensor
    logp: torch.Tensor
    draft_slot: torch.Tensor
    draft_probs: torch.Tensor | None
    topk: int
    num_steps: int
    mask: torch.Tensor | None = None

    @property
    def num_nodes(self) -> int:
        return self.tokens.shape[1]


def select_tree(state: TreeState, root_tokens: torch.Tensor, num_draft_tokens: int) -> DraftTree:
    """Keep the ``num_draft_tokens`` best candidates (ancestors closed, see module doc); root_tokens [B]."""
    B, M = state.scores.shape
    N, K, dev = num_draft_tokens, state.topk, state.scores.device
    if not 1 <= N <= M:
        raise ValueError(f"num_draft_tokens={N}: the tree holds {M} candidates")
    keep = torch.sort(state.scores, dim=1, descending=True, stable=True).indices[:, :N].sort(dim=1).values
    ids = torch.arange(1, N + 1, device=dev).expand(B, N)
    node_of = torch.full((B, M), -1, dtype=torch.long, device=dev).scatter_(1, keep, ids)
    cand_parent = state.parents.gather(1, keep)
    parents = torch.where(cand_parent < 0, 0, node_of.gather(1, cand_parent.clamp_min(0)))
    # entry e >= 1 of state.expanded is the frontier node written to draft tree slot e - 1
    E = state.expanded.shape[1]
    exp_of = torch.full((B, M + 1), -1, dtype=torch.long, device=dev)  # column M: the root's -1
    exp_of.scatter_(1, state.expanded.where(state.expanded >= 0, M), torch.arange(E, device=dev).expand(B, E))
    src = torch.cat([exp_of[:, M:], exp_of.gather(1, keep)], dim=1)  # [B, N + 1] row of state.q_rows, or -1
    q = None
    if state.q_rows is not None:
        V = state.q_rows.shape[-1]
        q = state.q_rows.gather(1, src.clamp_min(0)[:, :, None].expand(B, N + 1, V))
        q = torch.where(src[:, :, None] >= 0, q, 0.0)
    col = torch.zeros(B, 1, dtype=torch.long, device=dev)
    return DraftTree(
        tokens=torch.cat([root_tokens[:, None], state.tokens.gather(1, keep)], dim=1),
        parents=torch.cat([col - 1, parents], dim=1),
        depth=torch.cat([col, candidate_depth(K, M, dev)[keep]], dim=1),
        logp=torch.cat([col.float(), state.scores.gather(1, keep)], dim=1),
        draft_slot=torch.where(src >= 1, src - 1, -1), draft_probs=q, topk=K, num_steps=state.step)


def chain_tree(root_tokens: torch.Tensor, draft_tokens: torch.Tensor,
               draft_probs: torch.Tensor | None = None) -> DraftTree:
    """The chain as a tree (topk 1): root_tokens [B], draft_tokens [B, k], draft_probs [B, k, V] (row j drew
    draft j). Node j is draft j - 1; its draft KV is slot j - 1 except the last draft's (never fed)."""
    B, k = draft_tokens.shape
    dev = draft_tokens.device
    j = torch.arange(k + 1, device=dev).expand(B, k + 1)
    q = logp = None
    if draft_probs is not None:
        q = torch.cat([draft_probs.float(), draft_probs.new_zeros(B, 1, draft_probs.shape[-1]).float()], dim=1)
        logp = torch.cat([torch.zeros_like(q[:, :1, 0]), q[:, :k].gather(2, draft_tokens[:, :, None])[..., 0]
                          .log().cumsum(1)], dim=1)
    return DraftTree(tokens=torch.cat([root_tokens[:, None], draft_tokens], dim=1), parents=j - 1, depth=j,
                     logp=torch.zeros(B, k + 1, device=dev) if logp is None else logp,
                     draft_slot=torch.where(j < k, j - 1, -1), draft_probs=q, topk=1, num_steps=k)
