"""FlashInfer backend: paged decode / prefill wrappers reading the attnlab KV pool in place.

- ``Mode.DECODE`` (q_len = 1 everywhere, no custom mask): ``BatchDecodeWithPagedKVCacheWrapper``,
  tensor-core kernels chosen by :func:`decode_uses_tensor_cores`.
- ``Mode.PREFILL`` / ``Mode.VERIFY`` (and any pass with q_len != 1 or a tree mask):
  ``BatchPrefillWithPagedKVCacheWrapper`` with ``causal=True`` (bottom-right, as our rule) or the
  flattened bool ``custom_mask`` of :class:`~attnlab.backends.base.AttnMeta` (same format as FlashInfer's).

The pool layer ``[2, num_pages + 1, page_size, Hkv, D]`` is handed over as the tuple ``(layer[0], layer[1])``
(two NHD ``[pages, page_size, Hkv, D]`` views, no copy): FlashInfer's single-tensor form is
``[pages, 2, page_size, Hkv, D]``, which is not our layout.

Wrappers are stateful (``plan()`` writes into them), so there is one wrapper per (slot, kind[, batch size]):
slot 0 is the per-pass plan, slots 1..k the multi-step draft plans; they are created lazily and re-planned
every iteration. Causal and custom-mask prefill get separate wrappers because FlashInfer's ``backend="auto"``
resolves once per wrapper (fa3 on Hopper, which has no custom mask; fa2 with a mask).

CUDA graphs (``cuda_graph=True``): every slot owns preallocated int32 index buffers sized for
``max_batch_size`` requests and every page of the pool; wrappers are created with ``use_cuda_graph=True`` and
slices of those buffers, one wrapper per (slot, kind, batch size) bucket. What the capturing caller must do:

1. pad the batch to the bucket's batch size (padded requests: q_len as the others, kv_len = q_len, every page
   the scratch page ``pool.num_pages``; their outputs are ignored) and ``plan(meta)`` (or ``plan_steps``)
   *before* capture;
2. capture ``run(q, layer)`` for every layer on a side stream (``torch.cuda.graph``), with q a static buffer;
3. for every later pass with the same batch size (and, for verify, the same total number of query rows):
   ``plan(meta)`` again — this rewrites the buffers in place, outside the graph — then ``graph.replay()``.
   Never call ``plan`` during capture; a new batch size is a new bucket (new wrapper, new capture).
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass

import torch

from attnlab.backends.base import DTYPE_TO_NAME, AttentionBackend, AttnMeta, Capabilities, Mode
from attnlab.errors import BackendUnavailable, ConfigError
from attnlab.kvcache.layout import pages_needed
from attnlab.kvcache.pool import FP8_DTYPES

HEAD_DIMS = (64, 128, 256)
Q_DTYPES = (torch.float16, torch.bfloat16)
WORKSPACE_BYTES = 128 << 20  # FlashInfer's recommended float workspace (split-k partials), one per backend
INSTALL_HINT = "pip install 'attnlab[gpu]' (package flashinfer-python)"
TENSOR_CORE_MIN_GROUP = 4  # GQA ratio from which the tensor-core (prefill-kernel) decode wins, as in SGLang
CUDA_CORE_GROUPS = (1, 2, 3, 4, 6, 8, 16)  # GQA ratios compiled into the CUDA-core decode (DISPATCH_GQA_GROUP_SIZE)


def import_flashinfer():
    """The flashinfer module, or BackendUnavailable naming the fix."""
    try:
        return importlib.import_module("flashinfer")
    except Exception as e:  # ImportError, or a broken build (OSError / RuntimeError from its extensions)
        raise BackendUnavailable(f"flashinfer is not importable ({type(e).__name__}: {e}); {INSTALL_HINT}") from e


def decode_uses_tensor_cores(num_q_heads: int, num_kv_heads: int, kv_dtype: torch.dtype,
                             override: bool | None = None) -> bool:
    """The one rule for decode kernels: tensor cores for fp8 KV or GQA ratio >= 4, unless overridden."""
    if override is not None:
        return override
    return kv_dtype in FP8_DTYPES or num_q_heads // num_kv_heads >= TENSOR_CORE_MIN_GROUP


def wrapper_kind(meta: AttnMeta) -> str:
    """"decode" (decode wrapper), "causal" or "mask" (prefill wrapper) for one pass."""
    if meta.custom_mask is not None:
        return "mask"
    if meta.mode == Mode.DECODE and all(n == 1 for n in meta.q_lens):
        return "decode"
    return "causal"


def host_csr(meta: AttnMeta) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """qo_indptr [B+1], kv_indptr [B+1], kv_last_page_len [B] as host int32, built from the host lengths.

    Same values as ``meta.qo_indptr`` / ``meta.layout`` (built by the same rule), but on the host, so that
    FlashInfer's planner (which needs them on the host) does not sync the device to read them back.
    """
    ps = meta.page_size
    qo, kv, last = [0], [0], []
    for q_len, kv_len in zip(meta.q_lens, meta.kv_lens_host):
        n = pages_needed(kv_len, ps)
        qo.append(qo[-1] + q_len)
        kv.append(kv[-1] + n)
        last.append(kv_len - (n - 1) * ps if n else 0)
    return tuple(torch.tensor(x, dtype=torch.int32) for x in (qo, kv, last))


@dataclass
class _GraphBuffers:
    """Caller-owned int32 buffers of one slot (CUDA-graph mode); wrappers get slices of them."""

    qo_indptr: torch.Tensor  # [max_batch + 1]
    kv_indptr: torch.Tensor  # [max_batch + 1]
    kv_indices: torch.Tensor  # [num_pages + 1 + max_batch * pages(max_q_len)]: see _buffers
    kv_last_page_len: torch.Tensor  # [max_batch]
    mask_indptr: torch.Tensor  # [max_batch + 1]
    custom_mask: torch.Tensor | None = None  # [bytes] uint8 bit-packed tree mask, allocated on first use


@dataclass
class _Plan:
    wrapper: object
    kind: str
    batch_size: int
    num_tokens: int


class FlashInferBackend(AttentionBackend):
    name = "flashinfer"

    def __init__(self, pool, num_q_heads, num_kv_heads, head_dim, scale, dtype, *,
                 decode_tensor_cores: bool | None = None, cuda_graph: bool = False,
                 max_batch_size: int | None = None, max_q_len: int = 16, max_context: int | None = None,
                 workspace_bytes: int = WORKSPACE_BYTES):
        super().__init__(pool, num_q_heads, num_kv_heads, head_dim, scale, dtype)
        check_shapes(dtype, pool.dtype, head_dim)
        self._fi = import_flashinfer()
        self.use_tensor_cores = decode_uses_tensor_cores(num_q_heads, num_kv_heads, pool.dtype,
                                                         decode_tensor_cores)
        group = num_q_heads // num_kv_heads
        if not self.use_tensor_cores and group not in CUDA_CORE_GROUPS:
            raise ConfigError(f"flashinfer: CUDA-core decode has no kernel for GQA ratio {group} "
                              f"(compiled: {list(CUDA_CORE_GROUPS)}); leave decode_tensor_cores unset or True")
        self.cuda_graph = cuda_graph
        if cuda_graph and not max_batch_size:
            raise ConfigError("flashinfer with cuda_graph=True needs max_batch_size (the largest graph bucket)")
        self.max_batch_size = max_batch_size
        self.max_q_len = max_q_len
        self.max_context = max_context or pool.capacity_tokens()
        # One float workspace shared by every wrapper of this backend (= one model side): wrappers run one
        # after another on one stream, and the workspace only holds partials within one run().
        self.workspace = torch.zeros(workspace_bytes, dtype=torch.uint8, device=self.device)
        self._wrappers: dict[tuple, object] = {}
        self._graph_bufs: dict[int, _GraphBuffers] = {}
        # fp8 KV stores value / scale; FlashInfer folds k_scale into sm_scale and multiplies out by v_scale.
        self._k_scale = pool.k_scale if pool.is_fp8 else None
        self._v_scale = pool.v_scale if pool.is_fp8 else None

    @classmethod
    def capabilities(cls) -> Capabilities:
        return Capabilities(
            devices=frozenset({"cuda"}),
            dtypes=frozenset({"fp16", "bf16"}),
            kv_dtypes=frozenset({"fp16", "bf16"}),
            head_dims=frozenset(HEAD_DIMS),
            page_sizes="any",
            custom_mask=True,
            cuda_graph=frozenset({Mode.DECODE, Mode.VERIFY}),
            notes="decode: BatchDecode (tensor cores at GQA>=4); prefill/verify: BatchPrefill causal or custom "
                  "mask; CUDA graphs need cuda_graph=True (caller-owned buffers, one wrapper per batch size); "
                  "fp8 KV is wired (k_scale/v_scale) but not validated",
        )

    @classmethod
    def available(cls) -> str | None:
        try:
            import_flashinfer()
        except BackendUnavailable as e:
            return str(e)
        if not torch.cuda.is_available():
            return "no CUDA device visible: flashinfer runs on NVIDIA GPUs only (use backend=torch on CPU)"
        return None

    @classmethod
    def flavor_info(cls) -> dict:
        """For env.json: the flashinfer module this backend would use here."""
        try:
            fi = import_flashinfer()
        except BackendUnavailable as e:
            return {"module": "flashinfer", "version": None, "error": str(e)}
        return {"module": "flashinfer", "version": getattr(fi, "__version__", "unknown")}

    # -- wrappers ---------------------------------------------------------------------------------------

    def _buffers(self, slot: int) -> _GraphBuffers:
        if slot not in self._graph_bufs:
            b = self.max_batch_size
            # page ids: every pool page once, plus padded requests that repeat the scratch page
            pages = self.pool.num_pages + 1 + b * pages_needed(self.max_q_len, self.pool.page_size)
            z = [torch.zeros(n, dtype=torch.int32, device=self.device) for n in (b + 1, b + 1, pages, b, b + 1)]
            self._graph_bufs[slot] = _GraphBuffers(*z)
        return self._graph_bufs[slot]

    def _mask_capacity_bytes(self) -> int:
        # per request at most ceil(max_q_len * max_context / 8) packed bytes (segment_packbits pads each)
        return self.max_batch_size * -(-self.max_q_len * self.max_context // 8)

    def _wrapper(self, slot: int, kind: str, batch_size: int, graph_q_len: int | None):
        """graph_q_len: the uniform q_len of a graph-mode pass (its wrapper's row count is fixed at the
        first plan), or None for a plain wrapper (graph mode off, or a ragged pass such as a prefill)."""
        graph = self.cuda_graph and graph_q_len is not None
        key = (slot, kind, batch_size, graph_q_len) if graph else (slot, kind)
        if key in self._wrappers:
            return self._wrappers[key]
        fi = self._fi
        if not graph:
            if kind == "decode":
                w = fi.BatchDecodeWithPagedKVCacheWrapper(self.workspace, "NHD",
                                                          use_tensor_cores=self.use_tensor_cores)
            else:
                w = fi.BatchPrefillWithPagedKVCacheWrapper(self.workspace, "NHD")
        else:
            if batch_size > self.max_batch_size:
                raise ConfigError(f"flashinfer graph bucket: batch {batch_size} > max_batch_size {self.max_batch_size}")
            buf, b = self._buffers(slot), batch_size
            if kind == "decode":
                w = fi.BatchDecodeWithPagedKVCacheWrapper(
                    self.workspace, "NHD", use_cuda_graph=True, use_tensor_cores=self.use_tensor_cores,
                    paged_kv_indptr_buffer=buf.kv_indptr[:b + 1], paged_kv_indices_buffer=buf.kv_indices,
                    paged_kv_last_page_len_buffer=buf.kv_last_page_len[:b])
            else:
                mask_args = {}
                if kind == "mask":
                    if buf.custom_mask is None:
                        buf.custom_mask = torch.zeros(self._mask_capacity_bytes(), dtype=torch.uint8,
                                                      device=self.device)
                    mask_args = {"custom_mask_buf": buf.custom_mask, "mask_indptr_buf": buf.mask_indptr[:b + 1]}
                w = fi.BatchPrefillWithPagedKVCacheWrapper(
                    self.workspace, "NHD", use_cuda_graph=True, qo_indptr_buf=buf.qo_indptr[:b + 1],
                    paged_kv_indptr_buf=buf.kv_indptr[:b + 1], paged_kv_indices_buf=buf.kv_indices,
                    paged_kv_last_page_len_buf=buf.kv_last_page_len[:b], **mask_args)
        self._wrappers[key] = w
        return w

    # -- plan / run -------------------------------------------------------------------------------------

    def make_plan(self, meta: AttnMeta, slot: int = 0) -> _Plan:
        if meta.page_size != self.pool.page_size:
            raise ConfigError(f"flashinfer: meta.page_size {meta.page_size} != pool page_size {self.pool.page_size}")
        kind = wrapper_kind(meta)
        if kind == "mask" and self.cuda_graph:
            need = sum(-(-q * k // 8) for q, k in zip(meta.q_lens, meta.kv_lens_host))
            if need > self._mask_capacity_bytes():
                raise ConfigError(f"flashinfer graph mode: tree mask needs {need} bytes, buffer holds "
                                  f"{self._mask_capacity_bytes()}; raise max_q_len / max_context")
        uniform = meta.q_lens[0] if meta.q_lens and len(set(meta.q_lens)) == 1 else None
        wrapper = self._wrapper(slot, kind, meta.batch_size, uniform)
        qo_indptr, kv_indptr, last_page_len = host_csr(meta)
        common = {"q_data_type": self.dtype, "kv_data_type": self.pool.dtype, "sm_scale": self.scale}
        shape = (self.num_q_heads, self.num_kv_heads, self.head_dim, meta.page_size)
        if kind == "decode":
            wrapper.plan(kv_indptr, meta.layout.kv_indices, last_page_len, *shape, pos_encoding_mode="NONE",
                         **common)
        else:
            wrapper.plan(qo_indptr, kv_indptr, meta.layout.kv_indices, last_page_len, *shape,
                         causal=kind == "causal", custom_mask=meta.custom_mask if kind == "mask" else None,
                         **common)
        return _Plan(wrapper, kind, meta.batch_size, meta.num_tokens)

    def run(self, q: torch.Tensor, layer: int) -> torch.Tensor:
        """q: [num_tokens, Hq, D] fp16/bf16 -> [num_tokens, Hq, D]; the active wrapper's run(), no host sync."""
        plan = self.active_plan
        kv = self.pool.layer(layer)  # [2, num_pages + 1, page_size, Hkv, D]
        return plan.wrapper.run(q, (kv[0], kv[1]), k_scale=self._k_scale, v_scale=self._v_scale)


def check_shapes(dtype: torch.dtype, kv_dtype: torch.dtype, head_dim: int) -> None:
    """ConfigError for what FlashInfer's prebuilt/JIT paged kernels cannot do here."""
    if dtype not in Q_DTYPES:
        raise ConfigError(f"flashinfer: query dtype {DTYPE_TO_NAME.get(dtype, dtype)} unsupported "
                          "(fp16 or bf16; use backend=torch for fp32)")
    if kv_dtype != dtype and kv_dtype not in FP8_DTYPES:
        raise ConfigError(f"flashinfer: KV dtype {DTYPE_TO_NAME.get(kv_dtype, kv_dtype)} with query dtype "
                          f"{DTYPE_TO_NAME.get(dtype, dtype)}: KV must match the query dtype (or be fp8)")
    if head_dim not in HEAD_DIMS:
        raise ConfigError(f"flashinfer: head_dim {head_dim} unsupported (supported: {list(HEAD_DIMS)})")
