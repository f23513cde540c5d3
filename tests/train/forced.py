"""Teacher-forced step matches of a head over given sequences, through the trainer's own path (collate ->
loss_rows -> teacher_forward -> TargetDist -> ttt_loss), as Trainer.evaluate computes them."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from attnlab.train_draft.data import Example, collate
from attnlab.train_draft.loss import TargetDist, loss_rows, loss_weight, ttt_loss
from attnlab.train_draft.teacher import teacher_forward
from attnlab.train_draft.ttt import StepStats


@dataclass
class Forced:
    matches: list[torch.Tensor]  # per step [B, S-1] bool: the head's argmax == the target's
    valid: torch.Tensor  # [B, S-1] bool: the loss entries (they predict answer tokens)
    stats: StepStats
    ids: torch.Tensor  # [B, S]
    feats: torch.Tensor  # [B, S, F]: the target's captured features
    dist: TargetDist


@torch.no_grad()
def forced_matches(target, head, examples: list[Example], steps: int) -> Forced:
    """fp32 on CPU, no truncation."""
    ids, answer = collate(examples, list(range(len(examples))), max(len(e.ids) for e in examples), "cpu")
    valid, rows = loss_rows(answer)
    feats, hidden = teacher_forward(target, ids, tuple(head.config.capture_layers), rows)
    d2t = head.d2t if head.config.draft_vocab_size else None
    dist = TargetDist.build(target, hidden, valid, loss_weight(head, torch.float32), d2t)
    _, stats, matches = ttt_loss(head, ids, feats, dist, steps, 1.0)
    return Forced(matches, valid, stats, ids, feats, dist)
