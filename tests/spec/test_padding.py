"""Padded passes (the CUDA-graph path's batch buckets) give the real rows exactly the unpadded result."""

import pytest
import torch

from attnlab.backends.base import Mode
from tests.spec.tiny import runner, tiny_config, tiny_model

CFG = tiny_config()
MODEL = tiny_model(CFG, seed=0)


@pytest.mark.parametrize("page_size", [1, 4])
@pytest.mark.parametrize("q_len", [1, 3])
def test_padded_pass_matches_unpadded(page_size, q_len):
    a, b = runner(MODEL, CFG, page_size), runner(MODEL, CFG, page_size)
    prompts = [[5, 6, 7, 8, 9], [1, 2], [3]]
    for r in (a, b):
        ids = torch.tensor([t for p in prompts for t in p])
        r.run([0, 1, 2], [0, 0, 0], [len(p) for p in prompts], ids, Mode.PREFILL)
    new = torch.randint(0, CFG.vocab_size, (3 * q_len,))
    starts = [len(p) for p in prompts]
    mode = Mode.DECODE if q_len == 1 else Mode.VERIFY
    p_plain = a.prepare([0, 1, 2], starts, [q_len] * 3, mode)
    a.plan(p_plain)
    want = a.forward(p_plain, new)
    p_pad = b.prepare([0, 1, 2], starts, [q_len] * 3, mode, pad_to=8)
    assert p_pad.padded_to == 8 and p_pad.positions.shape[0] == 8 * q_len
    assert (p_pad.slots[3 * q_len:] == -1).all()
    b.plan(p_pad)
    got = b.forward(p_pad, new)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    # the padded rows wrote nothing into the real pages
    for req in range(3):
        n = starts[req] + q_len
        ka, va = a.pool.gather(0, a.allocator.page_tables[req], n)
        kb, vb = b.pool.gather(0, b.allocator.page_tables[req], n)
        torch.testing.assert_close(ka, kb)
        torch.testing.assert_close(va, vb)


def test_a_prefill_is_never_padded_into_a_graph_bucket():
    """With graphs captured for q_len 1 and 4, a decode / verify pass of that q_len is padded to its bucket (its
    graph replays), a prefill of the same uniform length is not: backends plan a prefill as one (flashinfer's
    plain prefill wrapper), so replaying the decode graph ran one-token prompts on that graph's stale plan
    (tests/integration/test_gpu_serving.py caught it on the H200: requests 0 and 6, the one-token prompts)."""
    from attnlab.engine.graphs import GraphCache

    r = runner(MODEL, CFG, 4)
    r.graphs = GraphCache(r)  # what capture_graphs records, without capturing (CPU)
    r.graphs.buckets, r.graphs.q_lens = (1, 2, 4), (1, 4)
    pre = r.prepare([0, 1, 2], [0, 0, 0], [1, 1, 1], Mode.PREFILL)
    assert pre.padded_to is None and pre.positions.shape[0] == 3
    dec = r.prepare([0, 1, 2], [1, 1, 1], [1, 1, 1], Mode.DECODE)
    ver = r.prepare([0, 1, 2], [2, 2, 2], [4, 4, 4], Mode.VERIFY)
    assert (dec.padded_to, ver.padded_to) == (4, 4) and ver.positions.shape[0] == 16
