"""flashinfer's kept plans (CPU, through the fake module, whose plans transliterate FlashInfer 0.7.2's graph-mode
schedulers on their own): a graph-mode decode or fa2 verify / extend pass whose schedule equals the one its wrapper
holds writes only its layout, attends exactly what a fresh plan would, and the model that says so is checked
against every real plan."""

import pytest
import torch

from attnlab.backends import flashinfer_schedule as fis
from attnlab.backends.base import Mode
from attnlab.backends.flashinfer import FlashInferBackend
from tests.backends.cases import make_case
from tests.backends.fakes import FakeDecode, FakePrefill
from tests.backends.test_flashinfer import backend, cpu_case, meta_over, needs_flashinfer_gpu, reference

MAX_LENS = [170, 60, 110]  # the case's pages: every pass below stays within them
SPLIT = {"verify_split_kv": True}  # the split-KV schedule model's tests: explicit, as under auto these passes run whole


def plans_made() -> int:
    return sum(len(w.plans) for w in FakeDecode.created + FakePrefill.created)


def run_pass(be, case, kv_lens, q_len, g):
    """Plan and run one pass of q_len new tokens per request at these lengths; check it against the reference."""
    meta = meta_over(case, kv_lens, [q_len] * len(kv_lens), Mode.DECODE if q_len == 1 else Mode.VERIFY)
    q = torch.randn(q_len * len(kv_lens), case.num_q_heads, case.head_dim, generator=g).to(case.q.dtype)
    be.plan(meta)
    got = torch.stack([be.run(q, layer).float() for layer in range(case.pool.num_layers)])
    torch.testing.assert_close(got, reference(case, meta, q), atol=2e-2, rtol=2e-2)


@pytest.mark.parametrize("q_len", [1, 5])
@pytest.mark.parametrize("page_size", [1, 4, 16])
def test_passes_of_one_schedule_keep_the_plan_and_attend_their_own_lengths(fake_fi, q_len, page_size):
    """Lengths grow by 0-2 tokens a pass (pages crossed on the way, one request at a chunk boundary at page 1); a
    batch-2 bucket plans into the shared slot buffers in between. Every pass equals the reference; the passes after
    the first real plan of a schedule keep it (the fake's kernel asserts no chunk starts past a length)."""
    case = cpu_case([1] * 3, MAX_LENS, page_size=page_size, gqa=3)
    be = backend(case, cuda_graph=True, max_batch_size=4, max_context=200, **SPLIT)
    g = torch.Generator().manual_seed(page_size + q_len)
    lens = [120, 10, 60]
    for i in range(24):
        run_pass(be, case, lens, q_len, g)
        if i % 7 == 3:  # another bucket writes its layout into the same slot buffers
            run_pass(be, case, lens[:2], q_len, g)
        lens = [n + int(torch.randint(0, 3, (1,), generator=g)) for n in lens]
    assert be.plans_made + be.plans_kept == 24 + 3 and be.plans_made == plans_made()
    assert be.plans_kept >= 12, (be.plans_made, be.plans_kept)
    assert be._schedule_model_ok if q_len == 1 else be._prefill_model_ok  # every real plan agreed with the model


def test_a_kept_plan_rewrites_the_query_indptr_another_q_len_left_in_the_slot(fake_fi):
    """Verify wrappers of several q_lens (k = 4 and k = 2) share slot 0's qo_indptr buffer: a q_len-5 pass keeps its
    plan after a q_len-3 pass wrote its offsets there, and still attends exactly (it rewrites qo_indptr)."""
    case = cpu_case([1] * 3, MAX_LENS, page_size=16, gqa=3)
    be = backend(case, cuda_graph=True, max_batch_size=4, max_context=200)
    g = torch.Generator().manual_seed(7)
    run_pass(be, case, [100, 20, 50], 5, g)
    run_pass(be, case, [100, 20, 50], 3, g)
    run_pass(be, case, [101, 21, 51], 5, g)  # same schedule: kept
    assert be.plans_kept == 1


def test_kept_plans_are_checked_by_a_real_plan_every_so_often(fake_fi, monkeypatch):
    """At most KEEP_CHECK_EVERY passes in a row keep a plan: the next plans for real and is checked against the
    model (a planner that disagrees where the model sees the same schedule is caught within that many passes)."""
    from attnlab.backends import flashinfer as fib

    monkeypatch.setattr(fib, "KEEP_CHECK_EVERY", 4)
    case = cpu_case([1] * 3, MAX_LENS, page_size=16, gqa=3)
    be = backend(case, cuda_graph=True, max_batch_size=4, max_context=200)
    g = torch.Generator().manual_seed(8)
    for n in range(11):
        run_pass(be, case, [100 + n, 20, 50], 5, g)
    assert (be.plans_made, be.plans_kept) == (3, 8)  # plan, 4 kept, plan, 4 kept, plan


def test_another_flashinfer_version_plans_every_pass(fake_fi):
    fake_fi.__version__ = "0.8.0"  # a scheduler the model was not written against
    case = cpu_case([1] * 3, MAX_LENS, page_size=16, gqa=3)
    be = backend(case, cuda_graph=True, max_batch_size=4, max_context=200)
    g = torch.Generator().manual_seed(9)
    for n in range(3):
        run_pass(be, case, [100 + n, 20, 50], 5, g)
    assert be.plan_counts() == (3, 0)


def test_without_graphs_or_with_keep_plans_off_every_pass_plans(fake_fi):
    case = cpu_case([1] * 3, MAX_LENS, page_size=16, gqa=3)
    g = torch.Generator().manual_seed(0)
    for kw in ({"cuda_graph": False}, {"cuda_graph": True, "max_batch_size": 4, "keep_plans": False}):
        be = backend(case, max_context=200, **kw)
        for n in range(3):
            run_pass(be, case, [100 + n, 20, 50], 5, g)
        assert (be.plans_made, be.plans_kept) == (3, 0), kw


@pytest.mark.parametrize("wrapper", [FakeDecode, FakePrefill])
def test_a_plan_that_disagrees_with_the_model_turns_it_off(fake_fi, monkeypatch, wrapper):
    """Another FlashInfer (the fake's chunk one page off): the first real plan disagrees with the model, which is
    off from then on; passes then keep a plan only for the same page counts, and each still attends exactly."""
    monkeypatch.setattr(wrapper, "CHUNK_BIAS", 1)
    q_len = 1 if wrapper is FakeDecode else 5
    case = cpu_case([1] * 3, MAX_LENS, page_size=4, gqa=3)
    be = backend(case, cuda_graph=True, max_batch_size=4, max_context=200, **SPLIT)
    g = torch.Generator().manual_seed(1)
    run_pass(be, case, [101, 20, 50], q_len, g)
    assert not (be._schedule_model_ok if wrapper is FakeDecode else be._prefill_model_ok)
    run_pass(be, case, [102, 20, 50], q_len, g)  # same page counts: kept
    run_pass(be, case, [102, 21, 50], q_len, g)  # request 1 crosses a page: planned
    assert (be.plans_made, be.plans_kept) == (2, 1)


@pytest.mark.parametrize("max_grid", [16, 64, 264])
@pytest.mark.parametrize("page_size", [1, 4, 16])
def test_the_prefill_schedule_model_is_the_planners(fake_fi, max_grid, page_size, monkeypatch):
    """flashinfer_schedule.prefill_schedule, fed what a plan reports (query tiles, padded work count), predicts the
    chunk size and every request's chunks the fake planner wrote, for random page counts and q_lens, including
    batches whose query tiles alone exceed the split bound."""
    monkeypatch.setattr(FakePrefill, "MAX_GRID", max_grid)
    g = torch.Generator().manual_seed(max_grid + page_size)
    for _ in range(40):
        rows = int(torch.randint(1, 12, (1,), generator=g))
        q_len, group, hkv = int(torch.randint(1, 30, (1,), generator=g)), int(torch.randint(1, 9, (1,), generator=g)), 2
        head_dim = (64, 128, 256)[int(torch.randint(0, 3, (1,), generator=g))]  # 256: a 64-row tile, tiles_q > 1
        pages = torch.randint(0, 300, (rows,), generator=g).tolist()
        w = FakePrefill(torch.zeros(8, dtype=torch.uint8), use_cuda_graph=True)
        w._fa2_plan(pages, q_len, group, hkv, page_size, head_dim)
        known = fis.prefill_learned(w, q_len, group)
        assert fis.prefill_schedule(pages, page_size, *known) == fis.prefill_planned(w, rows, q_len, page_size)


@pytest.mark.gpu
@needs_flashinfer_gpu
@pytest.mark.parametrize("q_len", [1, 5])
def test_gpu_kept_plans_give_a_fresh_plans_bits(q_len):
    """The real FlashInfer, graph-mode wrappers: a backend that keeps plans and one that plans every pass (keep_plans
    off) run the same passes over growing lengths (SmolLM2's 9 / 3 heads, page 16, requests from 1 to 1,100 tokens,
    so the split runs 1 to 9 chunks a request, pages crossed on the way): the same bits at every pass, the schedule
    model confirmed by every real plan, and most passes kept (the decode rows': the test below)."""
    starts, rows = [1, 200, 1000, 45], 4
    case = make_case(kv_lens=[s + 120 for s in starts], q_lens=[1] * rows, page_size=16, num_kv_heads=3, gqa=3,
                     head_dim=64, dtype=torch.bfloat16, device="cuda", num_layers=1)
    kept, fresh = (FlashInferBackend(case.pool, case.num_q_heads, case.num_kv_heads, case.head_dim, case.scale,
                                     torch.bfloat16, cuda_graph=True, max_batch_size=rows, max_context=2048,
                                     keep_plans=keep) for keep in (True, False))
    g, steps = torch.Generator(device="cuda").manual_seed(q_len), torch.Generator().manual_seed(q_len)
    lens = [s + q_len for s in starts]
    for _ in range(40):
        meta = meta_over(case, lens, [q_len] * rows, Mode.DECODE if q_len == 1 else Mode.VERIFY)
        q = torch.randn(q_len * rows, case.num_q_heads, case.head_dim, device="cuda", generator=g).bfloat16()
        outs = []
        for be in (kept, fresh):
            be.plan(meta)
            outs.append(be.run(q, 0))
        assert torch.equal(outs[0], outs[1]), lens
        lens = [n + int(torch.randint(1, 3, (1,), generator=steps)) for n in lens]
    torch.testing.assert_close(outs[0].float(), reference(case, meta, q)[0], atol=2e-2, rtol=2e-2)
    assert kept.active_plan.family == ("decode" if q_len == 1 else "fa2")
    assert (kept._schedule_model_ok if q_len == 1 else kept._prefill_model_ok), "the model disagreed with a plan"
    assert kept.plans_kept >= 20 and fresh.plans_kept == 0, (kept.plans_made, kept.plans_kept)


@pytest.mark.gpu
@needs_flashinfer_gpu
@pytest.mark.parametrize("shape", ["mixed", "unsplit"])
def test_gpu_kept_rows_plans_give_a_fresh_plans_bits(shape):
    """The real FlashInfer, verify_as_decode=true in graph mode, a backend that keeps plans against one that plans
    every pass: the same bits at every pass. ``mixed``: rows buckets of 4 x 5, 2 x 5 and 1 x 4 rows and decode passes
    of batch 4 interleaved over growing lengths (the slot's rows buffers rewritten between kept passes; the decode
    and the 4-row rows wrappers share the schedule model). ``unsplit``: 64 x 12 = 768 rows, at or past the decode
    grid's bound (2,304 row x KV-head programs), where the plan splits the KV little or not at all."""
    if shape == "mixed":
        starts, batch, q_lens, steps = [1, 200, 1000, 45], 4, (5, 5, 1, 4), 40
    else:
        starts = torch.randint(50, 400, (64,), generator=torch.Generator().manual_seed(1)).tolist()
        batch, q_lens, steps = 64, (12,), 10
    case = make_case(kv_lens=[s + 200 for s in starts], q_lens=[1] * batch, page_size=16, num_kv_heads=3, gqa=3,
                     head_dim=64, dtype=torch.bfloat16, device="cuda", num_layers=1)
    kept, fresh = (FlashInferBackend(case.pool, case.num_q_heads, case.num_kv_heads, case.head_dim, case.scale,
                                     torch.bfloat16, cuda_graph=True, max_batch_size=batch, max_q_len=12,
                                     max_context=2048, keep_plans=keep, verify_as_decode=True) for keep in (True, False))
    g = torch.Generator(device="cuda").manual_seed(0)
    lens = [s + 5 for s in starts]
    for i in range(steps):
        for j, q_len in enumerate(q_lens):
            n = batch if shape == "unsplit" else (4, 2, 4, 1)[j]
            meta = meta_over(case, lens[:n], [q_len] * n, Mode.DECODE if q_len == 1 else Mode.VERIFY)
            q = torch.randn(q_len * n, case.num_q_heads, case.head_dim, device="cuda", generator=g).bfloat16()
            outs = []
            for be in (kept, fresh):
                be.plan(meta)
                outs.append(be.run(q, 0).clone())
            assert torch.equal(outs[0], outs[1]), (i, n, q_len, lens[:n])
        lens = [n + 1 + i % 2 for n in lens]
    torch.testing.assert_close(outs[0].float(), reference(case, meta, q)[0], atol=2e-2, rtol=2e-2)
    passes = steps * len(q_lens)
    assert kept._schedule_model_ok and kept.plans_kept >= passes // 4 and fresh.plans_kept == 0, kept.plan_counts()
    assert kept.kernel_info()["verify"] == "cuda-core:rows"
