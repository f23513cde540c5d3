"""The decode kernel's early plan reads and K / V prefetch (attnlab.kernels.decode, with PDL): the same bits as the
wait-first launch and as PDL off, eagerly and under graph replay, across page sizes (per-token page gathers and
whole-tile pages), GQA ratios, head dims, split counts, padded rows and KV lengths from 1 to past the prefetched
tiles. The prefetch acts only with PDL on a Hopper GPU: nothing here runs elsewhere."""

import pytest
import torch

from attnlab.backends.registry import require_available
from attnlab.kernels import decode, pdl
from tests.backends.cases import make_case

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(pdl.unsupported("cuda") is not None,
                                                  reason=f"PDL needs a Hopper GPU: {pdl.unsupported('cuda')}")]
TritonBackend = require_available("triton")


def _outputs(case, on: bool, tiles: int, num_splits: int, graph: bool) -> torch.Tensor:
    with pdl.using(on, "cuda"), decode.kv_prefetching(tiles):
        be = case.backend(TritonBackend)
        be.num_splits = num_splits
        be.plan(case.meta)
        layers = range(case.pool.num_layers)
        if not graph:
            return torch.stack([be.run(case.q, layer) for layer in layers])
        for layer in layers:  # compile, then capture
            be.run(case.q, layer)
        torch.cuda.synchronize()
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            out = torch.stack([be.run(case.q, layer) for layer in layers])
        g.replay()
        g.replay()
        torch.cuda.synchronize()
        return out


@pytest.mark.parametrize("graph", [False, True], ids=["eager", "graph"])
@pytest.mark.parametrize("page_size,gqa,head_dim,num_splits", [(1, 3, 64, 1), (16, 4, 128, 32), (16, 1, 64, 5),
                                                                (128, 3, 128, 2), (3, 8, 64, 3)])
def test_prefetch_changes_no_bit(page_size, gqa, head_dim, num_splits, graph):
    q_lens = [1, 0, 1, 1, 1]  # a padded row among them
    kv_lens = [1, 0, 700, 4096, 130]
    case = make_case(kv_lens=kv_lens, q_lens=q_lens, page_size=page_size, num_kv_heads=2, gqa=gqa, head_dim=head_dim,
                     dtype=torch.bfloat16, device="cuda", num_layers=2, seed=page_size + gqa)
    ref = _outputs(case, False, decode.KV_PREFETCH_TILES, num_splits, graph)
    for tiles in (decode.KV_PREFETCH_TILES, 1, 0):
        out = _outputs(case, True, tiles, num_splits, graph)
        assert torch.equal(out, ref), (tiles, (out.float() - ref.float()).abs().max().item())
    torch.testing.assert_close(ref.float(), case.reference(), atol=2e-2, rtol=2e-2)
