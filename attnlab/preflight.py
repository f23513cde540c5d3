"""Checks that need the tokenized prompts and the model shapes, run in ``SpecJob.prepare`` before any weights
are read (and by the dry-run): the context against the model's trained positions, the page size against the
max context, and every side's KV pool against the device's free memory.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass

from attnlab.errors import ConfigError

log = logging.getLogger("attnlab")


def context_limit(plan, positions: int, mcfg, dcfg=None) -> dict:
    """Refuse a run whose positions reach past a model's ``max_position_embeddings`` (RoPE positions it was
    never trained on) unless ``kv.allow_past_model_context=true``; returns the metrics.json keys that record
    the choice. ``positions``: the longest prompt + max_new_tokens + k + 1. ``plan``: the RunPlan."""
    models = [("model", plan.model, mcfg)] + ([("draft", plan.draft.model, dcfg)] if dcfg is not None else [])
    past = [(prefix, m, c) for prefix, m, c in models if positions > c.max_position_embeddings]
    allow = plan.kv.allow_past_model_context
    if past and not allow:
        prefix, m, c = past[0]
        raise ConfigError(
            f"{prefix}={m.path or m.name}: the run reaches position {positions} (longest prompt + max_new_tokens + "
            f"k + 1) but the model was trained on {c.max_position_embeddings} (max_position_embeddings); shorten "
            f"the prompts or workload.max_new_tokens, or set kv.allow_past_model_context=true to run anyway "
            f"(metrics.json then says so)")
    for prefix, m, c in past:
        log.warning("%s=%s: running to position %d, past max_position_embeddings %d "
                    "(kv.allow_past_model_context=true)", prefix, m.path or m.name, positions, c.max_position_embeddings)
    out = {"past_model_context": bool(past)}
    if past:
        out["model_max_position_embeddings"] = min(c.max_position_embeddings for _, _, c in past)
    return out


def _granule(name: str, options, field: str) -> int:
    """The page-size step a side's backend needs (``multiple:N`` capabilities), 1 for any page size."""
    from attnlab.backends.registry import get_backend_class

    spec = get_backend_class(name, dict(options or {}), f"{field}.options").capabilities().page_sizes
    return int(spec.split(":")[1]) if spec.startswith("multiple:") else 1


def page_size(plan, requested: int, max_context: int) -> int:
    """A page larger than the max context holds slots no request can use: clamp it to the max context, rounded
    up to the page-size step every side's backend needs (FA2 takes pages of 256·n only), and say so."""
    sides = [(plan.verify, plan.verify_options, "verify")]
    if plan.draft.runs_attention:
        sides.append((plan.backend, plan.backend_options, "backend"))
    step = 1
    for name, options, field in sides:
        step = math.lcm(step, _granule(name, options, field))
    fitted = -(-max_context // step) * step
    if requested <= fitted:
        return requested
    log.warning("kv.page_size=%d is larger than the max context %d: using page_size=%d (one page per request; "
                "metrics.json records page_size_requested)", requested, max_context, fitted)
    return fitted


@dataclass(frozen=True)
class PoolSpec:
    """One side's KV pool, before it is allocated."""

    side: str  # "target" | "draft"
    num_layers: int
    num_pages: int
    page_size: int
    num_kv_heads: int
    head_dim: int
    kv_dtype: str

    @property
    def bytes(self) -> int:
        from attnlab.backends.base import DTYPE_NAMES
        from attnlab.kvcache.budget import pool_bytes

        return pool_bytes(self.num_layers, self.num_pages, self.page_size, self.num_kv_heads, self.head_dim,
                          DTYPE_NAMES[self.kv_dtype])


def kv_pools(plan, mcfg, dcfg, page: int, max_context: int, draft_layers=None) -> list[PoolSpec]:
    """The pools ``sides.build_pair`` will allocate (parity reference sides come later and are checked when
    they are built). ``draft_layers``: draft=self's layer indices (None = all)."""
    from attnlab.engine.build import auto_num_pages

    pages = plan.kv.num_pages or auto_num_pages(plan.workload.batch_size, max_context, page)
    prec, kind = plan.precision, plan.draft.kind
    out = [PoolSpec("target", mcfg.num_layers, pages, page, mcfg.num_kv_heads, mcfg.head_dim, prec.kv_target)]
    if kind == "self":
        out.append(PoolSpec("draft", len(draft_layers) if draft_layers else mcfg.num_layers, pages, page,
                            mcfg.num_kv_heads, mcfg.head_dim, prec.kv_draft))
    elif kind == "eagle":  # one layer at the target's attention shapes
        out.append(PoolSpec("draft", 1, pages, page, mcfg.num_kv_heads, mcfg.head_dim, prec.kv_draft))
    elif kind == "model" and dcfg is not None:
        out.append(PoolSpec("draft", dcfg.num_layers, pages, page, dcfg.num_kv_heads, dcfg.head_dim, prec.kv_draft))
    return out


def serving_pages(pools: list[PoolSpec], max_context: int) -> None:
    """Serving: every side's pool must hold one request at max context, so the scheduler can always run the
    request at the head of the queue to its end (back-pressure, never a deadlock or an out-of-pages crash)."""
    from attnlab.kvcache.layout import pages_needed

    for p in pools:
        need = pages_needed(max_context, p.page_size)
        if p.num_pages < need:
            raise ConfigError(f"kv.num_pages={p.num_pages}: the {p.side} pool cannot hold one request at max context "
                              f"{max_context} ({need} pages of {p.page_size}); raise kv.num_pages or lower "
                              f"workload.max_new_tokens / the prompt lengths")


def request_peak(prompt: int, budget: int, plan, side: str, max_context: int) -> int:
    """The most KV tokens one request of ``prompt`` tokens and an output ``budget`` holds on ``side``: with L = prompt
    + budget - 1 its longest context before the last step, a verify stores k + 1 tokens from L - 1 (L + k), N decode
    steps a launch (engine.decode_steps_per_sync, target-only) L - 1 + N, a tree's frontier passes (S - 1) * K draft
    slots from L (attnlab.spec.tree_loop.TreeIteration.fits); never past max_context."""
    longest = prompt + budget - 1
    over = max(plan.k, plan.engine.decode_steps_per_sync - 1)
    if side == "draft" and plan.spec.topk > 1:
        over = max(over, (plan.spec.num_steps - 1) * plan.spec.topk)
    return min(max_context, longest + over)


def batch_pages(plan, pools: list[PoolSpec], prompts, warmup_lengths, max_context: int) -> None:
    """A batch workload with a fixed kv.num_pages: each batch of workload.batch_size prompts (in order, as the run
    takes them; the warmup's batches of one length each) must fit every side's pool when each request runs to its
    budget (request_peak), so a short pool is refused before the weights are read, not at the first batch that
    outgrows it."""
    from attnlab.kvcache.layout import pages_needed

    w, bs = plan.workload, plan.workload.batch_size
    runs = [(len(p.token_ids), p.max_new_tokens or w.max_new_tokens) for p in prompts]
    fix = "lower workload.batch_size / workload.max_new_tokens"
    batches = [(f"batch {i // bs} of the workload", runs[i:i + bs], fix) for i in range(0, len(runs), bs)]
    batches += [(f"the warmup's {n}-token batch", [(n, plan.warmup.max_new_tokens)] * bs,
                 f"{fix}, or shorten warmup.lengths") for n in warmup_lengths]
    for pool in pools:
        for what, batch, hint in batches:
            need = sum(pages_needed(request_peak(n, b, plan, pool.side, max_context), pool.page_size)
                       for n, b in batch)
            if need > pool.num_pages:
                raise ConfigError(
                    f"kv.num_pages={pool.num_pages}: the {pool.side} pool cannot hold {what} ({len(batch)} "
                    f"request(s) run to their budgets: {need} pages of {pool.page_size}); raise kv.num_pages (or "
                    f"null = enough for one batch at max context), or {hint}")


def check_memory(plan, pools: list[PoolSpec]) -> None:
    """Every pool together against the device's free memory, naming both numbers and the fields to change."""
    from attnlab.kvcache.budget import check_fits, fmt_bytes

    shape = f"{pools[0].num_pages} pages of {pools[0].page_size} tokens"
    if len(pools) > 1:
        shape = " + ".join(f"{p.side} {fmt_bytes(p.bytes)}" for p in pools) + f"; {shape} each"
    what = f"the {pools[0].side} KV pool ({shape})" if len(pools) == 1 else f"the KV pools ({shape})"
    if plan.kv.num_pages:
        what = f"kv.num_pages={plan.kv.num_pages}: {what}"
        hint = "lower kv.num_pages, or null = enough pages for one batch at max context"
    else:
        hint = "lower workload.batch_size, the prompt lengths or workload.max_new_tokens"
    check_fits(sum(p.bytes for p in pools), plan.device, what, hint)
