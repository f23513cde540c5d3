"""Parity level 1: a backend's attention output vs the torch reference on a random paged case with the
run's shapes (heads, head_dim, dtypes, page size), per phase.

Cases come from attnlab.backends.cases (the builder the backend tests use): random K/V in a pool whose
pages are shuffled, so a backend that assumes contiguous pages fails here too.
"""

from __future__ import annotations

import torch

from attnlab.backends.base import DTYPE_NAMES, Mode
from attnlab.backends.cases import new_kv, random_paged_case
from attnlab.backends.torch_ref import TorchBackend


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
        pool, meta, q = random_paged_case(kv_lens=kv_lens, q_lens=q_lens, page_size=page_size,
                                          num_q_heads=num_q_heads, num_kv_heads=num_kv_heads, head_dim=head_dim,
                                          dtype=DTYPE_NAMES[dtype], kv_dtype=DTYPE_NAMES[kv_dtype], device=device,
                                          mode=mode, seed=seed, spare_pages=2)
        scale = head_dim ** -0.5
        ref = TorchBackend(pool, num_q_heads, num_kv_heads, head_dim, scale, torch.float32)
        ref.plan(meta)
        want = ref.run(q.float(), 0)
        be = backend_cls(pool, num_q_heads, num_kv_heads, head_dim, scale, DTYPE_NAMES[dtype])
        be.plan(meta)
        # a prefill's new K / V at hand, as the engine's layers give them (triton's contiguous prefill reads them)
        got = (be.run_new(q, *new_kv(pool, meta, 0), 0) if mode == Mode.PREFILL else be.run(q, 0)).float()
        err = (got - want).abs().max().item()
        result[mode.value] = {"max_abs_err": err, "max_rel_err": err / max(want.abs().max().item(), 1e-30),
                              "num_tokens": sum(q_lens)}
    return result
