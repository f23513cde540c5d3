"""A chain verify on FlashInfer's XQA kernel (``flashinfer`` with ``verify_backend=xqa``).

XQA is TensorRT-LLM's decode attention, shipped in FlashInfer 0.7 as ``xqa_batch_decode_with_kv_cache`` (what
``trtllm_batch_decode_with_kv_cache(backend="auto")`` resolves to on Hopper). With ``q_len_per_req > 1`` it is a
speculative-decoding verify: each request's q_len x GQA-group rows in one CTA tile, its KV split across CTAs
("multi-block": min(SMs / (batch x kv_heads), KV tiles) a request), and the split's merge done in the same launch by
the last CTA of a request (semaphores), not by a second kernel. FlashInfer's fa2 verify plan is two launches (attention,
then the merge of its KV chunks) plus a host plan, and on an H100 that fixed cost kept 24 of 150 verify cells above
1.3x their decode (docs/backends.md, "Measured"): this is the one-launch alternative.

What the kernel reads, built here from attnlab's layout (no host sync):

- ``block_table`` [batch, width] int32: request r's page ids, padded with the scratch page; the kernel's max_seq_len is
  width x page_size (it sizes the split's grid), so a graph keeps one width (``graph_width``);
- ``seq_lens`` [batch] uint32: the KV length of each request, the pass's new tokens included (``layout.kv_lens``);
- ``mask`` [batch, q_len, 2 x ceil(q_len / 32)] uint16: the draft block's mask, bit j of row i (little-endian 32-bit
  words) set where draft token i sees draft token j; a chain verify's is causal (j <= i). Every earlier token is seen.

XQA takes a verify whose q_len x GQA-group rows fit one query tile (``fits_tile``, at most 32 rows: SmolLM2 up to
q 10, Llama-8B up to q 8); the backend runs fa2 for longer ones, where fa2 was measured faster. Limits of the kernel
(``flashinfer.jit.xqa``): page sizes 16 / 32 / 64 / 128, fp16 / bf16 queries, KV of the query's
dtype or fp8 e4m3, sm_90 / sm_100 / sm_120. Each (dtype, page size, head dim, GQA ratio, q_len) is its own JIT module
(compiled on first use, then cached on disk: experiments/xqa-verify/jit.py builds a list of them in parallel).
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass

import torch

from attnlab.backends.base import DTYPE_TO_NAME
from attnlab.errors import ConfigError
from attnlab.kvcache.layout import pages_needed

PAGE_SIZES = (16, 32, 64, 128)  # TOKENS_PER_PAGE values gen_xqa_module builds
Q_DTYPES = (torch.float16, torch.bfloat16)
FP8_KV = (torch.float8_e4m3fn,)  # CACHE_ELEM_ENUM 2; e5m2 has no XQA build
ARCH_MAJORS = (9, 10, 12)
# XQA's query tile: M_TILESIZE = 32 rows (csrc/xqa/defines.h). A request's q_len x GQA-group rows past it take
# divUp(rows, 32) CTAs a KV head (mha.cu's nbTokenBlocksPerGrp), each reading the request's whole KV again. On an H100
# (experiments/xqa-verify, 150 cells) that lost to fa2: Llama-8B shapes at q 9 (36 rows) took 1.09x fa2's time
# (geomean, fa2 faster in 16 of 25 cells, up to 1.5x), while every shape within one tile ran 0.87-0.91x of fa2's.
MAX_ROWS = 32
# xqa_batch_decode_with_kv_cache takes its semaphores from the first 8 MB of the workspace (zeroed once; the kernel
# leaves them zero) and the split's partials from the rest
SEMAPHORE_BYTES = 8 << 20
SCRATCH_BYTES = 120 << 20


def xqa_unfit(dtype: torch.dtype, kv_dtype: torch.dtype, page_size: int, device: torch.device) -> str | None:
    """Why XQA cannot run this configuration (one line), or None."""
    if page_size not in PAGE_SIZES:
        return f"page size {page_size} (XQA builds {', '.join(map(str, PAGE_SIZES))})"
    if dtype not in Q_DTYPES:
        return f"query dtype {DTYPE_TO_NAME.get(dtype, dtype)} (fp16 or bf16)"
    if kv_dtype != dtype and kv_dtype not in FP8_KV:
        return f"KV dtype {DTYPE_TO_NAME.get(kv_dtype, kv_dtype)} (the query's dtype or fp8_e4m3)"
    if device.type == "cuda":
        major = torch.cuda.get_device_capability(device)[0]
        if major not in ARCH_MAJORS:
            return f"sm_{major}x (XQA runs on sm_90, sm_100 and sm_120)"
    return None


def fits_tile(q_len: int, group: int) -> bool:
    """Whether a verify of ``q_len`` tokens a request fits one XQA query tile (``MAX_ROWS`` rows)."""
    return q_len * group <= MAX_ROWS


def check_fit(dtype: torch.dtype, kv_dtype: torch.dtype, page_size: int, device: torch.device) -> None:
    reason = xqa_unfit(dtype, kv_dtype, page_size, device)
    if reason is not None:
        raise ConfigError(f"flashinfer: verify_backend=xqa cannot run {reason}; use verify_backend=fa2")


def chain_mask(batch: int, q_len: int, device) -> torch.Tensor:
    """A causal draft block's mask as XQA reads it: [batch, q_len, 2 x words] uint16, row i's bits 0..i set."""
    words = -(-q_len // 32)
    col = torch.arange(words * 32)
    bits = (col[None, :] <= torch.arange(q_len)[:, None]).to(torch.int64).view(q_len, words, 32)
    packed = (bits << torch.arange(32)).sum(-1)  # [q_len, words], each < 2^32
    packed = torch.where(packed >= 2 ** 31, packed - 2 ** 32, packed).to(torch.int32)  # the same 32 bits, signed
    return packed.view(torch.uint16).reshape(1, q_len, 2 * words).repeat(batch, 1, 1).to(device)


def block_table(kv_indptr: torch.Tensor, kv_indices: torch.Tensor, max_pages: int, width: int, pad_page: int,
                out: torch.Tensor | None = None, lens: tuple[torch.Tensor, torch.Tensor] | None = None) -> torch.Tensor:
    """[batch, width] int32 page table from a CSR layout (device tensors; ``max_pages``: the longest request's page
    count, host), column j of request r its j-th page id, the scratch page ``pad_page`` past its pages; written into
    ``out`` (a graph slot's buffer) when given, with ``lens`` = (src, dst) the KV lengths copied too. One launch
    (attnlab.kernels.page_table), no host sync."""
    from attnlab.kernels.page_table import write_page_table

    if max_pages > width:
        raise ValueError(f"flashinfer xqa: a request holds {max_pages} pages, the table {width}")
    if out is None:
        out = torch.empty(kv_indptr.numel() - 1, width, dtype=torch.int32, device=kv_indices.device)
    elif out.shape[1] != width:
        raise ValueError(f"flashinfer xqa: a table of width {width} into a buffer {tuple(out.shape)}")
    write_page_table(kv_indptr, kv_indices, out, pad_page, lens)
    return out


def graph_width(max_context: int, max_q_len: int, page_size: int) -> int:
    """The page table's width in CUDA-graph mode: pages for the longest KV a captured pass can hold."""
    return pages_needed(max_context + max_q_len, page_size)


def xqa_function(fi):
    """``fi`` (the flashinfer module)'s decode.xqa_batch_decode_with_kv_cache, or ConfigError naming the version that
    lacks it."""
    try:
        return importlib.import_module("flashinfer.decode").xqa_batch_decode_with_kv_cache
    except (ImportError, AttributeError) as e:
        raise ConfigError(f"flashinfer {getattr(fi, '__version__', '?')} has no xqa_batch_decode_with_kv_cache "
                          f"({type(e).__name__}); verify_backend=xqa needs FlashInfer >= 0.7") from e


@dataclass
class XqaPass:
    """One pass's XQA arguments (``FlashInferBackend._xqa_plan``): page table [batch, width] int32, KV lengths
    [batch] uint32, the draft-block mask, q_len tokens a request, and the kernel's max_seq_len (width x page size)."""

    table: torch.Tensor
    seq_lens: torch.Tensor
    mask: torch.Tensor
    q_len: int
    max_seq_len: int
