"""Everything a job can learn without reading weights: prompts, tokenizer, model shapes, max context, page size.

``prepare(plan)`` fails on user input here, before any weights are loaded: a missing prompt file, a drafter
with another vocabulary, a context a backend or the model cannot hold.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from dataclasses import dataclass, field

from attnlab import preflight
from attnlab.config import check_backend, self_draft_layers
from attnlab.errors import ConfigError
from attnlab.plan import ModelSource, RunPlan

log = logging.getLogger("attnlab")


@dataclass(frozen=True)
class Prepared:
    """The tokenized workload and the sizes every side is built with (the workload's alone: warmup is fitted
    into them, it never raises them)."""

    prompts: tuple  # workloads.Prompt, token_ids filled
    tokenizer: object
    model_config: object  # models.ModelConfig of the target
    draft_config: object | None  # of a draft=model drafter
    max_context: int
    page_size: int
    draft_layers: tuple[int, ...] | None  # draft=self, checked against the target's num_layers
    eos_ids: frozenset[int]
    warmup_lengths: tuple[int, ...]  # warmup prompt lengths, capped to fit max_context
    pools: tuple = ()  # preflight.PoolSpec of each side, checked against free memory
    # what preparing decided that metrics.json records: page_size_requested (a clamped page), past_model_context,
    # model_max_position_embeddings, num_prompts_requested (a source with fewer usable rows)
    notes: Mapping = field(default_factory=dict)

    def decode_text(self, ids) -> str:
        try:
            return self.tokenizer.decode(ids, skip_special_tokens=True)
        except Exception:  # noqa: BLE001 - a decode failure must not lose the run
            return ""


class step:
    """Log how long a setup step took."""

    def __init__(self, what: str):
        self.what = what

    def __enter__(self):
        self.t0 = time.perf_counter()

    def __exit__(self, *exc):
        if exc[0] is None:
            log.info("%s: %.1f s", self.what, time.perf_counter() - self.t0)


def peek_model_config(m: ModelSource):
    """The model's shape from its config.json / GGUF metadata / preset, without reading weights."""
    from attnlab.models.loading import read_config, resolve_source

    return read_config(resolve_source(m.source, m.init)).with_overrides(m.overrides_dict())


def load_tokenizer_for(m: ModelSource, mcfg):
    """The model's tokenizer; a random-init model without one gets the byte tokenizer (ids < 258)."""
    from attnlab.errors import ModelLoadError
    from attnlab.models.byte_tokenizer import ByteTokenizer
    from attnlab.models.loading import load_tokenizer

    try:
        return load_tokenizer(m.source)
    except ModelLoadError:
        if m.init != "random" or mcfg.vocab_size < 258:
            raise
        log.warning("model %s: no tokenizer available; using the byte tokenizer", m.name)
        return ByteTokenizer(256, 257)


def special_ids(mcfg) -> set[int]:
    return {t for t in set(mcfg.eos_token_ids) | {mcfg.bos_token_id} if t is not None}


def check_sides(plan: RunPlan, *, max_context: int, page_size: int, target_head_dim: int,
                draft_head_dim: int | None) -> None:
    """Backend capability check with the real max context and head_dim (after tokenization, before weights)."""
    p = plan.precision
    check_backend("verify", plan.verify, device=plan.device, dtype=p.target, kv_dtype=p.kv_target,
                  page_size=page_size, max_context=max_context, topk=plan.spec.topk, head_dim=target_head_dim,
                  options=dict(plan.verify_options))
    if draft_head_dim is not None:
        check_backend("backend", plan.backend, device=plan.device, dtype=p.draft, kv_dtype=p.kv_draft,
                      page_size=page_size, max_context=max_context, topk=plan.spec.topk, head_dim=draft_head_dim,
                      options=dict(plan.backend_options))


def fit_warmup(plan: RunPlan, max_context: int) -> tuple[int, ...]:
    """Warmup prompt lengths that fit the workload's max context (with warmup.max_new_tokens + k + 1 after
    them): the KV sizes stay the workload's, and a longer warmup prompt would only compile shapes the
    workload never runs."""
    if not plan.warmup.generates:
        return ()
    cap = max(1, max_context - plan.warmup.max_new_tokens - plan.k - 1)
    fitted = tuple(min(n, cap) for n in plan.warmup.lengths)
    if fitted != plan.warmup.lengths:
        log.warning("warmup.lengths=%s: capped to %s to fit the workload's max context %d",
                    list(plan.warmup.lengths), list(fitted), max_context)
    return fitted


def prepare(plan: RunPlan) -> Prepared:
    from attnlab.workloads import load_prompts, synthetic_prompts, tokenize_prompts

    w = plan.workload
    prompts = load_prompts(w)  # text sources fail here: missing file, empty list
    mcfg = peek_model_config(plan.model)
    dcfg = peek_model_config(plan.draft.model) if plan.draft.kind == "model" else None
    if dcfg is not None and dcfg.vocab_size != mcfg.vocab_size:
        raise ConfigError(f"draft={plan.draft.model.name}: vocabulary {dcfg.vocab_size} != target's "
                          f"{mcfg.vocab_size} (a drafter must share the target's tokenizer)")
    if plan.draft.kind == "eagle":  # the head's folder and shapes, before any weights are read (dry run too)
        from attnlab.models.eagle_io import check_shapes, head_folder, read_head_config

        folder = head_folder(plan.draft.head, plan.model.name)
        check_shapes(read_head_config(folder), mcfg, folder)
    layers = None
    if plan.draft.kind == "self":
        layers = self_draft_layers(list(plan.draft.layers) if plan.draft.layers is not None else None,
                                   mcfg.num_layers)
    with step("tokenizer"):
        tokenizer = load_tokenizer_for(plan.model, mcfg)
    if w.kind == "synthetic":
        prompts = synthetic_prompts(list(w.lengths), w.num_prompts, mcfg.vocab_size, plan.seed, special_ids(mcfg))
    notes: dict = {}
    if w.output_len == "recorded":  # budgets from the recorded answers, bench_serving's length filters
        from attnlab.workloads.lengths import select_by_length

        prompts, skipped = select_by_length(prompts, tokenizer,
                                            lambda p: tokenize_prompts([p], tokenizer, w.chat_template), w)
        notes.update(skipped)
    else:
        tokenize_prompts(prompts, tokenizer, w.chat_template)
    if len(prompts) < w.num_prompts:  # the source had fewer usable rows (logged): metrics say so
        notes["num_prompts_requested"] = w.num_prompts
    longest = max(len(p.token_ids) for p in prompts)
    # the longest request: prompt + its output budget (workload.max_new_tokens unless recorded) + k + 1
    need = max(len(p.token_ids) + (p.max_new_tokens or w.max_new_tokens) for p in prompts) + plan.k + 1
    max_context = plan.kv.max_context or need
    if max_context < need:
        raise ConfigError(f"kv.max_context={max_context}: the longest prompt ({longest} tokens) + "
                          f"its max_new_tokens + k + 1 needs {need} (raise it or leave it null = auto)")
    mcfg.check_context(max_context)  # a sliding window shorter than the run: refuse
    notes.update(preflight.context_limit(plan, need, mcfg, dcfg))  # past max_position_embeddings: refused or noted
    page_size = max_context if plan.kv.layout == "contiguous" else plan.kv.page_size
    if plan.kv.layout == "contiguous":
        log.info("kv.layout=contiguous: one page of max context %d tokens per request (kv.page_size=%d is not read)",
                 max_context, plan.kv.page_size)
    if (page := preflight.page_size(plan, page_size, max_context)) != page_size:
        notes["page_size_requested"], page_size = page_size, page
    draft_hd = {"self": mcfg.head_dim, "eagle": mcfg.head_dim,  # an EAGLE head has the target's attention shapes
                "model": dcfg.head_dim if dcfg else None}.get(plan.draft.kind)
    check_sides(plan, max_context=max_context, page_size=page_size, target_head_dim=mcfg.head_dim,
                draft_head_dim=draft_hd)
    pools = preflight.kv_pools(plan, mcfg, dcfg, page_size, max_context, layers)
    warm = fit_warmup(plan, max_context)
    if w.serving:  # the scheduler can always run one request to its end (no deadlock, no crash)
        preflight.serving_pages(pools, max_context)
    elif plan.kv.num_pages:  # a fixed pool: every batch of the workload fits it
        preflight.batch_pages(plan, pools, prompts, warm, max_context)
    preflight.check_memory(plan, pools)  # before any weights are read
    eos = set(mcfg.eos_token_ids)
    if getattr(tokenizer, "eos_token_id", None) is not None:
        eos.add(int(tokenizer.eos_token_id))
    if w.ignore_eos:
        eos = set()
    log.info("workload: %d prompts (%s), %s %d, max_new_tokens %d%s, max context %d, page size %d",
             len(prompts), w.kind, "max running" if w.serving else "batch", w.batch_size, w.max_new_tokens,
             " (cap of the recorded lengths)" if w.output_len == "recorded" else "", max_context, page_size)
    return Prepared(tuple(prompts), tokenizer, mcfg, dcfg, max_context, page_size,
                    tuple(layers) if layers is not None else None, frozenset(eos), warm,
                    tuple(pools), notes)
