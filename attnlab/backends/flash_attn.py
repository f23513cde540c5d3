"""FlashAttention backend ("fa"): one adapter over whichever ``flash_attn_with_kvcache`` is installed.

Flavors, probed lazily in this order by :func:`detect_flash_attn`:

- ``fa3``     — ``flash_attn_interface`` (FlashAttention 3, Hopper): paged KV through ``page_table``,
  any page size, fp16/bf16.
- ``fa3_fwd`` — ``fa3_fwd_interface`` (forward-only FA3 build: no paged KV, no fp16): the contiguous layout.
  Each request owns exactly one page of ``page_size >= max context`` tokens; the pool layer's K and V,
  ``[num_pages + 1, page_size, Hkv, D]``, are read as ``[batch_cache, seqlen_cache, Hkv, D]`` and each
  request picks its page through ``cache_batch_idx``. bf16 only.
- ``fa2``     — ``flash_attn`` (FlashAttention 2, sm80+): paged KV through ``block_table``, page size a
  multiple of 256, fp16/bf16.

K/V of this pass are already in the pool when ``run`` is called (``KVPool.store``), so only ``q`` is passed
(no ``k``/``v`` appends) with ``cache_seqlens = kv_lens``. ``causal=True`` aligns the queries to the end of
the cache (bottom-right), which is our rule. FA's kvcache API takes ``q: [B, q_len, Hq, D]`` with one q_len
per call, so the plan groups requests by q_len (decode and chain verify: one group, a free view; ragged
prefill: one call per distinct q_len). Tree masks are not supported.

CUDA graphs (``cuda_graph=True``, every flavor): a decode / verify pass with one q_len for the whole batch
plans into static buffers of its (slot, batch, q_len): ``cache_seqlens`` [B] and the table (``cache_batch_idx``
[B], or a [B, pages(max_context)] page table padded with the scratch page), rewritten in place by each later
plan, so a captured ``flash_attn_with_kvcache`` replays any later pass of that key. What FlashAttention
decides on the host (tile sizes, the KV split count) depends only on shapes that stay fixed: q's shape and
the cache's ``seqlen_k`` (the contiguous page size, or table width x page size), never the lengths' values.
"""

from __future__ import annotations

import importlib
import importlib.metadata
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from attnlab.backends.base import DTYPE_TO_NAME, AttentionBackend, AttnMeta, Capabilities, Mode
from attnlab.errors import BackendUnavailable, ConfigError
from attnlab.kvcache.layout import pages_needed

INSTALL_HINT = ("pip install 'attnlab[gpu]' (flash-attn, FA2) or install FlashAttention 3 "
                "(flash_attn_interface) / the forward-only fa3_fwd wheel")


@dataclass(frozen=True)
class FAFlavor:
    name: str  # "fa3" | "fa3_fwd" | "fa2"
    module: str  # import name
    table_arg: str | None  # kwarg carrying the page table; None = contiguous layout via cache_batch_idx
    page_sizes: str  # Capabilities.page_sizes spec
    dtypes: frozenset[str]
    head_dims: frozenset[int]
    min_capability: tuple[int, int]
    dist_names: tuple[str, ...]  # distributions to ask for a version
    fn: Callable = field(compare=False, repr=False, default=None)
    version: str = "unknown"


_FA3_HDIMS = frozenset({64, 96, 128, 192, 256})
_FLAVORS = (
    # name, module, table arg, page sizes, dtypes, head dims, min sm, distributions
    ("fa3", "flash_attn_interface", "page_table", "any", {"fp16", "bf16"}, _FA3_HDIMS, (9, 0),
     ("flash_attn_3", "flash-attn-3", "flashattn-hopper")),
    ("fa3_fwd", "fa3_fwd_interface", None, "contiguous", {"bf16"}, _FA3_HDIMS, (9, 0), ("fa3_fwd",)),
    ("fa2", "flash_attn", "block_table", "multiple:256", {"fp16", "bf16"},
     frozenset({32, 64, 96, 128, 160, 192, 224, 256}), (8, 0), ("flash_attn", "flash-attn")),
)
_import_errors: dict[str, str] = {}


def _version(mod, dists: tuple[str, ...]) -> str:
    if getattr(mod, "__version__", None):
        return str(mod.__version__)
    for d in dists:
        try:
            return importlib.metadata.version(d)
        except importlib.metadata.PackageNotFoundError:
            continue
    return "unknown"


def detect_flash_attn() -> FAFlavor | None:
    """The first importable FlashAttention flavor (fa3, fa3_fwd, fa2), or None. Import errors are kept for
    :meth:`FlashAttnBackend.available`."""
    _import_errors.clear()
    for name, module, table_arg, page_sizes, dtypes, hdims, sm, dists in _FLAVORS:
        try:
            mod = importlib.import_module(module)
            fn = mod.flash_attn_with_kvcache
        except Exception as e:  # noqa: BLE001 -- missing (ImportError) or a broken build (OSError, ...)
            _import_errors[module] = f"{type(e).__name__}: {e}"
            continue
        return FAFlavor(name, module, table_arg, page_sizes, frozenset(dtypes), hdims, sm, dists, fn,
                        _version(mod, dists))
    return None


@dataclass
class _Group:
    """Requests of one q_len, in batch order (all tensors on the pool's device).

    rows: [B_g * q_len] int64 query rows, or None when the group is the whole batch in order (q is a view)
    cache_seqlens: [B_g] int32; table: [B_g, max_pages] int32 page table, or [B_g] int32 cache_batch_idx
    """

    q_len: int
    batch: int
    rows: torch.Tensor | None
    cache_seqlens: torch.Tensor
    table: torch.Tensor


@dataclass
class _Plan:
    groups: list[_Group]
    num_tokens: int


class FlashAttnBackend(AttentionBackend):
    name = "fa"

    def __init__(self, pool, num_q_heads, num_kv_heads, head_dim, scale, dtype, *, flavor: FAFlavor | None = None,
                 cuda_graph: bool = False, max_batch_size: int | None = None, max_q_len: int = 16,
                 max_context: int | None = None):
        """cuda_graph: uniform-q_len decode / verify passes plan into static buffers per (slot, batch, q_len)
        (module doc); max_batch_size / max_q_len are the engine's graph sizes (unused here: buffers are sized
        per captured batch), max_context bounds the paged flavors' table width."""
        super().__init__(pool, num_q_heads, num_kv_heads, head_dim, scale, dtype)
        self.cuda_graph = cuda_graph
        self.max_context = max_context or pool.capacity_tokens()
        self._static: dict[tuple[int, int, int], _Group] = {}
        self.flavor = flavor or detect_flash_attn()
        if self.flavor is None:
            raise BackendUnavailable(f"no FlashAttention build importable; {INSTALL_HINT}")
        f = self.flavor
        name = DTYPE_TO_NAME.get(dtype, str(dtype))
        if name not in f.dtypes:
            raise ConfigError(f"fa ({f.name}, {f.module}): dtype {name} unsupported (supported: {sorted(f.dtypes)})")
        if pool.dtype != dtype:
            raise ConfigError(f"fa ({f.name}): KV dtype {DTYPE_TO_NAME.get(pool.dtype, pool.dtype)} must equal the "
                              f"query dtype {name} (no fp8 KV through this adapter)")
        if head_dim not in f.head_dims:
            raise ConfigError(f"fa ({f.name}): head_dim {head_dim} unsupported (supported: {sorted(f.head_dims)})")
        if f.page_sizes.startswith("multiple:") and pool.page_size % int(f.page_sizes.split(":")[1]):
            raise ConfigError(f"fa ({f.name}): page_size {pool.page_size} must be a multiple of "
                              f"{f.page_sizes.split(':')[1]} (FlashAttention 2's paged KV)")

    @classmethod
    def capabilities(cls) -> Capabilities:
        f = detect_flash_attn()
        if f is None:
            return Capabilities(devices=frozenset(), dtypes=frozenset(), kv_dtypes=frozenset(),
                                head_dims=frozenset(), notes="no FlashAttention build importable")
        return Capabilities(
            devices=frozenset({"cuda"}), dtypes=f.dtypes, kv_dtypes=f.dtypes, head_dims=f.head_dims,
            page_sizes=f.page_sizes, custom_mask=False, cuda_graph=frozenset({Mode.DECODE, Mode.VERIFY}),
            notes=f"{f.name} via {f.module} {f.version}; causal only (decode, chain verify, prefill); CUDA graphs "
                  "for uniform-q_len decode / verify (static cache_seqlens and table per batch and q_len)",
        )

    @classmethod
    def available(cls) -> str | None:
        f = detect_flash_attn()
        if f is None:
            errs = "; ".join(f"{m}: {e}" for m, e in _import_errors.items())
            return f"no FlashAttention build importable ({errs}); {INSTALL_HINT}"
        if not torch.cuda.is_available():
            return f"no CUDA device visible: FlashAttention ({f.module}) runs on NVIDIA GPUs only"
        cap = torch.cuda.get_device_capability()
        if cap < f.min_capability:
            return (f"{f.module} needs compute capability >= {f.min_capability[0]}.{f.min_capability[1]}, "
                    f"this GPU has {cap[0]}.{cap[1]}")
        return None

    @classmethod
    def flavor_info(cls) -> dict:
        """For env.json: which FlashAttention this backend would use here."""
        f = detect_flash_attn()
        if f is None:
            return {"flavor": None, "import_errors": dict(_import_errors)}
        return {"flavor": f.name, "module": f.module, "version": f.version, "page_sizes": f.page_sizes,
                "dtypes": sorted(f.dtypes)}

    # -- plan / run -------------------------------------------------------------------------------------

    def make_plan(self, meta: AttnMeta, slot: int = 0) -> _Plan:
        f, ps = self.flavor, meta.page_size
        if meta.custom_mask is not None:
            raise ConfigError(f"fa ({f.name}): custom (tree) masks are unsupported (spec.topk > 1); "
                              "use verify=flashinfer, triton or torch")
        if f.table_arg is None and meta.max_kv_len > ps:
            raise ConfigError(f"fa ({f.name}, {f.module}) has no paged KV: the contiguous layout needs "
                              f"page_size >= max context, got page_size {ps} and a request of {meta.max_kv_len} tokens")
        if self.cuda_graph and meta.mode != Mode.PREFILL and meta.q_lens and len(set(meta.q_lens)) == 1 \
                and meta.q_lens[0] > 0:
            return _Plan([self._graph_group(meta, slot)], meta.num_tokens)
        lay, dev = meta.layout, meta.layout.kv_indices.device
        by_len: dict[int, list[int]] = {}
        for i, n in enumerate(meta.q_lens):
            if n:
                by_len.setdefault(n, []).append(i)
        whole = len(by_len) == 1 and all(meta.q_lens)  # one group, every request, in order: q is a view
        qo = [0]
        for n in meta.q_lens:
            qo.append(qo[-1] + n)
        groups = []
        for q_len, reqs in by_len.items():
            idx = None if whole else torch.tensor(reqs, dtype=torch.long, device=dev)
            rows = None if whole else torch.tensor([r for i in reqs for r in range(qo[i], qo[i + 1])],
                                                   dtype=torch.long, device=dev)
            seqlens = lay.kv_lens if whole else lay.kv_lens[idx]
            starts = lay.kv_indptr[:-1] if whole else lay.kv_indptr[:-1][idx]
            if f.table_arg is None:
                table = lay.kv_indices[starts.long()].to(torch.int32)  # each request's single page
            else:
                npages = [pages_needed(meta.kv_lens_host[i], ps) for i in reqs]
                table = page_table(lay.kv_indices, starts, npages, pad=self.pool.num_pages)
            groups.append(_Group(q_len, len(reqs), rows, seqlens.contiguous(), table.contiguous()))
        return _Plan(groups, meta.num_tokens)

    def kernel_info(self) -> dict[str, str]:
        """Which FlashAttention build runs every pass (one function for decode, verify and prefill)."""
        f = self.flavor
        return {"all": f"{f.name} ({f.module} {f.version}){' graphs' if self.cuda_graph else ''}"}

    def _graph_group(self, meta: AttnMeta, slot: int) -> _Group:
        """The static group of (slot, batch, q_len), its buffers overwritten with this pass's values (device
        copies, no host sync): what a CUDA graph captured on an earlier plan of the same key reads."""
        f, lay, ps = self.flavor, meta.layout, meta.page_size
        b, q_len = meta.batch_size, meta.q_lens[0]
        key = (slot, b, q_len)
        g = self._static.get(key)
        if g is None:
            width = 0 if f.table_arg is None else pages_needed(self.max_context, ps)
            table = torch.empty((b,) if f.table_arg is None else (b, width), dtype=torch.int32, device=self.device)
            g = self._static[key] = _Group(q_len, b, None, torch.empty(b, dtype=torch.int32, device=self.device),
                                           table)
        g.cache_seqlens.copy_(lay.kv_lens)
        if f.table_arg is None:
            g.table.copy_(lay.kv_indices[lay.kv_indptr[:-1].long()])  # each request's single page
        else:
            npages = [pages_needed(n, ps) for n in meta.kv_lens_host]
            if max(npages) > g.table.shape[1]:
                raise ConfigError(f"fa ({f.name}) graph mode: a request of {meta.max_kv_len} tokens exceeds "
                                  f"max_context {self.max_context}")
            t = page_table(lay.kv_indices, lay.kv_indptr[:-1], npages, pad=self.pool.num_pages)
            g.table.fill_(self.pool.num_pages)
            g.table[:, : t.shape[1]].copy_(t)
        return g

    def run(self, q: torch.Tensor, layer: int) -> torch.Tensor:
        """q: [num_tokens, Hq, D] -> [num_tokens, Hq, D]; one FA call per q_len group, no host sync."""
        plan, f = self.active_plan, self.flavor
        kv = self.pool.layer(layer)  # [2, num_pages + 1, page_size, Hkv, D]
        k_cache, v_cache = kv[0], kv[1]
        h, d = q.shape[1], q.shape[2]
        out = None if len(plan.groups) == 1 and plan.groups[0].rows is None else torch.empty_like(q)
        for g in plan.groups:
            qg = q if g.rows is None else q.index_select(0, g.rows)
            table_kw = {f.table_arg or "cache_batch_idx": g.table}
            og = f.fn(qg.reshape(g.batch, g.q_len, h, d), k_cache, v_cache, cache_seqlens=g.cache_seqlens,
                      softmax_scale=self.scale, causal=True, **table_kw)
            if out is None:
                return og.reshape(q.shape)
            out.index_copy_(0, g.rows, og.reshape(-1, h, d))
        return out


def page_table(kv_indices: torch.Tensor, starts: torch.Tensor, npages: list[int], pad: int) -> torch.Tensor:
    """CSR page ids -> dense [B, max_pages] int32 table, on the device and without a host sync.

    kv_indices: [total_pages] int32; starts: [B] offsets of each request's pages; npages: host page counts.
    Entries past a request's pages hold ``pad`` (the scratch page): never read, since cache_seqlens bounds.
    """
    b, width = len(npages), max(npages, default=0)
    dev = kv_indices.device
    col = torch.arange(width, device=dev)
    valid = col[None, :] < torch.tensor(npages, device=dev)[:, None]
    pos = (starts.long()[:, None] + col[None, :]).clamp_max(max(kv_indices.numel() - 1, 0))
    gathered = kv_indices.long()[pos] if kv_indices.numel() else torch.zeros(b, width, dtype=torch.long, device=dev)
    return torch.where(valid, gathered, torch.full_like(gathered, pad)).to(torch.int32)
