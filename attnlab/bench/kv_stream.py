"""A read-only pass over a paged decode's K / V: the same programs (request x kv head x split), the same split bounds
and page gathers as ``attnlab.kernels.decode``, loads and a sum, no softmax, no partials. ``bench.launch_floor``'s
stream rows time it to say how fast this GPU can read a batch-1 decode's KV bytes at all with that launch grid (and
with others: ``--stream-splits``), so the decode floor's distance from the memory system is measured, not guessed.

Each program stores the fp32 sum of its K and V elements; ``expected_sums`` is the same from torch, so a bench can
prove every byte was read (a compiler cannot drop loads whose values reach the output). Unlike the decode it reads
no ``qo_indptr``: every request is taken as decoding (no padded rows), as in ``bench.launch_floor``'s batch-1 cells.
Split bounds are multiples of BLOCK_N, so a split count past ``kv_len / BLOCK_N`` adds empty programs, not a finer
partition (``working_splits``).

Three ways to read the same bytes (``mode``), so a bench can tell what the read's speed owes to its access pattern:
- ``gather``: the decode's own loads, a tile's rows through per-token pointers from the page table (``tile_slots``);
- ``pages``: one tensor-descriptor box of ``[page_size, head_dim]`` per page (TMA on Hopper), the page id a scalar
  load; the same bytes in page-sized blocks, no per-token addresses;
- ``contig``: one box of ``[block_n, head_dim]`` per tile from consecutive slots, as if request b's pages were the
  pool's pages ``kv_indptr[b]``, ``kv_indptr[b] + 1``, ... (its positions in the page table; checked by
  ``expected_sums(contiguous=True)``): the same byte count read with no page table at all. A reference, not a proven
  lower bound: its loads take another path (TMA boxes) than the gathers'.
- ``hnd``: the decode's own grid and gathers over the same values laid out head-major within a page (``[num_pages,
  kv_heads, page_size, head_dim]``, FlashInfer's HND; ``to_hnd`` makes the copy): a page's tokens of one head are
  ``page_size x head_dim`` contiguous elements, where attnlab's slot-major pool (NHD) spaces each token's
  ``head_dim`` by ``kv_heads x head_dim``. Whether a head-major pool would read faster is then a row beside it.
- ``rows``: the plan's bytes through the same per-token gathers, but each program reads *every* kv head of its tokens
  (whole slot rows, ``kv_heads x head_dim`` contiguous elements) instead of one head's ``head_dim``: the head axis
  folded into the row, the grid ``(request, 1, num_splits)``. ``out`` keeps its per-head shape. Whether the decode's
  one-head-a-program walk costs the read anything (its programs read 2 of every 16 bytes a slot holds at Llama-8B
  shapes, the other heads' programs the rest) is then a row beside it.
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from attnlab.kernels.paged import tile_slots
from attnlab.kernels.pdl import launch_args, pdl_start
from attnlab.kernels.prefill_contig import descriptor_ready
from attnlab.kvcache.layout import pages_needed, slot_mapping

MODES = ("gather", "pages", "contig", "rows", "hnd")


@triton.jit
def _split_bounds(KV_INDPTR, KV_LENS, b, split, num_splits, BLOCK_N: tl.constexpr):
    """Request b's first page-table position and its split's [lo, hi) tokens, as the decode splits them."""
    kv_len = tl.load(KV_LENS + b)
    chunk = tl.cdiv(tl.cdiv(kv_len, num_splits), BLOCK_N) * BLOCK_N
    lo = split * chunk
    return tl.load(KV_INDPTR + b), lo, tl.minimum(lo + chunk, kv_len)


@triton.jit
def _stream_kernel(K, V, OUT, KV_INDPTR, KV_INDICES, KV_LENS, num_splits, stride_slot, stride_kh, stride_page,
                   HEAD_DIM: tl.constexpr, PAGE_SIZE: tl.constexpr, BLOCK_N: tl.constexpr, HND: tl.constexpr = False,
                   USE_PDL: tl.constexpr = False):
    """``gather`` (slot-major K / V: a slot's row at ``slot * stride_slot``) and ``hnd`` (head-major pages: a token at
    ``page * stride_page + kvh * stride_kh + offset * stride_slot``)."""
    b = tl.program_id(0)
    kvh = tl.program_id(1)
    split = tl.program_id(2)
    pdl_start(USE_PDL)
    page_base, lo, hi = _split_bounds(KV_INDPTR, KV_LENS, b, split, num_splits, BLOCK_N)
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, HEAD_DIM)
    acc = tl.zeros([BLOCK_N, HEAD_DIM], tl.float32)
    for start in range(lo, hi, BLOCK_N):
        n_mask = start + offs_n < hi
        slots = tile_slots(KV_INDICES, page_base, start, offs_n, n_mask, PAGE_SIZE, BLOCK_N)
        if HND:
            tok = (slots // PAGE_SIZE) * stride_page + (slots % PAGE_SIZE) * stride_slot
        else:
            tok = slots * stride_slot
        off = tok[:, None] + kvh * stride_kh + offs_d[None, :]
        k = tl.load(K + off, mask=n_mask[:, None], other=0.0)
        v = tl.load(V + off, mask=n_mask[:, None], other=0.0)
        acc += k.to(tl.float32) + v.to(tl.float32)
    tl.store(OUT + (b * tl.num_programs(1) + kvh) * num_splits + split, tl.sum(acc))


@triton.jit
def _stream_rows_kernel(K, V, OUT, KV_INDPTR, KV_INDICES, KV_LENS, num_splits, stride_slot,
                        HKV: tl.constexpr, HEAD_DIM: tl.constexpr, COLS: tl.constexpr, PAGE_SIZE: tl.constexpr,
                        BLOCK_N: tl.constexpr, USE_PDL: tl.constexpr = False):
    """``rows``: program (request, split) reads its tokens' whole slot rows (HKV x HEAD_DIM elements, COLS its power
    of two) and stores each head's sum at ``OUT[b, head, split]``."""
    b = tl.program_id(0)
    split = tl.program_id(2)
    pdl_start(USE_PDL)
    page_base, lo, hi = _split_bounds(KV_INDPTR, KV_LENS, b, split, num_splits, BLOCK_N)
    offs_n = tl.arange(0, BLOCK_N)
    offs_c = tl.arange(0, COLS)
    c_mask = offs_c < HKV * HEAD_DIM
    acc = tl.zeros([BLOCK_N, COLS], tl.float32)
    for start in range(lo, hi, BLOCK_N):
        n_mask = start + offs_n < hi
        slots = tile_slots(KV_INDICES, page_base, start, offs_n, n_mask, PAGE_SIZE, BLOCK_N)
        off = slots[:, None] * stride_slot + offs_c[None, :]
        mask = n_mask[:, None] & c_mask[None, :]
        k = tl.load(K + off, mask=mask, other=0.0)
        v = tl.load(V + off, mask=mask, other=0.0)
        acc += k.to(tl.float32) + v.to(tl.float32)
    heads = tl.sum(tl.reshape(tl.sum(acc, 0), [COLS // HEAD_DIM, HEAD_DIM]), 1)
    offs_h = tl.arange(0, COLS // HEAD_DIM)
    tl.store(OUT + (b * HKV + offs_h) * num_splits + split, heads, mask=offs_h < HKV)


@triton.jit
def _stream_boxes_kernel(Kd, Vd, OUT, KV_INDPTR, KV_INDICES, KV_LENS, num_splits,
                         HEAD_DIM: tl.constexpr, PAGE_SIZE: tl.constexpr, BLOCK_N: tl.constexpr, ROWS: tl.constexpr,
                         CONTIG: tl.constexpr, USE_PDL: tl.constexpr = False):
    """``pages`` (ROWS = PAGE_SIZE, a box per page through the page table) and ``contig`` (ROWS = BLOCK_N, a box per
    tile from consecutive slots): the same programs and split bounds as ``_stream_kernel``. Rows of a box past the
    split's end are read (whole boxes) and left out of the sum."""
    b = tl.program_id(0)
    kvh = tl.program_id(1)
    split = tl.program_id(2)
    pdl_start(USE_PDL)
    page_base, lo, hi = _split_bounds(KV_INDPTR, KV_LENS, b, split, num_splits, BLOCK_N)
    offs_r = tl.arange(0, ROWS)
    acc = tl.zeros([ROWS, HEAD_DIM], tl.float32)
    col = kvh * HEAD_DIM
    for start in range(lo, hi, ROWS):  # pages: lo is a multiple of BLOCK_N, so of PAGE_SIZE (stream_kv checks)
        if CONTIG:
            row = page_base * PAGE_SIZE + start
        else:
            row = tl.load(KV_INDICES + page_base + start // PAGE_SIZE) * PAGE_SIZE
        k = Kd.load([row, col])
        v = Vd.load([row, col])
        keep = (start + offs_r < hi)[:, None]
        acc += tl.where(keep, k.to(tl.float32) + v.to(tl.float32), 0.0)
    tl.store(OUT + (b * tl.num_programs(1) + kvh) * num_splits + split, tl.sum(acc))


def working_splits(kv_len: int, num_splits: int, block_n: int) -> int:
    """How many of ``num_splits`` splits hold tokens of a ``kv_len`` request (the decode's bounds: each split a
    multiple of ``block_n``); the rest are empty programs."""
    if kv_len <= 0:
        return 0
    chunk = math.ceil(math.ceil(kv_len / num_splits) / block_n) * block_n
    return math.ceil(kv_len / chunk)


def stream_kv(k_cache: torch.Tensor, v_cache: torch.Tensor, out: torch.Tensor, kv_indptr: torch.Tensor,
              kv_indices: torch.Tensor, kv_lens: torch.Tensor, *, page_size: int, num_splits: int, block_n: int,
              num_warps: int = 4, num_stages: int = 2, mode: str = "gather") -> torch.Tensor:
    """Read every K / V element of each request's ``kv_lens`` tokens; ``out`` (fp32, ``[batch, kv_heads,
    num_splits]``) gets each program's sum. k/v_cache: ``[num_slots, kv_heads, head_dim]`` (slot = page * page_size
    + offset; ``hnd``: ``[num_pages, kv_heads, page_size, head_dim]``, ``to_hnd``), a power-of-two head dim;
    kv_indptr ``[batch + 1]``, kv_indices, kv_lens ``[batch]``: int32, as the decode's plan. ``mode``: how the bytes
    are loaded (module docstring; ``contig`` reads other slots than the plan's pages; ``rows`` runs ``num_splits``
    programs a request, each over every head). PDL as the process is set (``attnlab.kernels.pdl``)."""
    if mode not in MODES:
        raise ValueError(f"stream_kv: mode {mode!r}: one of {', '.join(MODES)}")
    dims, want = (4, "[pages, kv_heads, page_size, head_dim]") if mode == "hnd" else (3, "[slots, kv_heads, head_dim]")
    if k_cache.dim() != dims or k_cache.shape != v_cache.shape:
        raise ValueError(f"stream_kv: mode {mode!r} takes K and V caches of one shape {want}, got "
                         f"{list(k_cache.shape)} and {list(v_cache.shape)}")
    if mode == "hnd" and k_cache.shape[2] != page_size:
        raise ValueError(f"stream_kv: hnd caches hold pages of {k_cache.shape[2]} tokens, not page_size {page_size}")
    batch, hkv, head_dim = kv_lens.shape[0], k_cache.shape[1], k_cache.shape[-1]
    if head_dim & (head_dim - 1) or block_n & (block_n - 1):
        raise ValueError(f"stream_kv: head_dim {head_dim} and block_n {block_n} must be powers of two")
    if num_splits < 1:
        raise ValueError(f"stream_kv: num_splits {num_splits} < 1")
    if out.dtype != torch.float32 or tuple(out.shape) != (batch, hkv, num_splits):
        raise ValueError(f"stream_kv: out must be fp32 [{batch}, {hkv}, {num_splits}], got {out.dtype} "
                         f"{list(out.shape)}")
    if k_cache.stride() != v_cache.stride() or k_cache.stride(-1) != 1:
        raise ValueError("stream_kv: K and V caches must share strides, head dim contiguous")
    if mode == "rows":
        if k_cache.stride(1) != head_dim:
            raise ValueError("stream_kv: mode rows needs each slot's kv heads x head_dim contiguous")
        _stream_rows_kernel[(batch, 1, num_splits)](
            k_cache, v_cache, out, kv_indptr, kv_indices, kv_lens, num_splits, k_cache.stride(0), HKV=hkv,
            HEAD_DIM=head_dim, COLS=triton.next_power_of_2(hkv * head_dim), PAGE_SIZE=page_size, BLOCK_N=block_n,
            num_warps=num_warps, num_stages=num_stages, **launch_args(k_cache))
        return out
    if mode in ("pages", "contig"):
        return _stream_boxes(k_cache, v_cache, out, kv_indptr, kv_indices, kv_lens, page_size, num_splits, block_n,
                             num_warps, num_stages, mode == "contig")
    hnd = mode == "hnd"  # a token's row: slot * stride(0) (NHD), or page * stride(0) + offset * stride(2)
    _stream_kernel[(batch, hkv, num_splits)](
        k_cache, v_cache, out, kv_indptr, kv_indices, kv_lens, num_splits, k_cache.stride(2 if hnd else 0),
        k_cache.stride(1), k_cache.stride(0) if hnd else 0, HEAD_DIM=head_dim, PAGE_SIZE=page_size, BLOCK_N=block_n,
        HND=hnd, num_warps=num_warps, num_stages=num_stages, **launch_args(k_cache))
    return out


def _stream_boxes(k_cache, v_cache, out, kv_indptr, kv_indices, kv_lens, page_size: int, num_splits: int,
                  block_n: int, num_warps: int, num_stages: int, contig: bool) -> torch.Tensor:
    """stream_kv's ``pages`` / ``contig`` modes: host tensor descriptors over ``[num_slots, kv_heads * head_dim]``."""
    from triton.tools.tensor_descriptor import TensorDescriptor

    slots, hkv, d = k_cache.shape
    rows = block_n if contig else page_size
    if not contig and (page_size & (page_size - 1) or block_n % page_size):
        raise ValueError(f"stream_kv: mode pages needs a power-of-two page size dividing block_n "
                         f"(page {page_size}, block_n {block_n})")
    if not (descriptor_ready(k_cache) and descriptor_ready(v_cache)):
        raise ValueError("stream_kv: mode pages / contig needs each slot's heads x head_dim contiguous, 16-byte "
                         "aligned rows and base")
    descs = [TensorDescriptor(t, [slots, hkv * d], [t.stride(0), 1], [rows, d]) for t in (k_cache, v_cache)]
    _stream_boxes_kernel[(kv_lens.shape[0], hkv, num_splits)](
        *descs, out, kv_indptr, kv_indices, kv_lens, num_splits, HEAD_DIM=d, PAGE_SIZE=page_size, BLOCK_N=block_n,
        ROWS=rows, CONTIG=contig, num_warps=num_warps, num_stages=num_stages, **launch_args(k_cache))
    return out


def to_hnd(cache: torch.Tensor, page_size: int) -> torch.Tensor:
    """A slot-major ``[num_slots, kv_heads, head_dim]`` cache (slot = page * page_size + offset) copied head-major
    within each page: ``[num_pages, kv_heads, page_size, head_dim]``, contiguous (``stream_kv``'s ``hnd`` mode)."""
    slots, hkv, d = cache.shape
    if slots % page_size:
        raise ValueError(f"to_hnd: {slots} slots are not whole pages of {page_size}")
    return cache.view(slots // page_size, page_size, hkv, d).transpose(1, 2).contiguous()


def expected_sums(k_cache: torch.Tensor, v_cache: torch.Tensor, kv_indptr: torch.Tensor, kv_indices: torch.Tensor,
                  kv_lens: torch.Tensor, page_size: int, contiguous: bool = False) -> torch.Tensor:
    """Per request and kv head, the fp64 sum of its K and V elements (torch, for ``stream_kv``'s check).
    ``contiguous``: of the slots ``mode="contig"`` reads, the request's tokens laid out from page ``kv_indptr[b]``."""
    sums = []
    for b in range(kv_lens.shape[0]):
        n = int(kv_lens[b])
        pages = kv_indices[int(kv_indptr[b]):int(kv_indptr[b + 1])].tolist()
        if pages_needed(n, page_size) > len(pages):
            raise ValueError(f"expected_sums: request {b} has {n} tokens but {len(pages)} pages of {page_size}")
        if contiguous:
            pages = list(range(int(kv_indptr[b]), int(kv_indptr[b]) + len(pages)))
        slots = torch.tensor(slot_mapping(pages, 0, n, page_size), dtype=torch.long, device=k_cache.device)
        sums.append((k_cache[slots].double() + v_cache[slots].double()).sum(dim=(0, 2)))
    return torch.stack(sums)


def check_sums(out: torch.Tensor, want: torch.Tensor, kv_lens: torch.Tensor, k_cache: torch.Tensor,
               v_cache: torch.Tensor) -> None:
    """Raise unless ``out``'s per-(request, kv head) sums match ``want`` within fp32 summation error. The bound is
    1e-6 of the magnitude a request's sum may reach (its 2 x kv_len x head_dim elements at the pool's mean magnitude):
    fp32 error is ~1e-7 of it, while a missed tile of unit-scale data moves the sum by ~sqrt(its elements)."""
    got = out.double().sum(dim=2)
    scale = (k_cache.double().abs().mean() + v_cache.double().abs().mean()) / 2
    count = 2 * kv_lens.double().to(got.device)[:, None] * k_cache.shape[2]
    tol = 1e-6 * scale * count + 1e-6
    err = (got - want).abs()
    if not bool((err <= tol).all()):
        worst = int((err - tol).argmax())
        raise RuntimeError(f"stream_kv read other bytes than the plan's: sums differ by {err.max().item():.3g} "
                           f"(tolerance {tol.reshape(-1)[worst].item():.3g})")
