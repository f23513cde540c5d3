"""Multi-step greedy decode: N single-token passes per launch, one host sync per N tokens.

Target-only greedy decoding (``engine.decode_steps_per_sync = N``) prepares the N passes up front (pages
for N more tokens, their metadata in one copy, plan slots 1..N as the multi-step draft does), then runs them back to back, each step's
argmax feeding the next step's input on the device. Under CUDA graphs the N steps are one graph (a replay
per N tokens); without graphs ``greedy_steps`` runs eagerly, the same code minus the capture.

The caller commits up to N tokens per request and drops those past EOS / max_new_tokens; the target KV
then holds the committed sequence minus its last token, as after a verify pass (spec/decoder.py).

A greedy drafter's k - 1 single-token steps are the same loop (``decode_steps(..., features=...)``): an EAGLE
head's steps also pass each step's pre-norm output (``ctx.captured``) on as the next step's feature, so the
whole draft is one graph replay instead of a replay, an argmax and a feature copy per step.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence

import torch

from attnlab.backends.context import AttnContext


def greedy_steps(r, ids: torch.Tensor, positions: torch.Tensor, slots: torch.Tensor,
                 features: torch.Tensor | None = None) -> torch.Tensor:
    """The body of a multi-step pass (captured into a graph, or run eagerly).

    ids: [R] int64 the first step's input tokens; positions, slots: [N, R] int64 per step (slot -1: a
    padded row); step j runs under plan slot j + 1. ``features`` [R, F]: a draft head's first-step input
    feature; each later step reads the previous step's ``ctx.captured``. Returns the argmax tokens [N, R] int64.
    """
    out = []
    for j in range(positions.shape[0]):
        r.use_step(j)
        ctx = AttnContext(r.backend, r.pool, slots[j], fused_ops=r.fused_ops, invariant=r.invariant,
                          capture=r.capture_layers)
        extra = {} if features is None else {"features": features}
        ids = r.greedy_tokens(r.model(ids, positions[j], ctx, **extra))
        if features is not None:
            features = ctx.captured
        out.append(ids)
    return torch.stack(out)


@torch.inference_mode()
def decode_steps(r, reqs: Sequence[Hashable], starts: Sequence[int], last: torch.Tensor, n: int,
                 features: torch.Tensor | None = None) -> torch.Tensor:
    """Feed ``last`` [B] (each request's last committed token, at position ``starts[i]``) and decode ``n``
    greedy tokens per request: -> [B, n] int64 on device. Allocates KV for the n new positions.
    ``features`` [B, F]: a draft head's input feature for the first step (see greedy_steps)."""
    b = len(reqs)
    passes = r.prepare_steps(reqs, starts, n)  # one host-to-device copy for the n passes
    r.plan_steps(passes)
    bs = passes[0].padded_to
    width = None if features is None else features.shape[1]
    if r.graphs is not None and bs is not None and r.graphs.has_steps(bs, n, width):
        tokens = r.graphs.replay_steps(bs, n, passes, last, features)
    else:
        rows = passes[0].positions.shape[0]
        ids = torch.cat([last, last.new_zeros(rows - b)]) if rows > b else last
        if features is not None and rows > b:
            features = torch.cat([features, features.new_zeros(rows - b, features.shape[1])])
        tokens = greedy_steps(r, ids, torch.stack([p.positions for p in passes]),
                              torch.stack([p.slots for p in passes]), features)
    return tokens[:, :b].t()
