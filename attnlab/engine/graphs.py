"""CUDA graphs of whole forward passes, per (batch-size bucket, q_len per request, plan slot, captured layers,
tree mask or not).

A multi-step graph (``capture_steps``, key slot ``("steps", n, F)``) holds n greedy single-token passes under plan
slots 1..n, each step's argmax the next one's input (engine/multistep.py): one replay per n decoded tokens.
F = 0 for a plain decoder; a draft head's graph (F = its feature width) also feeds each step's pre-norm
output to the next step. A backend with device-planned steps gets a ``("dsteps", n, F)`` graph, which computes
the steps' metadata itself from one staged buffer; flashinfer, whose launches fit device steps only while no
request crosses a page, keeps the host-planned graph beside it.

Contract with the backend (``caps.cuda_graph`` non-empty, built with ``cuda_graph=True``): a plan for the
same (slot, batch size, q_len) reuses the same device buffers and launch parameters, so a graph captured
after one ``plan`` stays valid after the next ``plan`` rewrote those buffers in place. Padded requests
(see ``ModelRunner.prepare(pad_to=...)``) write to slot -1 and read the scratch page: harmless rows.

A backend whose plans of one (batch, q_len) can launch different kernels by the pass's lengths names those plan
variants (``AttentionBackend.graph_variants``: flashinfer's fa2 verify with and without split-KV, or as decode
rows); each gets its own graph, captured with the variant forced, and a replay takes the graph of the variant its
slot's plan chose.

Every graph of a runner shares one memory pool; buckets are captured largest first (as nano-vllm does) so
the smaller ones reuse the pool's blocks. A graph records the runner's ``capture_layers`` at capture time and
replays only while they are the same: a target captured for an EAGLE drafter (features out of every pass)
and the same target decoding alone (nothing captured) use different graphs, so the target-only baseline does
not pay for the drafter's features. Tree passes (a custom mask: tree verify, tree draft steps) have their own
graphs, captured over a masked plan of the backend (``caps.cuda_graph_mask``); a causal pass of the same shape
never replays one, nor the other way round.

Every graph also returns the argmax of its logits rows (``tokens``): greedy decode and greedy verify read
the target's choices from the graph's output, with no argmax launch after the replay. A sampling pass pays
that one reduction over [rows, vocab] unused (``runner.graph_argmax = False`` at capture leaves it out).
"""

from __future__ import annotations

import contextlib
import gc
from dataclasses import dataclass

import torch

DEFAULT_BUCKETS = (1, 2, 4, 8, 16, 32, 64)


@contextlib.contextmanager
def _gc_off():
    """The garbage collector off inside the block (an explicit gc.collect still runs)."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


def record_graph(fn, pool=None, stream=None, warmups: int = 2):
    """Run ``fn`` ``warmups`` times, then capture one call of it into a CUDA graph (of ``pool``, if given): -> (the
    graph, what the captured call returned, i.e. the graph's output buffers). Every attnlab capture goes through
    here (GraphCache.record, the benches' timers).

    The warm-up calls run on the stream the capture runs on (``stream``, or a new one; GraphCache keeps one per cache,
    as SGLang's graph runner does), so what a library sets up lazily per stream, e.g. the cuBLAS workspace of
    (handle, stream), is set up before the capture and not inside it; they also compile the kernels and settle the
    allocator. The garbage collector is off during the capture (as vLLM and SGLang keep it; torch.cuda.graph no longer
    collects before a capture unless TORCH_CUDAGRAPH_GC=1): a collection inside it could free another runner's graph,
    memory or a compiled kernel, calls a capture does not allow. Either could explain the H100's failures of
    2026-12-05: the EAGLE head's capture failed in cuBLAS in the three runs that collected the other EAGLE graph tests
    of test_gpu_engine.py, and passed in the five that ran it alone or in a pair (experiments/h100-2026-12-05)."""
    stream = stream or torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(warmups):
            fn()
    torch.cuda.current_stream().wait_stream(stream)
    g = torch.cuda.CUDAGraph()
    with _gc_off(), torch.cuda.graph(g, pool=pool, stream=stream):
        out = fn()
    return g, out


def bucket_for(batch: int, buckets) -> int | None:
    """The smallest captured bucket that holds ``batch`` requests, or None (eager)."""
    return next((b for b in sorted(buckets) if b >= batch), None)


def _feature_buffer(r, rows: int, width: int | None) -> torch.Tensor | None:
    """A graph's static [rows, width] input of a draft head's features, in its weights' dtype (None: no features)."""
    if not width:
        return None
    return torch.zeros(rows, width, dtype=next(r.model.parameters()).dtype, device=r.device)


@dataclass
class _Graph:
    graph: torch.cuda.CUDAGraph
    ids: torch.Tensor  # [bs * q_len] int64
    positions: torch.Tensor  # [bs * q_len] int64
    slots: torch.Tensor  # [bs * q_len] int64
    logits: torch.Tensor | None  # [bs * q_len, vocab] fp32; None in a multi-step graph (tokens only)
    # [bs * q_len] int64 the argmax of each logits row, inside the graph ([n, bs]: n steps); None when the runner's
    # graph_argmax was off at capture (bench.e2e's legacy host path)
    tokens: torch.Tensor | None
    features: torch.Tensor | None = None  # [bs * q_len, F] a draft head's per-token input
    aux: torch.Tensor | None = None  # [bs * q_len, F'] the captured layers / the head's pre-norm output
    # a device-planned multi-step graph's int32 input (runner.prepare_device_steps' layout, indices sized for
    # every page): its positions, slots and the backend's KV lengths are computed from it inside the graph
    meta: torch.Tensor | None = None
    # what the graph's kernels read but nothing else holds: a device-planned graph's step plans (their
    # o_part / lse_part scratch and qo_indptr), replaced in the backend's slots by the next bucket's capture
    keep: tuple = ()
    outputs: tuple = ()  # a tree-draft graph's outputs (attnlab.spec.tree_device.tree_draft_body)


class GraphCache:
    def __init__(self, runner):
        self.runner = runner
        self.graphs: dict[tuple, _Graph] = {}  # (bs, q_len, slot, capture_layers, masked, variant) -> graph
        self.buckets: tuple[int, ...] = ()
        self.q_lens: tuple[int, ...] = ()  # of causal passes
        self.mask_q_lens: tuple[int, ...] = ()  # of tree passes
        self.pool = None
        self.stream = None  # the capture stream (record), made at the first capture
        self.tree_accept: dict[tuple, object] = {}  # (topk, num_steps, T) -> spec.tree_accept_graph.AcceptGraphs
        self.step_replays = {"steps": 0, "dsteps": 0, "dtree": 0}  # multi-step graph replays: host- / device-planned, trees

    def q_lens_for(self, masked: bool) -> tuple[int, ...]:
        return self.mask_q_lens if masked else self.q_lens

    def has(self, bs: int, q_len: int, slot: int, features: torch.Tensor | None = None, masked: bool = False,
            variant=None) -> bool:
        """A graph for this key (``variant``: of the slot's plan) exists and takes the same kind of features (none,
        or the same width)."""
        g = self.graphs.get((bs, q_len, slot, self.runner.capture_layers, masked, variant))
        if g is None:
            return False
        if g.features is None or features is None:
            return g.features is None and features is None
        return g.features.shape[1] == features.shape[1]

    def capture(self, buckets, q_lens, slots, feature_dim: int | None = None, masked: bool = False) -> int:
        """Capture every (bucket, q_len, slot) not captured yet; returns how many were added."""
        gc.collect()  # once a batch of captures (record_graph keeps the collector off inside each)
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
                    for variant in r.backend.graph_variants(q, masked, bs, slot):
                        if (bs, q, slot, r.capture_layers, masked, variant) not in self.graphs:
                            self._capture_one(r, bs, q, slot, feature_dim, masked, variant)
        return len(self.graphs) - before

    def record(self, fn):
        """Run ``fn`` twice, then capture one call into a graph of this cache's pool, on this cache's capture stream
        (``record_graph``): -> (the graph, what the captured call returned, i.e. the graph's output buffers)."""
        if self.stream is None:
            self.stream = torch.cuda.Stream(device=self.runner.device)
        with torch.inference_mode():
            return record_graph(fn, self.pool, self.stream)

    def _capture_one(self, r, bs: int, q: int, slot: int, feature_dim: int | None, masked: bool = False,
                     variant=None) -> None:
        from attnlab.backends.base import Mode

        # a tree pass is captured over a masked plan (the dummies' own blocks, all True): the backend's static
        # mask buffers, which every later plan and update_mask of this key rewrite in place
        mask = torch.ones(0, dtype=torch.bool, device=r.device) if masked else None
        dummy = r.prepare([], [], [], Mode.DECODE if q == 1 and not masked else Mode.VERIFY, pad_to=bs,
                          pad_q_len=q, custom_mask=mask)
        with r.backend.forcing(variant):
            r.plan_slot(dummy, slot)
        got = r.backend.slot_variant(slot)
        if got != variant:
            raise RuntimeError(f"{r.name}: a capture forced plan variant {variant!r}, {r.backend.name} planned {got!r}")
        n = bs * q
        ids = torch.zeros(n, dtype=torch.long, device=r.device)
        positions, slots = dummy.positions.clone(), dummy.slots.clone()
        features = _feature_buffer(r, n, feature_dim)
        extra = {} if features is None else {"features": features}

        from attnlab.kernels import argmax

        def forward():
            # The context is built inside the capture: its store index is derived from the static ``slots``
            # buffer by a captured kernel, so a replay with new slots stores where they say.
            ctx = r.context(slots)
            logits = r.logits(r.model(ids, positions, ctx, **extra))
            return logits, ctx.captured, argmax.greedy(logits) if r.graph_argmax else None

        g, (logits, aux, tokens) = self.record(forward)
        self.graphs[(bs, q, slot, r.capture_layers, masked, variant)] = _Graph(g, ids, positions, slots, logits,
                                                                                 tokens, features, aux)

    def _steps_key(self, bs: int, n: int, feature_dim: int | None, device: bool = False) -> tuple:
        return bs, 1, ("dsteps" if device else "steps", n, feature_dim or 0), self.runner.capture_layers

    def has_steps(self, bs: int, n: int, feature_dim: int | None = None, device: bool = False) -> bool:
        """Whether the n-step graph of bucket ``bs`` is captured: the device-planned one (``device``) or the
        host-planned one."""
        return self._steps_key(bs, n, feature_dim, device) in self.graphs

    def capture_steps(self, buckets, n: int, feature_dim: int | None = None) -> int:
        """Capture the n-step greedy graph (engine/multistep.py) of every bucket not captured yet; with
        ``feature_dim``, a draft head's (its first step reads a [bs, feature_dim] feature buffer)."""
        gc.collect()  # once a batch of captures, as capture
        before = len(self.graphs)
        self.pool = self.pool or torch.cuda.graph_pool_handle()
        r = self.runner
        device = r.backend.supports_device_steps()
        for bs in sorted(set(buckets), reverse=True):
            if device and not self.has_steps(bs, n, feature_dim, device=True):
                self._capture_device_steps(r, bs, n, feature_dim)
            # the host-planned graph, for a backend without device steps or for the launches they do not fit
            if (not device or not r.backend.DEVICE_STEPS_ALWAYS_FIT) and not self.has_steps(bs, n, feature_dim):
                self._capture_steps(r, bs, n, feature_dim)
        return len(self.graphs) - before

    def _capture_steps(self, r, bs: int, n: int, feature_dim: int | None = None) -> None:
        from attnlab.backends.base import Mode
        from attnlab.engine.multistep import greedy_steps

        dummies = [r.prepare([], [], [], Mode.DECODE, pad_to=bs, pad_q_len=1) for _ in range(n)]
        r.plan_steps(dummies)
        ids = torch.zeros(bs, dtype=torch.long, device=r.device)
        positions = torch.stack([d.positions for d in dummies])  # [n, bs]
        slots = torch.stack([d.slots for d in dummies])
        features = _feature_buffer(r, bs, feature_dim)
        g, tokens = self.record(lambda: greedy_steps(r, ids, positions, slots, features))
        # logits are not kept: a multi-step pass returns tokens only (greedy)
        self.graphs[self._steps_key(bs, n, feature_dim)] = _Graph(g, ids, positions, slots, None, tokens, features)

    def _capture_device_steps(self, r, bs: int, n: int, feature_dim: int | None) -> None:
        """The n-step graph of a backend that plans steps on the device: the graph reads one int32 buffer (all
        rows dummies at capture: the scratch page, inc 0) and computes every step's metadata itself."""
        from attnlab.engine.multistep import (
            device_step_lens,
            device_step_meta,
            device_step_views,
            dummy_device_steps_meta,
            greedy_steps,
        )

        cap = r.pool.num_pages + bs  # page ids of any layout: every page, and a scratch page per dummy
        meta = dummy_device_steps_meta(bs, cap, r.pool.num_pages, r.device)
        kv_lens = device_step_lens(n, bs, r.device)
        views = device_step_views(meta, bs)
        plans = r.backend.device_step_plans(bs, n, *views, kv_lens)
        r.backend.device_steps_host_plan(bs, list(range(bs + 1)), [1] * bs, *views)
        ids = torch.zeros(bs, dtype=torch.long, device=r.device)
        features = _feature_buffer(r, bs, feature_dim)
        ps = r.allocator.page_size

        def body():
            positions, slots = device_step_meta(meta, bs, n, ps, kv_lens)
            return positions, slots, greedy_steps(r, ids, positions, slots, features)

        g, (positions, slots, tokens) = self.record(body)
        # the plans (and kv_lens, which only their rows view) live as long as the graph: the next bucket's
        # capture replaces them in the slots, and freed scratch would be reused under the graph's kernels
        self.graphs[self._steps_key(bs, n, feature_dim, device=True)] = _Graph(
            g, ids, positions, slots, None, tokens, features, meta=meta, keep=(tuple(plans), kv_lens))

    def replay_device_steps(self, bs: int, n: int, meta: torch.Tensor, last: torch.Tensor,
                            features: torch.Tensor | None = None) -> torch.Tensor:
        """Replay a device-planned n-step graph on one staged buffer (runner.prepare_device_steps, pad_to=bs);
        -> tokens [n, bs] (a view of the graph's output buffer)."""
        g = self.graphs[self._steps_key(bs, n, None if features is None else features.shape[1], device=True)]
        if meta.numel() > g.meta.numel():
            raise RuntimeError(f"device steps: {meta.numel()} metadata entries, the graph holds {g.meta.numel()}")
        g.ids[: last.shape[0]].copy_(last)
        if features is not None:
            g.features[: features.shape[0]].copy_(features)
        g.meta[: meta.numel()].copy_(meta)
        g.graph.replay()
        self.step_replays["dsteps"] += 1
        return g.tokens

    def replay_steps(self, bs: int, n: int, passes, last: torch.Tensor,
                     features: torch.Tensor | None = None) -> torch.Tensor:
        """Replay the n-step graph for n prepared, planned single-token passes; -> tokens [n, bs] (a view of
        the graph's output buffer). ``features`` [B, F]: a draft head's first-step features."""
        g = self.graphs[self._steps_key(bs, n, None if features is None else features.shape[1])]
        g.ids[: last.shape[0]].copy_(last)
        if features is not None:
            g.features[: features.shape[0]].copy_(features)
        torch.stack([p.positions for p in passes], out=g.positions)
        torch.stack([p.slots for p in passes], out=g.slots)
        g.graph.replay()
        self.step_replays["steps"] += 1
        return g.tokens

    def _tree_key(self, bs: int, shape, feature_dim: int | None) -> tuple:
        return bs, shape.topk, ("dtree", shape.num_steps, shape.num_draft_tokens, feature_dim or 0), \
            self.runner.capture_layers

    def has_tree_steps(self, bs: int, shape, feature_dim: int | None = None) -> bool:
        """Whether the device-planned tree draft graph of bucket ``bs`` and this tree shape is captured."""
        return self._tree_key(bs, shape, feature_dim) in self.graphs

    def capture_tree_steps(self, buckets, shape, feature_dim: int | None = None) -> int:
        """Capture the device-planned tree draft (attnlab.spec.tree_device: a greedy draft's S - 1 frontier
        passes, expansions and select_tree in one graph) of every bucket not captured yet; ``feature_dim``: an
        EAGLE head's feature width (None: a plain drafter)."""
        gc.collect()  # once a batch of captures, as capture
        before = len(self.graphs)
        self.buckets = tuple(sorted(set(self.buckets) | set(buckets)))
        self.pool = self.pool or torch.cuda.graph_pool_handle()
        for bs in sorted(set(buckets), reverse=True):
            if not self.has_tree_steps(bs, shape, feature_dim):
                self._capture_tree_steps(self.runner, bs, shape, feature_dim)
        return len(self.graphs) - before

    def _capture_tree_steps(self, r, bs: int, shape, feature_dim: int | None) -> None:
        from attnlab.spec.tree_device import (
            TreeStepBuffers,
            dummy_tree_steps_meta,
            meta_views,
            tree_draft_body,
        )

        K, S, N = shape.topk, shape.num_steps, shape.num_draft_tokens
        meta = dummy_tree_steps_meta(bs, K, S, r.allocator.page_size, r.pool.num_pages, r.pool.num_pages, r.device)
        bufs = TreeStepBuffers.empty(bs, K, S - 1, r.max_context, r.device)  # a pass's KV never exceeds it
        *_, indptr, indices = meta_views(meta, bs)
        plans = r.backend.device_tree_plans(bs, K, S - 1, indptr, indices, bufs)
        root_logits = torch.zeros(bs, r.model_config.vocab_size, dtype=torch.float32, device=r.device)
        last = torch.zeros(bs, dtype=torch.long, device=r.device)
        features = _feature_buffer(r, bs, feature_dim)
        g, outputs = self.record(lambda: tree_draft_body(r, meta, bs, K, S, N, root_logits, last, features, bufs))
        empty = last[:0]  # inputs: ids = the root tokens, logits = the root's draft logits; outputs: ``outputs``
        self.graphs[self._tree_key(bs, shape, feature_dim)] = _Graph(
            g, last, empty, empty, root_logits, None, features, meta=meta, keep=(tuple(plans), bufs),
            outputs=outputs)

    def replay_tree_steps(self, bs: int, shape, meta: torch.Tensor, root_logits: torch.Tensor, last: torch.Tensor,
                          features: torch.Tensor | None = None) -> tuple:
        """Replay the tree draft graph on one staged buffer (tree_device.stage_tree_steps, pad_to=bs); -> the
        DraftTree tensors over all bs rows (views of the graph's outputs, in the runner's shared graph pool: read
        them before any other replay on this runner)."""
        g = self.graphs[self._tree_key(bs, shape, None if features is None else features.shape[1])]
        if meta.numel() > g.meta.numel():
            raise RuntimeError(f"tree steps: {meta.numel()} metadata entries, the graph holds {g.meta.numel()}")
        b = last.shape[0]
        g.ids[:b].copy_(last)
        g.logits[:b].copy_(root_logits)
        if features is not None:
            g.features[:b].copy_(features)
        g.meta[: meta.numel()].copy_(meta)
        g.graph.replay()
        self.step_replays["dtree"] += 1
        return g.outputs

    def replay(self, bs: int, q: int, slot: int, p, input_ids: torch.Tensor,
               features: torch.Tensor | None = None, masked: bool = False, variant=None):
        """Copy the pass's inputs into the graph's buffers and replay the graph of the slot plan's ``variant``;
        returns ([bs * q, vocab] logits, [bs * q, F'] aux or None, [bs * q] argmax tokens), views of the graph's
        output buffers: consume them before the next replay of the same graph."""
        g = self.graphs[(bs, q, slot, self.runner.capture_layers, masked, variant)]
        g.ids[: input_ids.shape[0]].copy_(input_ids)
        if features is not None:
            g.features[: features.shape[0]].copy_(features)
        g.positions.copy_(p.positions)
        g.slots.copy_(p.slots)
        g.graph.replay()
        return g.logits, g.aux, g.tokens
