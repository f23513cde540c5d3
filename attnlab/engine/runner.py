"""One model side: weights + KV pool + page allocator + attention backend.

The runner turns "these requests get these new tokens at these positions" into a planned forward pass.
Host work (page allocation, index tensors, the backend's plan) happens in ``prepare``/``plan``; ``forward``
only launches device work, so a draft loop over prepared passes never syncs.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from dataclasses import dataclass

import torch

from attnlab.backends.base import AttentionBackend, AttnMeta, Mode
from attnlab.backends.context import AttnContext
from attnlab.engine.staging import HostStaging
from attnlab.errors import PromptTooLong
from attnlab.kvcache import KVPool, PageAllocator, PagedLayout, pages_needed, slot_mapping
from attnlab.kvcache.layout import layout_lists
from attnlab.models.fp8 import FP8Linear


@dataclass
class Pass:
    """A prepared forward pass. Tensors live on the runner's device.

    slots: [T] int64 pool slots of the new tokens; positions: [T] int64;
    last_rows: [B] int64 row of each request's last new token (-1 for q_len 0).
    """

    reqs: list[Hashable]
    meta: AttnMeta
    slots: torch.Tensor
    positions: torch.Tensor
    last_rows: torch.Tensor
    q_len: int | None = None  # uniform q_len per request (graph-eligible), else None
    padded_to: int | None = None  # batch size after padding with dummy requests (CUDA-graph bucket)
    graphable: bool = False  # a pass graphs hold (padded, or past the largest bucket): counted if it runs eager


class ModelRunner:
    def __init__(self, model: torch.nn.Module, model_config, tokenizer, pool: KVPool, allocator: PageAllocator,
                 backend: AttentionBackend, max_context: int, name: str = "target", max_batch: int = 1,
                 fused_ops: bool = False, invariant: bool = False):
        self.model = model
        self.model_config = model_config
        self.tokenizer = tokenizer
        self.pool = pool
        self.allocator = allocator
        self.backend = backend
        self.max_context = max_context
        self.max_batch = max_batch
        self.name = name
        self.device = pool.device
        self.graphs = None  # GraphCache once capture_graphs() ran
        self._slot = 0  # plan slot of the active plan: 0 = plan(), j + 1 = use_step(j)
        # Graph-eligible passes (decode / verify / extend of one q_len that graphs capture): how many replayed a
        # graph, and the keys (bucket, q_len, slot, plan variant) of those that ran eager, no graph captured for
        # them (bucket ">N": more requests than the largest bucket), with their counts. A timed run in graph mode
        # reads them (measure.graph_metrics): a silent eager pass would time something else.
        self.graph_replays = 0
        self.graph_misses: dict[tuple, int] = {}
        # engine.fused_ops for this side: its layers run attnlab.kernels.fused and the KV store joins them.
        # A side property, not the weights': a parity reference sharing the model still runs unfused.
        self.fused_ops = fused_ops
        # engine.invariant for this side (the target): fused, an invariant backend, GEMMs and the LM head through
        # attnlab.models.linear.invariant_linear; a row's logits do not depend on q_len, batch or padding.
        self.invariant = invariant
        # Layers whose output stream every forward also returns in ``aux`` (an EAGLE drafter's features);
        # None = capture nothing. Set before capture_graphs: graphs hold what was set when captured.
        self.capture_layers: tuple[int, ...] | None = None
        # [T, F] the last forward's auxiliary output, T = its unpadded token count: the captured target
        # features, or a draft head's pre-norm output; None when the model left none. A view of a graph's
        # static buffer after a replay: read it before the next replay of that graph.
        self.aux: torch.Tensor | None = None
        # engine.decode_steps_per_sync: greedy target-only decode runs this many steps per launch and host
        # sync (engine/multistep.py); capture_graphs also captures that multi-step graph when > 1.
        self.decode_steps_per_sync = 1
        # Graphs captured while True compute the argmax of their logits (forward_greedy reads it); False: the
        # previous path, an argmax launched after the replay (bench.e2e's "legacy" host path).
        self.graph_argmax = True
        # Every pass's int metadata goes to the device in one pinned copy (engine/staging.py).
        self.staging = HostStaging(self.device)
        # A gemm-path side's RoPE cos / sin over every position it can reach (allocate keeps each pass below
        # max_context), built once, before any graph captures them: the qkv epilogue indexes them by position
        # (AttnContext.rope_table, Decoder.rope_tables). None elsewhere.
        tables = getattr(model, "rope_tables", None)
        self.rope_table = tables(max_context) if fused_ops in ("gemm", "gemm_attn") and tables is not None else None

    def context(self, slots: torch.Tensor) -> AttnContext:
        """The attention context of one pass of this side writing its new K / V to ``slots``."""
        return AttnContext(self.backend, self.pool, slots, fused_ops=self.fused_ops, invariant=self.invariant,
                           capture=self.capture_layers, rope_table=self.rope_table)

    def kv_len(self, req: Hashable) -> int:
        return self.allocator.lengths.get(req, 0)

    def prepare(self, reqs: Sequence[Hashable], starts: Sequence[int], q_lens: Sequence[int], mode: Mode,
                custom_mask: torch.Tensor | None = None, pad_to: int | None = None,
                pad_q_len: int | None = None, positions: torch.Tensor | None = None) -> Pass:
        """Allocate pages so request i holds ``starts[i] + q_lens[i]`` tokens and build the pass's metadata.

        Positions ``starts[i] .. starts[i] + q_lens[i] - 1`` get new K/V; earlier positions must already be
        in the pool. Allocation only grows a request (a multi-step draft prepares all steps up front).
        ``positions``: [sum(q_lens)] int64 on the device, the new tokens' RoPE positions when they are not their
        KV positions (a tree pass: root_pos + depth); None = the KV positions. ``custom_mask``: the flat tree
        mask (AttnMeta); a padded pass (CUDA-graph bucket) appends each dummy's own block (all True).
        """
        segments, finish = self._host_pass(reqs, starts, q_lens, mode, custom_mask, pad_to, pad_q_len, positions)
        return finish(self.staging.stage(segments))

    def prepare_steps(self, reqs: Sequence[Hashable], starts: Sequence[int], n: int) -> list[Pass]:
        """``n`` single-token decode passes, step j feeding position ``starts[i] + j`` of request i (a multi-step
        draft, a multi-step decode): ``prepare`` each, their metadata staged together in one copy."""
        if n < 1:
            return []
        parts = [self._host_pass(reqs, [s + j for s in starts], [1] * len(reqs), Mode.DECODE)
                 for j in range(n)]
        views = self.staging.stage([seg for segments, _ in parts for seg in segments])
        m = len(views) // n
        return [finish(views[j * m:(j + 1) * m]) for j, (_, finish) in enumerate(parts)]

    def prepare_device_steps(self, reqs: Sequence[Hashable], starts: Sequence[int], n: int,
                             pad_to: int | None = None) -> tuple[torch.Tensor, int]:
        """The host half of ``n`` device-planned single-token steps (engine/multistep.py): pages for positions
        ``starts[i] .. starts[i] + n - 1`` of request i, and one staged int32 buffer ``[pos0 | inc | lens0 |
        kv_indptr | kv_indices]`` over ``rows = pad_to or len(reqs)`` rows (dummies: the scratch page, inc 0), the
        layout covering each request's last step. Returns (that device buffer, rows); the steps' positions, slots
        and KV lengths are computed from it on the device (``multistep.device_step_meta``; every section
        16-byte aligned, ``multistep.device_steps_layout``)."""
        from attnlab.engine.multistep import device_step_views, device_steps_values

        ends = [s + n for s in starts]
        tables = self.allocate(reqs, ends)
        rows = pad_to or len(reqs)
        pad = rows - len(reqs)
        indptr, indices, _ = layout_lists(tables + [[self.pool.num_pages]] * pad, ends + [1] * pad,
                                          self.allocator.page_size)
        values = device_steps_values(list(starts), indptr, indices, rows)
        meta = self.staging.stage([(values, torch.int32)])[0]
        # a backend whose step plans need host values (flashinfer) plans the launch once, here
        self.backend.device_steps_host_plan(rows, indptr, [s + 1 for s in starts] + [1] * pad,
                                            *device_step_views(meta, rows))
        return meta, rows

    def allocate(self, reqs, ends) -> list[list[int]]:
        """Grow request i to ``ends[i]`` tokens (allocation only grows); -> their page tables."""
        for r, e in zip(reqs, ends):
            if e > self.max_context:
                raise PromptTooLong(f"{self.name}: request {r!r} needs {e} tokens of context, "
                                    f"max context is {self.max_context}")
            if e > self.kv_len(r):
                self.allocator.allocate(r, e)
        return [self.allocator.page_tables[r] for r in reqs]

    def _host_pass(self, reqs, starts, q_lens, mode, custom_mask=None, pad_to=None, pad_q_len=None,
                   rope_pos: torch.Tensor | None = None):
        """The host half of ``prepare``: allocation and the int lists -> (segments to stage, a function of
        their device views that builds the Pass)."""
        ps = self.allocator.page_size
        ends = [s + q for s, q in zip(starts, q_lens)]
        tables = self.allocate(reqs, ends)
        slots: list[int] = []
        positions: list[int] = []
        last_rows: list[int] = []
        for table, s, e in zip(tables, starts, ends):
            slots += slot_mapping(table, s, e, ps)
            positions += range(s, e)
            last_rows.append(len(positions) - 1 if e > s else -1)
        masked = custom_mask is not None
        uniform = q_lens[0] if q_lens and len(set(q_lens)) == 1 else pad_q_len
        padded = None
        # A prefill is never padded into a graph bucket: graphs hold decode / verify / extend passes, and a
        # backend plans a prefill as one (flashinfer: its plain prefill wrapper), so a one-token prompt that
        # replayed the decode graph ran on that graph's stale plan (wrong first tokens, H200, 2026-12-01).
        eligible = (self.graphs is not None and uniform is not None and mode != Mode.PREFILL
                    and uniform in self.graphs.q_lens_for(masked))
        if pad_to is None and eligible:
            from attnlab.engine.graphs import bucket_for

            pad_to = bucket_for(len(reqs), self.graphs.buckets)
        if pad_to is not None and pad_to >= len(reqs) and uniform:
            # Dummy requests up to the graph bucket: q_len as the others, KV = their own tokens in the
            # scratch page (slot -1 writes nothing real, reads stay finite); outputs are ignored.
            n_pad = pad_to - len(reqs)
            q_lens, ends = list(q_lens) + [uniform] * n_pad, ends + [uniform] * n_pad
            scratch = [self.pool.num_pages] * pages_needed(uniform, ps)
            tables = tables + [scratch] * n_pad
            slots += [-1] * (uniform * n_pad)
            positions += list(range(uniform)) * n_pad
            if masked:
                custom_mask = torch.cat([custom_mask, custom_mask.new_ones(n_pad * uniform * uniform)])
            if rope_pos is not None:
                pad_pos = torch.tensor(list(range(uniform)) * n_pad, dtype=torch.int64)
                rope_pos = torch.cat([rope_pos, pad_pos.to(rope_pos.device, non_blocking=True)])
            padded = pad_to
        qo = [0]
        for q in q_lens:
            qo.append(qo[-1] + q)
        # Staged in one packed host buffer and one non-blocking copy: the Pass's tensors are views of one
        # device buffer (engine/staging.py).
        indptr, indices, last = layout_lists(tables, ends, ps)
        i32, i64 = torch.int32, torch.int64
        segments = [(slots, i64), (positions, i64), (last_rows, i64), (qo, i32), (indptr, i32), (indices, i32),
                    (last, i32), (ends, i32)]

        def finish(views: list[torch.Tensor]) -> Pass:
            slots_t, pos_t, last_t, qo_t, kv_indptr, kv_indices, kv_last, kv_lens = views
            meta = AttnMeta(mode=mode, qo_indptr=qo_t, layout=PagedLayout(kv_indptr, kv_indices, kv_last, kv_lens),
                            q_lens=list(q_lens), kv_lens_host=ends, page_size=ps, custom_mask=custom_mask)
            # a tree pass's RoPE positions (root + depth) come as a device tensor; the staged ones are KV positions
            return Pass(list(reqs), meta, slots_t, pos_t if rope_pos is None else rope_pos, last_t, uniform, padded,
                        eligible or padded is not None)

        return segments, finish

    def plan(self, p: Pass) -> None:
        self.backend.plan(p.meta)
        self._slot = 0

    def plan_slot(self, p: Pass, slot: int) -> None:
        """Plan ``p`` into a given slot (0 = the per-pass plan, j + 1 = draft step j) and make it active."""
        self.backend.plan_slot(p.meta, slot)
        self._slot = slot

    def plan_steps(self, passes: Sequence[Pass]) -> None:
        """Plan the k - 1 single-token draft steps before the draft loop (slots 1..)."""
        self.backend.plan_steps([p.meta for p in passes])

    def use_step(self, j: int) -> None:
        self.backend.use_step(j)
        self._slot = j + 1

    def update_mask(self, p: Pass, custom_mask: torch.Tensor) -> None:
        """New values for the active plan's tree mask (``p`` is that pass; ``custom_mask`` its flat layout,
        dummies included): device work only (AttentionBackend.update_mask)."""
        if p.meta.custom_mask is None or custom_mask.numel() != p.meta.custom_mask.numel():
            raise ValueError(f"{self.name}: update_mask needs a tree pass and a mask of its length")
        self.backend.update_mask(custom_mask)

    @torch.inference_mode()
    def forward(self, p: Pass, input_ids: torch.Tensor, rows: torch.Tensor | None = None,
                features: torch.Tensor | None = None) -> torch.Tensor:
        """input_ids: [T] int64 on device -> fp32 logits [len(rows) or T, vocab] (uses the active plan).

        features: [T, F] per-token inputs of a draft head (EAGLE); None for a plain decoder. After the call,
        ``self.aux`` holds the pass's auxiliary output for all T tokens (see __init__)."""
        return self._forward(p, input_ids, rows, features)[0]

    @torch.inference_mode()
    def forward_greedy(self, p: Pass, input_ids: torch.Tensor, rows: torch.Tensor | None = None,
                       features: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """``forward`` plus the argmax of every returned logits row: (logits [R, vocab] fp32, tokens [R] int64).
        Under a CUDA graph the argmax is part of the graph (no launch after the replay)."""
        from attnlab.kernels import argmax

        logits, tokens = self._forward(p, input_ids, rows, features)
        return logits, tokens if tokens is not None else argmax.greedy(logits)

    def _forward(self, p: Pass, input_ids: torch.Tensor, rows, features):
        """-> (logits, argmax tokens of those rows when a graph computed them, else None)."""
        g = self.graphs
        n = input_ids.shape[0]
        masked = p.meta.custom_mask is not None
        variant = self.backend.slot_variant(self._slot) if g is not None else None
        if g is not None and p.padded_to is not None and g.has(p.padded_to, p.q_len, self._slot, features, masked,
                                                               variant):
            logits, aux, tokens = g.replay(p.padded_to, p.q_len, self._slot, p, input_ids, features, masked, variant)
            self.graph_replays += 1
            self.aux = aux[:n] if aux is not None else None
            if tokens is None:
                return logits[rows] if rows is not None else logits[:n], None
            return (logits[rows], tokens[rows]) if rows is not None else (logits[:n], tokens[:n])
        if g is not None and p.graphable:  # ran eager: no graph of its key, or (not padded) past the largest bucket
            key = (p.padded_to or f">{max(g.buckets, default=0)}", p.q_len, self._slot, variant)
            self.graph_misses[key] = self.graph_misses.get(key, 0) + 1
        ctx = self.context(p.slots)
        if p.padded_to is not None and p.positions.shape[0] > n:  # padded, but no graph for this slot: eager
            pad = p.positions.shape[0] - n
            input_ids = torch.cat([input_ids, input_ids.new_zeros(pad)])
            if features is not None:
                features = torch.cat([features, features.new_zeros(pad, features.shape[1])])
        extra = {} if features is None else {"features": features}
        hidden = self.model(input_ids, p.positions, ctx, **extra)[:n]
        self.aux = ctx.captured[:n] if ctx.captured is not None else None
        if rows is not None:
            hidden = hidden[rows]
        return self.logits(hidden), None

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """The LM head (through invariant_linear on an invariant side; on attnlab's small-M GEMM on a gemm-path
        side, as its layers: the logits whose argmax ``greedy_tokens`` takes in one launch there)."""
        if self.invariant:
            return self.model.compute_logits(hidden, invariant=True)
        head = self._gemm_head(hidden)
        if head is not None:
            from attnlab.kernels import gemm

            return gemm.linear(hidden, head.weight, head.bias, w_scale=_scale(head), role="lm_head").float()
        return self.model.compute_logits(hidden)

    def _gemm_head(self, hidden: torch.Tensor):
        """The LM head module where this side runs it on attnlab's GEMM (engine.gemm=triton, <= 16 rows, a plain
        nn.Linear of the activation dtype or a weight-only FP8Linear (precision.fp8_lm_head): not a
        reduced-vocabulary head), else None."""
        if self.fused_ops != "gemm" or hidden.shape[0] > 16 or not hasattr(self.model, "compute_logits"):
            return None
        head = getattr(self.model, "lm_head", None)
        plain = type(head) is torch.nn.Linear and head.weight.dtype == hidden.dtype
        fp8 = isinstance(head, FP8Linear) and head.small_m == "weight_only"
        return head if plain or fp8 else None

    def greedy_tokens(self, hidden: torch.Tensor) -> torch.Tensor:
        """The argmax of ``logits(hidden)`` per row; a draft head with a reduced vocabulary takes it over its own
        logits (EagleHead.greedy_tokens: the same ids, without the [rows, vocab] -inf scatter); a gemm-path side
        (engine.gemm=triton), where ``gemm.argmax_head()`` is on (a bench arm's ``+lmargmax``; off by default: it did
        not pay on the H200), in one launch, the LM head's argmax epilogue (attnlab.kernels.gemm.argmax_linear)."""
        from attnlab.kernels import argmax

        head_argmax = getattr(self.model, "greedy_tokens", None)
        if head_argmax is not None and not self.invariant:
            return head_argmax(hidden)
        head = self._gemm_head(hidden)
        if head is not None:  # the LM head's argmax epilogue (when on): one launch, the argmax of ``logits`` there
            from attnlab.kernels import gemm

            if gemm.argmax_head():
                return gemm.argmax_linear(hidden, head.weight, head.bias, w_scale=_scale(head), role="lm_head")
            # the argmax of the model-dtype logits: their fp32 copy (``logits``) is exact and order-preserving,
            # so it has the same first maximum, and skipping it saves a launch a step
            return argmax.greedy(gemm.linear(hidden, head.weight, head.bias, w_scale=_scale(head), role="lm_head"))
        return argmax.greedy(self.logits(hidden))

    def capture_graphs(self, q_lens=(1,), num_slots: int = 1, buckets=None, keep: bool = False,
                       feature_dim: int | None = None, first_slot: int = 0, masked: bool = False,
                       multistep: int = 0) -> int:
        """Capture CUDA graphs for every bucket <= max batch, q_len and plan slot ``first_slot ..
        num_slots - 1``; ``keep`` adds to the graphs captured before; ``feature_dim``: the width of the
        per-token features a draft head reads in these passes (None: no features); ``masked``: graphs of tree
        passes (custom mask; the backend needs ``caps.cuda_graph_mask``); ``multistep`` n > 0: also the n-step
        greedy graph (engine/multistep.py, with ``feature_dim``: a draft head's). Returns how many were captured."""
        from attnlab.engine.graphs import GraphCache

        if self.device.type != "cuda":
            raise RuntimeError("CUDA graphs need a CUDA device")
        from attnlab.kernels import gemm

        # the ticket counters exist before any capture (attnlab.kernels.gemm.prepare): the gemm path's split-K
        # and every side's greedy argmax (attnlab.kernels.argmax)
        gemm.prepare(self.device)
        if buckets is None:
            buckets = self.default_buckets()
        if not (keep and self.graphs):
            self.graphs = GraphCache(self)
        if masked and not self.backend.capabilities().cuda_graph_mask:
            raise RuntimeError(f"{self.name}: backend {self.backend.name} cannot replay tree-masked passes "
                               f"from CUDA graphs")
        n = self.graphs.capture(buckets, q_lens, range(first_slot, num_slots), feature_dim, masked)
        if self.decode_steps_per_sync > 1 and 1 in q_lens and feature_dim is None and not masked:
            n += self.graphs.capture_steps(buckets, self.decode_steps_per_sync)
        if multistep > 0:
            n += self.graphs.capture_steps(buckets, multistep, feature_dim)
        return n

    def default_buckets(self) -> list[int]:
        """Every default graph bucket below max_batch, and the first one that holds it."""
        from attnlab.engine.graphs import DEFAULT_BUCKETS

        buckets = [b for b in DEFAULT_BUCKETS if b < self.max_batch]
        buckets.append(next((b for b in DEFAULT_BUCKETS if b >= self.max_batch), self.max_batch))
        return buckets

    def capture_tree_steps(self, shape, feature_dim: int | None = None) -> int:
        """The device-planned tree draft's graph (attnlab.spec.tree_device) for every default bucket, added to the
        graphs captured before; 0 when the backend plans no tree passes on the device."""
        from attnlab.engine.graphs import GraphCache
        from attnlab.kernels import gemm

        if self.device.type != "cuda":
            raise RuntimeError("CUDA graphs need a CUDA device")
        if not self.backend.supports_device_trees() or shape.num_steps < 2:
            return 0
        gemm.prepare(self.device)  # the tickets (split-K GEMMs, the rows argmax) before any capture
        self.graphs = self.graphs or GraphCache(self)
        return self.graphs.capture_tree_steps(self.graphs.buckets or self.default_buckets(), shape, feature_dim)

    def decode_greedy_steps(self, reqs, starts, last: torch.Tensor, n: int) -> torch.Tensor:
        """n greedy decode steps in one launch (see engine/multistep.py): -> tokens [B, n] int64."""
        from attnlab.engine.multistep import decode_steps

        return decode_steps(self, reqs, starts, last, n)

    def run(self, reqs, starts, q_lens, input_ids, mode: Mode, rows: str = "last") -> torch.Tensor:
        """prepare + plan + forward in one call. rows: "last" (one row per request) or "all"."""
        p = self.prepare(reqs, starts, q_lens, mode)
        self.plan(p)
        return self.forward(p, input_ids, p.last_rows if rows == "last" else None)

    def truncate(self, req: Hashable, new_len: int) -> None:
        self.allocator.truncate(req, new_len)

    def release(self, req: Hashable) -> None:
        if req in self.allocator.lengths:
            self.allocator.free(req)


def _scale(head) -> torch.Tensor | None:
    """An LM head's per-row fp8 scales (FP8Linear), or None (a 16-bit nn.Linear)."""
    return getattr(head, "weight_scale", None)
