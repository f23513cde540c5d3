"""Page allocator invariants under a randomized allocate / append / truncate / free sequence."""

import random

import pytest
import torch

from attnlab.errors import OutOfPages
from attnlab.kvcache import KVPool, PageAllocator, build_layout, pages_needed, slot_mapping


def check_invariants(a: PageAllocator):
    owned = [p for t in a.page_tables.values() for p in t]
    assert len(owned) == len(set(owned)), "a page is owned twice"
    assert not set(owned) & set(a._free), "a page is both owned and free"
    assert len(owned) + a.num_free == a.num_pages, "a page leaked"
    for r, t in a.page_tables.items():
        assert len(t) == pages_needed(a.lengths[r], a.page_size)


@pytest.mark.parametrize("page_size", [1, 4, 16])
def test_randomized_allocator(page_size):
    rng = random.Random(page_size)
    a = PageAllocator(num_pages=40, page_size=page_size)
    live = {}
    for step in range(2000):
        op = rng.random()
        if op < 0.4 or not live:
            r = rng.randrange(8)
            new_len = live.get(r, 0) + rng.randrange(0, 3 * page_size + 2)
            if a.can_allocate(r, new_len):
                added = a.allocate(r, new_len)
                assert len(added) == pages_needed(new_len, page_size) - pages_needed(live.get(r, 0), page_size)
                live[r] = new_len
            else:
                with pytest.raises(OutOfPages):
                    a.allocate(r, new_len)
        elif op < 0.8:
            r = rng.choice(list(live))
            new_len = rng.randrange(0, live[r] + 1)
            dropped = a.truncate(r, new_len)
            assert len(dropped) == pages_needed(live[r], page_size) - pages_needed(new_len, page_size)
            live[r] = new_len
        else:
            r = rng.choice(list(live))
            a.free(r)
            del live[r]
        check_invariants(a)
    for r in list(live):
        a.free(r)
    assert a.num_free == a.num_pages


def test_out_of_pages_is_clear_and_harmless():
    a = PageAllocator(num_pages=2, page_size=4)
    a.allocate("x", 8)
    before = (dict(a.page_tables), a.num_free)
    with pytest.raises(OutOfPages, match="out of pages.*kv.num_pages"):
        a.allocate("y", 1)
    assert (dict(a.page_tables), a.num_free) == before
    with pytest.raises(KeyError):
        a.free("y")


def test_layout_functions():
    tables = [[5, 2], [7], [], [1, 3, 4]]
    lay = build_layout(tables, [5, 4, 0, 9], page_size=4)
    assert lay.kv_indptr.tolist() == [0, 2, 3, 3, 6]
    assert lay.kv_indices.tolist() == [5, 2, 7, 1, 3, 4]
    assert lay.kv_last_page_len.tolist() == [1, 4, 0, 1]
    assert slot_mapping([5, 2], 3, 6, 4) == [23, 8, 9]
    with pytest.raises(ValueError):
        build_layout([[1]], [5], page_size=4)


@pytest.mark.parametrize("dtype", [torch.float8_e4m3fn, torch.bfloat16])
def test_pool_store_skips_minus_one_and_round_trips(dtype):
    scale = 0.5 if dtype == torch.float8_e4m3fn else 1.0
    pool = KVPool(1, 4, 2, 2, 8, dtype, "cpu", k_scale=scale, v_scale=scale)
    k = torch.randn(3, 2, 8)
    pool.store(0, k, -k, torch.tensor([5, -1, 0]))
    got_k, got_v = pool.gather(0, [0, 1, 2, 3], 8)
    tol = 0.07 if dtype == torch.float8_e4m3fn else 0.01  # e4m3: 3 mantissa bits -> <= 2^-4 relative
    torch.testing.assert_close(got_k[[5, 0]], k[[0, 2]], rtol=tol, atol=tol)
    torch.testing.assert_close(got_v[[5, 0]], -k[[0, 2]], rtol=tol, atol=tol)
    assert (got_k[[1, 2, 3, 4, 6, 7]] == 0).all()  # slot -1 wrote nothing visible


@pytest.mark.parametrize("dtype", [torch.float32, torch.float8_e5m2])
def test_pool_copy_slots_reads_before_writing_and_skips_minus_one(dtype):
    """copy_slots moves whole K/V rows in every layer; a slot can be a source and a destination at once."""
    pool = KVPool(2, 3, 4, 2, 8, dtype, "cpu")
    flat = pool.kv.view(2, 2, -1, 2, 8)
    flat[:, :, :12] = torch.arange(12, dtype=torch.float32).view(1, 1, 12, 1, 1).to(dtype)  # slot i holds i
    before = pool.kv.clone()
    # 5 -> 1 and 1 -> 2 at once (2 must get the old 1), 7 -> 3; (-1, 9) and (4, -1) are skipped
    pool.copy_slots(torch.tensor([[5, 1], [7, -1]]), torch.tensor([[1, 2], [3, 9]]))
    want = before.view(2, 2, -1, 2, 8)[:, :, :12].clone()
    want[:, :, 1], want[:, :, 2], want[:, :, 3] = before.view(2, 2, -1, 2, 8)[:, :, [5, 1, 7]].unbind(2)
    assert torch.equal(flat[:, :, :12].float(), want.float())
    pool.copy_slots(torch.tensor([4]), torch.tensor([-1]))  # a skipped write lands in the scratch page only
    assert torch.equal(flat[:, :, :12].float(), want.float())
