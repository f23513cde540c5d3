"""What every tree-drafting model side shares: the planned tree passes and one expansion step.

A tree draft (``K = topk`` branches, ``S = num_steps``) runs, per request, a root pass (the catch-up of a model
drafter, the stored draft-extend output of EAGLE) and then S - 1 frontier passes of q_len K. Frontier pass s
(s = 1 .. S - 1) feeds the K frontier nodes of depth s at KV positions ``kv_start + (s - 1) K + rank`` (the tree
slots of attnlab.spec.tree, after the root), RoPE position ``rope_root + s`` for all K, and attends to the
prefix (root included) plus, in the tree region, its own ancestors only (``draft_step_mask``). The tree region
of pass s is ``s * K`` columns wide.

Every pass is prepared and planned before the draft loop (``plan_tree_steps``), as the chain's multi-step
draft; the ancestor columns are data (which frontier rows descend from which) and are written into the planned
pass's mask on the device just before it runs (``write_step_mask``, AttentionBackend.update_mask). No page is
copied for a branch: all branches of a request are query rows of one request, reading its prefix pages in place;
each fed node owns one slot of the tree region.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from dataclasses import dataclass

import torch

from attnlab.backends.base import Mode
from attnlab.engine.sampler import SamplingParams, probs_from_logits
from attnlab.spec.tree import TreeState, draft_step_mask, draw_children, tree_start, tree_step
from attnlab.spec.tree_verify import custom_mask_index


@dataclass(frozen=True)
class TreeShape:
    """spec.topk (K), spec.num_steps (S), spec.num_draft_tokens (N): a tree verify checks N + 1 tokens."""

    topk: int
    num_steps: int
    num_draft_tokens: int

    @property
    def num_nodes(self) -> int:
        return self.num_draft_tokens + 1

    @property
    def tree_slots(self) -> int:
        """Draft KV slots the frontier passes write per request: (S - 1) * K."""
        return (self.num_steps - 1) * self.topk


def draft_rows(logits: torch.Tensor, sp: SamplingParams) -> torch.Tensor:
    """logits [..., V] -> the draft distribution q [..., V] fp32 the tree is built from: the processed one when
    sampling (the target's rows get the same processing), the plain softmax when greedy (EAGLE-2's scores)."""
    return torch.softmax(logits.float(), dim=-1) if sp.greedy else probs_from_logits(logits, sp)


def expand(state: TreeState | None, q: torch.Tensor, topk: int, sampled: bool, gen, root_pos: torch.Tensor,
           keep_q: bool) -> TreeState:
    """One tree step from draft rows q ([B, V] for the root, [B, K, V] for a frontier): children drawn by
    ``draw_children`` (sampled: without replacement, else top-k). keep_q: keep the rows in the tree (the
    "without_replacement" acceptance reads them)."""
    logp, tokens = draw_children(q, topk, sampled, gen)
    if state is None:
        return tree_start(logp, tokens, root_pos, q if keep_q else None)
    return tree_step(state, logp, tokens, q if keep_q else None)


@dataclass
class TreeStep:
    """One planned frontier pass and where its tree columns sit in the pass's flat mask."""

    p: object  # engine.runner.Pass
    index: torch.Tensor  # [B * K * s * K] int64 positions in p.meta.custom_mask


def plan_tree_steps(runner, reqs: Sequence[Hashable], kv_start: Sequence[int], rope_root: Sequence[int],
                    topk: int, num_steps: int) -> list[TreeStep]:
    """Prepare and plan the S - 1 frontier passes (plan slots 1 .. S - 1). kv_start: host position of tree slot 0
    per request (everything before it is the prefix the branches share); rope_root: the root's RoPE position."""
    K, dev = topk, runner.device
    steps = []
    for s in range(1, num_steps):
        total, index = custom_mask_index(K, s * K, list(kv_start), dev)
        mask = torch.ones(total, dtype=torch.bool, device=dev)  # the tree columns are written before the pass
        pos = torch.tensor([r + s for r in rope_root for _ in range(K)], dtype=torch.int64).to(dev, non_blocking=True)
        p = runner.prepare(reqs, [n + (s - 1) * K for n in kv_start], [K] * len(reqs), Mode.VERIFY,
                           custom_mask=mask, positions=pos)
        steps.append(TreeStep(p, index))
    runner.plan_steps([t.p for t in steps])
    return steps


def write_step_mask(runner, step: TreeStep, state: TreeState) -> None:
    """Before frontier pass ``state.step`` runs (its plan active): its ancestor columns, on the device."""
    mask = step.p.meta.custom_mask
    mask[step.index] = draft_step_mask(state).reshape(-1)
    runner.update_mask(step.p, mask)
