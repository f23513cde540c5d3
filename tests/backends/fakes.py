"""Fake flashinfer and FlashAttention modules for the CPU tests of the library backends.

The fake flashinfer wrappers check plan() arguments the way FlashInfer 0.7.2 documents them (the keyword names
are the real ones) and attend with exactly what was planned (indptr / indices / last_page_len, causal
bottom-right or the flattened custom mask); in CUDA-graph mode they copy the plan into the caller-owned buffers
and read it back from there, as the real ones do. The fake ``flash_attn_with_kvcache`` checks argument shapes and
dtypes as the real one documents them and computes attention from exactly what it was given (page_table /
block_table / cache_batch_idx, cache_seqlens, FA's bottom-right causal rule). The fixtures that install them
(``fake_fi``, ``use_flavor``) are in conftest.py.
"""

from __future__ import annotations

import math
import types
from typing import ClassVar

import torch

from attnlab.backends.torch_ref import reference_attention

FAMILIES = ("auto", "fa2", "fa3", "cudnn", "trtllm-gen", "cute-dsl")  # FlashInfer 0.7.2's backend= values


class _FakeWrapper:
    def __init__(self, workspace, kv_layout="NHD", use_cuda_graph=False, backend="auto", **kw):
        assert workspace.dtype == torch.uint8 and kv_layout == "NHD"
        assert backend in FAMILIES, backend
        self.workspace, self.use_cuda_graph, self.init_kw = workspace, use_cuda_graph, kw
        self._backend = backend
        self.plans = []
        self.packed = None
        self.created.append(self)

    def _store(self, qo, kv_indptr, indices, last, hq, hkv, d, ps, causal, mask, q_dtype, kv_dtype, scale, **extra):
        for t in (qo, kv_indptr, indices, last):
            assert t.dtype == torch.int32
        assert len(kv_indptr) == len(last) + 1 == len(qo) and len(indices) == int(kv_indptr[-1])
        if self.use_cuda_graph:  # as FlashInfer: copy into the caller's buffers (fixed batch), read from them
            b = self.bufs
            assert len(b["kv_indptr"]) == len(kv_indptr) and len(b["last"]) == len(last)
            b["kv_indptr"].copy_(kv_indptr)
            b["last"].copy_(last)
            b["indices"][:len(indices)].copy_(indices)
            if "qo" in b:
                b["qo"].copy_(qo)
            kv_indptr, last, indices = b["kv_indptr"], b["last"], b["indices"]
            qo = b.get("qo", qo)
            if mask is not None or extra.get("packed"):
                assert self.init_kw.get("custom_mask_buf") is not None, "graph mode mask needs custom_mask_buf"
        self.plans.append({"hq": hq, "hkv": hkv, "d": d, "ps": ps, "causal": causal,
                           "mask": mask is not None or extra.get("packed", False),
                           "q_dtype": q_dtype, "kv_dtype": kv_dtype, **extra})
        self.state = (qo, kv_indptr, indices, last, ps, causal, mask, q_dtype, kv_dtype, scale)

    def run(self, q, paged_kv_cache, k_scale=None, v_scale=None):
        qo, kv_indptr, indices, last, ps, causal, mask, q_dtype, kv_dtype, scale = self.state
        k_cache, v_cache = paged_kv_cache
        assert k_cache.dim() == 4 and k_cache.shape[1] == ps and q.dtype == q_dtype and k_cache.dtype == kv_dtype
        if kv_dtype in (torch.float8_e4m3fn, torch.float8_e5m2):  # as FlashInfer: sm_scale * k_scale, out * v_scale
            assert k_scale is not None and v_scale is not None, "fp8 KV needs k_scale and v_scale"
        out = torch.zeros(q.shape, dtype=torch.float32)
        mask_off = 0
        for i in range(len(last)):
            pages = indices[int(kv_indptr[i]):int(kv_indptr[i + 1])].long()
            n = (len(pages) - 1) * ps + int(last[i]) if len(pages) else 0
            q0, q1 = int(qo[i]), int(qo[i + 1])
            kk = k_cache[pages].reshape(-1, *k_cache.shape[2:])[:n].float()
            vv = v_cache[pages].reshape(-1, *v_cache.shape[2:])[:n].float()
            if self.packed is not None:  # as FlashInfer's kernel: request i's bits start at byte mask_indptr[i]
                packed, mask_indptr = self.packed
                start = int(mask_indptr[i]) * 8
                bits = torch.tensor([(int(packed[(start + j) // 8]) >> ((start + j) % 8)) & 1
                                     for j in range((q1 - q0) * n)], dtype=torch.bool)
                m = bits.view(q1 - q0, n)
            elif mask is not None:
                m = mask[mask_off:mask_off + (q1 - q0) * n].view(q1 - q0, n)
                mask_off += (q1 - q0) * n
            elif causal:
                m = torch.arange(n)[None] <= torch.arange(q1 - q0)[:, None] + n - (q1 - q0)  # bottom-right
            else:
                m = torch.ones(q1 - q0, n, dtype=torch.bool)
            o = reference_attention(q[q0:q1], kk, vv, m, scale * (k_scale or 1.0))
            out[q0:q1] = o * (v_scale or 1.0)
        return out.to(q.dtype)


class FakeDecode(_FakeWrapper):
    created: ClassVar[list] = []

    def __init__(self, workspace, kv_layout="NHD", use_cuda_graph=False, use_tensor_cores=False,
                 paged_kv_indptr_buffer=None, paged_kv_indices_buffer=None, paged_kv_last_page_len_buffer=None,
                 backend="auto"):
        super().__init__(workspace, kv_layout, use_cuda_graph, backend)
        self.use_tensor_cores = use_tensor_cores
        self.bufs = {"kv_indptr": paged_kv_indptr_buffer, "indices": paged_kv_indices_buffer,
                     "last": paged_kv_last_page_len_buffer}

    @property
    def resolved_backend(self):  # FlashInfer 0.7.2: "fa2" for the CUDA-core kernel and the tensor-core auto pick
        return "fa2" if self._backend == "auto" else self._backend

    # the CUDA-core decode's schedule in graph mode, as FlashInfer 0.7.2's DecodePlan writes it (scheduler.cuh,
    # transliterated here on its own, not shared with attnlab's model): max_grid_size = blocks per SM x SMs
    MAX_GRID: ClassVar[int] = 64
    CHUNK_BIAS: ClassVar[int] = 0  # a test's "other FlashInfer version": the chunk this many pages off

    def plan(self, indptr, indices, last_page_len, num_qo_heads, num_kv_heads, head_dim, page_size, *,
             pos_encoding_mode="NONE", q_data_type="float16", kv_data_type=None, sm_scale=None):
        qo = torch.arange(len(last_page_len) + 1, dtype=torch.int32)
        self._store(qo, indptr, indices, last_page_len, num_qo_heads, num_kv_heads, head_dim, page_size,
                    False, None, q_data_type, kv_data_type, sm_scale)
        self.sched = None
        if self.use_cuda_graph and not self.use_tensor_cores:
            self._decode_plan([int(indptr[i + 1] - indptr[i]) for i in range(len(last_page_len))], num_kv_heads,
                              page_size)

    def _decode_plan(self, pages, gdy, ps):
        batch = len(pages)
        if batch * gdy >= self.MAX_GRID:
            split, chunk = False, max([1, *pages])
        else:
            low, high = max(128 // ps, 1), 0
            for p in pages:
                high = max(high, p)
            while low < high:
                mid = (low + high) // 2
                new_batch = sum(math.ceil(p / mid) for p in pages)
                if new_batch * gdy > self.MAX_GRID:
                    low = mid + 1
                else:
                    high = mid
            split, chunk = True, low + self.CHUNK_BIAS
        o_indptr = [0]
        for p in pages:
            o_indptr.append(o_indptr[-1] + math.ceil(max(p, 1) / chunk))
        padded = self.MAX_GRID // gdy if split else batch
        chunk_off, o_off = 3, 16  # the chunk size is 1-byte aligned in FlashInfer's int workspace
        pinned = torch.zeros(o_off + 4 * (padded + 1), dtype=torch.uint8)
        pinned[chunk_off:chunk_off + 4] = torch.tensor([chunk * ps], dtype=torch.int32).view(torch.uint8)
        pinned[o_off:o_off + 4 * len(o_indptr)] = torch.tensor(o_indptr, dtype=torch.int32).view(torch.uint8)
        self._pin_memory_int_workspace_buffer = pinned
        self._plan_info = [padded, 0, 0, 0, 0, o_off, 0, chunk_off, 1, int(split)]
        self.sched = (split, chunk, o_indptr)

    def run(self, q, paged_kv_cache, k_scale=None, v_scale=None):
        if getattr(self, "sched", None) is not None and self.sched[0]:
            # as the kernel: tile t of request i covers [t x chunk, min((t + 1) x chunk, kv_len)) tokens of the
            # lengths in the buffers now; a tile starting past kv_len underflows its chunk size (a wrong result or a
            # fault on the GPU), and tokens past the last tile are never read
            _, chunk, o_indptr = self.sched
            kv_indptr, last, ps = self.state[1], self.state[3], self.state[4]
            for i in range(len(last)):
                n = (int(kv_indptr[i + 1] - kv_indptr[i]) - 1) * ps + int(last[i])
                tiles = o_indptr[i + 1] - o_indptr[i]
                assert (tiles - 1) * chunk * ps < max(n, 1), f"request {i}: a tile starts past its {n} tokens"
                assert tiles * chunk * ps >= n, f"request {i}: {n} tokens, the plan's tiles cover fewer"
        return super().run(q, paged_kv_cache, k_scale, v_scale)


class FakePrefill(_FakeWrapper):
    created: ClassVar[list] = []

    def __init__(self, workspace, kv_layout="NHD", use_cuda_graph=False, qo_indptr_buf=None,
                 paged_kv_indptr_buf=None, paged_kv_indices_buf=None, paged_kv_last_page_len_buf=None,
                 custom_mask_buf=None, mask_indptr_buf=None, backend="auto"):
        super().__init__(workspace, kv_layout, use_cuda_graph, backend, custom_mask_buf=custom_mask_buf,
                         mask_indptr_buf=mask_indptr_buf)
        self.bufs = {"qo": qo_indptr_buf, "kv_indptr": paged_kv_indptr_buf, "indices": paged_kv_indices_buf,
                     "last": paged_kv_last_page_len_buf}

    def plan(self, qo_indptr, paged_kv_indptr, paged_kv_indices, paged_kv_last_page_len, num_qo_heads,
             num_kv_heads, head_dim_qk, page_size, *, causal=False, custom_mask=None, packed_custom_mask=None,
             q_data_type="float16", kv_data_type=None, sm_scale=None, uniform_q_len=None, disable_split_kv=False):
        if self.use_cuda_graph:  # as FlashInfer: a graph-mode prefill wrapper's row count is fixed by its first plan
            rows = int(qo_indptr[-1])
            self.rows = getattr(self, "rows", rows)
            if rows > self.rows:
                raise ValueError(f"The total number of rows in qo_indptr {rows} in cuda graph mode cannot exceed "
                                 f"the number of rows set during initialization {self.rows}.")
        masked = (custom_mask is not None or packed_custom_mask is not None
                  or self.init_kw.get("custom_mask_buf") is not None)
        if self._backend == "auto":  # as determine_attention_backend on an H200: fa3 unless a mask or fp8 KV
            fp8 = kv_data_type in (torch.float8_e4m3fn, torch.float8_e5m2)
            self._backend = "fa2" if masked or fp8 else "fa3"
        if masked:
            assert self._backend == "fa2", "FlashInfer's fa3 prefill has no custom mask"
        if uniform_q_len is not None:  # FlashInfer drops a hint that does not describe the batch
            q_lens = (qo_indptr[1:] - qo_indptr[:-1]).tolist()
            assert all(n == uniform_q_len for n in q_lens), (uniform_q_len, q_lens)
        self.packed = None
        if packed_custom_mask is not None:
            # As FlashInfer's plan: the mask indptr comes from the *unpacked* lengths (bits), copied into
            # mask_indptr_buf (graph mode) next to the packed mask; the kernel reads it as byte offsets.
            assert custom_mask is None and packed_custom_mask.dtype == torch.uint8
            q_lens = qo_indptr[1:] - qo_indptr[:-1]
            kv_lens = (paged_kv_indptr[1:] - paged_kv_indptr[:-1] - 1) * page_size + paged_kv_last_page_len
            bit_indptr = torch.cat([torch.zeros(1, dtype=torch.int32), torch.cumsum(q_lens * kv_lens, 0).int()])
            if self.use_cuda_graph:
                buf, ind = self.init_kw["custom_mask_buf"], self.init_kw["mask_indptr_buf"]
                buf[:len(packed_custom_mask)].copy_(packed_custom_mask)
                ind.copy_(bit_indptr)
                self.packed = (buf, ind)  # read at run time: what is in the buffers then
            else:
                self.packed = (packed_custom_mask, bit_indptr)
        self._store(qo_indptr, paged_kv_indptr, paged_kv_indices, paged_kv_last_page_len, num_qo_heads,
                    num_kv_heads, head_dim_qk, page_size, causal, custom_mask, q_data_type, kv_data_type, sm_scale,
                    uniform_q_len=uniform_q_len, backend=self._backend, packed=packed_custom_mask is not None,
                    disable_split_kv=disable_split_kv)
        self.sched = None
        if self.use_cuda_graph and self._backend == "fa2" and uniform_q_len and not masked:
            pages = (paged_kv_indptr[1:] - paged_kv_indptr[:-1]).tolist()
            self._fa2_plan(pages, uniform_q_len, num_qo_heads // num_kv_heads, num_kv_heads, page_size, head_dim_qk,
                           disable_split_kv)

    # the fa2 paged prefill's schedule in graph mode with uniform_q_len, as FlashInfer 0.7.2's PrefillPlan writes it
    # (scheduler.cuh, PrefillSplitQOKVIndptr: transliterated here on its own, not shared with attnlab's model)
    MAX_GRID: ClassVar[int] = 64
    CHUNK_BIAS: ClassVar[int] = 0  # a test's "other FlashInfer version": the chunk this many pages off

    def _fa2_plan(self, pages, q_len, group, hkv, ps, head_dim=64, disable_split_kv=False):
        packed = q_len * group
        cta = 16 if packed <= 16 else 64 if packed <= 64 or head_dim >= 256 else 128  # FA2DetermineCtaTileQ-like
        tiles_q = math.ceil(packed / cta)
        max_if_split = self.MAX_GRID // hkv
        low, high = max(128 // ps, 1), max(1, *pages)
        while low < high:
            mid = (low + high) // 2
            if sum(tiles_q * math.ceil(max(p, 1) / mid) for p in pages) > max_if_split:
                low = mid + 1
            else:
                high = mid
        # disable_split_kv: one chunk a request (FlashInfer's kernel then reads each request's whole KV, whatever
        # the chunk size it was handed), no merge
        chunk = (2 ** 30 // ps) if disable_split_kv else low + self.CHUNK_BIAS
        o_indptr = [0]
        for p in pages:
            o_indptr.append(o_indptr[-1] + q_len * (1 if disable_split_kv else math.ceil(max(p, 1) / chunk)))
        padded = max(max_if_split, tiles_q * len(pages))
        chunk_off, o_off = 5, 32
        pinned = torch.zeros(o_off + 4 * (len(pages) + 1), dtype=torch.uint8)
        pinned[chunk_off:chunk_off + 4] = torch.tensor([chunk * ps], dtype=torch.int32).view(torch.uint8)
        pinned[o_off:o_off + 4 * len(o_indptr)] = torch.tensor(o_indptr, dtype=torch.int32).view(torch.uint8)
        self._pin_memory_int_workspace_buffer = pinned
        self._plan_info = [padded, q_len * len(pages), 0, cta, 0, 0, 0, 0, o_off, chunk_off, 0, 0, 0, 1,
                           int(not disable_split_kv)]
        self.sched = (chunk, o_indptr, q_len)

    def run(self, q, paged_kv_cache, k_scale=None, v_scale=None):
        if getattr(self, "sched", None) is not None:
            # as the kernel: request i's chunks of `chunk` pages cover its length in the buffers now; a chunk that
            # starts past it (a plan kept for other page counts) would underflow on the GPU
            chunk, o_indptr, q_len = self.sched
            kv_indptr, last, ps = self.state[1], self.state[3], self.state[4]
            for i in range(len(last)):
                n = (int(kv_indptr[i + 1] - kv_indptr[i]) - 1) * ps + int(last[i])
                tiles = (o_indptr[i + 1] - o_indptr[i]) // q_len
                assert (tiles - 1) * chunk * ps < max(n, 1), f"request {i}: a chunk starts past its {n} tokens"
                assert tiles * chunk * ps >= n, f"request {i}: {n} tokens, the plan's chunks cover fewer"
        return super().run(q, paged_kv_cache, k_scale, v_scale)


MODULES = {"fa3": "flash_attn_interface", "fa3_fwd": "fa3_fwd_interface", "fa2": "flash_attn"}
TABLE_ARG = {"fa3": "page_table", "fa3_fwd": "cache_batch_idx", "fa2": "block_table"}


def fake_fa_module(flavor: str, calls: list) -> types.ModuleType:
    mod = types.ModuleType(MODULES[flavor])
    mod.__version__ = f"0.0.0+fake-{flavor}"
    table_arg = TABLE_ARG[flavor]

    def flash_attn_with_kvcache(q, k_cache, v_cache, k=None, v=None, *, cache_seqlens=None, softmax_scale=None,
                                causal=False, **kw):
        assert set(kw) == {table_arg}, f"{flavor} got table kwargs {sorted(kw)}"
        table = kw[table_arg]
        assert k is None and v is None, "KV is already in the pool: no append"
        assert q.dim() == 4 and k_cache.dim() == 4 and k_cache.stride(-1) == 1
        b, q_len = q.shape[:2]
        assert cache_seqlens.dtype == torch.int32 and tuple(cache_seqlens.shape) == (b,)
        assert table.dtype == torch.int32 and table.is_contiguous()
        if flavor == "fa2":
            assert k_cache.shape[1] % 256 == 0, "FA2 paged KV: page size multiple of 256"
        calls.append({"q": tuple(q.shape), "q_dtype": q.dtype, "table": table.clone(),
                      "seqlens": cache_seqlens.clone(), "causal": causal, "scale": softmax_scale,
                      "ptrs": (table.data_ptr(), cache_seqlens.data_ptr())})
        out = torch.zeros(q.shape, dtype=torch.float32)
        for i in range(b):
            n = int(cache_seqlens[i])
            if flavor == "fa3_fwd":  # [batch_cache, seqlen_cache, H, D], row picked by cache_batch_idx
                assert table.shape == (b,) and n <= k_cache.shape[1]
                kk, vv = k_cache[int(table[i])][:n], v_cache[int(table[i])][:n]
            else:  # [num_blocks, page, H, D] through a [b, max_blocks] table
                assert table.dim() == 2 and table.shape[0] == b
                assert table.shape[1] >= math.ceil(n / k_cache.shape[1])
                pages = table[i].long()
                kk = k_cache[pages].reshape(-1, *k_cache.shape[2:])[:n]
                vv = v_cache[pages].reshape(-1, *v_cache.shape[2:])[:n]
            # FA's documented causal rule: query row r sees keys j <= r + seqlen_k - seqlen_q (bottom-right)
            r = torch.arange(q_len)[:, None]
            mask = torch.arange(n)[None, :] <= r + n - q_len if causal else torch.ones(q_len, n, dtype=torch.bool)
            out[i] = reference_attention(q[i], kk, vv, mask, softmax_scale)
        return out.to(q.dtype)

    mod.flash_attn_with_kvcache = flash_attn_with_kvcache
    return mod


XQA_CALLS: list = []  # the fake XQA's calls (arguments as given), for the tests to read


def fake_xqa_batch_decode_with_kv_cache(query, kv_cache, workspace_buffer, block_tables, seq_lens, max_seq_len,
                                        bmm1_scale=1.0, bmm2_scale=1.0, window_left=-1, out=None, sinks=None,
                                        kv_layout="NHD", enable_pdl=None, q_len_per_req=1, o_scale=1.0, mask=None,
                                        kv_cache_sf=None, q_cu_seq_lens=None):
    """FlashInfer 0.7.2's ``flashinfer.decode.xqa_batch_decode_with_kv_cache`` as its docstring and XQA's kernel
    (mha.cu, applyMaskFromInput) define it: ``query`` [batch x q_len, H, D]; ``kv_cache`` a (K, V) tuple of NHD
    [pages, page_size, Hkv, D]; ``block_tables`` [batch, width] int32 with width x page_size == ``max_seq_len``;
    ``seq_lens`` [batch] uint32, each request's KV length with its q_len draft tokens last; ``mask`` [batch, q_len,
    2 x ceil(q_len / 32)] uint16, bit j (little-endian 32-bit words) of row i: draft token i sees draft token j; every
    earlier token is seen. An fp8 cache: scores scaled by ``bmm1_scale``, the output by ``bmm2_scale``; a cache of the
    query's dtype: scores by ``bmm1_scale / bmm2_scale`` (the function's q_scale is bmm1 / kv_scale x sqrt(D), and the
    kernel applies kv_scale to quantized caches only), output unscaled. Returned as [batch, q_len, H, D] (the view of
    the query it was given, as the real function's)."""
    k_cache, v_cache = kv_cache
    ps, hkv = k_cache.shape[1], k_cache.shape[2]
    q_len = q_len_per_req
    assert kv_layout == "NHD" and q_cu_seq_lens is None and sinks is None and window_left == -1 and out is None
    assert workspace_buffer.dtype == torch.uint8 and workspace_buffer.numel() > 8 * 1024 * 1024
    assert query.dim() == 3 and query.is_contiguous() and query.shape[0] % q_len == 0
    b = query.shape[0] // q_len
    assert block_tables.dtype == torch.int32 and block_tables.shape[0] == b and block_tables.is_contiguous()
    assert max_seq_len == block_tables.shape[1] * ps, (max_seq_len, block_tables.shape, ps)
    assert seq_lens.dtype == torch.uint32 and tuple(seq_lens.shape) == (b,)
    words = -(-q_len // 32)
    assert q_len > 1 and mask is not None and mask.dtype == torch.uint16, "spec-dec mode needs its uint16 mask"
    assert tuple(mask.shape) == (b, q_len, 2 * words), mask.shape
    XQA_CALLS.append({"b": b, "q_len": q_len, "table": block_tables, "seq_lens": seq_lens, "mask": mask,
                      "max_seq_len": max_seq_len, "bmm1": bmm1_scale, "bmm2": bmm2_scale, "pdl": enable_pdl})
    bits = mask.contiguous().view(torch.int32).view(b, q_len, words).to(torch.int64) & 0xFFFFFFFF
    seen = ((bits[..., None] >> torch.arange(32)) & 1).bool().view(b, q_len, words * 32)[..., :q_len]
    out = torch.zeros(query.shape, dtype=torch.float32)
    for r in range(b):
        n = int(seq_lens[r].to(torch.int64))
        assert q_len <= n <= max_seq_len
        pages = block_tables[r, :-(-n // ps)].long()
        kk = k_cache[pages].reshape(-1, hkv, k_cache.shape[-1])[:n].float()
        vv = v_cache[pages].reshape(-1, hkv, v_cache.shape[-1])[:n].float()
        m = torch.ones(q_len, n, dtype=torch.bool)
        m[:, n - q_len:] = seen[r]
        rows = slice(r * q_len, (r + 1) * q_len)
        if k_cache.dtype in (torch.float8_e4m3fn, torch.float8_e5m2):  # mha.cu: qkScale x kvScale, output x kvScale
            out[rows] = reference_attention(query[rows], kk, vv, m, bmm1_scale) * bmm2_scale
        else:  # a cache of the query's dtype: the scores take bmm1 / bmm2 and the output is not rescaled
            out[rows] = reference_attention(query[rows], kk, vv, m, bmm1_scale / bmm2_scale)
    return out.to(query.dtype).view(b, q_len, *query.shape[1:])  # as FlashInfer's: [batch, q_len, H, D]
