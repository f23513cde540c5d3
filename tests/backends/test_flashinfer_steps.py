"""flashinfer's device-planned draft steps through the fake flashinfer module (CPU): one host plan per launch, each
step's last-page length rewritten on the device, the same attention at every step as a host plan of that step,
and the engine's fallback to host-planned steps for launches that cross a page boundary."""

import pytest
import torch

from attnlab.backends.flashinfer import FlashInferBackend
from attnlab.engine import multistep
from attnlab.engine.runner import ModelRunner
from attnlab.errors import ConfigError
from attnlab.kvcache import KVPool, PageAllocator
from attnlab.spec.decoder import SpecParams, SpeculativeDecoder
from attnlab.spec.drafters import NoDrafter
from tests.backends.cases import make_case
from tests.backends.fakes import FakeDecode
from tests.backends.test_flashinfer import (
    SMALL_WS,
    backend,
    cpu_case,
    meta_over,
    needs_flashinfer_gpu,
    reference,
    run_all_layers,
)
from tests.spec.tiny import prompts, tiny_config, tiny_model

STARTS, N = [5, 17, 9], 3  # step j of request i feeds position STARTS[i] + j: KV length STARTS[i] + 1 + j


def plans_made() -> int:
    return sum(len(w.plans) for w in FakeDecode.created)


@pytest.mark.parametrize("page_size", [4, 16])
def test_one_plan_per_launch_and_each_step_attends_its_own_length(fake_fi, page_size):
    case = cpu_case([1] * 3, [s + N for s in STARTS], page_size=page_size, gqa=3)
    be = backend(case, cuda_graph=True, max_batch_size=4, max_context=64)
    assert be.supports_device_steps() and be.device_steps_fit(STARTS, N)
    rows, scratch = 4, case.pool.num_pages  # one dummy row on the scratch page, KV length 1 at every step
    lay = case.meta.layout
    indptr = lay.kv_indptr.tolist() + [int(lay.kv_indptr[-1]) + 1]
    indices = torch.cat([lay.kv_indices, torch.tensor([scratch], dtype=torch.int32)])
    kv_lens = torch.tensor([[s + 1 + j for s in STARTS] + [1] for j in range(N)], dtype=torch.int32)
    dev_indptr = torch.tensor(indptr, dtype=torch.int32)
    be.device_step_plans(rows, N, dev_indptr, indices, kv_lens)
    be.device_steps_host_plan(rows, indptr, [s + 1 for s in STARTS] + [1], dev_indptr, indices)
    assert plans_made() == 1
    q = torch.cat([case.q, torch.randn(1, *case.q.shape[1:]).to(case.q.dtype)])
    for j in range(N):
        be.use_step(j)
        got = torch.stack([be.run(q, layer)[:3].float() for layer in range(case.pool.num_layers)])
        want = reference(case, meta_over(case, [s + 1 + j for s in STARTS], [1] * 3), case.q)
        torch.testing.assert_close(got, want, atol=2e-2, rtol=2e-2)
        assert be.active_plan.wrapper.bufs["last"][3] == 1  # the dummy row stays one token on its page
    assert plans_made() == 1  # the steps planned nothing
    assert "planned once per launch" in be.kernel_info()["decode_steps"]


def test_when_device_steps_apply(fake_fi):
    case = cpu_case([1] * 3, [20, 7, 33], page_size=4, gqa=3)
    be = backend(case, cuda_graph=True, max_batch_size=4, max_context=64)
    assert be.device_steps_fit([0, 4, 9], 3)  # lengths 1..3, 5..7, 10..12: one page count each
    assert not be.device_steps_fit([0, 6], 3)  # 7..9 crosses from 2 pages to 3
    assert not be.device_steps_fit([3], 2)  # 4..5 crosses
    off = [backend(case, max_batch_size=4),  # no CUDA-graph buffers: plain wrappers own their lengths
           backend(case, cuda_graph=True, max_batch_size=4, device_steps=False)]
    assert not any(b.supports_device_steps() for b in off)
    tc = cpu_case([1] * 3, [20, 7, 33], page_size=4, gqa=4)  # GQA 4: tensor-core decode, which plans on lengths
    assert not backend(tc, cuda_graph=True, max_batch_size=4).supports_device_steps()
    with pytest.raises(NotImplementedError, match="device_steps=true"):
        off[1].device_step_plans(4, 3, torch.zeros(5, dtype=torch.int32), torch.zeros(4, dtype=torch.int32),
                                 torch.ones(3, 4, dtype=torch.int32))
    with pytest.raises(ValueError, match="change FlashInfer.s schedule"):  # pages the first step lacks, no model
        be.device_steps_host_plan(1, [0, 3], [5], torch.tensor([0, 3], dtype=torch.int32),
                                  torch.zeros(3, dtype=torch.int32))
    with pytest.raises(ConfigError, match="device_steps='yes'"):
        FlashInferBackend.check_options({"device_steps": "yes"}, "backend.options")


def fi_runner(model, cfg, device_steps: bool, page_size=4, max_context=128) -> ModelRunner:
    pages = 8 * -(-max_context // page_size)
    pool = KVPool(cfg.num_layers, pages, page_size, cfg.num_kv_heads, cfg.head_dim, torch.bfloat16, "cpu")
    be = FlashInferBackend(pool, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim, cfg.head_dim ** -0.5,
                           torch.bfloat16, cuda_graph=True, max_batch_size=8, max_context=max_context,
                           workspace_bytes=SMALL_WS, device_steps=device_steps)
    return ModelRunner(model, cfg, None, pool, PageAllocator(pages, page_size), be, max_context, "target")


def test_multi_step_decode_takes_both_paths_with_the_same_tokens(fake_fi, monkeypatch):
    """engine.decode_steps_per_sync = 3 on flashinfer (eager, graph-mode buffers): launches in which no request
    crosses a page run device-planned (one plan), the others host-planned; the tokens equal those of
    host-planned steps everywhere (device_steps=false): the fake attends exactly what the buffers say."""
    cfg = tiny_config(heads=6, kv_heads=2, head_dim=64)
    model = tiny_model(cfg, seed=0, dtype=torch.bfloat16)
    ps = prompts(3, cfg.vocab_size)
    calls = []
    real = multistep._device_steps
    monkeypatch.setattr(multistep, "_device_steps", lambda r, reqs, starts, *a: calls.append(list(starts))
                        or real(r, reqs, starts, *a))
    outs = []
    for device_steps in (False, True):
        r = fi_runner(model, cfg, device_steps, page_size=16)
        r.decode_steps_per_sync = N
        out = SpeculativeDecoder(r, NoDrafter("cpu"), SpecParams(0)).generate(ps, 31)
        assert r.allocator.num_free == r.allocator.num_pages
        outs.append([o.output_ids for o in out.requests])
        launches = len(out.iterations)
        if not device_steps:
            assert not calls
        else:  # consecutive launches inside the same pages kept the previous launch's plan
            assert r.backend.step_plans_reused > 0
    assert outs[0] == outs[1]
    # once a plan confirmed FlashInfer's schedule model, launches that cross a page (page size 16, 3 steps) run
    # device-planned too; before that, they plan every step on the host
    assert 0 < len(calls) <= launches and r.backend.step_launches_widened > 0
    assert all(r.backend.device_steps_fit(s, N) for s in calls)


@pytest.mark.parametrize("keep_plans", [True, False])
def test_a_launch_with_the_previous_page_counts_keeps_its_plan(fake_fi, keep_plans):
    """The next launch with the same page counts (each request's next tokens still inside its pages) copies the
    page ids and plans nothing. A host plan of slot 1 in between (a launch that crossed a page) with the same page
    counts keeps that plan too (keep_plans), and the launch after it still finds it; with keep_plans off the host
    plan plans, and so does the launch after it. Each step still attends its own length."""
    ps = 16
    case = cpu_case([1] * 3, [s + 2 * N for s in STARTS], page_size=ps, gqa=3)
    be = backend(case, cuda_graph=True, max_batch_size=4, max_context=64, keep_plans=keep_plans)
    lay = case.meta.layout
    indptr, indices = lay.kv_indptr.tolist(), lay.kv_indices
    kv_lens = torch.zeros(N, 3, dtype=torch.int32)
    be.device_step_plans(3, N, lay.kv_indptr, indices, kv_lens)

    def launch(starts):
        kv_lens.copy_(torch.tensor([[s + 1 + j for s in starts] for j in range(N)], dtype=torch.int32))
        be.device_steps_host_plan(3, indptr, [s + 1 for s in starts], lay.kv_indptr, indices)
        for j in range(N):
            be.use_step(j)
            got = torch.stack([be.run(case.q, layer).float() for layer in range(case.pool.num_layers)])
            want = reference(case, meta_over(case, [s + 1 + j for s in starts], [1] * 3), case.q)
            torch.testing.assert_close(got, want, atol=2e-2, rtol=2e-2)

    assert be.device_steps_fit(STARTS, 2 * N)
    launch(STARTS)
    launch([s + N for s in STARTS])  # the next launch, same pages
    assert (plans_made(), be.step_plans_reused) == (1, 1)
    be.plan_slot(meta_over(case, [s + 1 for s in STARTS], [1] * 3), 1)  # a host-planned launch's step 0
    launch(STARTS)
    assert (plans_made(), be.step_plans_reused, be.plans_kept) == ((1, 2, 1) if keep_plans else (3, 1, 0))


def test_a_kept_plan_rewrites_the_layout_another_bucket_left_in_the_shared_buffers(fake_fi):
    """Every slot-1 wrapper (one per bucket) reads the same slot buffers. Bucket 4 keeps its plan, bucket 2 plans
    and writes its own kv_indptr there, then bucket 4 launches again with its kept page counts: the reused launch
    must rewrite kv_indptr, or the kernel reads bucket 2's (review of 2026-12-02: max error 0.77 before the fix)."""
    n, starts = 2, [5, 20, 9, 40]  # page 16: 1, 2, 1, 3 pages for lengths s + 1 .. s + n
    case = cpu_case([1] * 4, [s + n for s in starts], page_size=16, gqa=3)
    be = backend(case, cuda_graph=True, max_batch_size=4, max_context=64)
    lay = case.meta.layout
    ind4, idx4 = lay.kv_indptr.tolist(), lay.kv_indices
    tables = [idx4[ind4[i]:ind4[i + 1]] for i in range(4)]

    def launch(rows, st, indptr, indices):
        kv_lens = torch.tensor([[s + 1 + j for s in st] for j in range(n)], dtype=torch.int32)
        dev = torch.tensor(indptr, dtype=torch.int32)
        be.device_step_plans(rows, n, dev, indices, kv_lens)
        be.device_steps_host_plan(rows, indptr, [s + 1 for s in st], dev, indices)

    launch(4, starts, ind4, idx4)
    launch(2, [starts[3], starts[1]], [0, 3, 5], torch.cat([tables[3], tables[1]]))  # requests 3 and 1 alone
    launch(4, starts, ind4, idx4)
    assert be.step_plans_reused == 1
    for j in range(n):
        be.use_step(j)
        got = torch.stack([be.run(case.q, layer).float() for layer in range(case.pool.num_layers)])
        want = reference(case, meta_over(case, [s + 1 + j for s in starts], [1] * 4), case.q)
        torch.testing.assert_close(got, want, atol=2e-2, rtol=2e-2)


def test_multi_step_decode_with_the_batch_changing_between_runs(fake_fi):
    """One flashinfer runner decodes batches of 3, 1 and 3 requests in turn (other buckets' plans land in the
    shared slot buffers between a bucket's kept-plan launches): the tokens equal host-planned steps' every time."""
    cfg = tiny_config(heads=6, kv_heads=2, head_dim=64)
    model = tiny_model(cfg, seed=0, dtype=torch.bfloat16)
    ps = prompts(3, cfg.vocab_size)
    runs = []
    for device_steps in (False, True):
        r = fi_runner(model, cfg, device_steps, page_size=16)
        r.decode_steps_per_sync = N
        dec = SpeculativeDecoder(r, NoDrafter("cpu"), SpecParams(0))
        runs.append([[o.output_ids for o in dec.generate(batch, 20).requests] for batch in (ps, ps[:1], ps)])
        assert r.allocator.num_free == r.allocator.num_pages
    assert runs[0] == runs[1]


@pytest.mark.parametrize("max_grid", [16, 64, 264])
@pytest.mark.parametrize("page_size", [1, 4, 16])
def test_the_schedule_model_is_the_planners(fake_fi, max_grid, page_size, monkeypatch):
    """flashinfer_schedule.decode_schedule, fed the (split, grid rows) a plan reports, predicts the chunk size and
    every row's tiles the planner wrote (the fake transliterates FlashInfer 0.7.2's scheduler.cuh on its own), for
    random page counts, with and without split."""
    from attnlab.backends import flashinfer_schedule as fis

    monkeypatch.setattr(FakeDecode, "MAX_GRID", max_grid)
    g = torch.Generator().manual_seed(max_grid + page_size)
    for _ in range(40):
        rows = int(torch.randint(1, 9, (1,), generator=g))
        pages = torch.randint(0, 300, (rows,), generator=g).tolist()
        w = FakeDecode(torch.zeros(8, dtype=torch.uint8), use_cuda_graph=True)
        w._decode_plan(pages, 2, page_size)
        known = fis.learned(w)
        assert fis.decode_schedule(pages, page_size, *known) == fis.planned(w, rows, page_size), (pages, known)


def test_a_launch_that_crosses_a_page_runs_on_one_plan(fake_fi):
    """Page 4, 3 steps, request 0 at lengths 7..9 crosses from 2 pages to 3. Before any plan confirmed the schedule
    model it does not fit; after one (a launch within pages on the same layout), it fits, keeps that plan (same
    schedule) and each step attends its own length (the steps before the crossing with a last-page length <= 0
    in the buffer the kernel reads; the fake checks no tile starts past a length)."""
    ps, rows = 4, 4
    cross, within = [6, 17, 9], [8, 17, 9]  # first-step lengths 7 / 9: layout (the last step's) 3, 5, 3 pages
    case = cpu_case([1] * 3, [s + N for s in cross], page_size=ps, gqa=3)
    be = backend(case, cuda_graph=True, max_batch_size=4, max_context=64)
    lay = case.meta.layout
    indptr = lay.kv_indptr.tolist() + [int(lay.kv_indptr[-1]) + 1]
    indices = torch.cat([lay.kv_indices, torch.tensor([case.pool.num_pages], dtype=torch.int32)])
    dev_indptr = torch.tensor(indptr, dtype=torch.int32)
    kv_lens = torch.zeros(N, rows, dtype=torch.int32)
    be.device_step_plans(rows, N, dev_indptr, indices, kv_lens)
    q = torch.cat([case.q, torch.randn(1, *case.q.shape[1:]).to(case.q.dtype)])

    def launch(starts):
        kv_lens.copy_(torch.tensor([[s + 1 + j for s in starts] + [1] for j in range(N)], dtype=torch.int32))
        be.device_steps_host_plan(rows, indptr, [s + 1 for s in starts] + [1], dev_indptr, indices)
        for j in range(N):
            be.use_step(j)
            got = torch.stack([be.run(q, layer)[:3].float() for layer in range(case.pool.num_layers)])
            want = reference(case, meta_over(case, [s + 1 + j for s in starts], [1] * 3), case.q)
            torch.testing.assert_close(got, want, atol=2e-2, rtol=2e-2)

    assert not be.device_steps_fit(cross, N, rows)  # no plan yet: the model is unconfirmed
    assert be.device_steps_fit(within, N, rows)
    launch(within)
    assert be.device_steps_fit(cross, N, rows) and plans_made() == 1
    launch(cross)
    assert (plans_made(), be.step_plans_reused, be.step_launches_widened) == (1, 1, 1)
    assert int(be.active_plan.wrapper.bufs["last"][0]) == 9 - 2 * ps  # the last step: 9 tokens on 3 pages
    be.use_step(0)
    assert int(be.active_plan.wrapper.bufs["last"][0]) == 7 - 2 * ps  # step 0: 7 tokens, last page empty (-1)


def test_a_crossing_that_changes_the_schedule_plans_every_step(fake_fi, monkeypatch):
    """Page 16: FlashInfer's chunks are >= 8 pages (128 tokens). Crossing from 1 page to 2 keeps one tile; from 8
    pages to 9 adds a tile (its first step would meet a tile past its length): that launch does not fit. And when
    a plan disagrees with the model (another FlashInfer), no crossing fits any more."""
    case = cpu_case([1], [140], page_size=16, gqa=3)
    # keep_plans off: the host plan_slot below must really plan, so the changed planner's disagreement is seen here
    # (with kept plans a same-schedule host plan keeps its plan: test_flashinfer_keep.py covers that path's checks)
    be = backend(case, cuda_graph=True, max_batch_size=4, max_context=256, keep_plans=False)
    lay = case.meta.layout
    indptr = lay.kv_indptr.tolist()
    be.device_step_plans(1, N, lay.kv_indptr, lay.kv_indices, torch.zeros(N, 1, dtype=torch.int32))
    be.device_steps_host_plan(1, indptr, [137], lay.kv_indptr, lay.kv_indices)  # 137..139: 9 pages throughout
    assert be.device_steps_fit([14], N, 1) and be.device_steps_fit([62], N, 1)  # 1 -> 2, 4 -> 5 pages
    assert not be.device_steps_fit([126], N, 1)  # 127..129: 8 -> 9 pages, one tile -> two
    with pytest.raises(ValueError, match="change FlashInfer.s schedule"):
        be.device_steps_host_plan(1, indptr, [127], lay.kv_indptr, lay.kv_indices)
    monkeypatch.setattr(FakeDecode, "CHUNK_BIAS", 1)
    be.plan_slot(meta_over(case, [129], [1]), 1)  # a host-planned step in slot 1: the next launch plans anew
    be.device_steps_host_plan(1, indptr, [129], lay.kv_indptr, lay.kv_indices)
    assert not be.device_steps_fit([14], N, 1) and be.device_steps_fit([20], N, 1)  # within pages still fits


@pytest.mark.gpu
@needs_flashinfer_gpu
def test_gpu_a_launch_that_crosses_pages_gives_each_steps_own_bits():
    """The real FlashInfer: its plan at the capture-like trivial layout confirms the schedule model; then a launch
    of 4 steps in which two requests cross a page (1 -> 2 and 3 -> 4 pages, beside 19- and 63-page requests, so the
    split runs 1 to 8 tiles a request) runs on one plan of its last-step layout and gives every step the bits of
    that step's own host plan, close to the reference."""
    ps, n, rows = 16, 4, 4
    starts = [14, 300, 1000, 45]
    case = make_case(kv_lens=[s + n for s in starts], q_lens=[1] * rows, page_size=ps, num_kv_heads=2, gqa=3,
                     head_dim=64, dtype=torch.bfloat16, device="cuda", num_layers=2)
    be, host = (FlashInferBackend(case.pool, case.num_q_heads, case.num_kv_heads, case.head_dim, case.scale,
                                  torch.bfloat16, cuda_graph=True, max_batch_size=rows, max_context=2048)
                for _ in range(2))
    lay = case.meta.layout
    indptr, indices = lay.kv_indptr.tolist(), lay.kv_indices
    kv_lens = torch.zeros(n, rows, dtype=torch.int32, device="cuda")
    be.device_step_plans(rows, n, lay.kv_indptr, indices, kv_lens)
    trivial = torch.arange(rows + 1, dtype=torch.int32, device="cuda")
    be.device_steps_host_plan(rows, list(range(rows + 1)), [1] * rows, trivial, indices)  # as a graph capture
    assert be._schedule_model_ok and be.device_steps_fit(starts, n, rows)
    kv_lens.copy_(torch.tensor([[s + 1 + j for s in starts] for j in range(n)], dtype=torch.int32))
    be.device_steps_host_plan(rows, indptr, [s + 1 for s in starts], lay.kv_indptr, indices)
    assert be.step_launches_widened == 1 and be._schedule_model_ok
    metas = [meta_over(case, [s + 1 + j for s in starts], [1] * rows) for j in range(n)]
    host.plan_steps(metas)
    for j in range(n):
        be.use_step(j)
        host.use_step(j)
        got, want = run_all_layers(be, case), run_all_layers(host, case)
        assert torch.equal(got, want), f"step {j}: device-planned bits differ from the step's own plan"
        torch.testing.assert_close(got, reference(case, metas[j], case.q), atol=2e-2, rtol=2e-2)


def test_page_size_1_launches_cross_several_pages_on_one_plan(fake_fi):
    """Page 1, 3 steps: every launch gains two pages, its first step two pages short of the layout (a last-page
    length of -1 in the buffer): it fits, plans once, and each step attends its own length."""
    ps, rows, starts = 1, 2, [5, 9]
    case = cpu_case([1] * rows, [s + N for s in starts], page_size=ps, gqa=3)
    be = backend(case, cuda_graph=True, max_batch_size=4, max_context=64)
    lay = case.meta.layout
    indptr = lay.kv_indptr.tolist()
    kv_lens = torch.zeros(N, rows, dtype=torch.int32)
    be.device_step_plans(rows, N, lay.kv_indptr, lay.kv_indices, kv_lens)
    be.device_steps_host_plan(rows, list(range(rows + 1)), [1] * rows, torch.arange(rows + 1, dtype=torch.int32),
                              lay.kv_indices)  # as a graph capture: confirms the model
    assert be.device_steps_fit(starts, N, rows)
    kv_lens.copy_(torch.tensor([[s + 1 + j for s in starts] for j in range(N)], dtype=torch.int32))
    be.device_steps_host_plan(rows, indptr, [s + 1 for s in starts], lay.kv_indptr, lay.kv_indices)
    assert be.step_launches_widened == 1
    for j in range(N):
        be.use_step(j)
        got = torch.stack([be.run(case.q, layer).float() for layer in range(case.pool.num_layers)])
        want = reference(case, meta_over(case, [s + 1 + j for s in starts], [1] * rows), case.q)
        torch.testing.assert_close(got, want, atol=2e-2, rtol=2e-2)
    be.use_step(0)
    assert be.active_plan.wrapper.bufs["last"][:rows].tolist() == [-1, -1]


def test_a_kept_plan_serves_another_layout_of_the_same_schedule(fake_fi):
    """Two launches on different page counts (3, 5, 3 then 2, 5, 4 pages at page 4: one tile each either way) keep
    one plan; the second's layout reaches the buffers from the device at step 0 and each step attends it."""
    ps, rows = 4, 3
    case = cpu_case([1] * rows, [12, 20, 16], page_size=ps, gqa=3)
    be = backend(case, cuda_graph=True, max_batch_size=4, max_context=64)
    lay = case.meta.layout
    tables = [lay.kv_indices[int(lay.kv_indptr[i]):int(lay.kv_indptr[i + 1])] for i in range(rows)]
    kv_lens = torch.zeros(N, rows, dtype=torch.int32)
    launches = [([8, 17, 9], [3, 5, 3]), ([5, 17, 13], [2, 5, 4])]  # first step 9 / 6 tokens ... last step's pages
    dev_indptr = torch.zeros(rows + 1, dtype=torch.int32)
    indices = torch.zeros(int(lay.kv_indices.numel()) + 8, dtype=torch.int32)
    be.device_step_plans(rows, N, dev_indptr, indices, kv_lens)
    for starts, pages in launches:
        indptr = [0]
        for p in pages:
            indptr.append(indptr[-1] + p)
        dev_indptr.copy_(torch.tensor(indptr, dtype=torch.int32))
        ids = torch.cat([t[:p] for t, p in zip(tables, pages)])
        indices.zero_()
        indices[:len(ids)] = ids
        kv_lens.copy_(torch.tensor([[s + 1 + j for s in starts] for j in range(N)], dtype=torch.int32))
        be.device_steps_host_plan(rows, indptr, [s + 1 for s in starts], dev_indptr, indices)
        for j in range(N):
            be.use_step(j)
            got = torch.stack([be.run(case.q, layer).float() for layer in range(case.pool.num_layers)])
            want = reference(case, meta_over(case, [s + 1 + j for s in starts], [1] * rows), case.q)
            torch.testing.assert_close(got, want, atol=2e-2, rtol=2e-2)
    assert (plans_made(), be.step_plans_reused) == (1, 1)


def test_a_plan_that_disagrees_with_the_model_runs_nothing(fake_fi, monkeypatch):
    """The model, confirmed, says a launch from 4 to 5 pages (page 16) keeps one tile; a FlashInfer whose chunk is 4
    pages (CHUNK_BIAS -4) plans 2 tiles for 5 pages, 1 for the first step's 4: device_steps_host_plan raises
    DeviceStepsUnfit before any step runs, keeps no plan, and the model is off."""
    from attnlab.backends.base import DeviceStepsUnfit

    case = cpu_case([1], [66], page_size=16, gqa=3)
    # keep_plans off: the host plan_slot below must really plan, so the changed planner's disagreement is seen here
    # (with kept plans a same-schedule host plan keeps its plan: test_flashinfer_keep.py covers that path's checks)
    be = backend(case, cuda_graph=True, max_batch_size=4, max_context=256, keep_plans=False)
    lay = case.meta.layout
    be.device_step_plans(1, 4, lay.kv_indptr, lay.kv_indices, torch.zeros(4, 1, dtype=torch.int32))
    be.device_steps_host_plan(1, [0, 1], [1], torch.tensor([0, 1], dtype=torch.int32), lay.kv_indices)
    assert be.device_steps_fit([62], 4, 1)  # 63..66 tokens: 4 -> 5 pages
    monkeypatch.setattr(FakeDecode, "CHUNK_BIAS", -4)
    be.plan_slot(meta_over(case, [63], [1]), 1)  # drops the kept plan: the launch plans anew
    with pytest.raises(DeviceStepsUnfit):
        be.device_steps_host_plan(1, lay.kv_indptr.tolist(), [63], lay.kv_indptr, lay.kv_indices)
    assert not be._schedule_model_ok and not be.device_steps_fit([62], 4, 1)
    assert not be._step_plans


@pytest.mark.parametrize("device", ["cpu", "cpu-torch", pytest.param("cuda", marks=[pytest.mark.gpu, pytest.mark.skipif(
    not torch.cuda.is_available(), reason="needs a CUDA GPU: the compiled kernel")])])
@pytest.mark.parametrize("copy", [False, True])
def test_step_meta_kernel(copy, device, monkeypatch):
    """attnlab.kernels.steps.write_step_meta: last-page lengths (<= 0 a page or more ahead), and at step 0 the layout:
    kv_indptr and only the kv_indptr[rows] page ids it uses, over several programs. On CPU tensors the interpreter
    runs the kernel (CI) or, where Triton compiles for a GPU, its torch twin; on cuda the compiled kernel."""
    from attnlab.kernels import steps

    if device == "cpu-torch":  # the torch twin, as on a GPU machine's CPU tensors
        monkeypatch.setattr(steps, "interpreter_on", lambda: False)
        monkeypatch.setattr(steps.torch.cuda, "is_available", lambda: True)
        device = "cpu"
    rows, ps = 3, 4
    t = lambda x: torch.tensor(x, dtype=torch.int32, device=device)
    indptr = t([0, 700, 1500, 2600])  # 2,600 page ids: 3 programs of 1,024
    kv_lens = t([2797, 3199, 4397])  # last pages 1, 3, -3 ... (pages - 1) x 4 + last
    last = torch.full((rows,), 99, dtype=torch.int32, device=device)
    src = torch.arange(3000, dtype=torch.int32, device=device)
    dst_ptr = torch.zeros(rows + 1, dtype=torch.int32, device=device)
    dst = torch.full((3100,), -7, dtype=torch.int32, device=device)
    steps.write_step_meta(kv_lens, indptr, last, ps, (dst_ptr, src, dst) if copy else None)
    assert last.tolist() == [2797 - 699 * ps, 3199 - 799 * ps, 4397 - 1099 * ps] == [1, 3, 1]
    if copy:
        assert torch.equal(dst_ptr, indptr) and torch.equal(dst[:2600], src[:2600])
        assert (dst[2600:] == -7).all()  # past the launch's page ids: untouched
        with pytest.raises(ValueError, match="do not fit"):
            steps.write_step_meta(kv_lens, indptr, last, ps, (dst_ptr, src, dst[:100]))
    else:
        assert (dst == -7).all()
