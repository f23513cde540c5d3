"""Tree drafting (spec.topk > 1) must not change what the target generates (greedy, fp32), for every tree-capable
drafter and mask-capable backend on CPU, and must give every page back on both sides."""

import pytest

from attnlab.spec.decoder import SpecParams, SpeculativeDecoder
from attnlab.spec.drafters import ModelDrafter, NoDrafter
from attnlab.spec.eagle import EagleDrafter
from tests.spec.tiny import eagle_runner, perturbed, prompts, runner, tiny_config, tiny_eagle, tiny_model

CFG = tiny_config()
TARGET = tiny_model(CFG, seed=0)
OTHER = perturbed(TARGET, seed=1, noise=0.2)  # agrees with the target part of the time
HEAD = tiny_eagle(TARGET, CFG, seed=0)
# A random EAGLE head almost never guesses one of 96 tokens: on a 5-token vocabulary its top-k children hit
# the target's argmax often enough that paths of depth >= 2 are accepted, rolled back and draft-extended.
SMALL = tiny_config(vocab=5)
SMALL_TARGET = tiny_model(SMALL, seed=0)
SMALL_HEAD = tiny_eagle(SMALL_TARGET, SMALL, seed=0)

SHAPES = [  # (topk, num_steps, num_draft_tokens)
    (2, 1, 2),  # one level: no frontier pass
    (2, 3, 5),
    (3, 2, 6),
    (4, 4, 8),
]


def drafter_for(kind, page_size, backend="torch"):
    if kind == "self":  # the target's first layer only: cheap and imperfect
        return ModelDrafter(runner(TARGET, CFG, page_size, backend=backend, layers=[0], name="draft"), "self")
    if kind == "model":
        return ModelDrafter(runner(OTHER, CFG, page_size, backend=backend, name="draft"), "model")
    return EagleDrafter(eagle_runner(HEAD, page_size, backend=backend))


def target_only(ps, max_new, page_size=16, model=TARGET, cfg=CFG):
    tgt = runner(model, cfg, page_size)
    return SpeculativeDecoder(tgt, NoDrafter("cpu"), SpecParams(0)).generate(ps, max_new)


def run_tree(kind, shape, page_size, ps, max_new, backend="torch", max_context=256, small=False):
    """-> (output, target runner, drafter, number of iterations the tree path ran)."""
    K, S, N = shape
    model, cfg = (SMALL_TARGET, SMALL) if small else (TARGET, CFG)
    tgt = runner(model, cfg, page_size, backend=backend, max_context=max_context)
    if small:
        drafter = EagleDrafter(eagle_runner(SMALL_HEAD, page_size, backend=backend, max_context=max_context))
    else:
        drafter = drafter_for(kind, page_size, backend)
        drafter.runner.max_context = max_context
    dec = SpeculativeDecoder(tgt, drafter, SpecParams(N, topk=K, num_steps=S))
    calls, step = [0], dec.tree.step

    def counted(*a, **kw):
        calls[0] += 1
        return step(*a, **kw)

    dec.tree.step = counted
    out = dec.generate(ps, max_new)
    return out, tgt, drafter, calls[0]


def check_no_leak(tgt, drafter):
    assert tgt.allocator.num_free == tgt.allocator.num_pages
    assert drafter.runner.allocator.num_free == drafter.runner.allocator.num_pages


@pytest.mark.parametrize("page_size", [1, 3, 16])
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "K{}S{}N{}".format(*s))
@pytest.mark.parametrize("kind", ["self", "model", "eagle"])
def test_tree_greedy_equals_target_only_torch(kind, shape, page_size):
    ps = prompts(5, CFG.vocab_size)
    ref = target_only(ps, 20)
    out, tgt, drafter, tree_iters = run_tree(kind, shape, page_size, ps, 20)
    assert [r.output_ids for r in out.requests] == [r.output_ids for r in ref.requests]
    _, S, _ = shape
    taus = [t for r in out.requests for t in r.accept_lens]
    assert all(1 <= t <= S + 1 for t in taus)
    assert tree_iters == len(out.iterations)  # every iteration drafted a tree (the context never ran short)
    if kind != "eagle":  # the random head of the 96-token model accepts ~nothing (see the small test below)
        assert max(taus) > 1
    check_no_leak(tgt, drafter)


@pytest.mark.parametrize("page_size", [1, 3, 16])
@pytest.mark.parametrize("shape", [(2, 3, 5), (4, 3, 8)], ids=lambda s: "K{}S{}N{}".format(*s))
def test_tree_greedy_eagle_accepts_deep_paths(shape, page_size):
    ps = prompts(5, SMALL.vocab_size)
    ref = target_only(ps, 24, model=SMALL_TARGET, cfg=SMALL)
    out, tgt, drafter, _ = run_tree("eagle", shape, page_size, ps, 24, small=True)
    assert [r.output_ids for r in out.requests] == [r.output_ids for r in ref.requests]
    taus = [t for r in out.requests for t in r.accept_lens]
    assert max(taus) >= 3, taus  # depth-2 paths were accepted: the rollback and path draft-extend ran
    check_no_leak(tgt, drafter)


@pytest.mark.parametrize("kind", ["self", "model", "eagle"])
def test_tree_greedy_equals_target_only_triton(kind):
    """The triton kernels' custom-mask paths (interpreter on CPU: tiny shapes, one tree shape)."""
    ps = prompts(2, CFG.vocab_size)
    ref = target_only(ps, 8)
    out, tgt, drafter, tree_iters = run_tree(kind, (2, 3, 5), 3, ps, 8, backend="triton")
    assert [r.output_ids for r in out.requests] == [r.output_ids for r in ref.requests]
    assert tree_iters == len(out.iterations)
    check_no_leak(tgt, drafter)


def test_tree_near_the_context_end_drafts_chains_and_stays_lossless():
    """Where a whole tree does not fit the context, the loop drafts what fits (a chain) and stays exact."""
    ps = prompts(3, CFG.vocab_size)
    ref = target_only(ps, 40)
    out, tgt, drafter, tree_iters = run_tree("model", (2, 3, 5), 3, ps, 40, max_context=40)
    for r, want in zip(out.requests, ref.requests):
        n = len(r.output_ids)
        assert r.output_ids == want.output_ids[:n] and r.finish_reason in ("length", "context")
    assert 0 < tree_iters < len(out.iterations)
    check_no_leak(tgt, drafter)
