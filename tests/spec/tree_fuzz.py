"""The graph-padding fuzz harness of tree passes: random batch compositions x tree shapes x page sizes, each run
on two runners of one model, a reference (eager, unpadded) and a candidate (CUDA graphs on a GPU; on CPU the
same bucket padding run eagerly, the graph path's inputs without the replay). Per case: a prefill, the S - 1
topk-wide draft steps (planned before the loop, masks written per step through update_mask), one tree verify
pass of N + 1 tokens; the candidate's real rows must equal the reference's and its real K/V pages too.

Trees come out of the tree math itself (random draft rows -> tree_start / tree_step / select_tree), so their
shapes are the ones the loop makes: topk-wide frontiers, pruned to N nodes, ancestors closed.
"""

from __future__ import annotations

import random

import torch

from attnlab.backends.base import Mode
from attnlab.backends.registry import get_backend_class
from attnlab.engine.graphs import DEFAULT_BUCKETS, bucket_for
from attnlab.engine.runner import ModelRunner
from attnlab.kvcache import KVPool, PageAllocator
from attnlab.spec.tree import draw_children, select_tree, tree_start, tree_step
from attnlab.spec.tree_draft import plan_tree_steps, write_step_mask
from attnlab.spec.tree_verify import flatten_custom_mask, verify_inputs, verify_mask

SHAPES = [(2, 1, 2), (2, 3, 5), (3, 2, 6), (4, 3, 8), (4, 4, 8), (8, 2, 8)]  # (topk, num_steps, num_draft_tokens)
PAGE_SIZES = (1, 3, 16)


def make_runner(model, cfg, backend: str, page_size: int, device, max_batch: int, max_context: int,
                graphs: bool, dtype=torch.float32) -> ModelRunner:
    pages = max_batch * -(-max_context // page_size)
    pool = KVPool(cfg.num_layers, pages, page_size, cfg.num_kv_heads, cfg.head_dim, dtype, device)
    kw = {}
    if graphs:  # buffers sized as engine.build does, with the topk factor in max_q_len
        kw = {"cuda_graph": True, "max_batch_size": bucket_for(max_batch, DEFAULT_BUCKETS),
              "max_q_len": max(max(n + 1, k) for k, _, n in SHAPES), "max_context": max_context}
    be = get_backend_class(backend)(pool, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim, cfg.head_dim ** -0.5,
                                    dtype, **kw)
    return ModelRunner(model, cfg, None, pool, PageAllocator(pages, page_size), be, max_context, "fuzz",
                       max_batch=max_batch)


def random_tree_state(B, K, S, V, gen, device, root_pos):
    q = torch.softmax(torch.randn(B, V, generator=gen).to(device) * 3, -1)
    st = tree_start(*draw_children(q, K, False), root_pos)
    steps = [st]
    for _ in range(1, S):
        q = torch.softmax(torch.randn(B, K, V, generator=gen).to(device) * 3, -1)
        st = tree_step(st, *draw_children(q, K, False))
        steps.append(st)
    return steps


def describe(a: torch.Tensor, b: torch.Tensor, atol: float, B: int) -> str:
    """How a candidate pass differs: the error against the values' scale, and which rows (requests) differ: a
    wrong mask or page shows as a few rows far off, rounding (another GEMM tile for a padded bucket) as small
    errors spread over many rows."""
    d = (a.float() - b.float()).abs()
    scale = a.float().abs().max().item()
    off = (d > atol + atol * b.float().abs()).reshape(a.shape[0], -1).any(-1)
    rows = off.nonzero().flatten().tolist()
    per = a.shape[0] // max(B, 1)
    reqs = sorted({r // per for r in rows}) if per else []
    return (f"max err {d.max().item():.3g} (|ref| max {scale:.3g}, relative {d.max().item() / max(scale, 1e-30):.2g}), "
            f"{len(rows)}/{a.shape[0]} rows off, requests {reqs[:16]}")


def run_case(ref: ModelRunner, cand: ModelRunner, rng: random.Random, shape, B: int, cfg, atol: float,
             max_prompt: int = 40) -> list[str]:
    """One case on both runners (fresh requests, released at the end); -> mismatch descriptions (empty: ok)."""
    K, S, N = shape
    dev = ref.device
    gen = torch.Generator().manual_seed(rng.randrange(1 << 30))
    lens = [rng.randint(1, max_prompt) for _ in range(B)]
    reqs = list(range(B))
    prompts = [torch.randint(0, cfg.vocab_size, (n,), generator=gen).tolist() for n in lens]
    ids = torch.tensor([t for p in prompts for t in p]).to(dev)
    root = [n - 1 for n in lens]
    root_pos = torch.tensor(root, dtype=torch.int64).to(dev)
    states = random_tree_state(B, K, S, cfg.vocab_size, gen, dev, root_pos)
    outs = []
    for r in (ref, cand):
        got = [r.run(reqs, [0] * B, lens, ids, Mode.PREFILL, rows="all")]
        steps = plan_tree_steps(r, reqs, lens, root, K, S)  # the draft side's frontier passes, planned up front
        for j, step in enumerate(steps):
            r.use_step(j)
            write_step_mask(r, step, states[j])
            got.append(r.forward(step.p, states[j].frontier_tokens.reshape(-1)).clone())
        tree = select_tree(states[-1], torch.tensor([p[-1] for p in prompts]).to(dev), N)
        vids, pos = verify_inputs(tree, root_pos)
        p = r.prepare(reqs, root, [N + 1] * B, Mode.VERIFY, custom_mask=flatten_custom_mask(verify_mask(tree), root),
                      positions=pos.reshape(-1))
        r.plan(p)
        got.append(r.forward(p, vids.reshape(-1)).clone())
        if dev.type == "cuda":
            torch.cuda.synchronize()  # an illegal memory access surfaces here, in this case
        # every layer: layer 0's K/V come from the embeddings alone, only later layers' see attention output
        kv = [r.pool.gather(layer, r.allocator.page_tables[q], r.kv_len(q)) for q in reqs
              for layer in range(r.pool.num_layers)]
        outs.append((got, kv))
        for q in reqs:
            r.release(q)
    bad = []
    for i, (a, b) in enumerate(zip(outs[0][0], outs[1][0])):
        if a.shape != b.shape or not torch.allclose(a, b, atol=atol, rtol=atol):
            bad.append(f"shape {shape} B={B} lens={lens} page={ref.allocator.page_size} pass {i}: "
                       + (describe(a, b, atol, B) if a.shape == b.shape else f"shape {tuple(b.shape)}"))
    for (ka, va), (kb, vb) in zip(outs[0][1], outs[1][1]):
        if not (torch.allclose(ka, kb, atol=atol, rtol=atol) and torch.allclose(va, vb, atol=atol, rtol=atol)):
            bad.append(f"shape {shape} B={B} lens={lens} page={ref.allocator.page_size}: K/V differ")
    return bad
