"""The reference backend: gather each request's pages, attend in fp32 with an explicit mask.

It is the oracle every other backend is tested against; clarity beats speed here. CPU and GPU.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from attnlab.backends.base import AttentionBackend, AttnMeta, Capabilities


@dataclass
class _Plan:
    # one entry per request with q_len > 0: (q rows, token slots of its KV, mask [q_len, kv_len] bool)
    items: list[tuple[slice, torch.Tensor, torch.Tensor]]
    num_tokens: int


def causal_mask(q_len: int, kv_len: int, device=None) -> torch.Tensor:
    """[q_len, kv_len] bool: query j (the (kv_len - q_len + j)-th token) sees KV positions <= its own."""
    rows = torch.arange(q_len, device=device)[:, None] + (kv_len - q_len)
    return torch.arange(kv_len, device=device)[None, :] <= rows


def reference_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor,
                        scale: float) -> torch.Tensor:
    """q: [q_len, Hq, D]; k, v: [kv_len, Hkv, D]; mask [q_len, kv_len] bool -> [q_len, Hq, D] fp32.

    Rows whose mask is all False (no visible key) give zeros, not NaN.
    """
    group = q.shape[1] // k.shape[1]
    k = k.float().repeat_interleave(group, dim=1)
    v = v.float().repeat_interleave(group, dim=1)
    s = torch.einsum("qhd,khd->hqk", q.float(), k) * scale
    s = s.masked_fill(~mask[None], float("-inf"))
    p = torch.softmax(s, dim=-1).nan_to_num(0.0)
    return torch.einsum("hqk,khd->qhd", p, v)


class TorchBackend(AttentionBackend):
    name = "torch"

    @classmethod
    def capabilities(cls) -> Capabilities:
        return Capabilities(
            devices=frozenset({"cpu", "cuda"}),
            dtypes=frozenset({"fp32", "fp16", "bf16"}),
            kv_dtypes=frozenset({"fp32", "fp16", "bf16", "fp8_e4m3", "fp8_e5m2"}),
            head_dims=frozenset({32, 64, 80, 96, 128, 256}),
            page_sizes="any",
            custom_mask=True,
            cuda_graph=frozenset(),
            notes="fp32 reference: gathers pages per request; not graph-capturable (host-built plan)",
        )

    def make_plan(self, meta: AttnMeta, slot: int = 0) -> _Plan:
        ps = meta.page_size
        lay = meta.layout
        indptr = lay.kv_indptr.tolist()
        indices = lay.kv_indices.to(torch.long)
        items = []
        q_off = mask_off = 0
        for i, (q_len, kv_len) in enumerate(zip(meta.q_lens, meta.kv_lens_host)):
            if q_len:
                pages = indices[indptr[i]:indptr[i + 1]]
                slots = (pages[:, None] * ps + torch.arange(ps, device=pages.device)[None]).reshape(-1)[:kv_len]
                if meta.custom_mask is not None:
                    mask = meta.custom_mask[mask_off:mask_off + q_len * kv_len].view(q_len, kv_len).bool()
                else:
                    mask = causal_mask(q_len, kv_len, device=pages.device)
                items.append((slice(q_off, q_off + q_len), slots, mask))
            q_off += q_len
            mask_off += q_len * kv_len
        return _Plan(items, q_off)

    def run(self, q: torch.Tensor, layer: int) -> torch.Tensor:
        plan = self.active_plan
        pool = self.pool
        flat = pool.layer(layer).view(2, -1, pool.num_kv_heads, pool.head_dim)
        out = torch.zeros(q.shape, dtype=torch.float32, device=q.device)
        for rows, slots, mask in plan.items:
            k = flat[0, slots].float() * pool.k_scale
            v = flat[1, slots].float() * pool.v_scale
            out[rows] = reference_attention(q[rows], k, v, mask, self.scale)
        return out.to(q.dtype)


