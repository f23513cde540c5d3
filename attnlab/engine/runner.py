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
from attnlab.errors import PromptTooLong
from attnlab.kvcache import KVPool, PageAllocator, build_layout, slot_mapping


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


class ModelRunner:
    def __init__(self, model: torch.nn.Module, model_config, tokenizer, pool: KVPool, allocator: PageAllocator,
                 backend: AttentionBackend, max_context: int, name: str = "target"):
        self.model = model
        self.model_config = model_config
        self.tokenizer = tokenizer
        self.pool = pool
        self.allocator = allocator
        self.backend = backend
        self.max_context = max_context
        self.name = name
        self.device = pool.device

    def kv_len(self, req: Hashable) -> int:
        return self.allocator.lengths.get(req, 0)

    def prepare(self, reqs: Sequence[Hashable], starts: Sequence[int], q_lens: Sequence[int], mode: Mode,
                custom_mask: torch.Tensor | None = None) -> Pass:
        """Allocate pages so request i holds ``starts[i] + q_lens[i]`` tokens and build the pass's metadata.

        Positions ``starts[i] .. starts[i] + q_lens[i] - 1`` get new K/V; earlier positions must already be
        in the pool. Allocation only grows a request (a multi-step draft prepares all steps up front).
        """
        ps = self.allocator.page_size
        ends = [s + q for s, q in zip(starts, q_lens)]
        for r, e in zip(reqs, ends):
            if e > self.max_context:
                raise PromptTooLong(f"{self.name}: request {r!r} needs {e} tokens of context, "
                                    f"max context is {self.max_context}")
            if e > self.kv_len(r):
                self.allocator.allocate(r, e)
        tables = [self.allocator.page_tables[r] for r in reqs]
        slots: list[int] = []
        positions: list[int] = []
        last_rows: list[int] = []
        for table, s, e in zip(tables, starts, ends):
            slots += slot_mapping(table, s, e, ps)
            positions += range(s, e)
            last_rows.append(len(positions) - 1 if e > s else -1)
        qo = [0]
        for q in q_lens:
            qo.append(qo[-1] + q)
        dev = self.device
        t = lambda x, dt=torch.int64: torch.tensor(x, dtype=dt).to(dev, non_blocking=True)
        meta = AttnMeta(mode=mode, qo_indptr=t(qo, torch.int32), layout=build_layout(tables, ends, ps, dev),
                        q_lens=list(q_lens), kv_lens_host=ends, page_size=ps, custom_mask=custom_mask)
        return Pass(list(reqs), meta, t(slots), t(positions), t(last_rows))

    def plan(self, p: Pass) -> None:
        self.backend.plan(p.meta)

    @torch.inference_mode()
    def forward(self, p: Pass, input_ids: torch.Tensor, rows: torch.Tensor | None = None) -> torch.Tensor:
        """input_ids: [T] int64 on device -> fp32 logits [len(rows) or T, vocab] (uses the active plan)."""
        ctx = AttnContext(self.backend, self.pool, p.slots)
        hidden = self.model(input_ids, p.positions, ctx)
        if rows is not None:
            hidden = hidden[rows]
        return self.model.compute_logits(hidden)

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
