"""Performance summary of one generation: pure functions over GenerateOutput-like records.

Keys follow DESIGN.md (units in the name). Phase times are per-iteration means (CUDA events on GPU).
accept_rate_pos{i} (i = 1..k) is the fraction of the verify passes that drafted at least i tokens in which
draft token i was accepted (unconditional on the earlier positions: a pass that stopped before i counts as
not accepting it), so pos1 >= pos2 >= ... while k is constant, and then accept_len_mean =
1 + sum_i accept_rate_pos{i}. k shrinks near max context; those passes do not count against the positions
they did not draft.
"""

from __future__ import annotations

import math
from collections.abc import Sequence


def percentile(values: Sequence[float], q: float) -> float:
    """Linear-interpolated percentile (numpy's default); NaN for no values."""
    v = sorted(values)
    if not v:
        return math.nan
    pos = (len(v) - 1) * q / 100.0
    lo, hi = math.floor(pos), math.ceil(pos)
    return v[lo] + (v[hi] - v[lo]) * (pos - lo)


def _mean(values: Sequence[float]) -> float:
    return sum(values) / len(values) if values else math.nan


def tpot_ms(req) -> float | None:
    """Time per output token after the first: (latency - ttft) / (n_out - 1)."""
    n = len(req.output_ids)
    return (req.latency_ms - req.ttft_ms) / (n - 1) if n > 1 else None


def kv_waste_frac(final_lens: Sequence[int], page_size: int) -> float:
    """Internal fragmentation at each request's end: unused slots / allocated slots over all requests."""
    pages = [-(-n // page_size) for n in final_lens]
    alloc = sum(p * page_size for p in pages)
    return (alloc - sum(final_lens)) / alloc if alloc else 0.0


def accept_rates(taus: Sequence[int], k: int) -> dict[str, float]:
    """accept_rate_pos{i} for i = 1..k from per-verify-pass tau (= accepted drafts + 1), every pass with k drafts."""
    return accept_rates_by_pass([(k, t) for t in taus])


def accept_rates_by_pass(passes: Sequence[tuple[int, int]]) -> dict[str, float]:
    """accept_rate_pos{i} from (k of the pass, tau) per request per verify pass: position i divides by the
    passes whose k reached i."""
    k_max = max((k for k, _ in passes), default=0)
    out = {}
    for i in range(1, k_max + 1):
        drafted = [t for k, t in passes if k >= i]
        out[f"accept_rate_pos{i}"] = sum(t - 1 >= i for t in drafted) / len(drafted)
    return out


def summarize(out, page_size: int | None = None) -> dict[str, float]:
    """metrics.json keys from one GenerateOutput (requests, iterations, wall_s, num_draft_tokens)."""
    reqs, iters = out.requests, out.iterations
    n_out = sum(len(r.output_ids) for r in reqs)
    m: dict[str, float] = {
        "num_requests": len(reqs),
        "output_tokens": n_out,
        "wall_s": out.wall_s,
        "output_tokens_per_s": n_out / out.wall_s if out.wall_s > 0 else math.nan,
        "num_iterations": len(iters),
        "num_draft_tokens": out.num_draft_tokens,
    }
    ttft = [r.ttft_ms for r in reqs]
    tpot = [t for t in map(tpot_ms, reqs) if t is not None]
    for q in (50, 90, 99):
        m[f"ttft_ms_p{q}"] = percentile(ttft, q)
        m[f"tpot_ms_p{q}"] = percentile(tpot, q)
    taus = [t for r in reqs for t in r.accept_lens]
    m["accept_len_mean"] = _mean(taus) if taus else 1.0
    if iters:  # each iteration carries its own k (it shrinks near max context)
        m.update(accept_rates_by_pass([(it.num_draft_tokens, t) for it in iters for t in it.accept_lens]))
    else:  # requests alone (a subset of a run): every pass counted with the configured k
        m.update(accept_rates(taus, out.num_draft_tokens))
    # the drafter's prefill of one batch (not part of ttft_ms): GenerateOutput.draft_prefill_ms per batch
    m["draft_prefill_ms"] = getattr(out, "draft_prefill_ms", 0.0) / max(getattr(out, "num_batches", 1), 1)
    for key, attr in (("draft_ms", "draft_ms"), ("draft_extend_ms", "draft_extend_ms"), ("verify_ms", "verify_ms"),
                      ("accept_ms", "accept_ms"), ("sync_ms", "sync_ms"), ("overhead_ms", "other_ms"),
                      ("iteration_ms", "total_ms")):
        m[key] = _mean([getattr(it, attr, 0.0) for it in iters])  # draft_extend_ms: EAGLE iterations only
    # the host's own time in the same phases: next to the device ms above, a phase whose host ms is as large
    # waited for its launches (host-bound); on CPU the two are the same clock. sync_host_ms: the host's wait at the
    # iteration's sync for the device work still queued (large: device-bound; near 0: the device waited for the host)
    for key, phase in (("draft_host_ms", "draft"), ("draft_extend_host_ms", "draft_extend"),
                       ("verify_host_ms", "verify"), ("sync_host_ms", "sync"), ("overhead_host_ms", "other")):
        m[key] = _mean([getattr(it, "host_ms", {}).get(phase, 0.0) for it in iters])
    if page_size:
        m["kv_waste_frac"] = kv_waste_frac([len(r.prompt_ids) + len(r.output_ids) for r in reqs], page_size)
    return m


def merge_outputs(outs: list) -> object:
    """Concatenate the GenerateOutputs of several batches (wall time adds up: batches run one after another)."""
    from types import SimpleNamespace

    return SimpleNamespace(
        requests=[r for o in outs for r in o.requests],
        iterations=[it for o in outs for it in o.iterations],
        wall_s=sum(o.wall_s for o in outs),
        prefill_ms=sum(o.prefill_ms for o in outs),
        draft_prefill_ms=sum(getattr(o, "draft_prefill_ms", 0.0) for o in outs),
        num_batches=sum(getattr(o, "num_batches", 1) for o in outs),
        num_draft_tokens=outs[0].num_draft_tokens if outs else 0,
    )


def _side_modules(model) -> list:
    """The modules one side's forward runs: a LayerSubset (draft=self with draft.layers) reads its parent's
    embeddings, norm, lm_head and kept layers only."""
    parent, keep = getattr(model, "parent", None), getattr(model, "keep", None)
    if parent is None or keep is None:
        return [model]
    return [parent.embed_tokens, parent.norm, parent.lm_head, *(parent.layers[i] for i in keep)]


def _tensors(model) -> dict[tuple, object]:
    """Every parameter and buffer a side reads, keyed by storage (tied and shared tensors counted once); an EAGLE
    head's also the LM-head rows it scores every draft step (``EagleHead.scored_tensors``)."""
    tensors = [t for mod in _side_modules(model) for t in (*mod.parameters(), *mod.buffers())]
    if hasattr(model, "scored_tensors"):
        tensors += model.scored_tensors()
    return {(t.device.type, t.untyped_storage().data_ptr()): t for t in tensors}


def _nbytes(tensors) -> int:
    return sum(t.untyped_storage().nbytes() for t in tensors)


def weight_bytes(model) -> int:
    """Bytes of the weights (parameters and buffers) one side's forward reads; fp8 layers count 1 byte per
    weight plus their fp32 row scales. Tensors shared with another side are counted on both."""
    return _nbytes(_tensors(model).values())


def memory_metrics(runners: dict) -> dict[str, int]:
    """Memory keys per model side (runners: {"target": ModelRunner, "draft": ModelRunner | None}):

    kv_bytes_per_token_{side}  K and V of one token over all layers (KVPool.bytes_per_token)
    kv_capacity_tokens_{side}  token slots of the pool (num_pages * page_size, scratch page excluded)
    kv_pool_bytes_{side}       bytes of the pool tensor (scratch page included)
    weight_bytes_{side}        weights that side reads (weight_bytes)
    weight_bytes_total         weights of all sides, shared tensors once (draft=self shares the target's)
    """
    m: dict[str, int] = {}
    unique: dict[tuple, object] = {}
    for side, r in runners.items():
        if r is None:
            continue
        pool = r.pool
        m[f"kv_bytes_per_token_{side}"] = int(pool.bytes_per_token())
        m[f"kv_capacity_tokens_{side}"] = int(pool.capacity_tokens())
        m[f"kv_pool_bytes_{side}"] = int(pool.kv.numel() * pool.kv.element_size())
        tensors = _tensors(r.model)
        m[f"weight_bytes_{side}"] = _nbytes(tensors.values())
        unique.update(tensors)
    if unique:
        m["weight_bytes_total"] = _nbytes(unique.values())
    return m
