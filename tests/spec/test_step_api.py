"""The step API of the speculative loop: requests that join a running batch between iterations, and
requests dropped (preempted) and resumed by a prefill of their committed sequence, emit what a static
``generate`` emits (greedy fp32), for every drafter kind with per-request state (KV, EAGLE rows)."""

import random

import pytest

from attnlab.spec.decoder import LiveRequest, SpecParams, SpeculativeDecoder
from attnlab.spec.drafters import ModelDrafter, NgramDrafter, NoDrafter
from attnlab.spec.eagle import EagleDrafter
from attnlab.spec.records import RequestOutput
from tests.spec.tiny import eagle_runner, perturbed, prompts, runner, tiny_config, tiny_eagle, tiny_model

CFG = tiny_config(layers=3)
TARGET = tiny_model(CFG, seed=0)
OTHER = perturbed(TARGET, seed=1, noise=0.2)


def drafter(kind, page_size):
    if kind == "none":
        return NoDrafter("cpu")
    if kind == "ngram":
        return NgramDrafter("cpu")
    if kind == "model":
        return ModelDrafter(runner(OTHER, CFG, page_size, name="draft"), "model")
    return EagleDrafter(eagle_runner(tiny_eagle(TARGET, CFG, seed=4), page_size))


def staggered(dec, ps, budgets, seed, drop_every=0):
    """Requests join in random groups between iterations; with ``drop_every``, a random running request is
    dropped every that many iterations and put back in the queue (resumed by a later prefill)."""
    rng = random.Random(seed)
    batch = dec.start()
    queue = [LiveRequest(i, list(p), m, RequestOutput(prompt_ids=list(p)), 0.0)
             for i, (p, m) in zip(dec.new_ids(len(ps)), zip(ps, budgets))]
    done, it = [], 0
    while queue or batch.rows:
        if queue and (not batch.rows or rng.random() < 0.4):
            n = rng.randint(1, len(queue))
            joining, queue = queue[:n], queue[n:]
            done += dec.prefill(batch, joining)[1]
        if batch.rows:
            done += dec.step(batch).finished
            it += 1
        if drop_every and batch.rows and it % drop_every == 0:
            queue += dec.drop(batch, [rng.choice(batch.rows).id])
    dec.close(batch)
    return sorted(done, key=lambda r: r.id)


@pytest.mark.parametrize("kind", ["none", "ngram", "model", "eagle"])
@pytest.mark.parametrize("drop_every", [0, 3])
def test_joining_and_resumed_requests_emit_what_generate_emits(kind, drop_every):
    ps = prompts(7, CFG.vocab_size, seed=2)
    budgets = [3, 17, 9, 25, 1, 12, 20]  # per-request budgets: requests leave at different iterations
    k = 0 if kind == "none" else 3
    ref = SpeculativeDecoder(runner(TARGET, CFG, 4), drafter(kind, 4), SpecParams(k)).generate(ps, budgets)
    tgt = runner(TARGET, CFG, 4)
    d = drafter(kind, 4)
    out = staggered(SpeculativeDecoder(tgt, d, SpecParams(k)), ps, budgets, seed=1, drop_every=drop_every)
    assert [r.out.output_ids for r in out] == [r.output_ids for r in ref.requests]
    assert [len(r.out.output_ids) for r in out] == budgets
    assert tgt.allocator.num_free == tgt.allocator.num_pages  # no page left behind on either side
    if d.runner is not None:
        assert d.runner.allocator.num_free == d.runner.allocator.num_pages
    assert tgt.capture_layers is None


def test_generate_takes_one_budget_per_prompt():
    ps = prompts(3, CFG.vocab_size)
    out = SpeculativeDecoder(runner(TARGET, CFG), NgramDrafter("cpu"), SpecParams(2)).generate(ps, [2, 5, 9])
    assert [len(r.output_ids) for r in out.requests] == [2, 5, 9]
    assert all(r.finish_reason == "length" for r in out.requests)
