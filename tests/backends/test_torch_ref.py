"""The reference backend against a dense, unpaged computation written independently."""

import math

import pytest
import torch

from attnlab.backends.torch_ref import TorchBackend
from tests.backends.cases import make_case


def dense(q, k, v, scale, causal_offset):
    # q: [Lq, H, D], k/v: [Lk, H, D]; plain loops over heads, no shared code with the backend.
    out = torch.zeros_like(q)
    for h in range(q.shape[1]):
        s = q[:, h] @ k[:, h].T * scale
        for i in range(q.shape[0]):
            s[i, causal_offset + i + 1:] = -math.inf
        out[:, h] = torch.softmax(s, -1) @ v[:, h]
    return out


@pytest.mark.parametrize("page_size", [1, 3, 16])
@pytest.mark.parametrize("gqa", [1, 3])
@pytest.mark.parametrize("q_lens,kv_lens", [([1, 1], [1, 17]), ([4, 1, 2], [9, 5, 30]), ([0, 3], [5, 3])])
def test_reference_matches_dense(page_size, gqa, q_lens, kv_lens):
    case = make_case(kv_lens=kv_lens, q_lens=q_lens, page_size=page_size, num_kv_heads=2, gqa=gqa,
                     head_dim=16, dtype=torch.float32)
    be = case.backend(TorchBackend)
    be.plan(case.meta)
    out = be.run(case.q, 0)
    tables = case.meta.layout
    indptr, idx = tables.kv_indptr.tolist(), tables.kv_indices.tolist()
    row = 0
    for i, (ql, kl) in enumerate(zip(q_lens, kv_lens)):
        k, v = case.pool.gather(0, idx[indptr[i]:indptr[i + 1]], kl)
        k, v = k.repeat_interleave(gqa, 1), v.repeat_interleave(gqa, 1)
        exp = dense(case.q[row:row + ql], k, v, case.scale, kl - ql)
        torch.testing.assert_close(out[row:row + ql], exp, rtol=1e-5, atol=1e-5)
        row += ql
