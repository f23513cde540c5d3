"""``hybrid``: route each request of a pass to one of two backends by its length.

    verify=hybrid verify.options.short=flashinfer verify.options.long=triton verify.options.threshold=1024

A request whose context (``kv_len``: cached tokens plus this pass's new ones) is at most ``threshold`` tokens
goes to ``short``, a longer one to ``long`` (optional ``short_options`` / ``long_options`` are those backends'
own options). Both backends read the same KV pool; each plans its own requests, and ``run`` launches the sides
that have any:

- eager (the default, and any ragged / prefill / tree pass): each backend plans the sub-batch of its requests
  (its own qo_indptr, page table slice and mask blocks, gathered on the device: no host sync) and runs on
  those query rows (``index_select``); the two results land in disjoint rows of one output (``index_copy_``).
  A pass whose requests all go one way is that backend's own pass, ``run_new`` included (a prefill's new K / V:
  triton's contiguous kernel).
- CUDA graphs (``cuda_graph=True``, a decode / verify pass with one q_len, no tree mask): a graph's launches are
  fixed, so a (slot, batch, q_len) has three kinds of plan variant, a graph each (``graph_variants``):
  - ``("short", v, None)`` / ``("long", None, v)``: every request goes one way; that backend plans the whole
    batch and runs alone, as it would without the hybrid. A bucket's padding requests (nothing cached: kv_len =
    q_len) go with the real ones, so a batch of long requests padded to its bucket is still one-sided.
  - ``("both", v_short, v_long)``: mixed routing. Each backend plans the whole batch with the other side's
    requests replaced by dummies (q_len as theirs, kv_len = q_len, the scratch page: almost no work), as a padded
    bucket does; both run over every row and a per-row select (a static bool buffer rewritten by each plan) takes
    each row from its own backend. Every buffer a replay reads is rewritten in place by ``plan``, so the graph
    serves any later mixed routing of that (slot, batch, q_len).

  Passes planned ahead (``plan_steps``: chain-draft steps, the multi-step decode graph, whose capture is not per
  variant) always take ``both``, which serves any routing.

Capabilities are the intersection of both backends' (page sizes: both rules must hold; CUDA graphs: only the
modes both capture). ``parse_hybrid_options`` raises a one-line ConfigError for impossible hybrids: a missing
key, an unknown backend, a hybrid inside a hybrid, or the same backend with the same options on both sides.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import ClassVar

import torch

from attnlab.backends.base import AttentionBackend, AttnMeta, Capabilities, Mode
from attnlab.errors import ConfigError
from attnlab.kvcache.layout import PagedLayout, pages_needed

HYBRID_OPTIONS = {
    "short": "backend for requests with at most `threshold` tokens of context (torch, triton, flashinfer, fa)",
    "long": "backend for longer requests",
    "threshold": "int >= 1: the longest context (cached + new tokens) routed to `short`",
    "short_options": "options of the short backend (its own OPTIONS)",
    "long_options": "options of the long backend",
}
REQUIRED = ("short", "long", "threshold")


@dataclass(frozen=True)
class HybridSpec:
    short: str
    long: str
    threshold: int
    short_options: dict = field(default_factory=dict)
    long_options: dict = field(default_factory=dict)

    def sides(self) -> list[tuple[str, str, dict]]:
        """(role, backend name, its options) for short, then long."""
        return [("short", self.short, self.short_options), ("long", self.long, self.long_options)]

    def label(self) -> str:
        return f"hybrid({self.short}<={self.threshold}<{self.long})"


def parse_hybrid_options(options: dict | None, field: str = "options") -> HybridSpec:
    """The hybrid's options, checked: one-line ConfigError naming ``field.key`` for anything impossible."""
    from attnlab.backends.registry import backend_names, plain

    options = plain(options or {})
    for key in options:
        if key not in HYBRID_OPTIONS:
            raise ConfigError(f"{field}.{key}: unknown option for backend 'hybrid' "
                              f"(options: {', '.join(HYBRID_OPTIONS)})")
    usage = "short=<backend> long=<backend> threshold=<tokens>"
    for key in REQUIRED:
        if options.get(key) is None:
            raise ConfigError(f"{field}.{key} is required for backend=hybrid ({usage})")
    names = [n for n in backend_names() if n != "hybrid"]
    for role in ("short", "long"):
        name = options[role]
        if name == "hybrid":
            raise ConfigError(f"{field}.{role}=hybrid: a hybrid cannot route to another hybrid "
                              f"(choose from: {', '.join(names)})")
        if name not in names:
            raise ConfigError(f"{field}.{role}={name!r}: unknown backend (choose from: {', '.join(names)})")
        sub = options.get(f"{role}_options")
        if sub is not None and not isinstance(sub, dict):
            raise ConfigError(f"{field}.{role}_options={sub!r}: must be a mapping of the {name} backend's options")
    threshold = options["threshold"]
    if isinstance(threshold, bool) or not isinstance(threshold, int) or threshold < 1:
        raise ConfigError(f"{field}.threshold={threshold!r}: must be an int >= 1 (tokens of context)")
    spec = HybridSpec(options["short"], options["long"], threshold, options.get("short_options") or {},
                      options.get("long_options") or {})
    if spec.short == spec.long and spec.short_options == spec.long_options:
        raise ConfigError(f"{field}: short and long are both {spec.short!r} with the same options; a hybrid needs "
                          f"two different backends (or use {spec.short} alone)")
    return spec


def _page_rule_ok(rule: str, page_size: int, max_context: int) -> bool:
    return Capabilities(frozenset(), frozenset(), frozenset(), frozenset(), page_sizes=rule).page_size_ok(
        page_size, max_context)


@dataclass(frozen=True)
class BothCapabilities(Capabilities):
    """Capabilities of two backends at once: a page size must satisfy both page-size rules."""

    page_rules: tuple[str, ...] = ()

    def page_size_ok(self, page_size: int, max_context: int) -> bool:
        return all(_page_rule_ok(r, page_size, max_context) for r in self.page_rules)


def intersect(a: Capabilities, b: Capabilities, notes: str = "") -> Capabilities:
    rules = tuple(dict.fromkeys(r for r in (a.page_sizes, b.page_sizes) if r != "any")) or ("any",)
    return BothCapabilities(
        devices=a.devices & b.devices, dtypes=a.dtypes & b.dtypes, kv_dtypes=a.kv_dtypes & b.kv_dtypes,
        head_dims=a.head_dims & b.head_dims, page_sizes=" and ".join(rules), custom_mask=a.custom_mask and b.custom_mask,
        cuda_graph=a.cuda_graph & b.cuda_graph, notes=notes, page_rules=rules)


def sub_meta(meta: AttnMeta, keep: list[bool], scratch_page: int, dummies: bool) -> AttnMeta:
    """The pass restricted to the requests with ``keep[i]``, in order. ``dummies``: every other request stays
    as a dummy (same q_len, kv_len = q_len, KV on ``scratch_page``) so the batch keeps its size.

    Device tensors are gathered from ``meta``'s with index lists computed on the host from the host lengths
    (a request of kv_len tokens owns pages_needed(kv_len) consecutive entries of kv_indices): no host sync.
    """
    ps, dev = meta.page_size, meta.layout.kv_indices.device
    num_pages = meta.layout.kv_indices.shape[0]  # == sum of pages_needed over the requests
    qo, kv_indptr, last, kv_lens, pos, mask_parts = [0], [0], [], [], [], []
    q_lens, kv_host = [], []
    page_off = mask_off = 0
    for q_len, kv_len, k in zip(meta.q_lens, meta.kv_lens_host, keep):
        n = pages_needed(kv_len, ps)
        if k or dummies:
            if k:
                pos.extend(range(page_off, page_off + n))
                kv = kv_len
                if meta.custom_mask is not None:
                    mask_parts.append(meta.custom_mask[mask_off:mask_off + q_len * kv_len])
            else:
                kv = q_len
                pos.extend([num_pages] * pages_needed(q_len, ps))  # index num_pages = the scratch page appended below
                if meta.custom_mask is not None:  # the dummy sees its own tokens, causally
                    mask_parts.append(torch.ones(q_len, q_len, dtype=torch.bool, device=dev).tril_().reshape(-1))
            pages = pages_needed(kv, ps)
            q_lens.append(q_len)
            kv_host.append(kv)
            qo.append(qo[-1] + q_len)
            kv_indptr.append(kv_indptr[-1] + pages)
            last.append(kv - (pages - 1) * ps if pages else 0)
            kv_lens.append(kv)
        page_off += n
        mask_off += q_len * kv_len
    src = meta.layout.kv_indices
    if dummies:
        src = torch.cat([src, torch.full((1,), scratch_page, dtype=src.dtype, device=dev)])
    t = lambda x, dt=torch.int32: torch.tensor(x, dtype=dt).to(dev, non_blocking=True)
    indices = src[t(pos, torch.int64)] if pos else src[:0]
    layout = PagedLayout(t(kv_indptr), indices.to(torch.int32), t(last), t(kv_lens))
    mask = None
    if meta.custom_mask is not None:
        mask = torch.cat(mask_parts) if mask_parts else meta.custom_mask[:0]
    return AttnMeta(meta.mode, t(qo), layout, q_lens, kv_host, ps, mask)


def _mask_entries(meta: AttnMeta, keep: list[bool]) -> torch.Tensor | None:
    """[entries] int64 positions, in the pass's flat custom mask, of the kept requests' blocks (as sub_meta
    concatenates them); None without a custom mask."""
    if meta.custom_mask is None:
        return None
    idx, off = [], 0
    for q_len, kv_len, k in zip(meta.q_lens, meta.kv_lens_host, keep):
        if k:
            idx.append(torch.arange(off, off + q_len * kv_len))
        off += q_len * kv_len
    idx = torch.cat(idx) if idx else torch.zeros(0, dtype=torch.int64)
    return idx.to(meta.custom_mask.device, non_blocking=True)


@dataclass
class _Route:
    backend: AttentionBackend
    plan: object  # that backend's plan for its sub-batch (or its dummy-padded batch)
    rows: torch.Tensor | None  # [rows] int64 query rows of its requests; None = every row in order
    mask_index: torch.Tensor | None = None  # [entries] int64 its sub-batch's entries of the pass's flat custom
    # mask (update_mask gathers them); None = the whole mask (or no mask)


@dataclass
class HybridPlan:
    routes: list[_Route]
    num_tokens: int
    select_long: torch.Tensor | None = None  # graph mode, side "both": [T, 1, 1] bool, True = row from the long side
    side: str | None = None  # graph mode: "both", "short" or "long"; None: an eager plan
    new_kv: bool = False  # a prefill: its sides take the pass's new K / V (run_new); other passes never read them


class HybridBackend(AttentionBackend):
    name = "hybrid"
    OPTIONS: ClassVar[dict[str, str]] = HYBRID_OPTIONS
    spec: ClassVar[HybridSpec | None] = None  # set on the class bound to a config's options
    classes: ClassVar[tuple] = ()  # (short class, long class), bound to their own options

    @classmethod
    def bind(cls, options: dict, field: str = "options") -> type[HybridBackend]:
        """The hybrid class for these options (checked): what the registry returns for backend=hybrid."""
        from attnlab.backends.registry import get_backend_class

        spec = parse_hybrid_options(options, field)
        classes = tuple(get_backend_class(name, opts, f"{field}.{role}_options") for role, name, opts in spec.sides())
        return cls.with_classes(spec, *classes)

    @classmethod
    def with_classes(cls, spec: HybridSpec, short_cls, long_cls) -> type[HybridBackend]:
        """A hybrid over two given backend classes (``bind`` resolves them from names; tests may pass their own)."""
        return type("HybridBackend", (cls,), {"spec": spec, "classes": (short_cls, long_cls),
                                              "__module__": cls.__module__, "__doc__": cls.__doc__})

    @classmethod
    def capabilities(cls) -> Capabilities:
        if cls.spec is None:
            return Capabilities(devices=frozenset(), dtypes=frozenset(), kv_dtypes=frozenset(), head_dims=frozenset(),
                                notes="backend=hybrid needs options short, long, threshold")
        a, b = (c.capabilities() for c in cls.classes)
        graphs = "" if a.cuda_graph & b.cuda_graph else (
            f"; no CUDA graphs: {cls.spec.short if not a.cuda_graph else cls.spec.long} has none")
        return intersect(a, b, notes=f"{cls.spec.label()}: capabilities of both, per request by context "
                                     f"length{graphs}")

    @classmethod
    def available(cls) -> str | None:
        if cls.spec is None:
            return "backend=hybrid needs options short=<backend> long=<backend> threshold=<tokens>"
        for (role, name, _), c in zip(cls.spec.sides(), cls.classes):
            reason = c.available()
            if reason:
                return f"its {role} backend {name!r} is unavailable: {reason}"
        return None

    def __init__(self, pool, num_q_heads, num_kv_heads, head_dim, scale, dtype, *, cuda_graph: bool = False,
                 max_batch_size: int | None = None, max_q_len: int = 16, max_context: int | None = None):
        super().__init__(pool, num_q_heads, num_kv_heads, head_dim, scale, dtype)
        if self.spec is None:
            raise ConfigError("backend=hybrid needs options short=<backend> long=<backend> threshold=<tokens>")
        self.cuda_graph = cuda_graph
        graph_kw = ({"cuda_graph": True, "max_batch_size": max_batch_size, "max_q_len": max_q_len,
                     "max_context": max_context} if cuda_graph else {})
        self.short, self.long = (c(pool, num_q_heads, num_kv_heads, head_dim, scale, dtype, **graph_kw)
                                 for c in self.classes)
        self.threshold = self.spec.threshold
        self._select: dict[tuple[int, int, int], torch.Tensor] = {}  # (slot, batch, q_len) -> [T, 1, 1] bool
        self.routed = {"short": 0, "long": 0}  # requests routed per side, over every plan (kernel_info)

    def is_long(self, meta: AttnMeta) -> list[bool]:
        return [n > self.threshold for n in meta.kv_lens_host]

    def make_plan(self, meta: AttnMeta, slot: int = 0) -> HybridPlan:
        long_ = self.is_long(meta)
        self.routed["long"] += sum(long_)
        self.routed["short"] += len(long_) - sum(long_)
        uniform = meta.q_lens and len(set(meta.q_lens)) == 1 and meta.q_lens[0] > 0
        if self.cuda_graph and uniform and meta.mode != Mode.PREFILL and meta.custom_mask is None:
            return self._graph_plan(meta, slot, long_)
        routes = []
        qo = [0]
        for n in meta.q_lens:
            qo.append(qo[-1] + n)
        for backend, want in ((self.short, False), (self.long, True)):
            keep = [x == want for x in long_]
            rows = [r for i, k in enumerate(keep) if k for r in range(qo[i], qo[i + 1])]
            if not rows:
                continue  # no request (or only q_len-0 ones) for this side: nothing to launch
            if all(keep):
                routes.append(_Route(backend, backend.make_plan(meta, slot), None))
                continue
            sub = sub_meta(meta, keep, self.pool.num_pages, dummies=False)
            rows_t = torch.tensor(rows, dtype=torch.int64).to(self.device, non_blocking=True)
            routes.append(_Route(backend, backend.make_plan(sub, slot), rows_t, _mask_entries(meta, keep)))
        return HybridPlan(routes, meta.num_tokens, new_kv=meta.mode == Mode.PREFILL)

    # Plan variants (AttentionBackend.graph_variants): a graph-mode plan runs one side or both over the whole bucket, so
    # its variant is (side, the short side's, the long side's), a graph each; other plans (eager, tree masks) have none.

    def graph_variants(self, q_len: int, masked: bool, batch: int | None = None, slot: int = 0) -> tuple:
        """(side, short's variant, long's variant): "both" for each pair of the sides' variants, "short" / "long" for
        each of that side's (the module doc); a slot planned ahead (>= 1: plan_steps) has the "both" ones only."""
        if not self.cuda_graph or masked:
            return (None,)
        short, long_ = (be.graph_variants(q_len, masked, batch, slot) for be in (self.short, self.long))
        both = tuple(("both", a, b) for a, b in itertools.product(short, long_))
        if slot:
            return both
        return both + tuple(("short", a, None) for a in short) + tuple(("long", None, b) for b in long_)

    def plan_variant(self, plan) -> tuple | None:
        if not isinstance(plan, HybridPlan) or plan.side is None:
            return None
        if plan.side == "both":
            return ("both", *(r.backend.plan_variant(r.plan) for r in plan.routes))
        v = plan.routes[0].backend.plan_variant(plan.routes[0].plan)
        return (plan.side, v, None) if plan.side == "short" else (plan.side, None, v)

    @contextmanager
    def forcing(self, variant) -> Iterator[None]:
        _, short, long_ = (None, None, None) if variant is None else variant
        with super().forcing(variant), self.short.forcing(short), self.long.forcing(long_):
            yield

    def write_mask(self, plan: HybridPlan, custom_mask: torch.Tensor) -> None:
        """Each backend gets its sub-batch's entries (the eager plan's routes; graph plans take no mask)."""
        if plan.side is not None:
            raise ValueError("hybrid: update_mask on a graph-mode plan (tree passes plan eagerly)")
        for r in plan.routes:
            r.backend.write_mask(r.plan, custom_mask if r.mask_index is None else custom_mask[r.mask_index])

    def _graph_side(self, long_: list[bool], meta: AttnMeta, slot: int) -> str:
        """The graph-mode plan's side: forced by a capture, "both" in a slot planned ahead (>= 1: plan_steps), else
        by the routing of the requests with something cached (kv_len > q_len; a bucket's padding has nothing), or of
        all if none has."""
        if self.forced_variant is not None:
            return self.forced_variant[0]
        if slot:
            return "both"
        real = [x for x, kv, q in zip(long_, meta.kv_lens_host, meta.q_lens) if kv > q] or long_
        return "long" if all(real) else "short" if not any(real) else "both"

    def _graph_plan(self, meta: AttnMeta, slot: int, long_: list[bool]) -> HybridPlan:
        """Side "short" / "long": that backend plans the whole batch into its graph-mode buffers of (slot, batch,
        q_len). Side "both": both backends plan the whole batch (the other side's requests as dummies); the row
        select is this key's static buffer, rewritten in place."""
        side = self._graph_side(long_, meta, slot)
        if side != "both":
            backend = self.short if side == "short" else self.long
            return HybridPlan([_Route(backend, backend.make_plan(meta, slot), None)], meta.num_tokens, side=side)
        key = (slot, meta.batch_size, meta.q_lens[0])
        sel = self._select.get(key)
        if sel is None:
            sel = self._select[key] = torch.zeros(meta.num_tokens, 1, 1, dtype=torch.bool, device=self.device)
        rows = [x for x in long_ for _ in range(meta.q_lens[0])]
        sel.view(-1).copy_(torch.tensor(rows, dtype=torch.bool), non_blocking=True)
        routes = []
        for backend, want in ((self.short, False), (self.long, True)):
            m = sub_meta(meta, [x == want for x in long_], self.pool.num_pages, dummies=True)
            routes.append(_Route(backend, backend.make_plan(m, slot), None))
        return HybridPlan(routes, meta.num_tokens, sel, side="both")

    def run(self, q: torch.Tensor, layer: int) -> torch.Tensor:
        """q: [num_tokens, Hq, D] -> [num_tokens, Hq, D]: the launches of the sides with requests, no host sync."""
        return self.run_new(q, None, None, layer)

    def run_new(self, q: torch.Tensor, k: torch.Tensor | None, v: torch.Tensor | None, layer: int) -> torch.Tensor:
        """``run`` with this pass's new K / V: in a prefill each side gets its own requests' rows of them (its
        ``run_new``); no other pass gathers them (no backend reads a decode's or a verify's)."""
        plan: HybridPlan = self.active_plan
        if not plan.new_kv:
            k = v = None
        if plan.select_long is not None:
            short, long_ = (self._run_route(r, q, layer) for r in plan.routes)
            return torch.where(plan.select_long, long_, short)
        if len(plan.routes) == 1 and plan.routes[0].rows is None:
            return self._run_route(plan.routes[0], q, layer, k, v)
        out = torch.zeros_like(q)  # rows of q_len-0 requests: none; every real row is written below
        for r in plan.routes:
            kv = (None, None) if k is None or v is None else (k.index_select(0, r.rows), v.index_select(0, r.rows))
            out.index_copy_(0, r.rows, self._run_route(r, q.index_select(0, r.rows), layer, *kv))
        return out

    @staticmethod
    def _run_route(route: _Route, q: torch.Tensor, layer: int, k=None, v=None) -> torch.Tensor:
        route.backend._plan = route.plan  # that backend's active plan: a Python attribute, no device work
        return route.backend.run_new(q, k, v, layer)

    def kernel_info(self) -> dict[str, str]:
        """The routing and what each side ran (its own kernel_info, prefixed by the side)."""
        info = {"short": self.spec.short, "long": self.spec.long, "threshold": str(self.threshold),
                "routed_short": str(self.routed["short"]), "routed_long": str(self.routed["long"])}
        for role, be in (("short", self.short), ("long", self.long)):
            for k, v in getattr(be, "kernel_info", dict)().items():
                info[f"{role}.{k}"] = v
        return info
