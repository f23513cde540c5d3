"""Multi-step greedy decode (engine.decode_steps_per_sync = N): the same tokens as one step per sync, one
iteration (one host sync) per N tokens, EOS / max_new_tokens honoured, the KV past a stop freed. CPU, eager:
the same step code the CUDA graph captures."""

import pytest
import torch

from attnlab.backends.base import Mode
from attnlab.spec.decoder import SpecParams, SpeculativeDecoder
from attnlab.spec.drafters import NoDrafter
from tests.spec.tiny import prompts, runner, tiny_config, tiny_model

CFG = tiny_config()
MODEL = tiny_model(CFG, seed=0)


def decode(n_steps, ps, max_new, eos=frozenset(), page_size=4, max_context=256, temperature=0.0):
    r = runner(MODEL, CFG, page_size, max_context=max_context)
    r.decode_steps_per_sync = n_steps
    out = SpeculativeDecoder(r, NoDrafter("cpu"), SpecParams(0, temperature=temperature)).generate(ps, max_new, eos)
    assert r.allocator.num_free == r.allocator.num_pages  # every page back, including those past a stop
    assert r.staging.copies == 1 + len(out.iterations)  # the prefill's, then one per iteration (N passes)
    return out


@pytest.mark.parametrize("n_steps", [2, 3, 5])
def test_same_tokens_as_one_step_per_sync(n_steps):
    ps = prompts(4, CFG.vocab_size)
    ref = decode(1, ps, 13)
    out = decode(n_steps, ps, 13)
    assert [o.output_ids for o in out.requests] == [o.output_ids for o in ref.requests]
    assert all(len(o.output_ids) == 13 and o.finish_reason == "length" for o in out.requests)
    # the first token comes from prefill, then ceil(12 / N) iterations of N steps (one sync each)
    assert len(out.iterations) == -(-12 // n_steps)
    assert all(it.accept_lens == [n_steps] * 4 for it in out.iterations)


def test_stops_at_eos_inside_a_multi_step_launch():
    ps = prompts(3, CFG.vocab_size)
    ref = decode(1, ps, 20)
    eos = ref.requests[0].output_ids[5]  # emitted mid-launch for N=4 (tokens 2..5 are the second launch)
    ref = decode(1, ps, 20, {eos})
    out = decode(4, ps, 20, {eos})
    assert [o.output_ids for o in out.requests] == [o.output_ids for o in ref.requests]
    r0 = out.requests[0]
    assert r0.finish_reason == "eos" and r0.output_ids[-1] == eos and len(r0.output_ids) <= 6


def test_falls_back_to_single_steps_near_max_context():
    ps = [prompts(1, CFG.vocab_size)[0][:5], [1, 2]]
    ref = decode(1, ps, 50, max_context=16)
    out = decode(4, ps, 50, max_context=16)
    assert [o.output_ids for o in out.requests] == [o.output_ids for o in ref.requests]
    assert all(len(o.prompt_ids) + len(o.output_ids) == 16 and o.finish_reason == "context" for o in out.requests)


def test_kv_after_multi_step_equals_single_step():
    ps = prompts(2, CFG.vocab_size, seed=4)
    kv = {}
    for n in (1, 3):
        r = runner(MODEL, CFG, page_size=4)
        r.decode_steps_per_sync = n
        dec = SpeculativeDecoder(r, NoDrafter("cpu"), SpecParams(0))
        dec._release = lambda req, r=r, n=n: kv.setdefault(n, []).append(
            (r.kv_len(req), r.pool.gather(0, r.allocator.page_tables[req], r.kv_len(req))[0].clone()))
        dec.generate(ps, 10)
    for (n1, k1), (n3, k3) in zip(kv[1], kv[3]):
        # a finished request holds at least its committed tokens minus the last; up to N - 1 more past a stop
        assert n3 >= n1
        torch.testing.assert_close(k1, k3[:n1], rtol=1e-5, atol=1e-5)


def test_sampling_keeps_one_step_per_sync():
    ps = prompts(2, CFG.vocab_size)
    out = decode(4, ps, 9, temperature=0.8)
    assert len(out.iterations) == 8 and all(it.accept_lens == [1, 1] for it in out.iterations)


def test_config_reaches_the_target_side_only():
    from types import SimpleNamespace

    from attnlab.sides import side_spec
    from tests.test_config import _validate

    plan = _validate("draft=self", "engine.decode_steps_per_sync=6")
    work = SimpleNamespace(page_size=16, max_context=64, draft_layers=(0,))
    assert side_spec(plan, work, "target", "torch").decode_steps_per_sync == 6
    assert side_spec(plan, work, "draft", "torch").decode_steps_per_sync == 1


@pytest.mark.parametrize("page_size", [1, 4, 16])
def test_device_planned_steps_match_the_host_planned_passes(page_size):
    """runner.prepare_device_steps + multistep.device_step_meta (what a device-planned graph computes) give every
    step the positions, pool slots and KV lengths the host's prepare_steps gives it; padded rows write nowhere."""
    from attnlab.engine.multistep import device_step_meta, device_step_views
    from attnlab.kvcache import slot_mapping

    starts, n = [0, 6, 15, 3], 5
    host, dev = runner(MODEL, CFG, page_size), runner(MODEL, CFG, page_size)
    reqs = list(range(len(starts)))
    for r in (host, dev):  # some KV already there, as after a prefill
        r.prepare(reqs, [0] * len(reqs), [max(s, 1) for s in starts], Mode.PREFILL)
    passes = host.prepare_steps(reqs, starts, n)
    meta, rows = dev.prepare_device_steps(reqs, starts, n, pad_to=6)
    assert rows == 6 and dev.staging.copies == host.staging.copies  # one copy for the n steps on both
    assert [dev.kv_len(q) for q in reqs] == [host.kv_len(q) for q in reqs] == [s + n for s in starts]
    kv_lens = torch.zeros(n, rows, dtype=torch.int32)
    positions, slots = device_step_meta(meta, rows, n, page_size, kv_lens)
    indptr, indices = device_step_views(meta, rows)
    for j, p in enumerate(passes):
        assert positions[j, :4].tolist() == p.positions.tolist()
        # the two runners allocated in another order (all steps at once vs step by step): each its own tables
        assert slots[j, :4].tolist() == [slot_mapping(dev.allocator.page_tables[q], s + j, s + j + 1, page_size)[0]
                                         for q, s in zip(reqs, starts)]
        assert kv_lens[j, :4].tolist() == p.meta.layout.kv_lens.tolist()
        assert slots[j, 4:].tolist() == [-1, -1] and kv_lens[j, 4:].tolist() == [1, 1]
    # one layout for every step: the last step's pages
    assert indptr[:5].tolist() == passes[-1].meta.layout.kv_indptr.tolist()
    assert indices[:indptr[4]].tolist() == [p for q, s in zip(reqs, starts)
                                            for p in dev.allocator.page_tables[q][:-(-(s + n) // page_size)]]
    assert indices[indptr[4]:].tolist() == [dev.pool.num_pages] * 2  # the dummies' scratch page


def test_device_planned_multi_step_decode_on_triton():
    """engine.decode_steps_per_sync on the triton backend runs its N steps device-planned: the same tokens as one
    host-planned step per sync (the interpreter; the graph replay of it: tests/integration/test_gpu_engine.py)."""
    ps = prompts(3, CFG.vocab_size)
    outs = []
    for n_steps in (1, 4):
        r = runner(MODEL, CFG, 4, backend="triton")
        r.decode_steps_per_sync = n_steps
        out = SpeculativeDecoder(r, NoDrafter("cpu"), SpecParams(0)).generate(ps, 9)
        assert r.allocator.num_free == r.allocator.num_pages
        outs.append([o.output_ids for o in out.requests])
        if n_steps > 1:
            assert "device-planned" in r.backend.kernel_info()["decode_steps"]
    assert outs[0] == outs[1]


@pytest.mark.parametrize("rows", [1, 3, 4, 6])
def test_device_steps_buffer_sections_are_aligned_and_the_capture_buffer_is_all_dummies(rows):
    """Every section of a device-steps buffer starts on a 16-byte boundary (Triton specializes kernels on pointer
    alignment), each step's KV-length row too; the buffer a graph is captured over holds only dummies: position 0,
    KV length 1 on the scratch page, slot -1 (writes nothing) at every step."""
    from attnlab.engine.multistep import (
        device_step_lens,
        device_step_meta,
        device_step_views,
        device_steps_layout,
        dummy_device_steps_meta,
    )

    assert all(o % 4 == 0 for o in device_steps_layout(rows))
    lens = device_step_lens(3, rows, "cpu")
    assert lens.shape == (3, rows) and all(lens[j].data_ptr() % 16 == 0 for j in range(3))
    meta = dummy_device_steps_meta(rows, capacity=rows + 5, scratch_page=99, device="cpu")
    assert meta.data_ptr() % 16 == 0
    positions, slots = device_step_meta(meta, rows, 3, 16, lens)
    assert positions.eq(0).all() and slots.eq(-1).all() and lens.eq(1).all()
    indptr, indices = device_step_views(meta, rows)
    assert indptr.tolist() == list(range(rows + 1)) and indices[:rows].tolist() == [99] * rows
    assert indptr.data_ptr() % 16 == 0 and indices.data_ptr() % 16 == 0
