"""The reference backend: gather each request's pages, attend in fp32 with an explicit mask.

It is the oracle every other backend is tested against; clarity beats speed here. CPU and GPU.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from attnlab.backends.base import AttentionBackend, AttnMeta, Capabilities


@dataclass
class _Plan:
    """Padded batch view of one pass (requests with q_len 0 dropped).

    rows:  [B, max_q] int64 query row of each (request, new token), -1 = padding
    slots: [B, max_kv] int64 pool slot of each (request, KV position), scratch slot = padding
    mask:  [B, max_q, max_kv] bool, True = attend
    mask_index: [B, max_q, max_kv] int64 position of each mask entry in the pass's flat custom mask (its length
        = padding, False), or None for a causal pass: ``update_mask`` re-gathers ``mask`` through it
    """

    rows: torch.Tensor
    slots: torch.Tensor
    mask: torch.Tensor
    num_tokens: int
    mask_index: torch.Tensor | None = None
    mask_len: int = 0  # entries of the flat custom mask the pass was planned with


# Above this many score elements (B * max_q * max_kv * heads) a pass is split into request groups.
_MAX_SCORES = 1 << 27


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

    def kernel_info(self) -> dict[str, str]:
        return {"all": "torch fp32 reference (gathered pages, explicit mask)"}

    def make_plan(self, meta: AttnMeta, slot: int = 0) -> list[_Plan]:
        ps = meta.page_size
        lay = meta.layout
        indptr = lay.kv_indptr.tolist()
        indices = lay.kv_indices.to(torch.long)
        dev = indices.device
        items = []  # (q_len, kv_len, first row, slots [kv_len], mask [q_len, kv_len])
        q_off = mask_off = 0
        for i, (q_len, kv_len) in enumerate(zip(meta.q_lens, meta.kv_lens_host)):
            if q_len:
                pages = indices[indptr[i]:indptr[i + 1]]
                slots = (pages[:, None] * ps + torch.arange(ps, device=dev)[None]).reshape(-1)[:kv_len]
                if meta.custom_mask is not None:  # where the block sits in the flat mask (update_mask)
                    mask = torch.arange(mask_off, mask_off + q_len * kv_len, device=dev).view(q_len, kv_len)
                else:
                    mask = causal_mask(q_len, kv_len, device=dev)
                items.append((q_len, kv_len, q_off, slots, mask))
            q_off += q_len
            mask_off += q_len * kv_len
        # Group requests so that no padded score tensor grows past _MAX_SCORES.
        groups, cur = [], []
        for it in items:
            trial = cur + [it]
            size = len(trial) * max(x[0] for x in trial) * max(x[1] for x in trial) * self.num_q_heads
            if cur and size > _MAX_SCORES:
                groups.append(cur)
                trial = [it]
            cur = trial
        if cur:
            groups.append(cur)
        plans = [self._pad(g, q_off, dev, meta.custom_mask is not None, mask_off) for g in groups]
        if meta.custom_mask is not None:
            self.write_mask(plans, meta.custom_mask)
        return plans

    def _pad(self, items, num_tokens: int, dev, custom: bool = False, mask_len: int = 0) -> _Plan:
        """custom: the items' masks are index blocks into a flat custom mask of ``mask_len`` entries."""
        B, mq, mk = len(items), max(x[0] for x in items), max(x[1] for x in items)
        rows = torch.full((B, mq), -1, dtype=torch.long, device=dev)
        slots = torch.full((B, mk), self.pool.scratch_slot, dtype=torch.long, device=dev)
        if custom:
            mask = torch.full((B, mq, mk), mask_len, dtype=torch.long, device=dev)
        else:
            mask = torch.zeros(B, mq, mk, dtype=torch.bool, device=dev)
        for b, (q_len, kv_len, q0, s, m) in enumerate(items):
            rows[b, :q_len] = torch.arange(q0, q0 + q_len, device=dev)
            slots[b, :kv_len] = s
            mask[b, :q_len, :kv_len] = m
        if custom:
            return _Plan(rows, slots, torch.empty(0, dtype=torch.bool, device=dev), num_tokens, mask, mask_len)
        return _Plan(rows, slots, mask, num_tokens)

    def write_mask(self, plan: list[_Plan], custom_mask: torch.Tensor) -> None:
        flat = torch.cat([custom_mask.reshape(-1).bool(), custom_mask.new_zeros(1, dtype=torch.bool)])
        for p in plan:
            if p.mask_index is None or p.mask_len != custom_mask.numel():
                raise ValueError(f"torch: update_mask got {custom_mask.numel()} mask entries for a plan of "
                                 f"{p.mask_len if p.mask_index is not None else 'no custom mask'}")
            p.mask = flat[p.mask_index]

    def run(self, q: torch.Tensor, layer: int) -> torch.Tensor:
        pool = self.pool
        flat = pool.slots_view(layer)
        out = torch.zeros(q.shape, dtype=torch.float32, device=q.device)
        group = self.num_q_heads // self.num_kv_heads
        for plan in self.active_plan:
            valid = plan.rows >= 0
            qb = q[plan.rows.clamp_min(0)].float()  # [B, mq, Hq, D]
            k = (flat[0][plan.slots].float() * pool.k_scale).repeat_interleave(group, dim=2)  # [B, mk, Hq, D]
            v = (flat[1][plan.slots].float() * pool.v_scale).repeat_interleave(group, dim=2)
            s = torch.einsum("bqhd,bkhd->bhqk", qb, k) * self.scale
            s = s.masked_fill(~plan.mask[:, None], float("-inf"))
            p = torch.softmax(s, dim=-1).nan_to_num(0.0)  # a row with no visible key gives zeros
            o = torch.einsum("bhqk,bkhd->bqhd", p, v)
            out[plan.rows[valid]] = o[valid]
        return out.to(q.dtype)
