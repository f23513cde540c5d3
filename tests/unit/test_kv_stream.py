"""bench.kv_stream: the read-only pass over a decode's K / V reads exactly the plan's bytes (every split count,
page sizes incl. 1 and 3, kv lengths incl. 1 and shorter than a split), under the Triton interpreter on CPU."""

from __future__ import annotations

import pytest
import torch

from attnlab.backends.base import Mode
from attnlab.backends.cases import random_paged_case
from attnlab.bench import kv_stream

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def _case(kv_lens, page_size, hkv=2, d=64, dtype=torch.bfloat16):
    pool, meta, _ = random_paged_case(kv_lens=kv_lens, q_lens=[1] * len(kv_lens), page_size=page_size,
                                      num_q_heads=hkv * 3, num_kv_heads=hkv, head_dim=d, dtype=dtype, device=DEVICE,
                                      mode=Mode.DECODE, seed=3)
    k, v = pool.slots_view(0)
    lens = torch.tensor(kv_lens, dtype=torch.int32, device=DEVICE)
    return pool, meta, k, v, lens


CASES = [([1], 1, 1, 16), ([37], 3, 4, 16), ([40, 7], 16, 3, 16), ([5], 16, 8, 16), ([70, 1, 33], 4, 2, 32)]


def _boxes_fit(page_size, block_n):  # the pages mode: a power-of-two page dividing block_n
    return page_size & (page_size - 1) == 0 and block_n % page_size == 0


@pytest.mark.parametrize("kv_lens,page_size,splits,block_n,mode", [
    (*c, m) for c in CASES for m in kv_stream.MODES if m != "pages" or _boxes_fit(c[1], c[3])])
def test_reads_every_byte_once(kv_lens, page_size, splits, block_n, mode):
    pool, meta, k, v, lens = _case(kv_lens, page_size)
    out = torch.full((len(kv_lens), pool.num_kv_heads, splits), float("nan"), device=DEVICE)
    pair = (kv_stream.to_hnd(k, page_size), kv_stream.to_hnd(v, page_size)) if mode == "hnd" else (k, v)
    kv_stream.stream_kv(*pair, out, meta.layout.kv_indptr, meta.layout.kv_indices, lens, page_size=page_size,
                        num_splits=splits, block_n=block_n, mode=mode)
    assert torch.isfinite(out).all()  # every program stored, empty splits included (their sum is 0)
    want = kv_stream.expected_sums(k, v, meta.layout.kv_indptr, meta.layout.kv_indices, lens, page_size,
                                   contiguous=mode == "contig")
    torch.testing.assert_close(out.double().sum(dim=2), want, atol=1e-3, rtol=1e-5)  # fp32 sums against fp64
    kv_stream.check_sums(out, want, lens, k, v)


def test_to_hnd_puts_a_page_s_head_rows_together():
    _, _, k, _, _ = _case([37], 4, hkv=3)
    hnd = kv_stream.to_hnd(k, 4)
    assert hnd.shape == (k.shape[0] // 4, 3, 4, 64) and hnd.is_contiguous()
    for slot in (0, 5, 38):
        for h in range(3):
            assert torch.equal(hnd[slot // 4, h, slot % 4], k[slot, h])


@pytest.mark.parametrize("hkv,d", [(3, 64), (1, 128), (8, 16)])
def test_rows_mode_sums_each_head(hkv, d):
    """``rows``: a program reads every head of its tokens (a row of hkv x d, padded to a power of two when hkv is 3)
    and still stores each head's own sum."""
    _, meta, k, v, lens = _case([37, 1, 16], 4, hkv=hkv, d=d)
    lens[1] = 0  # a request with no tokens to read
    out = torch.full((3, hkv, 5), float("nan"), device=DEVICE)
    kv_stream.stream_kv(k, v, out, meta.layout.kv_indptr, meta.layout.kv_indices, lens, page_size=4, num_splits=5,
                        block_n=4, mode="rows")
    want = kv_stream.expected_sums(k, v, meta.layout.kv_indptr, meta.layout.kv_indices, lens, 4)
    torch.testing.assert_close(out.double().sum(dim=2), want, atol=1e-3, rtol=1e-5)
    assert (out[1] == 0).all()  # an empty request: every split stored 0


def test_contig_reads_other_slots_than_the_pages():
    """The pool's pages are shuffled (random_paged_case), so the contig read's sums are not the plan's: the check
    tells them apart (the contig row is a reference, not the plan's bytes)."""
    pool, meta, k, v, lens = _case([64], 16)
    assert sorted(meta.layout.kv_indices.tolist()) != list(range(4))  # other pages, not only another order
    out = torch.zeros(1, pool.num_kv_heads, 2, device=DEVICE)
    kv_stream.stream_kv(k, v, out, meta.layout.kv_indptr, meta.layout.kv_indices, lens, page_size=16, num_splits=2,
                        block_n=16, mode="contig")
    paged = kv_stream.expected_sums(k, v, meta.layout.kv_indptr, meta.layout.kv_indices, lens, 16)
    with pytest.raises(RuntimeError, match="read other bytes"):
        kv_stream.check_sums(out, paged, lens, k, v)


def test_pages_mode_refuses_other_pages():
    pool, meta, k, v, lens = _case([37], 3)
    out = torch.zeros(1, pool.num_kv_heads, 2, device=DEVICE)
    args = (k, v, out, meta.layout.kv_indptr, meta.layout.kv_indices, lens)
    with pytest.raises(ValueError, match="power-of-two page size dividing block_n"):
        kv_stream.stream_kv(*args, page_size=3, num_splits=2, block_n=16, mode="pages")
    pool, meta, k, v, lens = _case([37], 32)
    args = (k, v, out, meta.layout.kv_indptr, meta.layout.kv_indices, lens)
    with pytest.raises(ValueError, match="power-of-two page size dividing block_n"):
        kv_stream.stream_kv(*args, page_size=32, num_splits=2, block_n=16, mode="pages")
    with pytest.raises(ValueError, match="mode 'tma'"):
        kv_stream.stream_kv(*args, page_size=32, num_splits=2, block_n=32, mode="tma")


def test_check_catches_a_missed_tile():
    pool, meta, k, v, lens = _case([64], 16)
    out = torch.zeros(1, pool.num_kv_heads, 2, device=DEVICE)
    want = kv_stream.expected_sums(k, v, meta.layout.kv_indptr, meta.layout.kv_indices, lens, 16)
    kv_stream.stream_kv(k, v, out, meta.layout.kv_indptr, meta.layout.kv_indices, lens - 16, page_size=16, num_splits=2,
                        block_n=16)
    with pytest.raises(RuntimeError, match="read other bytes"):
        kv_stream.check_sums(out, want, lens, k, v)


def test_bad_input():
    pool, meta, k, v, lens = _case([8], 4)
    out = torch.zeros(1, pool.num_kv_heads, 2, device=DEVICE)
    args = (k, v, out, meta.layout.kv_indptr, meta.layout.kv_indices, lens)
    with pytest.raises(ValueError, match="powers of two"):
        kv_stream.stream_kv(*args, page_size=4, num_splits=2, block_n=24)
    with pytest.raises(ValueError, match="num_splits 0"):
        kv_stream.stream_kv(*args, page_size=4, num_splits=0, block_n=16)
    with pytest.raises(ValueError, match=r"fp32 \[1, 2, 3\]"):
        kv_stream.stream_kv(*args, page_size=4, num_splits=3, block_n=16)
    with pytest.raises(ValueError, match=r"mode 'hnd' takes K and V caches of one shape \[pages, kv_heads, page_size"):
        kv_stream.stream_kv(*args, page_size=4, num_splits=2, block_n=16, mode="hnd")
    hnd = kv_stream.to_hnd(k, 4), kv_stream.to_hnd(v, 4)
    with pytest.raises(ValueError, match="pages of 4 tokens, not page_size 8"):
        kv_stream.stream_kv(*hnd, *args[2:], page_size=8, num_splits=2, block_n=16, mode="hnd")
    with pytest.raises(ValueError, match=r"mode 'gather' takes K and V caches of one shape \[slots"):
        kv_stream.stream_kv(*hnd, *args[2:], page_size=4, num_splits=2, block_n=16)
    with pytest.raises(ValueError, match="of one shape"):  # a V shorter than K
        kv_stream.stream_kv(k, v[:-4], *args[2:], page_size=4, num_splits=2, block_n=16)
    with pytest.raises(ValueError, match="not whole pages of 3"):
        kv_stream.to_hnd(k[:10], 3)
    half = k[..., :32], v[..., :32]  # each head's first half: a slot's heads are 64 elements apart, not 32
    with pytest.raises(ValueError, match="mode rows needs each slot's kv heads x head_dim contiguous"):
        kv_stream.stream_kv(*half, *args[2:], page_size=4, num_splits=2, block_n=16, mode="rows")


@pytest.mark.parametrize("kv_len,splits,block_n,want", [
    (4096, 32, 128, 32), (4096, 64, 128, 32), (4096, 128, 128, 32), (4096, 64, 64, 64), (4096, 128, 64, 64),
    (4096, 8, 64, 8), (100, 3, 16, 3), (33, 8, 16, 3), (1, 4, 16, 1), (0, 4, 16, 0),
])
def test_working_splits(kv_len, splits, block_n, want):
    assert kv_stream.working_splits(kv_len, splits, block_n) == want
