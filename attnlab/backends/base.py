"""The attention-backend interface: plan once per forward pass, run once per layer.

A backend reads K/V from a :class:`~attnlab.kvcache.KVPool` in place; the model writes the new tokens'
K/V into the pool (``KVPool.store``) *before* calling ``run``, so a query always sees its own token.

Batch convention (ragged, FlashInfer-style): the queries of all requests are packed on the token axis,
``q: [num_tokens, num_q_heads, head_dim]``; request ``i`` owns rows ``qo_indptr[i]:qo_indptr[i+1]`` and
its KV has ``kv_lens[i]`` tokens, the last ``q_len_i`` of which are the new tokens. With ``causal``,
query row ``j`` of request ``i`` sees KV positions ``< kv_lens[i] - q_len_i + j + 1``. A custom (tree)
mask replaces that rule: ``custom_mask`` is bool, flattened request by request, each block
``[q_len_i, kv_len_i]`` row-major (True = attend), as FlashInfer's ``custom_mask`` argument.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Hashable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from enum import Enum
from typing import ClassVar

import torch

from attnlab.kvcache.layout import PagedLayout
from attnlab.kvcache.pool import KVPool


class DeviceStepsUnfit(RuntimeError):
    """A device-planned launch's host plan found that the plan cannot serve all its steps after all (the engine
    then plans every step on the host): raised by ``device_steps_host_plan``, before anything was replayed."""


class Mode(str, Enum):
    PREFILL = "prefill"  # prompt tokens, q_len = prompt length (or a chunk)
    DECODE = "decode"  # q_len = 1 per request (target decode and every draft step)
    VERIFY = "verify"  # q_len = k + 1 per request over a paged prefix, causal or custom mask


DTYPE_NAMES: dict[str, torch.dtype] = {
    "fp32": torch.float32,
    "fp16": torch.float16,
    "bf16": torch.bfloat16,
    "fp8_e4m3": torch.float8_e4m3fn,
    "fp8_e5m2": torch.float8_e5m2,
}
DTYPE_TO_NAME = {v: k for k, v in DTYPE_NAMES.items()}


@dataclass(frozen=True)
class Capabilities:
    """What a backend (as installed here) supports. Config validation checks requests against it."""

    devices: frozenset[str]  # {"cpu", "cuda"}
    dtypes: frozenset[str]  # query / compute dtypes, names as in DTYPE_NAMES
    kv_dtypes: frozenset[str]
    head_dims: frozenset[int]
    page_sizes: str = "any"  # "any" | "multiple:N" | "contiguous" (page_size must equal max context)
    custom_mask: bool = False  # tree verify and tree draft steps (update_mask)
    cuda_graph: frozenset[Mode] = frozenset()
    cuda_graph_mask: bool = False  # custom-mask (tree) passes replay from CUDA graphs too
    notes: str = ""
    # engine.invariant=true: built with invariant=True, a query row's attention output depends only on the
    # model shape and its visible context length, never on q_len, batch, padding or graph bucket (docs/design.md)
    invariant: bool = False

    def page_size_ok(self, page_size: int, max_context: int) -> bool:
        if self.page_sizes == "any":
            return page_size >= 1
        if self.page_sizes.startswith("multiple:"):
            return page_size % int(self.page_sizes.split(":")[1]) == 0
        if self.page_sizes == "contiguous":
            return page_size >= max_context
        raise ValueError(f"bad page_sizes spec {self.page_sizes!r}")

    def problems(
        self, *, device: str, dtype: str, kv_dtype: str, head_dim: int, page_size: int, max_context: int,
        custom_mask: bool = False,
    ) -> list[str]:
        """Human-readable reasons this combination is unsupported (empty list: supported)."""
        out = []
        if device not in self.devices:
            out.append(f"device {device!r} (supported: {', '.join(sorted(self.devices))})")
        if dtype not in self.dtypes:
            out.append(f"dtype {dtype!r} (supported: {', '.join(sorted(self.dtypes))})")
        if kv_dtype not in self.kv_dtypes:
            out.append(f"KV dtype {kv_dtype!r} (supported: {', '.join(sorted(self.kv_dtypes))})")
        if head_dim not in self.head_dims:
            out.append(f"head_dim {head_dim} (supported: {sorted(self.head_dims)})")
        if not self.page_size_ok(page_size, max_context):
            want = {"contiguous": f"page_size >= max context ({max_context}), the contiguous layout"}.get(
                self.page_sizes, self.page_sizes.replace("multiple:", "a multiple of ")
            )
            out.append(f"page_size {page_size} (supported: {want})")
        if custom_mask and not self.custom_mask:
            out.append("custom (tree) masks (spec.topk > 1)")
        return out


@dataclass
class AttnMeta:
    """Everything a backend needs to plan one forward pass (all tensors on the pool's device).

    qo_indptr: [batch + 1] int32   query rows of each request
    layout:    paged KV index tensors (kv_indptr, kv_indices, kv_last_page_len, kv_lens)
    custom_mask: optional flattened bool mask (see module doc); None = causal
    q_lens / kv_lens_host: host copies of the lengths, for planning without a device sync
    """

    mode: Mode
    qo_indptr: torch.Tensor
    layout: PagedLayout
    q_lens: list[int]
    kv_lens_host: list[int]
    page_size: int
    custom_mask: torch.Tensor | None = None

    @property
    def batch_size(self) -> int:
        return len(self.q_lens)

    @property
    def num_tokens(self) -> int:
        return sum(self.q_lens)

    @property
    def max_q_len(self) -> int:
        return max(self.q_lens, default=0)

    @property
    def max_kv_len(self) -> int:
        return max(self.kv_lens_host, default=0)


class AttentionBackend(ABC):
    """Base class. Subclasses set ``name`` and ``caps`` and implement ``make_plan`` and ``run``.

    ``plan(meta)`` does all host work for one forward pass and keeps the result as the active plan;
    ``run(q, layer)`` reads it for every layer. ``plan_steps(metas)`` prepares several passes ahead
    (the k chain-draft steps) and ``use_step(i)`` switches between them without host work, so the draft
    loop itself does no planning.
    """

    name: ClassVar[str] = "base"

    def __init__(self, pool: KVPool, num_q_heads: int, num_kv_heads: int, head_dim: int, scale: float,
                 dtype: torch.dtype):
        if num_q_heads % num_kv_heads:
            raise ValueError(f"num_q_heads {num_q_heads} not a multiple of num_kv_heads {num_kv_heads}")
        self.pool = pool
        self.num_q_heads = num_q_heads
        self.num_kv_heads = num_kv_heads
        self.head_dim = head_dim
        self.scale = scale
        self.dtype = dtype
        self.device = pool.device
        self._plan = None
        self._slots: dict[int, object] = {}  # slot -> plan (0: per pass, j + 1: draft step j)
        self.forced_variant: Hashable = None  # set by ``forcing`` (a graph capture of each variant)

    @classmethod
    @abstractmethod
    def capabilities(cls) -> Capabilities:
        """The capability descriptor of this backend as installed here (may probe the library)."""

    @classmethod
    def available(cls) -> str | None:
        """None if usable here, else a one-line reason with the fix."""
        return None

    @abstractmethod
    def make_plan(self, meta: AttnMeta, slot: int = 0):
        """Host work for one pass; returns an opaque plan object. ``slot`` separates concurrently kept
        plans (multi-step draft) for backends whose plans own buffers."""

    @abstractmethod
    def run(self, q: torch.Tensor, layer: int) -> torch.Tensor:
        """q: [num_tokens, num_q_heads, head_dim] -> out: same shape and dtype, using the active plan."""

    def run_new(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, layer: int) -> torch.Tensor:
        """``run`` with this pass's new K / V ([num_tokens, num_kv_heads, head_dim], already in the pool) at hand: a
        backend that can read them where they are (triton's contiguous prefill) does; the others run as ``run``."""
        return self.run(q, layer)

    def plan(self, meta: AttnMeta) -> None:
        self.plan_slot(meta, 0)

    def plan_slot(self, meta: AttnMeta, slot: int) -> None:
        """Plan into ``slot`` and make it the active plan."""
        self._plan = self._slots[slot] = self.make_plan(meta, slot=slot)

    def plan_steps(self, metas: list[AttnMeta]) -> None:
        for i, m in enumerate(metas):
            self._slots[i + 1] = self.make_plan(m, slot=i + 1)

    def use_step(self, i: int) -> None:
        self._plan = self._slots[i + 1]

    def supports_device_steps(self) -> bool:
        """True when ``device_step_plans`` can plan single-token steps whose metadata lives on the device."""
        return False

    def supports_device_trees(self) -> bool:
        """True when ``device_tree_plans`` can plan a tree draft's frontier passes whose metadata the device
        writes (attnlab.spec.tree_device)."""
        return False

    def device_tree_plans(self, batch: int, topk: int, n: int, kv_indptr, kv_indices, bufs) -> list:
        """Plan slots 1 .. n for the frontier passes of a device-planned tree draft (q_len ``topk`` per row, a
        custom mask); their KV lengths, masks and mask offsets live in ``bufs`` (tree_device.TreeStepBuffers)."""
        raise NotImplementedError(f"{self.name}: no device-planned tree passes")

    # False: some launches cannot run device-planned (``device_steps_fit``), so the engine keeps the host-planned
    # n-step graph beside the device-planned one
    DEVICE_STEPS_ALWAYS_FIT: ClassVar[bool] = True

    def device_steps_fit(self, starts, n: int, rows: int | None = None) -> bool:
        """Whether ``n`` device-planned steps of requests whose first step feeds position ``starts[i]`` can run
        on one launch plan of ``rows`` rows (the graph bucket; None: one per request) (triton: always; flashinfer:
        when its schedule is the same at the first and the last step, e.g. no request crosses a page)."""
        return True

    def device_steps_host_plan(self, rows: int, kv_indptr: list[int], kv_lens: list[int],
                               kv_indptr_dev: torch.Tensor, kv_indices: torch.Tensor) -> None:
        """The host half of one device-planned launch of ``rows`` rows (runner.prepare_device_steps calls it): the
        launch's page layout on the host (``kv_indptr``, the first step's ``kv_lens``) and on the device
        (``kv_indptr_dev``, ``kv_indices``). Nothing for a backend whose step plans read only device tensors
        (triton)."""

    def device_step_plans(self, batch: int, n: int, kv_indptr: torch.Tensor, kv_indices: torch.Tensor,
                          kv_lens: torch.Tensor, max_kv_len: int | None = None) -> list:
        """Plans for ``n`` single-token decode steps of ``batch`` rows into slots 1..n, reading their metadata from
        device tensors the caller fills (engine/multistep.py computes them on the device, inside the draft's CUDA
        graph): ``kv_indptr`` [batch + 1] and ``kv_indices`` int32, one layout for every step (the last step's
        pages: a step reads only its own length), and ``kv_lens`` [n, batch] int32, row j step j's. ``max_kv_len``:
        the longest context the launch must cover (None: the backend's max context, as in graph mode). Host work
        once per launch shape; no host copy of any length, so the host plans nothing per step. Returns the n plans:
        a CUDA graph captured over them must keep them (and so their scratch buffers) alive as long as it lives,
        since a later call replaces them in the slots."""
        raise NotImplementedError(f"{self.name}: no device-planned steps")

    def update_mask(self, custom_mask: torch.Tensor, slot: int | None = None) -> None:
        """New values for the custom (tree) mask of a planned pass (slot None = the active plan).

        custom_mask: flat bool, the layout and length of the ``AttnMeta.custom_mask`` the pass was planned with.
        Device work only (no host sync, no planning), written in place into the plan's buffers, so a CUDA graph
        captured over that plan reads the new values. A multi-step tree draft needs it: every step is planned
        before the draft loop, but which branches are each other's ancestors is known only once the previous
        step ran (attnlab.spec.tree.draft_step_mask)."""
        self.write_mask(self.active_plan if slot is None else self._slots[slot], custom_mask)

    def write_mask(self, plan, custom_mask: torch.Tensor) -> None:
        """Backend part of ``update_mask``: write ``custom_mask`` into ``plan`` (one of this backend's plans)."""
        raise NotImplementedError(f"{self.name}: plans take no custom mask")

    # -- plan variants: one CUDA graph each ------------------------------------------------------------------
    # A graph replays the launches it captured; a backend whose plan of the same (batch, q_len) can launch other
    # kernels by the lengths (flashinfer: an fa2 verify with or without split-KV and its merge) names those
    # variants, and the engine captures a graph per variant and replays the one the pass's plan chose.

    def graph_variants(self, q_len: int, masked: bool, batch: int | None = None, slot: int = 0) -> tuple[Hashable, ...]:
        """The plan variants a graph-mode pass of ``q_len`` tokens per request (``masked``: a tree pass) in a bucket
        of ``batch`` requests (None: any) can take in plan ``slot`` (0: planned one pass at a time; 1..n: planned
        ahead by plan_steps); one graph is captured per variant. ``(None,)``: one kind of plan."""
        return (None,)

    def plan_variant(self, plan) -> Hashable:
        """The variant ``plan`` (one of this backend's plans) took: one of ``graph_variants``."""
        return getattr(plan, "variant", None)

    def slot_variant(self, slot: int) -> Hashable:
        """The variant of the plan in ``slot`` (the graph a replay of that slot must take)."""
        return self.plan_variant(self._slots.get(slot))

    @contextmanager
    def forcing(self, variant: Hashable) -> Iterator[None]:
        """Plans made inside take ``variant`` whatever their lengths (a graph capture of that variant over dummy
        lengths); ``None`` forces nothing."""
        before, self.forced_variant = self.forced_variant, variant
        try:
            yield
        finally:
            self.forced_variant = before

    @property
    def active_plan(self):
        if self._plan is None:
            raise RuntimeError(f"{self.name}: run() before plan()")
        return self._plan
