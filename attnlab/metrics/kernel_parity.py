"""Parity level 1: a backend's attention output vs the torch reference on a random paged case with the
run's shapes (heads, head_dim, dtypes, page size), per phase.

The case builder mirrors tests/backends/cases.py (the package must not import tests/): random K/V in a
pool whose pages are shuffled, so a backend that assumes contiguous pages fails here too.
"""

from __future__ import annotations

import random

import torch

from attnlab.backends.base import DTYPE_NAMES, AttnMeta, Mode
from attnlab.backends.torch_ref import TorchBackend
from attnlab.kvcache import KVPool, build_layout, pages_needed


def make_paged_case(kv_lens: list[int], q_lens: list[int], page_size: int, num_q_heads: int, num_kv_heads: int,
                    head_dim: int, dtype: torch.dtype, kv_dtype: torch.dtype, device: str, mode: Mode,
                    seed: int = 0) -> tuple[KVPool, AttnMeta, torch.Tensor]:
    """(pool, meta, q): kv_lens[i] includes the q_lens[i] new tokens; q: [sum(q_lens), Hq, D] in dtype."""
    g = torch.Generator().manual_seed(seed)
    need = [pages_needed(n, page_size) for n in kv_lens]
    perm = list(range(sum(need) + 2))
    random.Random(seed).shuffle(perm)
    tables, off = [], 0
    for n in need:
        tables.append(perm[off:off + n])
        off += n
    pool = KVPool(1, len(perm), page_size, num_kv_heads, head_dim, kv_dtype, device)
    pool.kv.copy_((torch.randn(pool.kv.shape, generator=g) * 0.5).to(kv_dtype))
    qo = [0]
    for n in q_lens:
        qo.append(qo[-1] + n)
    meta = AttnMeta(mode=mode, qo_indptr=torch.tensor(qo, dtype=torch.int32, device=device),
                    layout=build_layout(tables, kv_lens, page_size, device), q_lens=list(q_lens),
                    kv_lens_host=list(kv_lens), page_size=page_size)
    q = torch.randn(sum(q_lens), num_q_heads, head_dim, generator=g).to(dtype).to(device)
    return pool, meta, q


def phase_shapes(prompt_len: int, k: int, batch: int) -> dict[Mode, tuple[list[int], list[int]]]:
    """(kv_lens, q_lens) per phase for a batch like the run's: prefill, decode (draft steps), verify."""
    lens = [max(1, prompt_len - 7 * i) for i in range(batch)]
    shapes = {Mode.PREFILL: (lens, lens), Mode.DECODE: ([n + 3 for n in lens], [1] * batch)}
    if k > 0:
        shapes[Mode.VERIFY] = ([n + k + 1 for n in lens], [k + 1] * batch)
    return shapes


def kernel_parity(backend_cls, *, num_q_heads: int, num_kv_heads: int, head_dim: int, dtype: str, kv_dtype: str,
                  page_size: int, device: str, prompt_len: int, k: int, batch: int, seed: int = 0) -> dict:
    """{phase: {max_abs_err, max_rel_err}} of ``backend_cls`` vs TorchBackend (fp32) on the same inputs.

    max_rel_err = max |out - ref| / max |ref| (element-wise relative error is meaningless near zero).
    """
    result = {}
    for mode, (kv_lens, q_lens) in phase_shapes(prompt_len, k, batch).items():
        pool, meta, q = make_paged_case(kv_lens, q_lens, page_size, num_q_heads, num_kv_heads, head_dim,
                                        DTYPE_NAMES[dtype], DTYPE_NAMES[kv_dtype], device, mode, seed)
        scale = head_dim ** -0.5
        ref = TorchBackend(pool, num_q_heads, num_kv_heads, head_dim, scale, torch.float32)
        ref.plan(meta)
        want = ref.run(q.float(), 0)
        be = backend_cls(pool, num_q_heads, num_kv_heads, head_dim, scale, DTYPE_NAMES[dtype])
        be.plan(meta)
        got = be.run(q, 0).float()
        err = (got - want).abs().max().item()
        result[mode.value] = {"max_abs_err": err, "max_rel_err": err / max(want.abs().max().item(), 1e-30),
                              "num_tokens": sum(q_lens)}
    return result
