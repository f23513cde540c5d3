"""The device-planned tree draft (attnlab.spec.tree_device) drafts the same trees as the step-by-step path: its
device-built masks equal the host-built ones, padded rows change nothing, and a whole greedy generation gives the
same drafts, acceptances and outputs (target-only's) and gives back every page. Triton runs under the interpreter
on CPU (tiny shapes); on a GPU the graph replays are checked by tests/integration/test_gpu_tree.py (test_device_tree_graph_fuzz)."""

import random

import pytest
import torch

from attnlab.backends.registry import get_backend_class
from attnlab.spec import tree_device
from attnlab.spec.decoder import SpecParams, SpeculativeDecoder
from attnlab.spec.drafters import ModelDrafter, NoDrafter
from attnlab.spec.eagle import EagleDrafter
from attnlab.spec.tree import draft_step_mask, draw_children, tree_start, tree_step
from attnlab.spec.tree_device import TreeStepBuffers, meta_views
from attnlab.spec.tree_verify import flatten_custom_mask, verify_mask
from tests.spec.tiny import eagle_runner, perturbed, prompts, runner, tiny_config, tiny_eagle, tiny_model

CFG = tiny_config()
TARGET = tiny_model(CFG, seed=0)
OTHER = perturbed(TARGET, seed=1, noise=0.2)
HEAD = tiny_eagle(TARGET, CFG, seed=0)


# -- the torch reference of attnlab.kernels.tree_meta (what one frontier pass's metadata must be) -------------

def step_inputs(meta: torch.Tensor, rows: int, topk: int, s: int, page_size: int):
    """Frontier pass s (1 .. S - 1): -> (positions [rows * K] int64, pool slots [rows * K] int64, KV length
    [rows] int64). Its K rows feed tree slots (s - 1) K .. sK - 1 at RoPE position rope_root + s. The torch
    reference of attnlab.kernels.tree_meta, as ``write_tree_mask`` below."""
    kv_start, rope_root, _, real, indptr, indices = meta_views(meta, rows)
    rank = torch.arange(topk, device=meta.device)
    pos = kv_start[:, None] + (s - 1) * topk + rank[None]
    page = indices[indptr[:rows].long()[:, None] + pos // page_size].long()
    slots = torch.where(real[:, None] > 0, page * page_size + pos % page_size, -1)
    positions = (rope_root + s)[:, None].expand(rows, topk)
    return positions.reshape(-1), slots.reshape(-1), kv_start + s * topk


def write_tree_mask(mask: torch.Tensor, mask_indptr: torch.Tensor, kv_len: torch.Tensor, kv_start: torch.Tensor,
                    tree_mask: torch.Tensor, width: int) -> None:
    """The dense custom mask the extend kernel reads (per request a [K, kv_len] block, row-major, back to back):
    prefix columns (< kv_start) True, tree columns ``tree_mask`` [rows, K, sK] (ancestor-or-self). Writes
    ``mask_indptr`` [rows] (block starts) and the blocks into ``mask`` (last entry: where columns past a row's
    kv_len go)."""
    rows, K, W = tree_mask.shape
    size = K * kv_len
    start = torch.cumsum(size, 0) - size
    mask_indptr.copy_(start)
    c = torch.arange(width, device=mask.device)[None, None, :]
    flat = start[:, None, None] + torch.arange(K, device=mask.device)[None, :, None] * kv_len[:, None, None] + c
    rel = c - kv_start[:, None, None]
    bits = tree_mask.gather(2, rel.clamp(0, W - 1).expand(rows, K, width))
    val = torch.where(rel >= 0, bits, True)
    dst = torch.where(c < kv_len[:, None, None], flat, mask.numel() - 1)
    mask.scatter_(0, dst.reshape(-1), val.to(torch.uint8).reshape(-1))


def _cpu_triton():
    if "cpu" not in get_backend_class("triton").capabilities().devices:
        pytest.skip("triton runs on CPU tensors only under TRITON_INTERPRET=1 (CPU-only machines); "
                    "test_gpu_tree.py::test_device_tree_graph_fuzz covers the GPU")


@pytest.mark.parametrize("K,S", [(2, 3), (3, 4), (4, 2)])
def test_device_mask_equals_host_mask(K, S):
    """write_tree_mask (device, all requests of a step at once) = flatten_custom_mask (host index) of every step."""
    g = torch.Generator().manual_seed(K * 10 + S)
    B, V, width = 3, 20, 40
    prefix = [0, 7, 19]
    st = tree_start(*draw_children(torch.softmax(torch.randn(B, V, generator=g), -1), K, False),
                    torch.tensor(prefix))
    for s in range(1, S):
        kv_len = torch.tensor(prefix) + s * K
        ref = flatten_custom_mask(draft_step_mask(st), prefix)
        bufs = TreeStepBuffers.empty(B, K, 1, width, "cpu")
        bufs.masks.fill_(7)  # stale values must not leak into a block
        write_tree_mask(bufs.masks[0], bufs.mask_indptr[0], kv_len, torch.tensor(prefix), draft_step_mask(st), width)
        assert bufs.mask_indptr[0].tolist() == [0, *torch.cumsum(K * kv_len, 0)[:-1].tolist()]
        assert torch.equal(bufs.masks[0][:ref.numel()], ref.to(torch.uint8))
        q = torch.softmax(torch.randn(B, K, V, generator=g), -1)
        st = tree_step(st, *draw_children(q, K, False))


def _drafter(kind, page_size, max_context):
    if kind == "eagle":
        return EagleDrafter(eagle_runner(HEAD, page_size, backend="triton", max_context=max_context))
    return ModelDrafter(runner(OTHER, CFG, page_size, backend="triton", name="draft", max_context=max_context),
                        "model")


def _generate(kind, page_size, shape, ps, max_new, device_trees, max_context=96):
    """-> (outputs, accept lengths, the drafted trees, how many device launches ran, pages back on both sides)."""
    K, S, N = shape
    tgt = runner(TARGET, CFG, page_size, backend="triton", max_context=max_context)
    d = _drafter(kind, page_size, max_context)
    d.device_trees = device_trees
    dec = SpeculativeDecoder(tgt, d, SpecParams(N, topk=K, num_steps=S))
    trees, launches = [], [0]
    draft = d.draft_tree

    def recorded(*a, **kw):
        t = draft(*a, **kw)
        assert (t.mask is not None) == device_trees  # the launch builds the verify mask too
        if t.mask is not None:
            assert torch.equal(t.mask, verify_mask(t))
        trees.append([x.clone() for x in (t.tokens, t.parents, t.depth, t.draft_slot, t.logp)])
        return t

    real_body = tree_device.tree_draft_body

    def counted(*a, **kw):
        launches[0] += 1
        return real_body(*a, **kw)

    d.draft_tree = recorded
    tree_device.tree_draft_body = counted
    try:
        out = dec.generate(ps, max_new)
    finally:
        tree_device.tree_draft_body = real_body
    back = (tgt.allocator.num_free == tgt.allocator.num_pages
            and d.runner.allocator.num_free == d.runner.allocator.num_pages)
    return ([r.output_ids for r in out.requests], [r.accept_lens for r in out.requests], trees, launches[0], back)


@pytest.mark.parametrize("kind,page_size", [("eagle", 1), ("eagle", 16), ("model", 3)])  # the interpreter is slow
def test_device_tree_draft_equals_step_by_step_triton(kind, page_size):
    _cpu_triton()
    shape = (2, 3, 5)
    ps = prompts(3, CFG.vocab_size)
    ref_out = SpeculativeDecoder(runner(TARGET, CFG, 16), NoDrafter("cpu"), SpecParams(0)).generate(ps, 8)
    dev = _generate(kind, page_size, shape, ps, 8, True)
    step = _generate(kind, page_size, shape, ps, 8, False)
    assert dev[3] == len(dev[2]) > 0 and step[3] == 0  # every iteration drafted in one launch (or none did)
    assert dev[0] == step[0] == [r.output_ids for r in ref_out.requests]
    assert dev[1] == step[1]
    for a, b in zip(dev[2], step[2]):
        for x, y in zip(a[:4], b[:4]):  # tokens, parents, depth, draft slots: exact; scores: within rounding
            assert torch.equal(x, y)
        torch.testing.assert_close(a[4], b[4], rtol=1e-5, atol=1e-5)
    assert dev[4] and step[4]


def test_device_tree_padded_rows_change_nothing_triton():
    """A graph bucket's dummy rows (scratch pages, slots -1) leave the real rows' trees and KV as they are."""
    _cpu_triton()
    from attnlab.spec.tree_device import stage_tree_steps, tree_draft_body
    rng = random.Random(0)
    ps = [[rng.randrange(CFG.vocab_size) for _ in range(n)] for n in (5, 17)]
    outs, kvs = [], []
    for pad_to in (None, 4):
        d = _drafter("model", 3, 96)
        r, reqs = d.runner, [0, 1]
        d.prefill(reqs, ps)
        meta, rows = stage_tree_steps(r, reqs, [len(p) for p in ps], [len(p) - 1 for p in ps],
                                      [len(p) - 1 for p in ps], 3, 3, pad_to=pad_to)
        bufs = TreeStepBuffers.empty(rows, 3, 2, r.backend.max_context, "cpu")
        r.backend.device_tree_plans(rows, 3, 2, *meta_views(meta, rows)[4:], bufs)
        g = torch.Generator().manual_seed(1)
        logits = torch.randn(rows, CFG.vocab_size, generator=g)
        last = torch.tensor([p[-1] for p in ps] + [0] * (rows - 2))
        outs.append([t[:2] for t in tree_draft_body(r, meta, rows, 3, 3, 6, logits, last, None, bufs)])
        kvs.append(torch.cat([torch.cat(r.pool.gather(0, r.allocator.page_tables[q], len(p) + 6)) for q, p
                              in zip(reqs, ps)]))
    for a, b in zip(*outs):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(kvs[0], kvs[1], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("page_size", [1, 3, 16])
def test_accept_graph_body_equals_eager_accept(page_size):
    """accept_and_compact (the accept graph's body) = tree_greedy_accept + emitted_tokens + compact_target on the
    real rows, and rows marked not real (a bucket's dummies, holding stale trees) move no K/V."""
    from attnlab.kvcache import KVPool, PageAllocator
    from attnlab.spec.tree import select_tree
    from attnlab.spec.tree_accept import emitted_tokens, tree_greedy_accept
    from attnlab.spec.tree_accept_graph import accept_and_compact, window_width
    from attnlab.spec.tree_rollback import compact_target, window_lists

    g = torch.Generator().manual_seed(page_size)
    B, R, K, S, N, V = 3, 5, 3, 3, 7, 6  # V small: paths of depth >= 2 get accepted
    T = N + 1
    st = tree_start(*draw_children(torch.softmax(torch.randn(R, V, generator=g), -1), K, False), torch.zeros(R))
    for _ in range(1, S):
        st = tree_step(st, *draw_children(torch.softmax(torch.randn(R, K, V, generator=g), -1), K, False))
    tree = select_tree(st, torch.zeros(R, dtype=torch.long), N)
    top = torch.randint(0, V, (R, T), generator=g)
    pools, alloc = [], PageAllocator(160, page_size)
    root = [4, 17, 30]
    for i, n in enumerate(root):
        alloc.allocate(i, n + T)
    for _ in range(2):
        p = KVPool(1, 160, page_size, 1, 4, torch.float32, "cpu")
        p.kv.copy_(torch.randn(p.kv.shape, generator=torch.Generator().manual_seed(9)))
        pools.append(p)
    # eager, on the real rows
    sub = type(tree)(*(x[:B] if isinstance(x, torch.Tensor) else x for x in (tree.tokens, tree.parents, tree.depth,
                                                                              tree.logp, tree.draft_slot)),
                     None, K, S)
    n_acc, path, nxt = tree_greedy_accept(sub, torch.nn.functional.one_hot(top[:B], V).float())
    emitted = emitted_tokens(sub, path, n_acc, nxt)

    class _R:
        allocator, pool, device = alloc, pools[0], torch.device("cpu")

    compact_target(_R, [0, 1, 2], root, T, path, n_acc)
    # the body, with two stale rows that must move nothing
    W = window_width(T, page_size)
    rows, bases = window_lists(alloc, [0, 1, 2], root, T, W)
    table = torch.tensor(rows + [rows[0]] * (R - B))
    rel = torch.tensor([f - b for f, b in zip(root, bases)] + [0] * (R - B))
    real = torch.arange(R) < B
    out = accept_and_compact(tree.tokens, tree.parents, verify_mask(tree), top, table, rel, real, K, S, pools[1])
    for a, b in zip(out, (n_acc, path, nxt, emitted)):
        assert torch.equal(a[:B], b)
    assert int(n_acc.max()) >= 1  # something moved
    assert torch.equal(pools[0].kv, pools[1].kv)


@pytest.mark.parametrize("K,S,page_size", [(2, 3, 1), (3, 4, 3), (4, 5, 16), (8, 2, 3)])
def test_tree_meta_kernel_equals_torch_reference(K, S, page_size):
    """attnlab.kernels.tree_meta (one launch a pass) = step_inputs + write_tree_mask(draft_step_mask) (the torch
    reference), for requests of several prefix lengths and a padded dummy row; on the GPU where there is one, else
    under the interpreter."""
    from attnlab.kernels.tree_meta import tree_step_meta
    from attnlab.spec.tree_device import stage_tree_steps

    if torch.cuda.is_available():
        dev = "cuda"
    else:
        _cpu_triton()
        dev = "cpu"
    g = torch.Generator().manual_seed(K * 100 + S)
    V, width, prefix = 30, 1100, [1, 7, 19]  # width > one column block: two blocks a row
    r = runner(TARGET, CFG, page_size, max_context=width)
    reqs = [0, 1, 2]
    for q, n in zip(reqs, prefix):
        r.allocate([q], [n])
    meta, rows = stage_tree_steps(r, reqs, prefix, [n - 1 for n in prefix], [n - 1 for n in prefix], K, S, pad_to=4)
    meta = meta.to(dev)
    st = tree_start(*draw_children(torch.softmax(torch.randn(rows, V, generator=g), -1), K, False),
                    torch.tensor(prefix + [0]))
    for s in range(1, S):
        ref = TreeStepBuffers.empty(rows, K, 1, width, "cpu")
        got = TreeStepBuffers.empty(rows, K, 1, width, dev)
        got.masks.fill_(7)
        pos, slots, kv_len = step_inputs(meta.cpu(), rows, K, s, page_size)
        ref.kv_lens[0].copy_(kv_len)
        write_tree_mask(ref.masks[0], ref.mask_indptr[0], kv_len, meta.cpu()[:rows].long(), draft_step_mask(st),
                        width)
        kpos, kslots = tree_step_meta(meta, rows, K, s, page_size, st.frontier_anc.to(dev), got.kv_lens[0],
                                      got.mask_indptr[0], got.masks[0], width)
        assert torch.equal(kpos.cpu(), pos) and torch.equal(kslots.cpu(), slots)
        assert torch.equal(got.kv_lens.cpu(), ref.kv_lens) and torch.equal(got.mask_indptr.cpu(), ref.mask_indptr)
        total = int((K * kv_len).sum())
        assert torch.equal(got.masks[0][:total].cpu(), ref.masks[0][:total])
        q = torch.softmax(torch.randn(rows, K, V, generator=g), -1)
        st = tree_step(st, *draw_children(q, K, False))
