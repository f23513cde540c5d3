"""Random paged-attention cases: the one builder behind kernel parity (metrics), the kernel benchmark and
the backend tests.

A case is a KV pool holding random K/V for a batch of requests at given lengths, with its pages shuffled
(so a backend that assumes contiguous pages fails), the AttnMeta of one pass and its query.
"""

from __future__ import annotations

import random

import torch

from attnlab.backends.base import AttnMeta, Mode
from attnlab.backends.torch_ref import causal_mask
from attnlab.kvcache import KVPool, build_layout, pages_needed


def random_tree_mask(q_lens: list[int], kv_lens: list[int], g: torch.Generator) -> torch.Tensor:
    """Flattened bool mask: causal, and each new token drops a random subset of the other new tokens."""
    blocks = []
    for q_len, kv_len in zip(q_lens, kv_lens):
        m = causal_mask(q_len, kv_len)
        drop = torch.rand(q_len, q_len, generator=g) < 0.4
        drop.fill_diagonal_(False)
        m[:, kv_len - q_len:] &= ~drop
        blocks.append(m.reshape(-1))
    return torch.cat(blocks) if blocks else torch.zeros(0, dtype=torch.bool)


def random_paged_case(*, kv_lens: list[int], q_lens: list[int], page_size: int, num_q_heads: int,
                      num_kv_heads: int, head_dim: int, dtype: torch.dtype, kv_dtype: torch.dtype | None = None,
                      device: str | torch.device = "cpu", mode: Mode | None = None, tree_mask: bool = False,
                      num_layers: int = 1, seed: int = 0, spare_pages: int = 3
                      ) -> tuple[KVPool, AttnMeta, torch.Tensor]:
    """(pool, meta, q). kv_lens[i] includes the q_lens[i] new tokens (their K/V are already in the pool);
    q: [sum(q_lens), num_q_heads, head_dim] in ``dtype``. mode None: DECODE if every q_len is 1, else VERIFY.

    K/V are drawn on the pool's device (a benchmark pool can be tens of GB); q and the mask on the CPU."""
    if any(kv < q for kv, q in zip(kv_lens, q_lens)):
        raise ValueError(f"kv_lens {kv_lens} must include q_lens {q_lens}")
    device = torch.device(device)
    g = torch.Generator().manual_seed(seed)
    need = [pages_needed(n, page_size) for n in kv_lens]
    perm = list(range(sum(need) + spare_pages))
    random.Random(seed).shuffle(perm)
    tables, off = [], 0
    for n in need:
        tables.append(perm[off:off + n])
        off += n
    kv_dtype = kv_dtype or dtype
    pool = KVPool(num_layers, len(perm), page_size, num_kv_heads, head_dim, kv_dtype, device)
    gk = g if device.type == "cpu" else torch.Generator(device).manual_seed(seed)
    if pool.is_fp8:  # normal_ has no fp8 kernel: draw in bf16, then cast
        pool.kv.copy_(torch.randn(pool.kv.shape, generator=gk, device=device, dtype=torch.bfloat16) * 0.5)
    else:
        pool.kv.normal_(0.0, 0.5, generator=gk)
    mask = random_tree_mask(q_lens, kv_lens, g).to(device) if tree_mask else None
    qo = [0]
    for n in q_lens:
        qo.append(qo[-1] + n)
    if mode is None:
        mode = Mode.DECODE if all(q == 1 for q in q_lens) else Mode.VERIFY
    meta = AttnMeta(mode=mode, qo_indptr=torch.tensor(qo, dtype=torch.int32, device=device),
                    layout=build_layout(tables, kv_lens, page_size, device), q_lens=list(q_lens),
                    kv_lens_host=list(kv_lens), page_size=page_size, custom_mask=mask)
    q = torch.randn(sum(q_lens), num_q_heads, head_dim, generator=g).to(dtype).to(device)
    return pool, meta, q


def new_kv(pool, meta, layer: int) -> tuple[torch.Tensor, torch.Tensor]:
    """This pass's new tokens' K / V as the layer's projection hands them to attention ([T, Hkv, D], contiguous),
    read back from their pool slots: what ``run_new`` takes (a prefill: every token of every request is new)."""
    lay, ps = meta.layout, meta.page_size
    q_lens = torch.tensor(meta.q_lens, device=lay.kv_indices.device)
    req = torch.repeat_interleave(torch.arange(len(meta.q_lens), device=q_lens.device), q_lens)
    qo = meta.qo_indptr.to(q_lens.device).long()
    pos = torch.arange(req.numel(), device=q_lens.device) - qo[req] + (lay.kv_lens.long() - q_lens)[req]
    slots = lay.kv_indices.long()[lay.kv_indptr.long()[req] + pos // ps] * ps + pos % ps
    k_cache, v_cache = pool.slots_view(layer)
    return k_cache[slots].contiguous(), v_cache[slots].contiguous()
