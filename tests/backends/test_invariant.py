"""Invariant attention (engine.invariant, attnlab.kernels.invariant): a query row's output is the same bits
whether it is computed with q_len 1 (decode), inside a q_len k+1 verify pass, inside a prefill, in a batch with
longer or padding requests, or through a CUDA-graph plan sized for a longer context. Under the Triton
interpreter on CPU (small shapes), bf16 and fp32; the GPU version is at the end (gpu-marked).

One pool holds request R's KV for positions 0..P+k and two other requests; each pass reads R's first L
positions through the same page table, so any difference can only come from how the pass is computed."""

from __future__ import annotations

import pytest
import torch

from attnlab.backends.base import AttnMeta, Mode
from attnlab.backends.cases import random_paged_case
from attnlab.backends.registry import require_available
from attnlab.backends.torch_ref import TorchBackend
from attnlab.kernels.invariant import invariant_params
from attnlab.kvcache import build_layout

CUDA = torch.cuda.is_available()
DEVICE = "cuda" if CUDA else "cpu"
TritonBackend = require_available("triton")
HQ, HKV, D = 4, 2, 32
P, K = 300, 9  # R's context before the new tokens; k + 1 = 10 rows: two query blocks of 8 tokens (GQA 2)
SPLIT = 128  # two KV tiles of 64 per split, three splits at P


def _bits(x: torch.Tensor) -> torch.Tensor:
    return x.contiguous().view({2: torch.int16, 4: torch.int32}[x.element_size()])


def _tables(meta: AttnMeta) -> list[list[int]]:
    ind, ptr = meta.layout.kv_indices.tolist(), meta.layout.kv_indptr.tolist()
    return [ind[ptr[i]:ptr[i + 1]] for i in range(len(ptr) - 1)]


class Setup:
    """R (P + K + 1 tokens of KV), two others (900 and 40 tokens), random q for every row."""

    def __init__(self, dtype, page_size, seed=0):
        self.pool, meta, _ = random_paged_case(kv_lens=[P + K + 1, 900, 40], q_lens=[1, 1, 1], page_size=page_size,
                                               num_q_heads=HQ, num_kv_heads=HKV, head_dim=D, dtype=dtype,
                                               device=DEVICE, seed=seed)
        self.tables, self.ps, self.dtype = _tables(meta), page_size, dtype
        g = torch.Generator().manual_seed(seed + 1)
        self.q_r = torch.randn(P + K + 1, HQ, D, generator=g).to(dtype).to(DEVICE)  # one q per position of R
        self.q_other = torch.randn(64, HQ, D, generator=g).to(dtype).to(DEVICE)

    def run(self, reqs, invariant=True, graph_context=None):
        """reqs: (request, q_len, kv_len); request 0 is R (its rows are its last q_len positions before
        kv_len), 1 / 2 the others, "pad" a graph bucket's dummy (KV on the scratch page). -> out rows of R."""
        tables, qs, q_lens, kv_lens, r_rows, row = [], [], [], [], None, 0
        for req, q_len, kv_len in reqs:
            if req == "pad":  # as ModelRunner.prepare pads: KV = its own tokens on the scratch page
                tables.append([self.pool.num_pages] * -(-kv_len // self.ps))
                qs.append(torch.zeros(q_len, HQ, D, dtype=self.dtype, device=DEVICE))
            else:
                tables.append(self.tables[req][: -(-kv_len // self.ps)])
                qs.append(self.q_r[kv_len - q_len:kv_len] if req == 0 else self.q_other[:q_len])
            if req == 0:
                r_rows = (row, row + q_len)
            q_lens.append(q_len)
            kv_lens.append(kv_len)
            row += q_len
        qo = torch.tensor([0, *torch.tensor(q_lens).cumsum(0).tolist()], dtype=torch.int32, device=DEVICE)
        mode = Mode.DECODE if max(q_lens) == 1 else Mode.VERIFY
        meta = AttnMeta(mode, qo, build_layout(tables, kv_lens, self.ps, DEVICE), q_lens, kv_lens, self.ps)
        kw = {"cuda_graph": True, "max_context": graph_context} if graph_context else {}
        be = TritonBackend(self.pool, HQ, HKV, D, D ** -0.5, self.dtype, invariant=invariant, split_tokens=SPLIT, **kw)
        be.plan(meta)
        out = be.run(torch.cat(qs), 0)
        return out[r_rows[0]:r_rows[1]], be.active_plan.params

    def reference(self, kv_len):
        """R's row at position kv_len - 1, from the fp32 torch reference."""
        layout = build_layout([self.tables[0][: -(-kv_len // self.ps)]], [kv_len], self.ps, DEVICE)
        qo = torch.tensor([0, 1], dtype=torch.int32, device=DEVICE)
        ref = TorchBackend(self.pool, HQ, HKV, D, D ** -0.5, torch.float32)
        ref.plan(AttnMeta(Mode.DECODE, qo, layout, [1], [kv_len], self.ps))
        return ref.run(self.q_r[kv_len - 1:kv_len].float(), 0)[0]


def _tol(dtype) -> dict:
    """vs the fp32 torch reference: the output is rounded to the model dtype (bf16: 8 mantissa bits, fp16: 11;
    fp16 on the H200 differed by 2.6e-5 abs / 6e-3 rel on small values), fp32: torch's defaults."""
    return {torch.bfloat16: {"atol": 2e-2, "rtol": 2e-2}, torch.float16: {"atol": 1e-3, "rtol": 1e-2}}.get(dtype, {})


def _passes():
    """Every way R's row at position P + j is computed: name -> (reqs, row of R's output, graph context)."""
    n = P + K + 1
    return {
        "verify": ([(0, K + 1, n)], None),
        "verify_in_batch": ([(1, K + 1, 900), (0, K + 1, n), (2, K + 1, 40)], None),  # a longer request: more splits
        "verify_padded_graph": ([(0, K + 1, n), ("pad", K + 1, K + 1), ("pad", K + 1, K + 1)], 4096),
        "verify_short": ([(0, 4, P + 4)], None),  # q_len 4: rows 0..3 only
        "prefill": ([(0, n, n)], None),
    }


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("page_size", [1, 16])
def test_row_is_bitwise_equal_across_q_len_batch_padding_and_graph_plans(dtype, page_size):
    s = Setup(dtype, page_size)
    decode = {}
    for j in range(K + 1):  # each row alone, q_len 1, at batch 1 and in a batch of 3 (q_len 0 beside it)
        alone, params = s.run([(0, 1, P + j + 1)])
        batched, _ = s.run([(1, 1, 900), (2, 0, 40), (0, 1, P + j + 1)])
        assert params.kind == "invariant" and params.split_tokens == SPLIT
        assert torch.equal(_bits(alone), _bits(batched)), j
        torch.testing.assert_close(alone[0].float(), s.reference(P + j + 1),
                                   **_tol(dtype))
        decode[j] = alone[0]
    for name, (reqs, ctx) in _passes().items():
        out, params = s.run(reqs, graph_context=ctx)
        q_len, kv_len = reqs[[r[0] for r in reqs].index(0)][1:]
        first = kv_len - q_len - P  # R's first row in this pass is position P + first
        for i in range(q_len):
            j = first + i
            if 0 <= j <= K:
                assert torch.equal(_bits(out[i]), _bits(decode[j])), (name, j)


def test_the_default_kernels_are_not_invariant():
    """The same comparison on the default kernels (split count per pass, decode vs extend kernel): some row
    differs, which is what the invariant kernel is for (fp32, under the interpreter)."""
    s = Setup(torch.float32, 16)
    decode = [s.run([(0, 1, P + j + 1)], invariant=False)[0][0] for j in range(K + 1)]
    verify, params = s.run([(0, K + 1, P + K + 1)], invariant=False)
    assert params.kind == "extend"
    assert not all(torch.equal(_bits(verify[j]), _bits(decode[j])) for j in range(K + 1))


def test_params_depend_on_the_shape_only():
    a = invariant_params(group=3, head_dim=64, max_kv_len=100)
    b = invariant_params(group=3, head_dim=64, max_kv_len=40000)
    assert (a.block_m, a.block_n, a.tokens_per_block, a.split_tokens) == (b.block_m, b.block_n, b.tokens_per_block,
                                                                         b.split_tokens) == (32, 64, 10, 256)
    assert (a.num_splits, b.num_splits) == (1, 157)
    assert invariant_params(group=4, head_dim=128, max_kv_len=1, split_tokens=100).split_tokens == 128  # whole tiles
    big = invariant_params(group=128, head_dim=64, max_kv_len=1)
    assert big.block_m == 128 and big.tokens_per_block == 1


def test_warmup_compiles_the_invariant_kernel():
    pool, _, _ = random_paged_case(kv_lens=[20], q_lens=[1], page_size=16, num_q_heads=HQ, num_kv_heads=HKV,
                                   head_dim=D, dtype=torch.float32)
    be = TritonBackend(pool, HQ, HKV, D, D ** -0.5, torch.float32, invariant=True, split_tokens=SPLIT)
    records = be.warmup(batch_sizes=(1, 4), q_lens=(1, 5), kv_lens=(20, 4000))
    assert all(r["params"].kind == "invariant" and r["params"].split_tokens == SPLIT for r in records)
    # Triton specializes an int argument equal to 1 or divisible by 16: one launch of each kind of split count
    assert [r["params"].num_splits for r in records] == [1, 2, 16]


def test_tree_masks_are_refused():
    from attnlab.errors import ConfigError

    pool, meta, _ = random_paged_case(kv_lens=[20], q_lens=[4], page_size=16, num_q_heads=HQ, num_kv_heads=HKV,
                                      head_dim=D, dtype=torch.float32, tree_mask=True)
    be = TritonBackend(pool, HQ, HKV, D, D ** -0.5, torch.float32, invariant=True)
    with pytest.raises(ConfigError, match="tree"):
        be.plan(meta)


@pytest.mark.gpu
@pytest.mark.skipif(not CUDA, reason="needs a CUDA GPU: the tensor-core dots and exp2 of the real kernel")
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32], ids=["bf16", "fp16", "fp32"])
def test_gpu_row_is_bitwise_equal(dtype):
    test_row_is_bitwise_equal_across_q_len_batch_padding_and_graph_plans(dtype, 16)
