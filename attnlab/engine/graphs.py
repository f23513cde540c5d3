"""CUDA graphs of whole forward passes, per (batch-size bucket, q_len per request, plan slot, captured layers,
tree mask or not).

Contract with the backend (``caps.cuda_graph`` non-empty, built with ``cuda_graph=True``): a plan for the
same (slot, batch size, q_len) reuses the same device buffers and launch parameters, so a graph captured
after one ``plan`` stays valid after the next ``plan`` rewrote those buffers in place. Padded requests
(see ``ModelRunner.prepare(pad_to=...)``) write to slot -1 and read the scratch page: harmless rows.

Every graph of a runner shares one memory pool; buckets are captured largest first (as nano-vllm does) so
the smaller ones reuse the pool's blocks. A graph records the runner's ``capture_layers`` at capture time and
replays only while they are the same: a target captured for an EAGLE drafter (features out of every pass)
and the same target decoding alone (nothing captured) use different graphs, so the target-only baseline does
not pay for the drafter's features. Tree passes (a custom mask: tree verify, tree draft steps) have their own
graphs, captured over a masked plan of the backend (``caps.cuda_graph_mask``); a causal pass of the same shape
never replays one, nor the other way round.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from attnlab.backends.context import AttnContext

DEFAULT_BUCKETS = (1, 2, 4, 8, 16, 32, 64)


def bucket_for(batch: int, buckets) -> int | None:
    """The smallest captured bucket that holds ``batch`` requests, or None (eager)."""
    return next((b for b in sorted(buckets) if b >= batch), None)


@dataclass
class _Graph:
    graph: torch.cuda.CUDAGraph
    ids: torch.Tensor  # [bs * q_len] int64
    positions: torch.Tensor  # [bs * q_len] int64
    slots: torch.Tensor  # [bs * q_len] int64
    logits: torch.Tensor  # [bs * q_len, vocab] fp32
    features: torch.Tensor | None = None  # [bs * q_len, F] a draft head's per-token input
    aux: torch.Tensor | None = None  # [bs * q_len, F'] the captured layers / the head's pre-norm output


class GraphCache:
    def __init__(self, runner):
        self.runner = runner
        self.graphs: dict[tuple, _Graph] = {}  # (bs, q_len, slot, capture_layers, masked) -> graph
        self.buckets: tuple[int, ...] = ()
        self.q_lens: tuple[int, ...] = ()  # of causal passes
        self.mask_q_lens: tuple[int, ...] = ()  # of tree passes
        self.pool = None

    def q_lens_for(self, masked: bool) -> tuple[int, ...]:
        return self.mask_q_lens if masked else self.q_lens

    def has(self, bs: int, q_len: int, slot: int, features: torch.Tensor | None = None, masked: bool = False) -> bool:
        """A graph for this key exists and takes the same kind of features (none, or the same width)."""
        g = self.graphs.get((bs, q_len, slot, self.runner.capture_layers, masked))
        if g is None:
            return False
        if g.features is None or features is None:
            return g.features is None and features is None
        return g.features.shape[1] == features.shape[1]

    def capture(self, buckets, q_lens, slots, feature_dim: int | None = None, masked: bool = False) -> int:
        """Capture every (bucket, q_len, slot) not captured yet; returns how many were added."""
        r = self.runner
        before = len(self.graphs)
        self.buckets = tuple(sorted(set(self.buckets) | set(buckets)))
        if masked:
            self.mask_q_lens = tuple(sorted(set(self.mask_q_lens) | set(q_lens)))
        else:
            self.q_lens = tuple(sorted(set(self.q_lens) | set(q_lens)))
        self.pool = self.pool or torch.cuda.graph_pool_handle()
        for bs in sorted(set(buckets), reverse=True):
            for q in sorted(set(q_lens)):
                for slot in slots:
                    if (bs, q, slot, r.capture_layers, masked) not in self.graphs:
                        self._capture_one(r, bs, q, slot, feature_dim, masked)
        return len(self.graphs) - before

    def _capture_one(self, r, bs: int, q: int, slot: int, feature_dim: int | None, masked: bool = False) -> None:
        from attnlab.backends.base import Mode

        # a tree pass is captured over a masked plan (the dummies' own blocks, all True): the backend's static
        # mask buffers, which every later plan and update_mask of this key rewrite in place
        mask = torch.ones(0, dtype=torch.bool, device=r.device) if masked else None
        dummy = r.prepare([], [], [], Mode.DECODE if q == 1 and not masked else Mode.VERIFY, pad_to=bs,
                          pad_q_len=q, custom_mask=mask)
        r.plan_slot(dummy, slot)
        n = bs * q
        ids = torch.zeros(n, dtype=torch.long, device=r.device)
        positions, slots = dummy.positions.clone(), dummy.slots.clone()
        features = None
        if feature_dim:
            wdtype = next(r.model.parameters()).dtype
            features = torch.zeros(n, feature_dim, dtype=wdtype, device=r.device)
        extra = {} if features is None else {"features": features}

        def forward():
            # The context is built inside the capture: its store index is derived from the static ``slots``
            # buffer by a captured kernel, so a replay with new slots stores where they say.
            ctx = AttnContext(r.backend, r.pool, slots, fused_ops=r.fused_ops, capture=r.capture_layers)
            logits = r.model.compute_logits(r.model(ids, positions, ctx, **extra))
            return logits, ctx.captured

        with torch.inference_mode():
            stream = torch.cuda.Stream()
            stream.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(stream):  # warm up (compiles kernels, settles allocator) off the capture
                for _ in range(2):
                    forward()
            torch.cuda.current_stream().wait_stream(stream)
            g = torch.cuda.CUDAGraph()
            with torch.cuda.graph(g, pool=self.pool):
                logits, aux = forward()
        self.graphs[(bs, q, slot, r.capture_layers, masked)] = _Graph(g, ids, positions, slots, logits, features,
                                                                        aux)

    def replay(self, bs: int, q: int, slot: int, p, input_ids: torch.Tensor,
               features: torch.Tensor | None = None, masked: bool = False) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Copy the pass's inputs into the graph's buffers and replay; returns ([bs * q, vocab] logits,
        [bs * q, F'] aux or None), views of the graph's output buffers: consume them before the next replay
        of the same graph."""
        g = self.graphs[(bs, q, slot, self.runner.capture_layers, masked)]
        g.ids[: input_ids.shape[0]].copy_(input_ids)
        if features is not None:
            g.features[: features.shape[0]].copy_(features)
        g.positions.copy_(p.positions)
        g.slots.copy_(p.slots)
        g.graph.replay()
        return g.logits, g.aux
