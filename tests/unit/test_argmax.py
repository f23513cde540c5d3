"""attnlab.kernels.argmax.argmax_rows against torch's argmax, under the interpreter (CPU) or on the GPU: the first
maximal column, ties inside a tile and across tiles, ragged vocabularies, every row count up to 16, fp32 / fp16 /
bf16; the ticket is left at 0 for the next launch; bad input is refused."""

import pytest
import torch

from attnlab.backends.registry import get_backend_class
from attnlab.kernels import argmax, gemm

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
if DEVICE == "cpu" and "cpu" not in get_backend_class("triton").capabilities().devices:
    pytest.skip("triton runs on CPU tensors only under TRITON_INTERPRET=1", allow_module_level=True)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("m,v", [(1, 1), (1, 700), (3, 1500), (16, argmax.BLOCK * 3 + 5), (7, argmax.BLOCK)])
def test_first_maximal_column_as_torch(m, v, dtype):
    g = torch.Generator().manual_seed(m * 1000 + v)
    x = torch.randn(m, v, generator=g).to(dtype)
    if v > 3:  # ties: the row max repeated later in the same tile, and in a later tile
        for r in range(m):
            top = x[r].max() + 1
            cols = sorted({int(c) for c in torch.randint(0, v, (3,), generator=g)})
            x[r, cols] = top
    x = x.to(DEVICE)
    got = argmax.argmax_rows(x)
    assert got.dtype == torch.int64 and torch.equal(got, x.argmax(-1)), (got, x.argmax(-1))
    assert torch.equal(argmax.argmax_rows(x.t().contiguous().t()), got)  # a strided view: copied first
    assert not gemm._ticket_buffer(x.device)[gemm.ARGMAX_TICKET:].any()


def test_greedy_switch_and_refusals():
    x = torch.randn(2, 300).to(DEVICE)
    assert argmax.enabled()
    assert torch.equal(argmax.greedy(x), x.argmax(-1))
    argmax.set_enabled(False)
    try:
        assert torch.equal(argmax.greedy(x), x.argmax(-1))  # torch's
    finally:
        argmax.set_enabled(True)
    assert argmax.argmax_rows(x[:0]).shape == (0,)
    for bad in (torch.zeros(17, 4), torch.zeros(2, 3, 4), torch.zeros(2, 4, dtype=torch.int32), torch.zeros(2, 0)):
        with pytest.raises(ValueError, match="argmax_rows"):
            argmax.argmax_rows(bad.to(DEVICE))
