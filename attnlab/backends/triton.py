"""The ``triton`` backend: attnlab's own paged-attention kernels (attnlab.kernels).

``make_plan`` does all host work: picks the decode or extend kernel and its launch parameters
(``attnlab.kernels.heuristics.plan_params``), builds the extend kernel's query-block table and the
uint8 custom mask, and allocates this plan's split-KV scratch. ``run`` only launches kernels: no host
sync, and nothing it touches is shared between plans of different ``slot`` values.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import ClassVar

import torch

from attnlab.backends.base import AttentionBackend, AttnMeta, Capabilities, Mode
from attnlab.errors import ConfigError


@dataclass
class TritonPlan:
    params: object  # attnlab.kernels.heuristics.LaunchParams
    num_tokens: int
    qo_indptr: torch.Tensor  # [batch + 1] int32
    kv_indptr: torch.Tensor  # [batch + 1] int32
    kv_indices: torch.Tensor  # [pages] int32
    kv_lens: torch.Tensor  # [batch] int32
    block_req: torch.Tensor | None = None  # extend: [num_blocks] int32
    block_qstart: torch.Tensor | None = None  # extend: [num_blocks] int32
    mask: torch.Tensor | None = None  # extend: [sum(q_len * kv_len)] uint8
    mask_indptr: torch.Tensor | None = None  # extend: [batch] int64
    o_part: torch.Tensor | None = None  # split-KV: [num_tokens, Hq, num_splits, D] fp32 (decode_partials=out: the
    # backend's dtype, in decode plans)
    lse_part: torch.Tensor | None = None  # split-KV: [num_tokens, Hq, num_splits] fp32
    counters: torch.Tensor | None = None  # fused_merge: int32 [programs over (block, kv head)], 0 between launches
    mask_len: int = 0  # entries of the custom mask this pass was planned with (``mask`` may be a larger buffer)
    # a prefill with no cached prefix: (tile_req, tile_q0, (BLOCK_M, BLOCK_N, warps, stages), kernel_info label) of
    # the contiguous kernel, which run_new launches on the new K / V (run, without them, keeps the paged kernel)
    contig: tuple | None = None
    paged_label: str = ""  # with contig: kernel_info's prefill label when ``run`` launches the paged kernel instead


def _int32(t: torch.Tensor, device) -> torch.Tensor:
    return t.to(device=device, dtype=torch.int32)


def _tma_rows(t: torch.Tensor) -> torch.Tensor:
    """t [T, H, D] as the contiguous prefill's descriptors want it: each token's H x D contiguous, its row stride and
    base 16-byte aligned (a view of a fused qkv output is; anything else is copied, whatever its strides)."""
    from attnlab.kernels.prefill_contig import descriptor_ready

    return t if descriptor_ready(t) else t.clone(memory_format=torch.contiguous_format)


def _mask_offsets(meta: AttnMeta) -> list[int]:
    """Start of each request's [q_len, kv_len] block in the flat custom mask, then the total (host ints)."""
    offs = [0]
    for q_len, kv_len in zip(meta.q_lens, meta.kv_lens_host):
        offs.append(offs[-1] + q_len * kv_len)
    return offs


# The fused_merge option's default (OPTIONS): the split merge inside the decode where each split is one KV tile.
FUSED_MERGE = "auto"
# The decode_partials option's values (OPTIONS): fp32, the default, and out.
DECODE_PARTIALS = ("fp32", "out")


class TritonBackend(AttentionBackend):
    name = "triton"
    OPTIONS: ClassVar[dict[str, str]] = {
        "num_splits": "int >= 1: force the split-KV count of every pass (tuning); null = heuristic",
        "split_tokens": "int >= 1: engine.invariant's fixed KV split size in tokens (rounded up to whole KV "
                        "tiles); null = 256",
        "prefill_tiles": "BLOCK_MxBLOCK_NxWARPSxSTAGES (e.g. 128x64x8x3): the extend kernel's launch for "
                         "prefills (>= 65 new tokens per request), in place of the heuristic (tuning); null = "
                         "heuristic",
        "prefill_contig": "true / false; null (default) = true unless prefill_tiles is set: a prefill with no "
                          "cached prefix (head dim 64 or 128, fp16 / bf16, a KV pool of the same dtype, the launch "
                          "fitting the GPU's shared memory) reads its new K / V from the projection output "
                          "(kernels/prefill_contig.py, tensor descriptors: TMA on Hopper) instead of the pool's pages",
        "fused_merge": "auto (default) / true / false: merge split-KV partials inside the kernel (the last split to "
                       "finish merges), not in a second launch per layer. auto: the decode's launches whose every "
                       "split holds one KV tile by the heuristic (batch-1 / small-batch decode; a decode_tiles "
                       "override keeps the launch: set true to fuse it), and split loops of head dim 128's 64-token "
                       "tile (BLOCK_D 128: head dims 65-128, measured at 128; an override of that tile too) of at "
                       "most 16 splits, under a 128-register cap (experiments/fused-merge-auto); true: "
                       "every split launch, the extend kernel's (verify) too, which took 1.11x / 1.53x its kernel time "
                       "in the engine's graphs at SmolLM2 / Llama-8B shapes (H100, 2026-12-06d, "
                       "experiments/fused-merge); false: always the merge launch",
        "decode_partials": "fp32 (default) / out: the dtype of a split decode's partial outputs (its LSEs stay fp32). "
                           "out: the backend's dtype (bf16 / fp16), as FlashInfer's split-KV decode keeps them (its "
                           "tmp_v is DTypeO): half the bytes the splits write and the merge reads, each partial "
                           "rounded once more. At the batch-1 4k decode (H100, experiments/decode-partials) the same "
                           "time with engine.pdl, 0.97-0.99x without. The extend kernel keeps fp32; refused with "
                           "engine.invariant",
        "decode_tiles": "BLOCK_NxWARPSxSTAGES (e.g. 64x4x3): the decode kernel's KV tile, warps and stages, in place "
                        "of the heuristic (tuning: the batch-1 floor); the split count follows the tile (a forced "
                        "num_splits wins); a launch past the GPU's shared memory fails when it compiles; null = "
                        "heuristic",
    }

    @classmethod
    def check_options(cls, options: dict, field: str) -> None:
        from attnlab.kernels.heuristics import parse_decode_tiles, parse_tiles
        from attnlab.kernels.merge import check_fused_merge

        for key, what in (("num_splits", "heuristic"), ("split_tokens", "256")):
            n = options.get(key)
            if n is not None and (isinstance(n, bool) or not isinstance(n, int) or n < 1):
                raise ConfigError(f"{field}.{key}={n!r}: must be an int >= 1 or null ({what})")
        try:
            check_fused_merge(options.get("fused_merge", FUSED_MERGE))
        except ValueError as e:
            raise ConfigError(f"{field}.{e}") from None
        if options.get("decode_partials", "fp32") not in DECODE_PARTIALS:
            raise ConfigError(f"{field}.decode_partials={options['decode_partials']!r}: must be one of "
                              f"{', '.join(DECODE_PARTIALS)}")
        if options.get("prefill_contig") not in (None, True, False):
            raise ConfigError(f"{field}.prefill_contig={options['prefill_contig']!r}: must be true, false or null")
        for key, parse in (("prefill_tiles", parse_tiles), ("decode_tiles", parse_decode_tiles)):
            if options.get(key) is not None:
                try:
                    parse(options[key])
                except ValueError as e:
                    raise ConfigError(f"{field}.{key}={e}") from None

    def __init__(self, *args, num_splits: int | None = None, cuda_graph: bool = False,
                 max_batch_size: int | None = None, max_q_len: int = 16, max_context: int | None = None,
                 invariant: bool = False, split_tokens: int | None = None, prefill_tiles: str | None = None,
                 fused_merge: bool | str = FUSED_MERGE, prefill_contig: bool | None = None,
                 decode_tiles: str | None = None, decode_partials: str = "fp32", **kwargs):
        """num_splits: force the split-KV count (tests, tuning); None = heuristic.

        invariant (engine.invariant): every pass, prefill, decode and verify, runs attnlab.kernels.invariant
        (fixed tiles, a fixed split size of ``split_tokens`` KV tokens, splits merged in order), so a row's
        output is the same bits at any q_len, batch, padding or graph bucket; num_splits is then unused.

        cuda_graph: plans of uniform-q_len passes are graph-safe: for a given (slot, batch size, q_len,
        custom mask or not) they reuse the same device buffers (rewritten in place) and the same launch
        parameters (split count chosen for ``max_context``), so a captured graph replays any later plan of that
        key. A tree pass's uint8 mask lives in a buffer of batch x q_len x max_context entries, its offsets in
        a [batch] buffer. Other passes (ragged prefill) plan as usual and run eagerly.
        """
        super().__init__(*args, **kwargs)
        self.num_splits = num_splits
        self.invariant = invariant
        self.split_tokens = split_tokens
        self.prefill_tiles = prefill_tiles
        if decode_tiles is not None and invariant:
            raise ConfigError("triton: decode_tiles does not apply with engine.invariant=true (its kernel's tiles are "
                              "fixed; attnlab.kernels.invariant)")
        self.decode_tiles = decode_tiles
        self.check_options({"fused_merge": fused_merge, "decode_partials": decode_partials}, "triton")
        if decode_partials == "out" and invariant:
            raise ConfigError("triton: decode_partials=out does not apply with engine.invariant=true (its kernel keeps "
                              "fp32 partials for its bits: attnlab.kernels.invariant)")
        self.fused_merge = fused_merge
        self.decode_partials = decode_partials
        # a prefill_tiles sweep times the paged kernel's launches: it keeps them unless prefill_contig says otherwise
        self.prefill_contig = prefill_tiles is None if prefill_contig is None else prefill_contig
        self.cuda_graph = cuda_graph
        self.max_context = max_context or self.pool.capacity_tokens()
        self.max_q_len = max_q_len
        self._static: dict[tuple[int, int, int], TritonPlan] = {}
        self._kernels: dict[str, str] = {}  # pass label -> last launch parameters (kernel_info)

    @classmethod
    def capabilities(cls) -> Capabilities:
        interp = os.environ.get("TRITON_INTERPRET") == "1"
        kv = {"fp32", "fp16", "bf16", "fp8_e4m3", "fp8_e5m2"}
        if not interp and torch.cuda.is_available() and torch.cuda.get_device_capability() < (8, 9):
            kv.discard("fp8_e4m3")  # Triton lowers e4m3 ("fp8e4nv") on sm_89+ only; e5m2 also on sm_80
        return Capabilities(
            devices=frozenset({"cpu", "cuda"} if interp else {"cuda"}),
            dtypes=frozenset({"fp32", "fp16", "bf16"}),
            kv_dtypes=frozenset(kv),
            head_dims=frozenset({16, 32, 64, 80, 96, 128, 256}),
            page_sizes="any",
            custom_mask=True,
            cuda_graph=frozenset({Mode.DECODE, Mode.VERIFY}),
            cuda_graph_mask=True,
            notes="split-KV flash-decoding + GQA-packed extend kernel; fp8 KV dequantized after load "
                  "(e4m3 needs sm_89+, e5m2 sm_80+); CPU only under TRITON_INTERPRET=1 (slow); "
                  "invariant: one kernel for every pass (engine.invariant, causal masks only)",
            invariant=True,
        )

    @classmethod
    def available(cls) -> str | None:
        try:
            import triton  # noqa: F401
        except ImportError as e:
            return f"triton cannot be imported ({e}); pip install triton"
        if torch.cuda.is_available() or os.environ.get("TRITON_INTERPRET") == "1":
            return None
        return "no CUDA GPU (set TRITON_INTERPRET=1 to run the Triton kernels on CPU, slowly)"

    def make_plan(self, meta: AttnMeta, slot: int = 0) -> TritonPlan:
        q_lens = meta.q_lens
        if self.cuda_graph and q_lens and len(set(q_lens)) == 1:
            plan = self._graph_plan(meta, slot)
        else:
            plan = self._plan_for(meta, meta.kv_lens_host)
        p = plan.params
        label = meta.mode.value + ("_tree" if meta.custom_mask is not None else "")
        split = f"split_tokens={p.split_tokens} " if p.kind == "invariant" else ""
        merge = " merge=fused" if plan.counters is not None else ""
        merge += " partials=out" if plan.o_part is not None and plan.o_part.dtype != torch.float32 else ""
        self._kernels[label] = (f"{p.kind} BLOCK_M={p.block_m} BLOCK_N={p.block_n} {split}splits={p.num_splits}{merge} "
                                f"warps={p.num_warps} {p.stages_text()}")
        plan.contig = self._contig(meta)  # per pass (a graph bucket's static plan may also serve a prefill)
        plan.paged_label = self._kernels[label]
        return plan

    def _contig(self, meta: AttnMeta) -> tuple | None:
        """The contiguous prefill's tiles for a prefill whose every request has no cached prefix (kv_len = q_len)
        and >= PREFILL_MIN_Q_LEN new tokens somewhere, at a head dim it has a launch for; None otherwise."""
        from attnlab.kernels.extend import query_blocks
        from attnlab.kernels.heuristics import PREFILL_MIN_Q_LEN
        from attnlab.kernels.prefill_contig import contig_config

        if (not self.prefill_contig or self.invariant or meta.mode != Mode.PREFILL or meta.custom_mask is not None
                or max(meta.q_lens, default=0) < PREFILL_MIN_Q_LEN or list(meta.q_lens) != list(meta.kv_lens_host)):
            return None
        cfg = contig_config(self.head_dim, self.dtype, self.pool.dtype, self.device)
        if cfg is None:
            return None
        reqs, starts = query_blocks(meta.q_lens, cfg[0], meta.q_lens)  # heaviest first
        as_t = (lambda x: torch.tensor(x, dtype=torch.int32).to(self.device, non_blocking=True))
        bm, bn, warps, stages = cfg
        return as_t(reqs), as_t(starts), cfg, f"contig BLOCK_M={bm} BLOCK_N={bn} warps={warps} stages={stages} (new K/V)"

    def supports_device_steps(self) -> bool:
        return not self.invariant

    def device_step_plans(self, batch, n, kv_indptr, kv_indices, kv_lens, max_kv_len=None) -> list:
        from attnlab.kernels.heuristics import plan_params

        if self.invariant:
            raise NotImplementedError("triton: engine.invariant plans every step on the host")
        group = self.num_q_heads // self.num_kv_heads
        # launch parameters for the longest context a step can reach: the split boundaries follow each row's
        # own kv_len in the kernel, so the one launch holds for every step and every later draft
        params = plan_params(q_lens=[1] * batch, kv_lens=[max_kv_len or self.max_context] * batch,
                             num_kv_heads=self.num_kv_heads, group=group, head_dim=self.head_dim, has_mask=False,
                             sms=self._sms(), num_splits=self.num_splits, decode_tiles=self.decode_tiles)
        qo = torch.arange(batch + 1, dtype=torch.int32, device=self.device)
        plans = []
        for j in range(n):
            plan = TritonPlan(params, batch, qo, kv_indptr, kv_indices, kv_lens[j])
            self._split_scratch(plan, batch, batch)
            self._slots[j + 1] = plan
            plans.append(plan)
        self._kernels["decode_steps"] = (f"decode BLOCK_M={params.block_m} BLOCK_N={params.block_n} "
                                         f"splits={params.num_splits} warps={params.num_warps} "
                                         f"{params.stages_text()} (device-planned)")
        return plans

    def supports_device_trees(self) -> bool:
        return not self.invariant

    def device_tree_plans(self, batch, topk, n, kv_indptr, kv_indices, bufs) -> list:
        """Plans of ``n`` tree frontier passes (q_len ``topk``, custom mask) whose KV lengths, masks and mask
        offsets the device writes into ``bufs`` (attnlab.spec.tree_device.TreeStepBuffers) before each pass, over
        one page layout (``kv_indptr`` / ``kv_indices``, every row's pages up to its last pass). Slots 1 .. n. Launch
        parameters for the longest KV a pass can have, ``bufs.width`` (the split boundaries follow each row's own
        kv_len in the kernel)."""
        from attnlab.kernels.extend import query_blocks
        from attnlab.kernels.heuristics import plan_params

        if self.invariant:
            raise NotImplementedError("triton: engine.invariant has no tree passes")
        group = self.num_q_heads // self.num_kv_heads
        kv = [bufs.width] * batch
        params = plan_params(q_lens=[topk] * batch, kv_lens=kv, num_kv_heads=self.num_kv_heads, group=group,
                             head_dim=self.head_dim, has_mask=True, sms=self._sms(), num_splits=self.num_splits)
        reqs, starts = query_blocks([topk] * batch, params.tokens_per_block, kv)
        as_t = (lambda x: torch.tensor(x, dtype=torch.int32).to(self.device, non_blocking=True))
        qo, block_req, block_qstart = as_t([i * topk for i in range(batch + 1)]), as_t(reqs), as_t(starts)
        tokens = batch * topk
        plans = []
        for j in range(n):
            plan = TritonPlan(params, tokens, qo, kv_indptr, kv_indices, bufs.kv_lens[j], block_req, block_qstart,
                              mask=bufs.masks[j], mask_indptr=bufs.mask_indptr[j])
            self._split_scratch(plan, tokens, len(reqs))
            self._slots[j + 1] = plan
            plans.append(plan)
        self._kernels["tree_steps"] = (f"{params.kind} BLOCK_M={params.block_m} BLOCK_N={params.block_n} "
                                       f"splits={params.num_splits} warps={params.num_warps} "
                                       f"{params.stages_text()} (device-planned)")
        return plans

    def _sms(self) -> int:
        from attnlab.kernels.heuristics import sm_count

        return sm_count(self.device.index or 0) if self.device.type == "cuda" else sm_count()

    def kernel_info(self) -> dict[str, str]:
        """The kernel and launch parameters of the last plan per pass label (decode, verify, prefill, ..._tree)."""
        return dict(sorted(self._kernels.items()))

    def _graph_plan(self, meta: AttnMeta, slot: int) -> TritonPlan:
        """The static plan of (slot, batch, q_len, masked), its buffers overwritten with this pass's values."""
        masked = meta.custom_mask is not None
        bs, q_len = meta.batch_size, meta.q_lens[0]
        key = (slot, bs, q_len, masked)
        plan = self._static.get(key)
        if plan is None:
            # Launch parameters for the longest context this side can see: valid for every later length.
            plan = self._plan_for(meta, [self.max_context] * bs)
            cap = self.pool.num_pages + 1 + bs * -(-self.max_q_len // self.pool.page_size)
            indices = torch.zeros(cap, dtype=torch.int32, device=self.device)
            plan.kv_indptr, plan.kv_lens = plan.kv_indptr.clone(), plan.kv_lens.clone()
            plan.kv_indices = indices
            if masked:  # every request may reach max_context (a padded dummy holds q_len)
                plan.mask = torch.zeros(bs * q_len * max(self.max_context, q_len), dtype=torch.uint8,
                                        device=self.device)
                plan.mask_indptr = plan.mask_indptr.clone()
            self._static[key] = plan
        lay = meta.layout
        plan.kv_indptr.copy_(lay.kv_indptr, non_blocking=True)
        plan.kv_lens.copy_(lay.kv_lens, non_blocking=True)
        if lay.kv_indices.shape[0] > plan.kv_indices.shape[0]:
            raise ConfigError(f"triton graph plan: {lay.kv_indices.shape[0]} page ids, buffer holds "
                              f"{plan.kv_indices.shape[0]} (max_q_len {self.max_q_len} < this pass's {q_len}?)")
        plan.kv_indices[: lay.kv_indices.shape[0]].copy_(lay.kv_indices, non_blocking=True)
        if masked:
            offs = _mask_offsets(meta)
            plan.mask_indptr.copy_(torch.tensor(offs[:-1], dtype=torch.int64), non_blocking=True)
            plan.mask_len = offs[-1]
            self.write_mask(plan, meta.custom_mask)
        return plan

    def _plan_for(self, meta: AttnMeta, kv_lens_for_params: list[int]) -> TritonPlan:
        from attnlab.kernels.extend import query_blocks
        from attnlab.kernels.heuristics import plan_params

        dev = self.device
        lay = meta.layout
        has_mask = meta.custom_mask is not None
        sms = self._sms()
        group = self.num_q_heads // self.num_kv_heads
        if self.invariant:
            from attnlab.kernels.invariant import invariant_params

            if has_mask:  # config refuses it; a direct caller gets the same one line
                raise ConfigError("engine.invariant=true: tree (custom-mask) passes are not invariant (spec.topk=1)")
            params = invariant_params(group=group, head_dim=self.head_dim, max_kv_len=max(kv_lens_for_params, default=0),
                                      split_tokens=self.split_tokens)
        else:
            params = plan_params(q_lens=meta.q_lens, kv_lens=kv_lens_for_params, num_kv_heads=self.num_kv_heads,
                                 group=group, head_dim=self.head_dim, has_mask=has_mask, sms=sms,
                                 num_splits=self.num_splits, prefill_tiles=self.prefill_tiles,
                                 decode_tiles=self.decode_tiles)
        num_tokens = meta.num_tokens
        plan = TritonPlan(params, num_tokens, _int32(meta.qo_indptr, dev), _int32(lay.kv_indptr, dev),
                          _int32(lay.kv_indices, dev), _int32(lay.kv_lens, dev))
        if params.kind in ("extend", "invariant"):
            reqs, starts = query_blocks(meta.q_lens, params.tokens_per_block, kv_lens_for_params)
            plan.block_req = torch.tensor(reqs, dtype=torch.int32).to(dev, non_blocking=True)
            plan.block_qstart = torch.tensor(starts, dtype=torch.int32).to(dev, non_blocking=True)
            if has_mask:
                plan.mask = meta.custom_mask.to(device=dev, dtype=torch.uint8, copy=True)
                offs = _mask_offsets(meta)
                plan.mask_indptr = torch.tensor(offs[:-1], dtype=torch.int64).to(dev, non_blocking=True)
                plan.mask_len = offs[-1]
        self._split_scratch(plan, num_tokens, len(meta.q_lens) if params.kind == "decode" else len(plan.block_req))
        return plan

    def _split_scratch(self, plan: TritonPlan, num_tokens: int, blocks: int) -> None:
        """A split plan's partial outputs, LSEs and (fused_merge) arrival counters over ``blocks`` programs per kv
        head; nothing for an unsplit one (the invariant kernel always merges, one split too)."""
        from attnlab.kernels.merge import partials_dtype

        params = plan.params
        if params.num_splits > 1 or params.kind == "invariant":
            plan.o_part = torch.empty(num_tokens, self.num_q_heads, params.num_splits, self.head_dim,
                                      dtype=partials_dtype(self.decode_partials, params, self.dtype),
                                      device=self.device)
            plan.lse_part = torch.empty(num_tokens, self.num_q_heads, params.num_splits, dtype=torch.float32,
                                        device=self.device)
            plan.counters = self._merge_counters(params, blocks)

    def _merge_counters(self, params, blocks: int) -> torch.Tensor | None:
        """fused_merge's arrival counters of a plan that merges inside its kernel (``fuses_merge``): one per (request
        or query block, kv head), zeros."""
        from attnlab.kernels.merge import fuses_merge, merge_counters

        if not fuses_merge(self.fused_merge, params):
            return None
        return merge_counters(blocks, self.num_kv_heads, self.device)

    def write_mask(self, plan: TritonPlan, custom_mask: torch.Tensor) -> None:
        """In place into the plan's uint8 mask buffer (bool -> uint8 in the copy): graph-safe."""
        if plan.mask is None or custom_mask.numel() != plan.mask_len:
            raise ValueError(f"triton: update_mask got {custom_mask.numel()} mask entries for a plan of "
                             f"{plan.mask_len if plan.mask is not None else 'no custom mask'}")
        plan.mask[: plan.mask_len].copy_(custom_mask.reshape(-1), non_blocking=True)

    def run(self, q: torch.Tensor, layer: int) -> torch.Tensor:
        from attnlab.kernels.decode import paged_decode
        from attnlab.kernels.extend import paged_extend

        plan: TritonPlan = self.active_plan
        if plan.contig is not None:  # a contiguous-prefill plan run without its new K / V: the paged kernel runs
            self._kernels["prefill"] = plan.paged_label
        pool = self.pool
        lay = pool.layer(layer)
        k_cache = lay[0].view(-1, pool.num_kv_heads, pool.head_dim)
        v_cache = lay[1].view(-1, pool.num_kv_heads, pool.head_dim)
        out = torch.empty(q.shape, dtype=q.dtype, device=q.device)
        common = {"page_size": pool.page_size, "scale": self.scale, "params": plan.params, "k_scale": pool.k_scale,
                  "v_scale": pool.v_scale, "o_part": plan.o_part, "lse_part": plan.lse_part, "counters": plan.counters}
        if plan.params.kind == "invariant":
            from attnlab.kernels.invariant import paged_invariant

            return paged_invariant(q, k_cache, v_cache, out, plan.qo_indptr, plan.kv_indptr, plan.kv_indices,
                                   plan.kv_lens, plan.block_req, plan.block_qstart, page_size=pool.page_size,
                                   scale=self.scale, params=plan.params, o_part=plan.o_part, lse_part=plan.lse_part,
                                   k_scale=pool.k_scale, v_scale=pool.v_scale, counters=plan.counters)
        if plan.params.kind == "decode":
            return paged_decode(q, k_cache, v_cache, out, plan.qo_indptr, plan.kv_indptr, plan.kv_indices,
                                plan.kv_lens, **common)
        return paged_extend(q, k_cache, v_cache, out, plan.qo_indptr, plan.kv_indptr, plan.kv_indices,
                            plan.kv_lens, plan.block_req, plan.block_qstart, mask=plan.mask,
                            mask_indptr=plan.mask_indptr, **common)

    def run_new(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, layer: int) -> torch.Tensor:
        """``run``, but a prefill planned for the contiguous kernel (``_contig``) reads the new K / V given here.
        kernel_info's prefill label says which kernel ran, when it ran (a hybrid hands its triton side its rows)."""
        plan: TritonPlan = self.active_plan
        if plan.contig is None or k is None or v is None:
            return self.run(q, layer)
        from attnlab.kernels.prefill_contig import prefill_contig

        req, q0, (bm, bn, warps, stages), label = plan.contig
        self._kernels["prefill"] = label
        q, k, v = (_tma_rows(t) for t in (q, k, v))
        return prefill_contig(q, k, v, plan.qo_indptr, req, q0, scale=self.scale, block_m=bm, block_n=bn,
                              num_warps=warps, num_stages=stages)

    def warmup(self, *, batch_sizes=(1,), q_lens=(1,), kv_lens=(1,), custom_mask: bool = False) -> list:
        """Compile every kernel variant the given shapes will use (see attnlab.kernels.warmup); an invariant
        backend has one, whatever the shapes."""
        from attnlab.kernels.warmup import WarmupShape, warmup

        if self.invariant:
            from attnlab.kernels.invariant import warmup_invariant

            return warmup_invariant(self.num_q_heads, self.num_kv_heads, self.head_dim, self.pool.page_size,
                                    self.dtype, self.pool.dtype, self.device, self.split_tokens,
                                    self.fused_merge is True)

        shape = WarmupShape(self.num_q_heads, self.num_kv_heads, self.head_dim, self.pool.page_size,
                            self.dtype, self.pool.dtype, tuple(batch_sizes), tuple(q_lens), tuple(kv_lens),
                            custom_mask, self.num_splits, self.prefill_tiles, self.fused_merge,
                            self.prefill_contig, self.decode_tiles, self.decode_partials)
        return warmup([shape], self.device)
