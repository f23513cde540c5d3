"""flashinfer's ``verify_kv_chunk`` (CPU, through the fake module, whose graph-mode fa2 plans transliterate FlashInfer
0.7.2's PrefillSplitQOKVIndptr on their own): an fa2 split plan of a uniform verify searches its chunk from the
option's floor and passes it as ``fixed_split_size``, never past the wrapper's captured grid and never changing its
split-KV launches; every pass attends exactly, and kept plans follow the same schedule."""

import pytest
import torch

from attnlab.backends import flashinfer_schedule as fis
from attnlab.backends.base import Mode
from attnlab.backends.flashinfer import NOMINAL_SMS
from attnlab.errors import ConfigError
from tests.backends.fakes import FakePrefill
from tests.backends.test_flashinfer import backend, cpu_case, meta_over, reference

MAX_LENS = [170, 60, 110]
SPLIT = {"verify_split_kv": True}  # the split plan every pass (under auto these short passes may run whole)


def run_verify(be, case, kv_lens, q_len, g):
    meta = meta_over(case, kv_lens, [q_len] * len(kv_lens), Mode.VERIFY)
    q = torch.randn(q_len * len(kv_lens), case.num_q_heads, case.head_dim, generator=g).to(case.q.dtype)
    be.plan(meta)
    got = torch.stack([be.run(q, layer).float() for layer in range(case.pool.num_layers)])
    torch.testing.assert_close(got, reference(case, meta, q), atol=2e-2, rtol=2e-2)


def fixed_sizes() -> list:
    return [p.get("fixed_split_size") for w in FakePrefill.created for p in w.plans]


@pytest.mark.parametrize("bad", [0, -2, True, 1.5, "4"])
def test_bad_values_are_refused(fake_fi, bad):
    with pytest.raises(ConfigError, match="verify_kv_chunk"):
        backend(cpu_case([1], [5]), verify_kv_chunk=bad)


@pytest.mark.parametrize("max_grid", [16, 64, 264])
@pytest.mark.parametrize("page_size", [1, 4, 16])
@pytest.mark.parametrize("floor", [1, 2, 3, 8])
def test_the_fine_schedule_is_the_planners(fake_fi, max_grid, page_size, floor, monkeypatch):
    """A wrapper's first plan (FlashInfer's search) reports its tiles and padded grid; a later plan of other page
    counts with fine_chunk's fixed size fits that grid (the fake raises as FlashInfer does where it would not),
    keeps split-KV on (the fake asserts it), and writes the schedule prefill_schedule predicts with the floor."""
    monkeypatch.setattr(FakePrefill, "MAX_GRID", max_grid)
    g = torch.Generator().manual_seed(max_grid + page_size + floor)
    fixed_seen = 0
    for _ in range(30):
        rows = int(torch.randint(1, 10, (1,), generator=g))
        q_len, group = int(torch.randint(2, 9, (1,), generator=g)), int(torch.randint(1, 9, (1,), generator=g))
        head_dim = (64, 128, 256)[int(torch.randint(0, 3, (1,), generator=g))]
        w = FakePrefill(torch.zeros(8, dtype=torch.uint8), use_cuda_graph=True)
        w._fa2_plan([1] * rows, q_len, group, 2, page_size, head_dim)  # the capture's plan: dummies of one page
        known = fis.prefill_learned(w, q_len, group)
        pages = torch.randint(0, 300, (rows,), generator=g).tolist()
        fixed = fis.fine_chunk(pages, *known, floor)
        fixed_seen += fixed is not None
        w._fa2_plan(pages, q_len, group, 2, page_size, head_dim, fixed_split_size=fixed)
        assert fis.prefill_schedule(pages, page_size, *known, floor) == fis.prefill_planned(w, rows, q_len, page_size)
    assert fixed_seen > 0


def test_fine_chunk_only_where_a_request_splits():
    """No fixed size where the search from the floor leaves every request one chunk (FlashInfer would then plan
    without split-KV, which a captured graph's merge does not allow), and none without a floor."""
    assert fis.fine_chunk([3, 2], 1, 32, 4) is None  # 4 pages hold each request whole
    assert fis.fine_chunk([3, 2], 1, 32, None) is None
    assert fis.fine_chunk([3, 2], 1, 32, 1) == 1  # 5 work items fit 32
    assert fis.fine_chunk([64], 1, 8, 1) == 8  # the grid bounds it: 8 chunks of 8 pages
    assert fis.fine_chunk([64] * 8, 1, 8, 1) is None  # one chunk a request already fills the grid


@pytest.mark.parametrize("page_size", [1, 4, 16])
@pytest.mark.parametrize("floor", [1, 2])
def test_graph_mode_passes_attend_exactly_and_keep_plans(fake_fi, page_size, floor, monkeypatch):
    """Growing lengths in graph mode: every pass equals the reference; a plan carries the fixed size where a
    request splits, its first included (the grid computed as FlashInfer 0.7 sizes it: the fake's grid is the
    nominal GPU's here, so a wrong bound raises); kept plans agree with the model (which checks every real plan)."""
    monkeypatch.setattr(FakePrefill, "MAX_GRID", 2 * NOMINAL_SMS)
    case = cpu_case([1] * 3, MAX_LENS, page_size=page_size, gqa=3)
    be = backend(case, cuda_graph=True, max_batch_size=4, max_context=200, verify_kv_chunk=floor, **SPLIT)
    g = torch.Generator().manual_seed(page_size + floor)
    run_verify(be, case, [5, 5, 5], 5, g)  # the capture's shape: q_len tokens a request
    assert fixed_sizes() == [fis.fine_chunk([-(-5 // page_size)] * 3, 1, 2 * NOMINAL_SMS // 2, floor)]
    lens = [120, 10, 60]
    for _ in range(16):
        run_verify(be, case, lens, 5, g)
        lens = [n + int(torch.randint(0, 3, (1,), generator=g)) for n in lens]
    sizes = fixed_sizes()
    assert any(s is not None for s in sizes[1:]), sizes
    assert be._prefill_model_ok
    # at page size 1 the finest chunks follow every token (the schedule changes each pass); at 4 and 16 they keep
    assert be.plans_kept > 0 or page_size == 1, (be.plans_made, be.plans_kept)
    assert "fa2:fine" in be.kernel_info()["verify"].split("+")


def test_eager_passes_carry_the_fixed_size(fake_fi):
    """Without graphs the bound is the planner's split bound (2 CTAs an SM over the KV heads): a long verify gets a
    fixed size at the floor, a short one none; both attend exactly."""
    case = cpu_case([1] * 2, [170, 60], page_size=1, gqa=4)
    be = backend(case, verify_kv_chunk=2, **SPLIT)
    g = torch.Generator().manual_seed(3)
    run_verify(be, case, [160, 50], 4, g)
    run_verify(be, case, [2, 2], 4, g)  # one chunk of 2 pages each: FlashInfer's default
    assert fixed_sizes() == [2, None]


def test_off_by_default(fake_fi):
    case = cpu_case([1] * 2, [170, 60], page_size=1, gqa=4)
    be = backend(case, **SPLIT)
    run_verify(be, case, [160, 50], 4, torch.Generator().manual_seed(4))
    assert fixed_sizes() == [None] and be.kernel_info()["verify"] == "fa2"


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("floor", [1, 2, 4])
@pytest.mark.parametrize("gqa,head_dim,page_size", [(3, 64, 16), (4, 128, 16), (3, 64, 1)])
def test_gpu_fine_chunks_attend_the_reference(floor, gqa, head_dim, page_size):
    """The real FlashInfer, graph-mode wrappers: a capture-shaped first plan (FlashInfer's default), then passes
    whose fine fixed_split_size the planner accepts within that grid (it raises past it), each equal to the
    reference; the plans kept in between agree with the model."""
    from attnlab.backends.flashinfer import FlashInferBackend
    from tests.backends.cases import GPU_TOL, make_case
    from tests.backends.test_flashinfer import run_all_layers

    if why := FlashInferBackend.available():
        pytest.skip(why)
    case = make_case(kv_lens=[1500, 1500, 1500], q_lens=[5] * 3, page_size=page_size, num_kv_heads=2, gqa=gqa,
                     head_dim=head_dim, dtype=torch.bfloat16, device="cuda", num_layers=2, mode=Mode.VERIFY)
    be = backend(case, cuda_graph=True, max_batch_size=3, max_context=2048, verify_kv_chunk=floor,
                 workspace_bytes=128 << 20, **SPLIT)
    g = torch.Generator(device="cuda").manual_seed(floor + gqa)
    for kv_lens in ([5, 5, 5], [100, 7, 300], [1500, 20, 900], [1501, 21, 901], [60, 1200, 33]):
        meta = meta_over(case, kv_lens, [5] * 3, Mode.VERIFY)
        be.plan(meta)
        q = torch.randn(15, case.num_q_heads, case.head_dim, device="cuda", generator=g).bfloat16()
        tol = GPU_TOL[torch.bfloat16]
        torch.testing.assert_close(run_all_layers(be, case, q), reference(case, meta, q), atol=tol, rtol=tol)
    assert "fa2:fine" in be.kernel_info()["verify"] and be._prefill_model_ok
