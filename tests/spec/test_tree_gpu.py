"""Tree math on CUDA: no host sync anywhere in draft steps, selection, masks, acceptance and compaction, and
the whole pipeline replays from one CUDA graph with results equal to eager."""

import pytest
import torch

from attnlab.engine.syncs import count_syncs
from attnlab.spec.tree import draft_step_mask, draw_children, select_tree, tree_start, tree_step
from attnlab.spec.tree_accept import emitted_tokens, tree_greedy_accept, tree_rejection_accept
from attnlab.spec.tree_verify import (
    ancestor_mask,
    draft_compaction,
    mask_bits,
    target_compaction,
    verify_inputs,
)

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]

B, K, S, N, V, PAGE = 8, 3, 4, 12, 512, 16


def pipeline(draft_logits, target_logits, root_tokens, root_pos, page_table, sampled, gen=None):
    """A draft loop's worth of tree math over given logits (the models' outputs stand in as inputs)."""
    q = torch.softmax(draft_logits, -1)  # [S, B, K, V]; step 1 reads row 0 of branch 0
    st = tree_start(*draw_children(q[0, :, 0], K, sampled, gen), root_pos, q[0, :, 0])
    masks = [draft_step_mask(st, width=(S - 1) * K)]
    for s in range(1, S):
        # the draft pass would run on st.frontier_tokens at st.positions with masks[-1]
        rows = q[s].gather(1, st.frontier_parent[:, :, None].expand(B, K, V))  # any per-branch rows
        st = tree_step(st, *draw_children(rows, K, sampled, gen), rows)
        if s < S - 1:  # the depth-S frontier is never fed
            masks.append(draft_step_mask(st, width=(S - 1) * K))
    tree = select_tree(st, root_tokens, N)
    ids, pos = verify_inputs(tree, root_pos)
    mask = ancestor_mask(tree.parents, S)
    if sampled:
        n, path, nxt = tree_rejection_accept(tree, torch.softmax(target_logits, -1), gen, "without_replacement")
    else:
        n, path, nxt = tree_greedy_accept(tree, target_logits)
    ts, td, tk = target_compaction(path, n, root_pos, page_table, PAGE)
    ds, dd, dk = draft_compaction(tree, path, n, root_pos, page_table, PAGE)
    return [ids, pos, mask, mask_bits(mask), n, path, emitted_tokens(tree, path, n, nxt), ts, td, tk, ds, dd, dk,
            torch.stack(masks)]


def inputs(seed):
    g = torch.Generator(device="cuda").manual_seed(seed)
    dl = torch.randn(S, B, K, V, device="cuda", generator=g)
    tl = torch.randn(B, N + 1, V, device="cuda", generator=g)
    tl[:, :, :2] += 6.0  # the target's argmax is among the draft's favourites: deep paths
    dl[..., :4] += 6.0
    return [dl, tl, torch.randint(0, V, (B,), device="cuda", generator=g),
            torch.randint(0, 100, (B,), device="cuda", generator=g), torch.arange(B * 16, device="cuda").view(B, 16)]


@pytest.mark.parametrize("sampled", [False, True])
def test_tree_pipeline_makes_no_host_sync(sampled):
    args = inputs(0)
    gen = torch.Generator(device="cuda").manual_seed(1)
    pipeline(*args, sampled, gen)  # first call: lazy init outside the count
    with count_syncs("cuda") as c:
        pipeline(*args, sampled, gen)
    assert c.n == 0


def test_tree_pipeline_replays_in_a_cuda_graph():
    static = inputs(0)
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        pipeline(*static, False)  # warm up on the side stream, as capture requires
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = pipeline(*static, False)
    deepest = 0
    for seed in range(1, 6):
        new = inputs(seed)
        for s, x in zip(static, new):
            s.copy_(x)
        graph.replay()
        want = pipeline(*new, False)
        for a, b in zip(out, want):
            assert torch.equal(a, b)
        deepest = max(deepest, int(want[4].max()))
    assert deepest >= 2  # deep paths were exercised
