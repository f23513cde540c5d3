"""FlashInfer backend: paged decode / prefill wrappers reading the attnlab KV pool in place.

- ``Mode.DECODE`` (q_len = 1 everywhere, no custom mask): ``BatchDecodeWithPagedKVCacheWrapper``,
  tensor-core kernels chosen by :func:`decode_uses_tensor_cores`.
- ``Mode.PREFILL`` / ``Mode.VERIFY`` (and any pass with q_len != 1 or a tree mask):
  ``BatchPrefillWithPagedKVCacheWrapper`` with ``causal=True`` (bottom-right, as our rule) or the
  flattened bool ``custom_mask`` of :class:`~attnlab.backends.base.AttnMeta` (same format as FlashInfer's).

Which FlashInfer kernel family a prefill wrapper runs is chosen per pass, as SGLang does it (its flashinfer
backend builds every paged prefill / verify wrapper with ``backend="fa2"``): :func:`prefill_family`.
Verify, draft catch-up and other short extends (max q_len < ``prefill_min_q_len``) run ``fa2``, whose
planner packs q_len x GQA-group rows into one query tile and splits long KV across CTAs; long prefills run
``auto`` (FA3 on Hopper: one work item per query head and 128-row tile, no GQA packing and no split-KV,
which only pays once a pass has enough rows); tree masks always run ``fa2`` (FA3 has no custom mask). In
CUDA-graph mode an fa2 plan of a uniform-q_len pass passes ``uniform_q_len``, so the graph-mode scheduler
sizes its query tile for q_len x group rows instead of the ragged worst case. ``kernel_info()`` reports what
each wrapper resolved to (``w.resolved_backend`` / the prefill wrapper's resolved ``_backend``).
``verify_backend=xqa`` runs uniform chain verifies of at most 32 q_len x GQA rows on FlashInfer's XQA kernel instead
(one launch, its split merged in-kernel, no host plan: flashinfer_xqa), the other short passes on fa2.

The pool layer ``[2, num_pages + 1, page_size, Hkv, D]`` is handed over as the tuple ``(layer[0], layer[1])``
(two NHD ``[pages, page_size, Hkv, D]`` views, no copy): FlashInfer's single-tensor form is
``[pages, 2, page_size, Hkv, D]``, which is not our layout.

Wrappers are stateful (``plan()`` writes into them), so there is one wrapper per (slot, kind, kernel family
[, batch size, q_len]): slot 0 is the per-pass plan, slots 1..k the multi-step draft plans; they are created
lazily and re-planned every iteration (a wrapper's ``backend`` is fixed at construction).

CUDA graphs (``cuda_graph=True``): every slot owns preallocated int32 index buffers sized for
``max_batch_size`` requests and every page of the pool; wrappers are created with ``use_cuda_graph=True`` and
slices of those buffers, one wrapper per (slot, kind, family, batch size, q_len) bucket and plan variant
(``verify_split_kv=auto``: with or without split-KV; ``verify_as_decode=auto``: the decode rows too, whose wrappers
are keyed by their row count: a graph each), for decode and verify passes (prefills are never captured and plan
plain wrappers). What the capturing caller must do:

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
from typing import ClassVar

import torch

from attnlab.backends import flashinfer_schedule as fis
from attnlab.backends import flashinfer_xqa as xqa
from attnlab.backends.base import (
    DTYPE_TO_NAME,
    AttentionBackend,
    AttnMeta,
    Capabilities,
    DeviceStepsUnfit,
    Mode,
)
from attnlab.backends.flashinfer_rows import rows_layout
from attnlab.errors import BackendUnavailable, ConfigError
from attnlab.kvcache.layout import pages_needed
from attnlab.kvcache.pool import FP8_DTYPES

HEAD_DIMS = (64, 128, 256)
Q_DTYPES = (torch.float16, torch.bfloat16)
WORKSPACE_BYTES = 128 << 20  # FlashInfer's recommended float workspace (split-k partials), one per backend
INSTALL_HINT = "pip install 'attnlab[gpu]' (package flashinfer-python)"
TENSOR_CORE_MIN_GROUP = 4  # GQA ratio from which the tensor-core (prefill-kernel) decode wins, as in SGLang
CUDA_CORE_GROUPS = (1, 2, 3, 4, 6, 8, 16)  # GQA ratios compiled into the CUDA-core decode (DISPATCH_GQA_GROUP_SIZE)
PREFILL_FAMILIES = ("fa2", "fa3", "auto")  # BatchPrefillWithPagedKVCacheWrapper(backend=...) values we allow
VERIFY_FAMILIES = (*PREFILL_FAMILIES, "xqa")  # verify_backend: also XQA (flashinfer_xqa) for uniform chain verifies
# A causal pass whose longest request has at least this many new tokens is a "long prefill" and runs
# prefill_backend (auto: FA3 on Hopper). FA3's paged planner makes one work item per (query head, 128-row
# tile) with no GQA packing and no split-KV: at 512 rows a request fills 4 tiles per head, 128 items per
# request for 32 query heads (~ one wave of an H200's 132 SMs); shorter passes leave most tile rows or
# most SMs idle, where fa2's GQA-packed, split-KV plan wins (H200, 2026-12-01: verify q_len 5 ran 6x
# slower under FA3 than the Triton kernel; a 4096-token prefill ran 2x faster).
PREFILL_MIN_Q_LEN = 512
# Kept plans (make_plan): the FlashInfer versions whose schedulers flashinfer_schedule models; and a real plan,
# checked against the model, at least every KEEP_CHECK_EVERY kept passes, so a planner that disagrees where the
# model says "same schedule" is caught.
MODELLED_VERSIONS = ("0.7.",)
KEEP_CHECK_EVERY = 64
# verify_split_kv=auto (the default since its GPU tests ran, experiments/h200-2026-12-04h): an fa2 verify / short
# extend runs without split-KV (one launch, no merge) when its longest request's KV is short for the grid the pass
# makes unsplit (``verify_whole_kv``).
# Fitted on an H200 (experiments/h200-2026-12-04g: 24 cells of SmolLM2 and Llama-8B shapes, batch 1-64, context
# 512-2048, k = 4, both plans measured in one process): it picks the faster plan in all 24. Below the knee, a request
# whose K holds at most WHOLE_KV_ELEMENTS (kv_len x head_dim: SmolLM2 at 512 tokens, 32K, ran 0.80-0.88x of the split
# plan; at 1024, 64K, 1.09-1.10x) goes whole; past WHOLE_GRID_KNEE x SMs unsplit programs (batch x kv_heads x query
# tiles) the split has less to spread and the bound grows in proportion (Llama-8B batch 16, 128 programs: 512 tokens
# 0.87x, 1024 1.07x).
WHOLE_KV_ELEMENTS = 48 * 1024
WHOLE_GRID_KNEE = 0.5
# verify_as_decode=auto: a uniform verify / short extend runs as decode rows (flashinfer_rows) when its rows' traffic
# is small: each of a request's q_len rows reads that request's whole K, so the rows read q_len x the batch's kv tokens
# x head_dim elements, at most ROWS_ELEMENTS, at batch <= ROWS_MAX_BATCH and where the longest request holds at least
# ROWS_MIN_KV tokens (below it the fa2 plan is already at its launch floor and the rows' extra work items lose).
# Refitted on an H100 (experiments/h100-2026-12-05, results/rows1-*.json: 150 cells, batch 1-16 x context 128-4,096 x
# q 3 / 5 / 9, SmolLM2 and Llama-8B shapes, the rows and the default in one process): 127 cells within 3% of the better
# plan against the default's 116 (SmolLM2 55 / 51 of 75, Llama-8B 72 / 65), the worst 1.32x against 1.47x (scored
# with bench.verify_floor --computed; its measured run: experiments/rows-refit). It takes the faster plan in all 18
# cells of the H200's 2026-12-04h grid (batch 1 / 16 / 64 x 512 / 1,024 / 4,096, k 4), where a bound of 1M elements
# would lose one (Llama-8B b1 x 1,024, 1.11x). The rule before it (the batch's K <= 64K elements at batch <= 8, no
# q_len), measured on the same cells: 119 within 3%, worst 1.81x.
ROWS_ELEMENTS = 512 * 1024
ROWS_MAX_BATCH = 4
ROWS_MIN_KV = 256
NOMINAL_SMS = 132  # an H200's, for a backend off the GPU (the CPU tests' fake FlashInfer)


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


def prefill_family(kind: str, max_q_len: int, *, verify_backend: str = "fa2", prefill_backend: str = "auto",
                   prefill_min_q_len: int = PREFILL_MIN_Q_LEN) -> str:
    """The ``backend=`` of the prefill wrapper for a pass: fa2 for tree masks (FA3 has none), ``prefill_backend``
    for causal passes with max q_len >= ``prefill_min_q_len``, ``verify_backend`` for shorter ones."""
    if kind == "mask":
        return "fa2"
    return prefill_backend if max_q_len >= prefill_min_q_len else verify_backend


def verify_whole_kv(max_kv_len: int, head_dim: int, batch: int, num_kv_heads: int, q_len: int, group: int,
                    sms: int) -> bool:
    """verify_split_kv=auto's rule: whether a uniform-q_len fa2 causal pass runs without split-KV. The unsplit
    plan's programs are batch x kv_heads x query tiles (``fis.fa2_cta_tile_q``); it wins when the longest request's
    K (``max_kv_len`` x ``head_dim`` elements) is at most WHOLE_KV_ELEMENTS, a bound that grows with those programs
    past WHOLE_GRID_KNEE x ``sms``. In graph mode ``batch`` is the padded bucket: its dummies are programs of the plan
    (FlashInfer's split planner counts their tiles as well)."""
    packed = q_len * group
    programs = batch * num_kv_heads * -(-packed // fis.fa2_cta_tile_q(packed, head_dim))
    return max_kv_len * head_dim <= WHOLE_KV_ELEMENTS * max(1.0, programs / (WHOLE_GRID_KNEE * sms))


def verify_as_rows(kv_tokens: int, head_dim: int, batch: int, q_len: int, max_kv_len: int) -> bool:
    """verify_as_decode=auto's rule: whether a uniform verify / short extend (``q_len`` tokens a request) runs as
    decode rows: at most ROWS_MAX_BATCH requests, the longest holding at least ROWS_MIN_KV tokens (``max_kv_len``),
    whose rows read at most ROWS_ELEMENTS (``q_len`` x ``kv_tokens``, the sum of the kv lengths, x ``head_dim``). In
    graph mode ``batch`` is the padded bucket (the launch's size) and a dummy adds its q_len tokens (its KV is the
    scratch page), so graph and eager passes choose alike but for those few tokens."""
    return (batch <= ROWS_MAX_BATCH and max_kv_len >= ROWS_MIN_KV
            and q_len * kv_tokens * head_dim <= ROWS_ELEMENTS)


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
class MaskPacking:
    """How a flat bool custom mask becomes FlashInfer's packed uint8 mask (bit order "little", every request's
    block starting on a byte, as ``flashinfer.segment_packbits``), as one device gather: no host sync.

    src:        [num_bytes, 8] int64 flat-mask entry of each bit, num_bits (= a False pad) past a block's end
    byte_indptr: [batch + 1] int32 (host) first byte of each request's block
    """

    src: torch.Tensor
    byte_indptr: torch.Tensor
    num_bits: int
    num_bytes: int

    @classmethod
    def build(cls, q_lens, kv_lens, device) -> MaskPacking:
        seg = [q * k for q, k in zip(q_lens, kv_lens)]
        nbytes = [-(-n // 8) for n in seg]
        bits_off, bytes_off = [0], [0]
        for n, b in zip(seg, nbytes):
            bits_off.append(bits_off[-1] + n)
            bytes_off.append(bytes_off[-1] + b)
        total_bits, total_bytes = bits_off[-1], bytes_off[-1]
        host = torch.tensor([seg, bits_off[:-1], bytes_off[:-1], nbytes], dtype=torch.int64)
        seg_t, bit0, byte0, nb = host.to(device, non_blocking=True)
        req = torch.repeat_interleave(torch.arange(len(seg), device=device), nb, output_size=total_bytes)
        j = torch.arange(total_bytes, device=device) - byte0[req]  # byte within its request's block
        pos = j[:, None] * 8 + torch.arange(8, device=device)  # [num_bytes, 8] bit within the block
        src = torch.where(pos < seg_t[req][:, None], bit0[req][:, None] + pos, total_bits)
        return cls(src, torch.tensor(bytes_off, dtype=torch.int32), total_bits, total_bytes)

    def pack(self, custom_mask: torch.Tensor) -> torch.Tensor:
        """flat bool [num_bits] -> [num_bytes] uint8."""
        flat = torch.cat([custom_mask.reshape(-1).to(torch.uint8), custom_mask.new_zeros(1, dtype=torch.uint8)])
        weights = torch.tensor([1, 2, 4, 8, 16, 32, 64, 128], dtype=torch.uint8).to(flat.device, non_blocking=True)
        return (flat[self.src] * weights).sum(-1, dtype=torch.uint8)


@dataclass
class _Plan:
    wrapper: object
    kind: str
    family: str  # the wrapper's requested backend ("decode" for the decode wrapper)
    batch_size: int
    num_tokens: int
    mask_buf: torch.Tensor | None = None  # a tree pass's packed mask, in our buffer (update_mask writes it)
    packing: MaskPacking | None = None
    # graph-mode plan variants, each its own wrapper and graph: fa2 causal passes under verify_split_kv=auto "split"
    # (FlashInfer's split-KV and merge) or "whole" (disable_split_kv); under verify_as_decode=auto also "rows" (decode
    # rows), and "prefill" for the prefill wrapper's plan where the split is not by rule; None elsewhere
    variant: str | None = None


@dataclass
class _DeviceStep:
    """Step j of a device-planned launch: slot 1's wrapper (planned once per launch), and what ``use_step(j)``
    writes before it runs (one kernel, attnlab.kernels.steps): into its last-page-length buffer ``kv_lens`` (this
    step's row of the engine's device lengths) minus page_size x (pages - 1) per row of the launch's layout; at
    step 0 also the layout (kv_indptr, page ids) into the wrapper's buffers, which every slot-1 wrapper shares."""

    plan: _Plan
    step: int
    kv_lens: torch.Tensor  # [batch] int32
    kv_indptr: torch.Tensor  # [batch + 1] int32, the launch's (device) layout
    kv_indices: torch.Tensor  # int32, its page ids
    bufs: _GraphBuffers  # the wrapper's: kv_indptr, kv_indices, kv_last_page_len

    def advance(self, page_size: int) -> None:
        from attnlab.kernels.steps import write_step_meta

        b = self.kv_lens.shape[0]
        write_step_meta(self.kv_lens, self.kv_indptr, self.bufs.kv_last_page_len[:b], page_size,
                        (self.bufs.kv_indptr[:b + 1], self.kv_indices, self.bufs.kv_indices) if self.step == 0
                        else None)


class FlashInferBackend(AttentionBackend):
    name = "flashinfer"
    # backend.options / verify.options keys (constructor keyword arguments)
    OPTIONS: ClassVar[dict[str, str]] = {
        "decode_tensor_cores": "true/false: force the tensor-core (prefill-kernel) decode on or off; null = rule",
        "device_steps": "true (default) / false: plan a multi-step draft's n decode steps once per launch (CUDA "
                        "graphs, CUDA-core decode, no page boundary crossed), not once per step",
        "verify_backend": "fa2 (default) | auto | fa3 | xqa: kernel family of causal passes shorter than "
                          "prefill_min_q_len (verify, draft catch-up, short extends); auto = FlashInfer's pick; xqa = "
                          "FlashInfer's XQA speculative-decoding kernel (one launch, its split merged in-kernel) for "
                          "uniform verifies of >= 2 tokens a request that are not prefills and whose q_len x GQA group "
                          "rows are at most 32 (one query tile), fa2 for the other passes (page size "
                          "16/32/64/128, KV of the query's dtype or fp8_e4m3; flashinfer_xqa)",
        "xqa_pdl": "null (default: FlashInfer's choice, on for sm_90+) / true / false: verify_backend=xqa's launch "
                   "with programmatic dependent launch (its enable_pdl); an A/B of what the kernel's early start "
                   "costs or saves beside the engine's other launches (experiments/xqa-verify)",
        "prefill_backend": "auto (default: FA3 on Hopper) | fa2 | fa3: kernel family of long causal prefills",
        "prefill_min_q_len": f"int >= 1 (default {PREFILL_MIN_Q_LEN}): a causal pass whose longest request has "
                             "this many new tokens runs prefill_backend",
        "workspace_bytes": f"float workspace per backend instance (default {WORKSPACE_BYTES})",
        "verify_split_kv": "auto (default) | true | false: whether fa2 passes (verify, short extends, tree masks; "
                           "prefills where prefill_backend=fa2) may split long KV across CTAs and merge (FlashInfer's "
                           "plan); false plans them with disable_split_kv (one launch, no merge); auto: without the "
                           "split where the KV is short for the grid (verify_whole_kv; uniform-q_len causal passes; "
                           "in CUDA-graph mode a graph per choice), else as true (docs/backends.md)",
        "verify_as_decode": "false (default) | true | auto: a verify / short extend (uniform q_len >= 2, causal, no "
                            "mask) runs FlashInfer's decode kernel over its batch x q_len rows, row i of a request a "
                            "decode of its first kv_len - q_len + 1 + i tokens (flashinfer_rows; no GQA-packed query "
                            "tile, no merge of its own: the decode's split-KV); in CUDA-graph mode q_len <= max_q_len; "
                            "auto: where the batch's K is small (verify_as_rows; in CUDA-graph mode a graph more)",
        "keep_plans": "true (default) / false: in CUDA-graph mode, a decode (CUDA-core; also a verify's decode rows) "
                      "or fa2 verify / extend pass "
                      "whose FlashInfer schedule equals the one its wrapper holds keeps that plan and writes only "
                      "its layout (no plan() on the host)",
    }

    def __init__(self, pool, num_q_heads, num_kv_heads, head_dim, scale, dtype, *,
                 decode_tensor_cores: bool | None = None, device_steps: bool = True, verify_backend: str = "fa2",
                 prefill_backend: str = "auto", prefill_min_q_len: int = PREFILL_MIN_Q_LEN,
                 cuda_graph: bool = False, max_batch_size: int | None = None, max_q_len: int = 16,
                 max_context: int | None = None, workspace_bytes: int = WORKSPACE_BYTES, keep_plans: bool = True,
                 verify_split_kv: bool | str = "auto", verify_as_decode: bool | str = False,
                 xqa_pdl: bool | None = None):
        super().__init__(pool, num_q_heads, num_kv_heads, head_dim, scale, dtype)
        check_shapes(dtype, pool.dtype, head_dim)
        self.check_options({"verify_backend": verify_backend, "prefill_backend": prefill_backend,
                            "prefill_min_q_len": prefill_min_q_len, "device_steps": device_steps,
                            "keep_plans": keep_plans, "verify_split_kv": verify_split_kv,
                            "verify_as_decode": verify_as_decode, "xqa_pdl": xqa_pdl}, "flashinfer")
        fa3 = [n for n, v in (("verify_backend", verify_backend), ("prefill_backend", prefill_backend)) if v == "fa3"]
        if fa3 and pool.dtype in FP8_DTYPES:
            raise ConfigError(f"flashinfer: {fa3[0]}=fa3 with fp8 KV: FlashInfer's FA3 kernels need an fp8 query "
                              "for fp8 KV; use fa2 or auto")
        if fa3 and self.device.type == "cuda" and torch.cuda.get_device_capability(self.device)[0] != 9:
            raise ConfigError(f"flashinfer: {fa3[0]}=fa3 needs a Hopper GPU (sm_90); use fa2 or auto")
        self._fi = import_flashinfer()
        self._xqa_run = None  # verify_backend=xqa: FlashInfer's xqa_batch_decode_with_kv_cache
        self._xqa_pdl = xqa_pdl  # its enable_pdl (None: FlashInfer's default)
        if verify_backend == "xqa":
            xqa.check_fit(dtype, pool.dtype, pool.page_size, self.device)
            self._xqa_run = xqa.xqa_function(self._fi)
        self.use_tensor_cores = decode_uses_tensor_cores(num_q_heads, num_kv_heads, pool.dtype,
                                                         decode_tensor_cores)
        group = num_q_heads // num_kv_heads
        if not self.use_tensor_cores and group not in CUDA_CORE_GROUPS:
            raise ConfigError(f"flashinfer: CUDA-core decode has no kernel for GQA ratio {group} "
                              f"(compiled: {list(CUDA_CORE_GROUPS)}); leave decode_tensor_cores unset or True")
        self.verify_backend, self.prefill_backend = verify_backend, prefill_backend
        self.prefill_min_q_len = int(prefill_min_q_len)
        self.cuda_graph = cuda_graph
        self.device_steps = device_steps
        self.step_plans_reused = 0  # device-steps launches that kept the previous launch's plan
        self.step_launches_widened = 0  # device-steps launches in which a request crossed a page
        # rows -> (split, grid rows) of the CUDA-core decode wrappers of that many rows (decode passes, device-steps
        # launches, a verify's decode rows: one kernel, one grid bound), once a real plan confirmed the schedule model
        # (flashinfer_schedule); False after a disagreement: then only launches within pages run device-planned
        self._schedules: dict[int, tuple[bool, int | None]] = {}
        self._schedule_model_ok = True
        # (rows, q_len) -> (query tiles a request, padded work count) of graph-mode fa2 prefill wrappers, confirmed
        # by a real plan (flashinfer_schedule.prefill_schedule); off for good after a disagreement
        self._prefill_models: dict[tuple[int, int], tuple[int, int]] = {}
        self._prefill_model_ok = True
        self.keep_plans = keep_plans
        # True: uniform verify passes as decode rows (flashinfer_rows); "auto": by rule (verify_as_rows)
        self.verify_as_decode = verify_as_decode
        self.verify_split_kv = verify_split_kv  # False: fa2 causal / mask plans with disable_split_kv; "auto": by rule
        self.sms = (torch.cuda.get_device_properties(self.device).multi_processor_count
                    if self.device.type == "cuda" else NOMINAL_SMS)
        # the schedulers flashinfer_schedule models are FlashInfer 0.7's: another version plans every pass
        self._modelled_version = str(getattr(self._fi, "__version__", "")).startswith(MODELLED_VERSIONS)
        self._unchecked = 0  # passes kept since the last real plan: every KEEP_CHECK_EVERY-th plans and checks
        self.plans_made = 0  # make_plan calls that ran FlashInfer's plan()
        self.plans_kept = 0  # make_plan calls that kept the wrapper's plan (same schedule) and wrote the layout only
        if cuda_graph and not max_batch_size:
            raise ConfigError("flashinfer with cuda_graph=True needs max_batch_size (the largest graph bucket)")
        self.max_batch_size = max_batch_size
        self.max_q_len = max_q_len
        self.max_context = max_context or pool.capacity_tokens()
        # One float workspace shared by every wrapper of this backend (= one model side): wrappers run one
        # after another on one stream, and the workspace only holds partials within one run().
        self.workspace = torch.zeros(workspace_bytes, dtype=torch.uint8, device=self.device)
        self._wrappers: dict[tuple, object] = {}
        self._wrapper_bufs: dict[tuple, _GraphBuffers | None] = {}  # the buffers a fixed-buffer wrapper reads
        self._graph_bufs: dict[int, _GraphBuffers] = {}
        # id(wrapper) -> what its kept plan serves (_keep_key, _plan_key): for a decode wrapper (rows, schedule), or
        # its kv_indptr before the schedule model is confirmed
        self._step_plans: dict[int, tuple] = {}
        self._resolved: dict[str, set[str]] = {}  # pass label -> kernel families its wrappers resolved to
        # verify_backend=xqa: its workspace (semaphores, then the split's partials; made on first use), its graph-mode
        # buffers a slot (page table, KV lengths) and its draft-block masks a (batch, q_len)
        self._xqa_workspace: torch.Tensor | None = None
        self._xqa_bufs: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
        self._xqa_masks: dict[tuple[int, int], torch.Tensor] = {}
        # fp8 KV stores value / scale; FlashInfer folds k_scale into sm_scale and multiplies out by v_scale.
        self._k_scale = pool.k_scale if pool.is_fp8 else None
        self._v_scale = pool.v_scale if pool.is_fp8 else None
        # XQA takes the same as two scales: bmm1 = sm_scale x k_scale on Q.K, bmm2 = v_scale on the output
        self._xqa_bmm1, self._xqa_bmm2 = scale * (self._k_scale or 1.0), self._v_scale or 1.0

    @classmethod
    def check_options(cls, options: dict, field: str) -> None:
        """ConfigError (one line, naming ``field.key``) for option values FlashInfer cannot take."""
        for key, allowed in (("verify_backend", VERIFY_FAMILIES), ("prefill_backend", PREFILL_FAMILIES)):
            if key in options and options[key] not in allowed:
                raise ConfigError(f"{field}.{key}={options[key]!r}: choose from {', '.join(allowed)}")
        n = options.get("prefill_min_q_len", PREFILL_MIN_Q_LEN)
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            raise ConfigError(f"{field}.prefill_min_q_len={n!r}: must be an int >= 1 (query tokens)")
        tc = options.get("decode_tensor_cores")
        if tc is not None and not isinstance(tc, bool):
            raise ConfigError(f"{field}.decode_tensor_cores={tc!r}: must be true, false or null")
        for key in ("device_steps", "keep_plans"):
            if not isinstance(options.get(key, True), bool):
                raise ConfigError(f"{field}.{key}={options[key]!r}: must be true or false")
        for key in ("verify_split_kv", "verify_as_decode"):
            v = options.get(key, False)
            if not (v is True or v is False or v == "auto"):
                raise ConfigError(f"{field}.{key}={v!r}: must be auto, true or false")
        pdl = options.get("xqa_pdl")
        if pdl is not None and not isinstance(pdl, bool):
            raise ConfigError(f"{field}.xqa_pdl={pdl!r}: must be true, false or null")
        if pdl is not None and options.get("verify_backend", "fa2") != "xqa":
            raise ConfigError(f"{field}.xqa_pdl={str(pdl).lower()} acts on XQA's launch only: add "
                              f"{field}.verify_backend=xqa, or drop xqa_pdl")
        if options.get("verify_backend") == "xqa" and options.get("verify_as_decode", False) is not False:
            raise ConfigError(f"{field}.verify_backend=xqa with verify_as_decode={options['verify_as_decode']}: two "
                              "plans for the same verify passes; choose one")

    @classmethod
    def capabilities(cls) -> Capabilities:
        return Capabilities(
            devices=frozenset({"cuda"}),
            dtypes=frozenset({"fp16", "bf16"}),
            # fp8 KV (k_scale / v_scale at run): tests/backends/test_fp8_kv.py's flashinfer cases passed on an
            # H200 (2026-12-01, e4m3 and e5m2, decode and verify) against the reference on the same fp8 values
            kv_dtypes=frozenset({"fp16", "bf16", "fp8_e4m3", "fp8_e5m2"}),
            head_dims=frozenset(HEAD_DIMS),
            page_sizes="any",
            custom_mask=True,
            cuda_graph=frozenset({Mode.DECODE, Mode.VERIFY}),
            cuda_graph_mask=True,
            notes="decode: BatchDecode (tensor cores at GQA>=4 or fp8 KV); verify / short extends: BatchPrefill "
                  "fa2 (GQA-packed, split-KV; verify_backend=xqa: XQA for chain verifies), long prefills: auto "
                  "(FA3 on Hopper), tree masks: fa2; CUDA graphs "
                  "need cuda_graph=True (caller-owned buffers, one wrapper per batch size and q_len)",
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

    def family_for(self, meta: AttnMeta) -> str:
        """"decode" or the prefill wrapper's ``backend=`` for this pass."""
        kind = wrapper_kind(meta)
        return "decode" if kind == "decode" else self._prefill_family(kind, meta.max_q_len)

    def _prefill_family(self, kind: str, max_q_len: int) -> str:
        """The prefill wrapper's family (verify_backend=xqa: fa2 for the passes XQA does not take)."""
        verify = "fa2" if self.verify_backend == "xqa" else self.verify_backend
        return prefill_family(kind, max_q_len, verify_backend=verify,
                              prefill_backend=self.prefill_backend, prefill_min_q_len=self.prefill_min_q_len)

    def graph_variants(self, q_len: int, masked: bool, batch: int | None = None, slot: int = 0) -> tuple:
        """CUDA-graph mode: the plans one (``batch`` bucket, ``q_len``) pass can take, a graph each. verify_split_kv=
        auto: an fa2 causal pass (verify, draft-extend) plans with or without split-KV by its lengths, and the split
        launches a merge the whole plan does not. verify_as_decode=auto: the prefill wrapper's plan is a variant
        ("prefill" where the split is fixed), and the decode rows another where the bucket's K can be small enough
        (verify_as_rows with the fewest kv tokens it takes: one request at ROWS_MIN_KV, the others at q_len)."""
        rows = self._rows_eligible("causal", q_len, prefill=False)
        if not self.cuda_graph or masked or rows is True or self._xqa_takes("causal", q_len, prefill=False):
            return (None,)
        fa2 = (("split", "whole") if self._by_rule("causal", self._prefill_family("causal", q_len), q_len,
                                                   prefill=False) else (None,))
        if rows != "auto":
            return fa2
        fa2 = tuple(v or "prefill" for v in fa2)
        if batch is not None and not verify_as_rows(ROWS_MIN_KV + (batch - 1) * q_len, self.head_dim, batch, q_len,
                                                    ROWS_MIN_KV):
            return fa2
        return fa2 + ("rows",)

    def _by_rule(self, kind: str, family: str, uniform: int | None, prefill: bool) -> bool:
        """Whether verify_split_kv=auto decides a pass: a uniform (``uniform`` tokens a request) fa2 causal pass of
        >= 2 tokens a request that is not a prefill (the rule was fitted on verify passes). In graph mode these are
        the passes ``graph_variants`` names two plans for."""
        return (self.verify_split_kv == "auto" and kind == "causal" and family == "fa2" and uniform is not None
                and uniform >= 2 and not prefill)

    def _chain_verify(self, kind: str, uniform: int | None, prefill: bool) -> bool:
        """Whether a pass is a chain verify the verify-only plans (decode rows, XQA) may take: causal and unmasked,
        ``uniform`` (>= 2) tokens a request, shorter than a long prefill, not a prefill; in graph mode at most
        max_q_len (their buffers)."""
        return (kind == "causal" and not prefill and uniform is not None and 2 <= uniform < self.prefill_min_q_len
                and (not self.cuda_graph or uniform <= self.max_q_len))

    def _rows_eligible(self, kind: str, uniform: int | None, prefill: bool) -> bool | str:
        """verify_as_decode for this pass: False, or its value (True / "auto") for a chain verify."""
        return self.verify_as_decode if self._chain_verify(kind, uniform, prefill) else False

    def _xqa_takes(self, kind: str, uniform: int | None, prefill: bool) -> bool:
        """Whether verify_backend=xqa runs this pass on XQA: a chain verify whose uniform x GQA-group rows fit one XQA
        query tile (xqa.fits_tile)."""
        return (self.verify_backend == "xqa" and self._chain_verify(kind, uniform, prefill)
                and xqa.fits_tile(uniform, self.num_q_heads // self.num_kv_heads))

    def _as_rows(self, eligible: bool | str, meta: AttnMeta) -> bool:
        """Whether this pass (``eligible``: its _rows_eligible) runs as decode rows: verify_as_decode=true on every
        eligible pass; auto a graph capture's forced variant, else the rule (verify_as_rows)."""
        if eligible != "auto":
            return bool(eligible)
        if self.forced_variant is not None:
            return self.forced_variant == "rows"
        return verify_as_rows(sum(meta.kv_lens_host), self.head_dim, meta.batch_size, meta.q_lens[0],
                              meta.max_kv_len)

    def _whole(self, kind: str, family: str, meta: AttnMeta, by_rule: bool) -> bool:
        """Whether this pass plans with disable_split_kv (verify_split_kv; under auto a forced graph variant, else
        the rule)."""
        if not by_rule:
            return self.verify_split_kv is False and kind != "decode" and family == "fa2"
        if self.forced_variant is not None:
            return self.forced_variant == "whole"
        return verify_whole_kv(meta.max_kv_len, self.head_dim, meta.batch_size, self.num_kv_heads, meta.q_lens[0],
                               self.num_q_heads // self.num_kv_heads, self.sms)

    def kernel_info(self) -> dict[str, str]:
        """What the wrappers planned so far resolved to, per pass label (``decode``, ``verify``, ``prefill``,
        ``verify_tree``...): FlashInfer's kernel family (fa2 / fa3 / cudnn / ...; ``cuda-core`` for the
        CUDA-core decode kernel), several joined by ``+`` (e.g. short and long prefills)."""
        return {label: "+".join(sorted(v)) for label, v in sorted(self._resolved.items())}

    def plan_counts(self) -> tuple[int, int]:
        """(make_plan calls that ran FlashInfer's plan(), calls that kept their wrapper's plan)."""
        return self.plans_made, self.plans_kept

    # -- wrappers ---------------------------------------------------------------------------------------

    def _buffers(self, slot: int, batch: int | None = None, q_len: int | None = None,
                 rows: bool = False) -> _GraphBuffers:
        """Graph mode: the slot's buffers for max_batch_size requests (batch None). Otherwise the buffers of one
        (slot, batch, q_len) tree-mask wrapper, sized for ``batch`` (a tree pass's mask lives in buffers we own):
        one set per wrapper, so no later pass of the slot resizes what an earlier wrapper reads. ``rows`` (graph mode,
        verify_as_decode): the slot's buffers for max_batch_size x max_q_len decode rows, each a prefix of its
        request's page list, so the slot's page ids once per row of a request."""
        key = ("rows", slot) if rows else slot if batch is None else (slot, batch, q_len)
        if key not in self._graph_bufs:
            b = self.max_batch_size if batch is None else batch
            # page ids: every pool page once, plus padded requests that repeat the scratch page
            pages = self.pool.num_pages + 1 + b * pages_needed(self.max_q_len, self.pool.page_size)
            if rows:
                b, pages = b * self.max_q_len, pages * self.max_q_len
            z = [torch.zeros(n, dtype=torch.int32, device=self.device) for n in (b + 1, b + 1, pages, b, b + 1)]
            self._graph_bufs[key] = _GraphBuffers(*z)
        return self._graph_bufs[key]

    def _mask_capacity_bytes(self, batch: int | None = None, q_len: int | None = None) -> int:
        # per request at most ceil(q_len * max_context / 8) packed bytes (each request's bits start on a byte)
        b, q = batch or self.max_batch_size, q_len or self.max_q_len
        return b * -(-q * self.max_context // 8)

    def _wrapper(self, slot: int, kind: str, family: str, batch_size: int, graph_q_len: int | None,
                 whole: bool = False):
        """graph_q_len: the uniform q_len of a graph-mode decode / verify pass or of any tree-mask pass (its
        wrapper's row count is fixed at the first plan), or None for a plain wrapper (graph mode off, or a
        prefill / ragged pass). A tree-mask pass of one q_len always gets a fixed-buffer wrapper over buffers
        we own, graph mode or not: its packed mask is written there (``_pack_mask``, ``write_mask``). ``whole``:
        a plan without split-KV, which in graph mode is a wrapper of its own (its plan launches no merge)."""
        own = kind == "mask" and graph_q_len is not None
        graph = (self.cuda_graph or own) and graph_q_len is not None
        key = (slot, kind, family, batch_size, graph_q_len, whole) if graph else (slot, kind, family)
        if key in self._wrappers:
            return self._wrappers[key], self._wrapper_bufs.get(key)
        fi = self._fi
        buf = None
        if not graph:
            if kind == "decode":
                w = fi.BatchDecodeWithPagedKVCacheWrapper(self.workspace, "NHD",
                                                          use_tensor_cores=self.use_tensor_cores)
            else:
                w = fi.BatchPrefillWithPagedKVCacheWrapper(self.workspace, "NHD", backend=family)
        else:
            rows = family == "rows"  # verify_as_decode: batch_size counts decode rows (graph mode only)
            if self.cuda_graph and batch_size > self.max_batch_size * (self.max_q_len if rows else 1):
                raise ConfigError(f"flashinfer graph bucket: batch {batch_size} > max_batch_size {self.max_batch_size}"
                                  + (f" x max_q_len {self.max_q_len} decode rows" if rows else ""))
            b = batch_size
            buf = self._buffers(slot, rows=rows) if self.cuda_graph else self._buffers(slot, b, graph_q_len)
            if kind == "decode":
                w = fi.BatchDecodeWithPagedKVCacheWrapper(
                    self.workspace, "NHD", use_cuda_graph=True, use_tensor_cores=self.use_tensor_cores,
                    paged_kv_indptr_buffer=buf.kv_indptr[:b + 1], paged_kv_indices_buffer=buf.kv_indices,
                    paged_kv_last_page_len_buffer=buf.kv_last_page_len[:b])
            else:
                mask_args = {}
                if kind == "mask":
                    # Allocated once and never replaced: a wrapper reads the buffer it was built over for its
                    # whole life, and write_mask writes buf.custom_mask. Replacing it (as a longer pass of the
                    # same (slot, batch) once did, eager mode) left the earlier wrappers reading the old buffer:
                    # their frontier passes ran with the plan-time placeholder mask (issue 13's fuzz).
                    if buf.custom_mask is None:
                        cap = self._mask_capacity_bytes(*(() if self.cuda_graph else (b, graph_q_len)))
                        buf.custom_mask = torch.zeros(cap, dtype=torch.uint8, device=self.device)
                    mask_args = {"custom_mask_buf": buf.custom_mask, "mask_indptr_buf": buf.mask_indptr[:b + 1]}
                w = fi.BatchPrefillWithPagedKVCacheWrapper(
                    self.workspace, "NHD", use_cuda_graph=True, qo_indptr_buf=buf.qo_indptr[:b + 1],
                    paged_kv_indptr_buf=buf.kv_indptr[:b + 1], paged_kv_indices_buf=buf.kv_indices,
                    paged_kv_last_page_len_buf=buf.kv_last_page_len[:b], backend=family, **mask_args)
        self._wrappers[key] = w
        self._wrapper_bufs[key] = buf
        return w, buf

    # -- plan / run -------------------------------------------------------------------------------------

    def make_plan(self, meta: AttnMeta, slot: int = 0) -> _Plan:
        if meta.page_size != self.pool.page_size:
            raise ConfigError(f"flashinfer: meta.page_size {meta.page_size} != pool page_size {self.pool.page_size}")
        kind = wrapper_kind(meta)
        family = self.family_for(meta)
        uniform = meta.q_lens[0] if meta.q_lens and len(set(meta.q_lens)) == 1 else None
        graph_q_len = uniform if meta.mode != Mode.PREFILL else None  # prefills are never captured
        if kind == "mask" and graph_q_len is not None:
            need = sum(-(-q * k // 8) for q, k in zip(meta.q_lens, meta.kv_lens_host))
            cap = self._mask_capacity_bytes() if self.cuda_graph else self._mask_capacity_bytes(meta.batch_size,
                                                                                                graph_q_len)
            if need > cap:
                raise ConfigError(f"flashinfer graph mode: tree mask needs {need} bytes, buffer holds "
                                  f"{cap}; raise max_q_len / max_context")
        if self._xqa_takes(kind, uniform, meta.mode == Mode.PREFILL):
            return self._xqa_plan(meta, slot)
        eligible = self._rows_eligible(kind, uniform, meta.mode == Mode.PREFILL)
        rows_auto = self.cuda_graph and eligible == "auto"
        if self._as_rows(eligible, meta):
            return self._rows_plan(meta, slot, "rows" if rows_auto else None)
        by_rule = self._by_rule(kind, family, uniform, meta.mode == Mode.PREFILL)
        whole = self._whole(kind, family, meta, by_rule)
        variant = ("whole" if whole else "split") if by_rule and self.cuda_graph else "prefill" if rows_auto else None
        wrapper, buf = self._wrapper(slot, kind, family, meta.batch_size, graph_q_len, whole)
        qo_indptr, kv_indptr, last_page_len = host_csr(meta)
        ind = kv_indptr.tolist()
        pages = fis.page_counts(ind)
        keep = self._keep_key(kind, family, meta, graph_q_len, ind, pages, whole) if buf is not None else None
        if self._keeps(wrapper, keep):
            self._write_layout(buf, kv_indptr, last_page_len, meta.layout.kv_indices,
                               qo_indptr if kind != "decode" else None)
            self._record(meta, kind, wrapper, family, ":whole" if whole else "")
            return _Plan(wrapper, kind, family, meta.batch_size, meta.num_tokens, variant=variant)
        common = {"q_data_type": self.dtype, "kv_data_type": self.pool.dtype, "sm_scale": self.scale}
        if whole:
            common["disable_split_kv"] = True
        shape = (self.num_q_heads, self.num_kv_heads, self.head_dim, meta.page_size)
        packing = None
        if kind == "decode":
            wrapper.plan(kv_indptr, meta.layout.kv_indices, last_page_len, *shape, pos_encoding_mode="NONE",
                         **common)
        else:
            graphed = getattr(wrapper, "_use_cuda_graph", getattr(wrapper, "use_cuda_graph", False))
            if graphed and graph_q_len is not None and family == "fa2":
                # fa2's graph-mode scheduler otherwise sizes the query tile for the ragged worst case
                # (total rows - batch + 1 rows per request); the hint is exact here (every request has it)
                common["uniform_q_len"] = graph_q_len
            mask_args = {"custom_mask": meta.custom_mask} if kind == "mask" else {}
            if kind == "mask" and buf is not None:
                # Our own packing, on the device (FlashInfer's segment_packbits reads its output size back: a
                # host sync per plan), into our buffer; update_mask rewrites it in place.
                packing = MaskPacking.build(meta.q_lens, meta.kv_lens_host, self.device)
                mask_args = {"packed_custom_mask": packing.pack(meta.custom_mask)}
            wrapper.plan(qo_indptr, kv_indptr, meta.layout.kv_indices, last_page_len, *shape,
                         causal=kind == "causal", **mask_args, **common)
            if packing is not None:
                # The kernel reads request i's bits from byte mask_indptr[i]; with a packed mask FlashInfer's plan
                # fills that buffer from the unpacked (bit) offsets, so write the byte offsets after it.
                buf.mask_indptr[: meta.batch_size + 1].copy_(packing.byte_indptr, non_blocking=True)
        self._record(meta, kind, wrapper, family, ":whole" if whole else "")
        if keep is not None:
            if not whole:  # a whole plan has one schedule per (rows, q_len): nothing to model
                self._confirm_model(kind, wrapper, meta.batch_size, graph_q_len, pages)
            self._step_plans[id(wrapper)] = self._keep_key(kind, family, meta, graph_q_len, ind, pages, whole)
        return _Plan(wrapper, kind, family, meta.batch_size, meta.num_tokens,
                     buf.custom_mask if packing is not None else None, packing, variant)

    def _rows_plan(self, meta: AttnMeta, slot: int, variant: str | None) -> _Plan:
        """verify_as_decode: the pass's batch x q_len query rows as decode requests (flashinfer_rows), on a decode
        wrapper of their own per row count (graph mode: over the slot's rows buffers; buckets of one row count, e.g. 2
        x 4 and 4 x 2, share it: the same launch shape, planned before each replay). The rows' page ids are one gather
        of the layout's on the device. In graph mode the CUDA-core decode's plans are kept as a decode pass's are
        (the rows' schedule, flashinfer_schedule, of their page counts)."""
        q, ps = meta.q_lens[0], meta.page_size
        kv_indptr, last, gather = rows_layout(meta.kv_lens_host, q, ps)
        rows = meta.batch_size * q
        wrapper, buf = self._wrapper(slot, "decode", "rows", rows, 1 if self.cuda_graph else None)
        if buf is not None and gather.numel() > buf.kv_indices.numel():
            raise ValueError(f"flashinfer rows: {gather.numel()} page ids exceed the graph buffer's "
                             f"{buf.kv_indices.numel()}")
        indices = meta.layout.kv_indices[gather.to(self.device, non_blocking=True)]
        keep = None
        if buf is not None and self.keep_plans and self._modelled_version:
            ind = kv_indptr.tolist()
            pages = fis.page_counts(ind)
            keep = self._decode_keep_key(rows, pages, ind)
        plan = _Plan(wrapper, "decode", "rows", rows, meta.num_tokens, variant=variant)
        if self._keeps(wrapper, keep):
            self._write_layout(buf, kv_indptr, last, indices)
            self._record(meta, "decode", wrapper, "decode", ":rows")
            return plan
        wrapper.plan(kv_indptr, indices, last, self.num_q_heads, self.num_kv_heads, self.head_dim, ps,
                     pos_encoding_mode="NONE", q_data_type=self.dtype, kv_data_type=self.pool.dtype,
                     sm_scale=self.scale)
        self._record(meta, "decode", wrapper, "decode", ":rows")
        if keep is not None:
            self._learn_schedule(wrapper, rows, pages)
            self._step_plans[id(wrapper)] = self._decode_keep_key(rows, pages, ind)
        return plan

    def _xqa_plan(self, meta: AttnMeta, slot: int) -> xqa.XqaPass:
        """verify_backend=xqa: the pass's page table, KV lengths and causal draft-block mask as XQA reads them (device
        ops, no plan on the host). Graph mode: written into the slot's buffers, whose page table is as wide as the
        longest captured KV (XQA's grid depends on the width: one width, one launch shape)."""
        q, ps, b = meta.q_lens[0], meta.page_size, meta.batch_size
        most = pages_needed(meta.max_kv_len, ps)  # the longest request's pages
        lay = meta.layout
        if self._xqa_workspace is None:
            self._xqa_workspace = torch.zeros(xqa.SEMAPHORE_BYTES + xqa.SCRATCH_BYTES, dtype=torch.uint8,
                                              device=self.device)
        if (b, q) not in self._xqa_masks:
            self._xqa_masks[(b, q)] = xqa.chain_mask(b, q, self.device)
        if self.cuda_graph:
            if b > self.max_batch_size:
                raise ConfigError(f"flashinfer graph bucket: batch {b} > max_batch_size {self.max_batch_size}")
            if slot not in self._xqa_bufs:
                width = xqa.graph_width(self.max_context, self.max_q_len, ps)
                self._xqa_bufs[slot] = (torch.zeros(self.max_batch_size, width, dtype=torch.int32, device=self.device),
                                        torch.zeros(self.max_batch_size, dtype=torch.int32, device=self.device))
            table_buf, lens_buf = self._xqa_bufs[slot]
            table, lens = table_buf[:b], lens_buf[:b]
            xqa.block_table(lay.kv_indptr, lay.kv_indices, most, table.shape[1], self.pool.num_pages, out=table,
                            lens=(lay.kv_lens, lens))  # one launch: the table and the lengths
        else:
            table = xqa.block_table(lay.kv_indptr, lay.kv_indices, most, max(most, 1), self.pool.num_pages)
            lens = lay.kv_lens
        self._record(meta, "causal", None, "xqa")
        return xqa.XqaPass(table, lens.view(torch.uint32), self._xqa_masks[(b, q)], q, table.shape[1] * ps)

    def _record(self, meta: AttnMeta, kind: str, wrapper, family: str, tag: str = "") -> None:
        """What this pass's plan runs, for kernel_info (a capture's forced plans are not a pass's: not recorded): the
        resolved family and ``tag``, ``:whole`` for an fa2 plan without split-KV, ``:rows`` for decode rows."""
        if self.forced_variant is not None:
            return
        label = meta.mode.value + ("_tree" if kind == "mask" else "")
        got = family if wrapper is None else resolved_family(wrapper, kind, family)
        self._resolved.setdefault(label, set()).add(got + tag)

    # -- kept plans ------------------------------------------------------------------------------------
    # A graph-mode wrapper's plan is a function of its schedule (flashinfer_schedule): the CUDA-core decode's of the
    # page counts, the fa2 prefill's (uniform q_len: verify, draft-extend) of the page counts too. A pass whose
    # schedule equals the one the wrapper's workspace holds keeps that plan and only writes its layout (indptr, page
    # ids, last page lengths) into the buffers the wrapper reads: no FlashInfer plan() on the host. Before a real
    # plan confirmed the model for a shape, only the same page counts keep a plan; a disagreement switches the model
    # off for good (another FlashInfer version).

    def _keeps(self, wrapper, keep: tuple | None) -> bool:
        """Whether ``wrapper``'s plan serves a pass whose kept-plan key is ``keep`` (None: never kept), counted as
        kept; else the pass plans (counted made), which replaces what the wrapper's workspace held. At most
        KEEP_CHECK_EVERY passes in a row keep a plan: the next one plans for real and checks the model."""
        if keep is not None and self._step_plans.get(id(wrapper)) == keep and self._unchecked < KEEP_CHECK_EVERY:
            self._unchecked += 1
            self.plans_kept += 1
            return True
        self._step_plans.pop(id(wrapper), None)
        self.plans_made += 1
        self._unchecked = 0
        return False

    def _keep_key(self, kind: str, family: str, meta: AttnMeta, graph_q_len: int | None, ind: list[int],
                  pages: list[int], whole: bool = False) -> tuple | None:
        """What a plan of this pass (kv_indptr ``ind``, page counts ``pages``) serves, or None where plans are not
        kept (keep_plans off, no graphs, the tensor-core decode, a tree mask, a family other than fa2). A ``whole``
        plan (disable_split_kv) serves every layout of its (rows, q_len): FlashInfer 0.7's planner then gives each
        request one chunk, so what it writes (tile indices, output indptr, total rows) depends on neither the
        lengths nor the page counts."""
        if not (self.keep_plans and self.cuda_graph and graph_q_len is not None and self._modelled_version):
            return None
        rows, ps = meta.batch_size, self.pool.page_size
        if kind == "decode":
            return self._decode_keep_key(rows, pages, ind)
        if kind != "causal" or family != "fa2":
            return None
        if whole:
            return ("fa2:whole", rows, graph_q_len)
        known = self._prefill_models.get((rows, graph_q_len)) if self._prefill_model_ok else None
        if known is None:
            return ("fa2", rows, graph_q_len, tuple(pages))
        return ("fa2", rows, graph_q_len, fis.prefill_schedule(pages, ps, *known))

    def _confirm_model(self, kind: str, wrapper, rows: int, q_len: int, pages: list[int]) -> None:
        """Check the schedule model against the plan just made (its page-locked copy, no device sync)."""
        ps = self.pool.page_size
        if kind == "decode":
            self._learn_schedule(wrapper, rows, pages)
            return
        if not self._prefill_model_ok:
            return
        known = fis.prefill_learned(wrapper, q_len, self.num_q_heads // self.num_kv_heads)
        got = fis.prefill_planned(wrapper, rows, q_len, ps)
        if known is None or got is None or fis.prefill_schedule(pages, ps, *known) != got:
            self._prefill_model_ok = False
            self._prefill_models.clear()
        else:
            self._prefill_models[(rows, q_len)] = known

    def _write_layout(self, buf: _GraphBuffers, kv_indptr, last_page_len, kv_indices, qo_indptr=None) -> None:
        """A kept plan's new layout (host indptr / last page lengths of its rows, the device page ids; a prefill
        plan's qo_indptr), into the buffers its wrapper reads (what FlashInfer's plan() copies there)."""
        b, n = last_page_len.numel(), int(kv_indptr[-1])
        if n > buf.kv_indices.numel():
            raise ValueError(f"flashinfer: {n} page ids exceed the graph buffer's {buf.kv_indices.numel()}")
        if qo_indptr is not None:
            buf.qo_indptr[:b + 1].copy_(qo_indptr, non_blocking=True)
        buf.kv_indptr[:b + 1].copy_(kv_indptr, non_blocking=True)
        buf.kv_last_page_len[:b].copy_(last_page_len, non_blocking=True)
        buf.kv_indices[:n].copy_(kv_indices[:n], non_blocking=True)

    def write_mask(self, plan: _Plan, custom_mask: torch.Tensor) -> None:
        """Re-pack the new values into the plan's own mask buffer, in place (graph-safe)."""
        if plan.packing is None:
            raise ValueError("flashinfer: update_mask needs a tree-mask pass with one q_len per request (its "
                             "mask lives in a buffer we own); this plan has none")
        if custom_mask.numel() != plan.packing.num_bits:
            raise ValueError(f"flashinfer: update_mask got {custom_mask.numel()} mask entries for a plan of "
                             f"{plan.packing.num_bits}")
        plan.mask_buf[: plan.packing.num_bytes].copy_(plan.packing.pack(custom_mask))

    # -- device-planned steps --------------------------------------------------------------------------
    # FlashInfer's CUDA-core decode plan depends on the page counts only through its schedule (chunk size in pages,
    # tiles per request: flashinfer_schedule), and its kernel reads the last page's length from our buffer when it
    # runs. So one plan, made on the launch's last-step layout, serves all n steps of a draft whose first and last
    # steps have the same schedule, and each step only rewrites last_page_len on the device, inside the graph: a
    # step before a page crossing runs with a last-page length <= 0 (its length (pages - 1) x ps + last stays
    # exact). The schedule model is used for a row count once a real plan confirmed it; until then, launches that
    # cross a page plan every step on the host.
    # The tensor-core decode (GQA >= 4, fp8 KV) plans on token lengths: it keeps one host plan per step.

    DEVICE_STEPS_ALWAYS_FIT = False

    def supports_device_steps(self) -> bool:
        return self.device_steps and self.cuda_graph and not self.use_tensor_cores

    def device_steps_fit(self, starts, n: int, rows: int | None = None) -> bool:
        ps = self.pool.page_size
        first = [pages_needed(s + 1, ps) for s in starts]
        last = [pages_needed(s + n, ps) for s in starts]
        return first == last or self._same_schedule(first, last, rows or len(starts))

    def _same_schedule(self, first: list[int], last: list[int], rows: int) -> bool:
        """Whether a plan of the ``last`` page counts schedules the ``first`` ones identically (padded rows hold
        one page), on the confirmed model of a ``rows``-row wrapper."""
        known = self._schedules.get(rows) if self._schedule_model_ok else None
        if known is None:
            return False
        pad = [1] * (rows - len(first))
        ps = self.pool.page_size
        return fis.decode_schedule(first + pad, ps, *known) == fis.decode_schedule(last + pad, ps, *known)

    def device_steps_host_plan(self, rows: int, kv_indptr: list[int], kv_lens: list[int],
                               kv_indptr_dev: torch.Tensor, kv_indices: torch.Tensor) -> None:
        """Plan slot 1 for the launch (on its last-step layout), or, when its wrapper already holds a plan of the
        same schedule (flashinfer_schedule; before the model is confirmed, of the same page counts), keep it (the
        wrapper's own int workspace): at batch 1 and page 16 that skips the host plan on most draft launches. The
        layout reaches the slot's buffers on the device, at step 0 (``use_step``: every slot-1 wrapper shares
        them, so each launch writes its own), with each step's last page length."""
        wrapper, _ = self._wrapper(1, "decode", "decode", rows, 1)
        ps = self.pool.page_size
        pages = [kv_indptr[i + 1] - kv_indptr[i] for i in range(rows)]
        last = [n - (p - 1) * ps for p, n in zip(pages, kv_lens)]
        if min(last, default=1) < 1:  # the layout has pages the first step does not reach yet
            # any number of pages ahead: the kernel's length (pages - 1) x ps + last stays exact while >= 1
            first = [pages_needed(n, ps) for n in kv_lens]
            if min(kv_lens, default=1) < 1 or not self._same_schedule(first, pages, rows):
                raise ValueError(f"flashinfer device steps: last page lengths {last} (page {ps}) on this layout "
                                 "change FlashInfer's schedule between the launch's steps")
            widened = first
        elif max(last, default=1) > ps:
            raise ValueError(f"flashinfer device steps: last page lengths {last} outside 1..{ps} (a layout that "
                             "is not the last step's pages)")
        else:
            widened = None
        if self._step_plans.get(id(wrapper)) == self._plan_key(rows, pages, kv_indptr):
            self.step_plans_reused += 1  # the layout is written by step 0 on the device (advance)
            self.step_launches_widened += widened is not None
            return
        # the plan's last-page lengths only land in the buffer use_step rewrites before each step: kept in 1..ps
        wrapper.plan(torch.tensor(kv_indptr, dtype=torch.int32), kv_indices[:kv_indptr[-1]],
                     torch.tensor([max(x, 1) for x in last], dtype=torch.int32), self.num_q_heads,
                     self.num_kv_heads, self.head_dim, ps, pos_encoding_mode="NONE", q_data_type=self.dtype,
                     kv_data_type=self.pool.dtype, sm_scale=self.scale)
        got = self._learn_schedule(wrapper, rows, pages)
        if widened is not None:
            if got is None or (got[0] and tuple(-(-max(p, 1) // got[1]) for p in widened) != got[2]):
                # the plan does not give the first step its own tiles (the model, now off, was wrong): nothing has
                # run on it; the engine plans each step
                self._step_plans.pop(id(wrapper), None)
                raise DeviceStepsUnfit("flashinfer: the launch's plan does not schedule its first step alike")
            self.step_launches_widened += 1
        self._step_plans[id(wrapper)] = self._plan_key(rows, pages, kv_indptr)
        self._resolved.setdefault("decode_steps", set()).add(
            resolved_family(wrapper, "decode", "decode") + " (planned once per launch)")

    def _decode_keep_key(self, rows: int, pages: list[int], kv_indptr: list[int]) -> tuple | None:
        """What a graph-mode decode wrapper's kept plan serves (a decode pass's or a verify's decode rows), or None:
        the tensor-core decode plans on token lengths, so its plans are never kept."""
        return None if self.use_tensor_cores else self._plan_key(rows, pages, kv_indptr)

    def _plan_key(self, rows: int, pages: list[int], kv_indptr: list[int]) -> tuple:
        """What a slot-1 plan serves: its schedule, once the model is confirmed (the plan's content is a function of
        it, so any layout of the same schedule keeps it); before, its exact page counts."""
        known = self._schedules.get(rows) if self._schedule_model_ok else None
        return (rows, fis.decode_schedule(pages, self.pool.page_size, *known)) if known else tuple(kv_indptr)

    def _learn_schedule(self, wrapper, rows: int, pages: list[int]) -> tuple | None:
        """The schedule of the plan just made (its page-locked copy), checked against the model: the first agreement
        enables the model for this row count; a disagreement (or an unreadable plan) disables it for good."""
        got = fis.planned(wrapper, rows, self.pool.page_size)
        if self._schedule_model_ok:
            known = fis.learned(wrapper)
            if got is None or known is None or fis.decode_schedule(pages, self.pool.page_size, *known) != got:
                self._schedule_model_ok = False  # launches keep within pages from now on
                self._schedules.clear()
            else:
                self._schedules[rows] = known
        return got

    def device_step_plans(self, batch, n, kv_indptr, kv_indices, kv_lens, max_kv_len=None) -> list:
        if not self.supports_device_steps():
            raise NotImplementedError("flashinfer: device-planned steps need cuda_graph=True, the CUDA-core decode "
                                      "and device_steps=true")
        wrapper, buf = self._wrapper(1, "decode", "decode", batch, 1)
        plan = _Plan(wrapper, "decode", "decode", batch, batch)
        steps = [_DeviceStep(plan, j, kv_lens[j], kv_indptr, kv_indices, buf) for j in range(n)]
        for j, step in enumerate(steps):
            self._slots[j + 1] = step
        return steps

    def use_step(self, i: int) -> None:
        step = self._slots[i + 1]
        if isinstance(step, _DeviceStep):
            step.advance(self.pool.page_size)  # device work: captured with the step in a graph
            step = step.plan
        self._plan = step

    def run(self, q: torch.Tensor, layer: int) -> torch.Tensor:
        """q: [num_tokens, Hq, D] fp16/bf16 -> [num_tokens, Hq, D]; the active wrapper's run(), no host sync."""
        plan = self.active_plan
        kv = self.pool.layer(layer)  # [2, num_pages + 1, page_size, Hkv, D]
        if isinstance(plan, xqa.XqaPass):
            out = self._xqa_run(q.contiguous(), (kv[0], kv[1]), self._xqa_workspace, plan.table, plan.seq_lens,
                                plan.max_seq_len, bmm1_scale=self._xqa_bmm1, bmm2_scale=self._xqa_bmm2,
                                kv_layout="NHD", q_len_per_req=plan.q_len, mask=plan.mask, enable_pdl=self._xqa_pdl)
            return out.view(q.shape)  # XQA returns [batch, q_len, Hq, D]
        return plan.wrapper.run(q, (kv[0], kv[1]), k_scale=self._k_scale, v_scale=self._v_scale)


def resolved_family(wrapper, kind: str, requested: str) -> str:
    """The kernel family a planned wrapper runs. Decode: ``resolved_backend`` (FlashInfer 0.7.2's property),
    or ``cuda-core`` for the CUDA-core kernel; prefill: the wrapper's ``_backend``, which ``plan()`` turns from
    ``auto`` into its pick (0.7.2 has no public accessor for it)."""
    if kind == "decode":
        if not getattr(wrapper, "use_tensor_cores", False):
            return "cuda-core"
        return str(getattr(wrapper, "resolved_backend", None) or getattr(wrapper, "_backend", requested))
    return str(getattr(wrapper, "_backend", None) or requested)


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
