"""Test helper: run a Decoder over a paged KV pool with the torch reference backend, request by request."""

from __future__ import annotations

import torch

from attnlab.backends.base import AttnMeta, Mode
from attnlab.backends.context import AttnContext
from attnlab.backends.torch_ref import TorchBackend
from attnlab.kvcache import KVPool, PageAllocator, build_layout, slot_mapping


class PagedRunner:
    """Holds one pool + allocator; ``step`` appends new tokens to each request and returns their logits."""

    def __init__(self, model, cfg, page_size: int, num_pages: int, dtype=torch.float32):
        self.model, self.page_size = model, page_size
        self.pool = KVPool(cfg.num_layers, num_pages, page_size, cfg.num_kv_heads, cfg.head_dim, dtype, "cpu")
        self.alloc = PageAllocator(num_pages, page_size)
        self.backend = TorchBackend(self.pool, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim,
                                    cfg.head_dim ** -0.5, dtype)

    @torch.no_grad()
    def step(self, new_tokens: list[list[int]], mode: Mode) -> list[torch.Tensor]:
        """new_tokens[i]: tokens appended to request i -> logits [len, vocab] fp32 per request."""
        ids, pos, slots, qo, kv_lens = [], [], [], [0], []
        for req, toks in enumerate(new_tokens):
            start = self.alloc.lengths.get(req, 0)
            self.alloc.allocate(req, start + len(toks))
            ids += toks
            pos += range(start, start + len(toks))
            slots += slot_mapping(self.alloc.page_tables[req], start, start + len(toks), self.page_size)
            qo.append(qo[-1] + len(toks))
            kv_lens.append(start + len(toks))
        layout = build_layout([self.alloc.page_tables[r] for r in range(len(new_tokens))], kv_lens,
                              self.page_size)
        meta = AttnMeta(mode=mode, qo_indptr=torch.tensor(qo, dtype=torch.int32), layout=layout,
                        q_lens=[len(t) for t in new_tokens], kv_lens_host=kv_lens, page_size=self.page_size)
        self.backend.plan(meta)
        ctx = AttnContext(self.backend, self.pool, torch.tensor(slots, dtype=torch.long))
        hidden = self.model(torch.tensor(ids), torch.tensor(pos), ctx)
        logits = self.model.compute_logits(hidden)
        return list(logits.split([len(t) for t in new_tokens]))
