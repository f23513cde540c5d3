"""Speculative decoding must not change what the target generates (greedy, fp32)."""

import pytest
import torch

from attnlab.spec.decoder import SpecParams, SpeculativeDecoder
from attnlab.spec.drafters import ModelDrafter, NgramDrafter, NoDrafter
from tests.spec.tiny import perturbed, prompts, runner, tiny_config, tiny_model

CFG = tiny_config()
TARGET = tiny_model(CFG, seed=0)
OTHER = perturbed(TARGET, seed=1, noise=0.2)  # same vocabulary, other weights: agrees part of the time


def target_only(page_size, ps, max_new, eos=frozenset()):
    tgt = runner(TARGET, CFG, page_size)
    return SpeculativeDecoder(tgt, NoDrafter("cpu"), SpecParams(0)).generate(ps, max_new, eos)


def make_drafter(kind, page_size):
    if kind == "ngram":
        return NgramDrafter("cpu")
    if kind == "self":  # the target's first layer only: cheap and imperfect
        return ModelDrafter(runner(TARGET, CFG, page_size, layers=[0], name="draft"), "self")
    return ModelDrafter(runner(OTHER, CFG, page_size, name="draft"), "model")


@pytest.mark.parametrize("kind", ["self", "model"])
def test_one_launch_greedy_draft_accepts_as_the_per_step_loop(kind):
    """ModelDrafter.multistep (the default for greedy drafting: steps 1..k-1 as one multi-step pass) drafts the
    tokens the per-step loop drafts: the same outputs and the same acceptance, iteration by iteration."""
    ps = prompts(4, CFG.vocab_size)
    runs = []
    for multistep in (False, True):
        d = make_drafter(kind, 16)
        d.multistep = multistep
        out = SpeculativeDecoder(runner(TARGET, CFG, 16), d, SpecParams(4)).generate(ps, 20)
        runs.append([(r.output_ids, r.accept_lens) for r in out.requests])
    assert runs[0] == runs[1] and any(max(a) > 1 for _, a in runs[0])


@pytest.mark.parametrize("page_size", [1, 16])
@pytest.mark.parametrize("k", [1, 3, 8])
@pytest.mark.parametrize("kind", ["self", "ngram", "model"])
def test_greedy_speculative_equals_target_only(kind, k, page_size):
    ps = prompts(5, CFG.vocab_size)
    ref = target_only(page_size, ps, 24)
    tgt = runner(TARGET, CFG, page_size)
    drafter = make_drafter(kind, page_size)
    out = SpeculativeDecoder(tgt, drafter, SpecParams(k)).generate(ps, 24)
    for a, b in zip(out.requests, ref.requests):
        assert a.output_ids == b.output_ids
        assert all(1 <= t <= k + 1 for t in a.accept_lens)
    # every page went back on both sides
    assert tgt.allocator.num_free == tgt.allocator.num_pages
    if drafter.runner is not None:
        assert drafter.runner.allocator.num_free == drafter.runner.allocator.num_pages
    assert sum(r.batch_size for r in out.iterations) == sum(len(r.accept_lens) for r in out.requests)


@pytest.mark.parametrize("k", [1, 4])
def test_self_draft_with_identical_weights_accepts_everything(k):
    tgt = runner(TARGET, CFG, 4)
    drafter = ModelDrafter(runner(TARGET, CFG, 4, name="draft"), "self")
    out = SpeculativeDecoder(tgt, drafter, SpecParams(k)).generate(prompts(4, CFG.vocab_size), 1 + 3 * (k + 1))
    for r in out.requests:
        assert r.accept_lens == [k + 1] * 3


def test_committed_target_kv_equals_non_speculative_kv(monkeypatch):
    """Rollback leaves exactly the KV a plain decode over the same tokens would have written."""
    ps = prompts(4, CFG.vocab_size, seed=3)
    snapshots = {}

    def capture(label):
        def release(self, r):
            tgt = self.target
            n = tgt.kv_len(r)
            table = tgt.allocator.page_tables[r]
            snapshots[(label, r % 4)] = [tgt.pool.gather(l, table, n) for l in range(CFG.num_layers)]
            tgt.release(r)
            self.drafter.release(r)
        return release

    monkeypatch.setattr(SpeculativeDecoder, "_release", capture("ref"))
    ref = target_only(16, ps, 20)
    monkeypatch.setattr(SpeculativeDecoder, "_release", capture("spec"))
    out = SpeculativeDecoder(runner(TARGET, CFG, 1), make_drafter("model", 1), SpecParams(3)).generate(ps, 20)
    assert [r.output_ids for r in out.requests] == [r.output_ids for r in ref.requests]
    for i in range(4):
        for (k1, v1), (k2, v2) in zip(snapshots[("ref", i)], snapshots[("spec", i)]):
            # committed tokens: prompt + output minus the last one (the next verify input); a request that
            # stopped at max_new_tokens may hold accepted KV past that, freed with it
            n = len(ps[i]) + 20 - 1
            assert k1.shape[0] == n and k2.shape[0] >= n
            torch.testing.assert_close(k1, k2[:n], rtol=1e-5, atol=1e-5)
            torch.testing.assert_close(v1, v2[:n], rtol=1e-5, atol=1e-5)


class TestEdgeCases:
    def test_prompt_of_one_token(self):
        ps = [[7], [3]]
        ref = target_only(16, ps, 10)
        out = SpeculativeDecoder(runner(TARGET, CFG), make_drafter("model", 16), SpecParams(4)).generate(ps, 10)
        assert [r.output_ids for r in out.requests] == [r.output_ids for r in ref.requests]

    def test_max_new_tokens_smaller_than_k(self):
        ps = prompts(3, CFG.vocab_size)
        ref = target_only(16, ps, 2)
        tgt = runner(TARGET, CFG)
        out = SpeculativeDecoder(tgt, make_drafter("self", 16), SpecParams(8)).generate(ps, 2)
        assert [r.output_ids for r in out.requests] == [r.output_ids for r in ref.requests]
        assert all(len(r.output_ids) == 2 and r.finish_reason == "length" for r in out.requests)
        assert tgt.allocator.num_free == tgt.allocator.num_pages

    def test_eos_inside_accepted_draft(self):
        ps = prompts(4, CFG.vocab_size)
        ref = target_only(16, ps, 30)
        # an EOS that the target emits mid-way through request 0, inside an accepted run of drafts
        eos = ref.requests[0].output_ids[5]
        ref = target_only(16, ps, 30, eos={eos})
        drafter = ModelDrafter(runner(TARGET, CFG, name="draft"), "self")  # accepts everything
        out = SpeculativeDecoder(runner(TARGET, CFG), drafter, SpecParams(4)).generate(ps, 30, {eos})
        for a, b in zip(out.requests, ref.requests):
            assert a.output_ids == b.output_ids
        r0 = out.requests[0]
        assert r0.output_ids[-1] == eos and r0.finish_reason == "eos" and len(r0.output_ids) <= 6

    def test_k_larger_than_remaining_context(self):
        ps = [prompts(1, CFG.vocab_size)[0][:5], [1, 2]]
        ref = SpeculativeDecoder(runner(TARGET, CFG, max_context=16), NoDrafter("cpu"), SpecParams(0)).generate(ps, 50)
        tgt = runner(TARGET, CFG, max_context=16)
        drafter = ModelDrafter(runner(OTHER, CFG, max_context=16, name="draft"), "model")
        out = SpeculativeDecoder(tgt, drafter, SpecParams(8)).generate(ps, 50)
        assert [r.output_ids for r in out.requests] == [r.output_ids for r in ref.requests]
        for r in out.requests:
            assert len(r.prompt_ids) + len(r.output_ids) == 16 and r.finish_reason == "context"
        assert tgt.allocator.num_free == tgt.allocator.num_pages


def test_ttft_is_the_targets_first_token_and_the_drafter_prefill_is_apart():
    ps = prompts(3, CFG.vocab_size)
    out = SpeculativeDecoder(runner(TARGET, CFG, 16), make_drafter("model", 16), SpecParams(3)).generate(ps, 8)
    assert out.draft_prefill_ms > 0
    for r in out.requests:
        assert 0 < r.ttft_ms <= out.prefill_ms - out.draft_prefill_ms + 1e-6


@pytest.mark.parametrize("kind", ["ngram", "none"])
def test_the_iterations_sync_is_a_phase_of_its_own(kind, monkeypatch):
    """The host's wait at an iteration's one sync is timed as ``sync``, not inside the phase before it (draft-extend
    with a drafter, verify target-only): a sync that takes 30 ms (the pending timers read there, slowed) shows up in
    ``host_ms["sync"]`` and no other phase, and the iteration's total still sums every phase."""
    import time

    drafter = NgramDrafter("cpu") if kind == "ngram" else NoDrafter("cpu")
    dec = SpeculativeDecoder(runner(TARGET, CFG, 16), drafter, SpecParams(3 if kind == "ngram" else 0))
    dec.generate(prompts(2, CFG.vocab_size), 6)  # the process's first passes (lazy initialisation: ~0.1 s on CPU)
    slow = SpeculativeDecoder._read_pending

    def read_slowly(batch):
        time.sleep(0.03)
        slow(batch)

    monkeypatch.setattr(SpeculativeDecoder, "_read_pending", staticmethod(read_slowly))
    out = dec.generate(prompts(2, CFG.vocab_size), 6)
    timed = [it for it in out.iterations if it.host_ms]  # the last iteration's timers are read after the loop
    assert timed
    for it in timed:
        assert it.host_ms["sync"] >= 30.0 and it.sync_ms == pytest.approx(it.host_ms["sync"])  # CPU: one clock
        assert all(ms < 30.0 for ph, ms in it.host_ms.items() if ph != "sync"), it.host_ms
        parts = it.draft_ms + it.draft_extend_ms + it.verify_ms + it.accept_ms + it.sync_ms + it.other_ms
        assert it.total_ms == pytest.approx(parts)
