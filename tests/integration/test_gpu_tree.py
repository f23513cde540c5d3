"""Tree drafting on the GPU: the whole tree loop in CUDA graphs (tree verify and the topk draft steps, sized with
the topk factor) equals eager and target-only decoding, and reads the device once per iteration."""

import pytest
import torch

from attnlab.spec.decoder import SpecParams, SpeculativeDecoder
from attnlab.spec.drafters import ModelDrafter, NoDrafter
from attnlab.spec.tree_loop import capture_tree_graphs, tree_shape
from tests.integration.test_gpu_engine import CFG, _eagle, gpu_runner
from tests.spec.tiny import perturbed, prompts, tiny_model

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]

SHAPES = [(2, 3, 5), (4, 3, 7)]  # (topk, num_steps, num_draft_tokens): verify q_len <= gpu_runner's max_q_len 8


def _drafter(kind, target, backend, dtype, graphs):
    if kind == "eagle":
        return _eagle(target, backend, dtype, graphs, 4)
    model = perturbed(target, seed=1, noise=0.2) if kind == "model" else target
    return ModelDrafter(gpu_runner(model, backend, dtype, graphs, name="draft"), kind)


@pytest.mark.parametrize("backend,dtype", [("triton", torch.float32), ("triton", torch.bfloat16),
                                           ("flashinfer", torch.bfloat16)])
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "K{}S{}N{}".format(*s))
@pytest.mark.parametrize("kind", ["model", "eagle"])
def test_tree_graphs_match_eager_and_target_only(kind, shape, backend, dtype):
    K, S, N = shape
    target = tiny_model(CFG, seed=0).to("cuda", dtype)
    ps = prompts(3, CFG.vocab_size)  # batch 3 -> padded to the graph bucket 4; requests finish apart
    outs = []
    for graphs in (False, True):
        t = gpu_runner(target, backend, dtype, graphs)
        d = _drafter(kind, target, backend, dtype, graphs)
        if graphs:
            assert capture_tree_graphs(t, d, tree_shape(K, S, N)) > 0
        outs.append(SpeculativeDecoder(t, d, SpecParams(N, topk=K, num_steps=S)).generate(ps, 24))
        assert t.allocator.num_free == t.allocator.num_pages
        assert d.runner.allocator.num_free == d.runner.allocator.num_pages
    base = SpeculativeDecoder(gpu_runner(target, backend, dtype, False), NoDrafter("cuda"), SpecParams(0)).generate(ps, 24)
    eager, graphed, ref = ([r.output_ids for r in o.requests] for o in (*outs, base))
    if dtype == torch.float32:
        assert graphed == eager == ref
        assert [r.accept_lens for r in outs[1].requests] == [r.accept_lens for r in outs[0].requests]
    else:  # bf16: a padded batch may pick other GEMM tiles; a near-tie can flip late in a sequence
        same = sum(a == b for x, y in zip(graphed, eager) for a, b in zip(x, y))
        assert same / sum(map(len, eager)) >= 0.9


@pytest.mark.parametrize("graphs", [False, True])
@pytest.mark.parametrize("kind", ["model", "eagle"])
def test_tree_loop_at_most_one_sync_per_iteration(kind, graphs):
    """triton only: FlashInfer's mask packing reads its size back once per tree plan (docs/backends.md)."""
    from attnlab.engine.syncs import count_syncs

    K, S, N = SHAPES[1]
    target = tiny_model(CFG, seed=0).to("cuda", torch.bfloat16)
    t = gpu_runner(target, "triton", torch.bfloat16, graphs)
    d = _drafter(kind, target, "triton", torch.bfloat16, graphs)
    if graphs:
        capture_tree_graphs(t, d, tree_shape(K, S, N))
    dec = SpeculativeDecoder(t, d, SpecParams(N, topk=K, num_steps=S))
    ps = prompts(3, CFG.vocab_size)
    dec.generate(ps, 8)
    with count_syncs("cuda") as c:
        out = dec.generate(ps, 32)
    assert len(out.iterations) >= 6
    assert c.n <= len(out.iterations) + 1, (c.n, len(out.iterations), sorted(set(c.where)))


def test_device_tree_graph_fuzz():
    """The device-planned tree draft's graph (attnlab.spec.tree_device) and the accept graph
    (spec/tree_accept_graph.py) over random batch compositions (padded into buckets), tree shapes and page sizes,
    fp32 greedy: the same outputs and acceptances as the step-by-step path and target-only, one replay of each per
    iteration, every page back."""
    import random

    from attnlab.spec.eagle import EagleDrafter

    rng = random.Random(0)
    target = tiny_model(CFG, seed=0).to("cuda")
    bad, cases = [], 24
    for case in range(cases):
        kind = rng.choice(["model", "eagle"])
        K, S, N = rng.choice([(2, 3, 5), (4, 3, 7), (3, 2, 6), (2, 5, 7), (4, 5, 7)])
        page = rng.choice([1, 3, 16])
        ps = prompts(rng.choice([1, 2, 3, 4]), CFG.vocab_size, seed=case)
        base = gpu_runner(target, "triton", torch.float32, False, page_size=page)
        ref = [r.output_ids for r in SpeculativeDecoder(base, NoDrafter("cuda"), SpecParams(0)).generate(ps, 20).requests]
        outs = {}
        for device_trees in (True, False):
            t = gpu_runner(target, "triton", torch.float32, True, page_size=page)
            if kind == "eagle":
                d = EagleDrafter(_head_runner(target, page))
            else:
                d = ModelDrafter(gpu_runner(perturbed(target, seed=1, noise=0.2), "triton", torch.float32, True,
                                            page_size=page, name="draft"), "model")
            d.device_trees = device_trees
            capture_tree_graphs(t, d, tree_shape(K, S, N))
            before = d.runner.graphs.step_replays["dtree"]
            accept = t.graphs.tree_accept[(K, S, N + 1)]
            accepts = accept.replays
            out = SpeculativeDecoder(t, d, SpecParams(N, topk=K, num_steps=S)).generate(ps, 20)
            outs[device_trees] = out
            replays = d.runner.graphs.step_replays["dtree"] - before
            if replays != (len(out.iterations) if device_trees else 0):
                bad.append(f"case {case}: {replays} tree-draft replays over {len(out.iterations)} iterations")
            if accept.replays - accepts != len(out.iterations):
                bad.append(f"case {case}: {accept.replays - accepts} accept replays over {len(out.iterations)} "
                           f"iterations")
            if (t.allocator.num_free != t.allocator.num_pages
                    or d.runner.allocator.num_free != d.runner.allocator.num_pages):
                bad.append(f"case {case}: pages leaked")
        graph, step = ([r.output_ids for r in outs[x].requests] for x in (True, False))
        what = f"case {case} {kind} K{K}S{S}N{N} page {page} batch {len(ps)}"
        if not graph == step == ref:
            bad.append(f"{what}: outputs differ")
        if [r.accept_lens for r in outs[True].requests] != [r.accept_lens for r in outs[False].requests]:
            bad.append(f"{what}: acceptance differs from the step-by-step path")
    print(f"device tree graph fuzz: {cases} cases, {len(bad)} mismatches")
    assert not bad, "\n".join(bad)


def _head_runner(target, page):
    """An EAGLE head's draft side at any page size (test_gpu_engine._eagle builds page 16)."""
    from tests.spec.tiny import tiny_eagle

    head = tiny_eagle(target, CFG, seed=2).to("cuda")
    r = gpu_runner(head, "triton", torch.float32, True, page_size=page, name="draft")
    r.model_config = head.config.as_model_config()
    return r
