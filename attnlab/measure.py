"""Measurement: warmup, CUDA-graph capture, then the timed runs, with nothing else inside them.

The workload runs ``bench.repeats`` times, each spec run followed by a target-only run of the same target
runner (same warmup, graphs, batch), so the speedup of a repeat compares two runs made under identical
conditions. No timed run records logits or does parity work (attnlab.parity_pass runs after, untimed).
KV pages and peak memory are read over the spec runs alone: warmup and the target-only runs do not count.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field

from attnlab.metrics.memory import peak_memory_bytes, reset_peak_memory
from attnlab.plan import TRITON_GEMMS, RunPlan, plan_dict
from attnlab.prepare import Prepared, special_ids, step
from attnlab.sides import Pair, decode

log = logging.getLogger("attnlab")

# attnlab jobs this process has measured before the current one (a sweep's basic launcher runs them all in
# one process: their JIT compiles, graph pools and allocator caches are warm for the later jobs)
_JOBS_MEASURED = [0]


@dataclass
class Measured:
    spec: list  # merged GenerateOutput of each timed spec run, in order (a ServeOutput when serving)
    base: list  # of each timed target-only run ([] with draft=none: the spec run is target-only)
    metrics: dict = field(default_factory=dict)
    events: list = field(default_factory=list)  # events.jsonl rows (a serving run's KV timeline)


def _sync(device: str) -> None:
    if device == "cuda":
        import torch

        torch.cuda.synchronize()


def capture_graphs(plan: RunPlan, pair: Pair) -> dict:
    """Target: decode (q_len 1, also the target-only runs) and verify (q_len k + 1); then whatever the
    drafter's passes replay (Drafter.capture_graphs: a model drafter's catch-up and k - 1 steps; an EAGLE
    head's draft-extend and steps, with the target again capturing its features). Buckets up to
    workload.batch_size."""
    t0 = time.perf_counter()
    with step("capture CUDA graphs"):
        if plan.k and plan.spec.topk > 1:  # trees: the tree verify and the topk draft passes (spec.tree_loop)
            from attnlab.spec.tree_loop import capture_tree_graphs, tree_shape

            shape = tree_shape(plan.spec.topk, plan.spec.num_steps, plan.k)
            n = capture_tree_graphs(pair.target, pair.drafter, shape)
        else:
            n = pair.target.capture_graphs(q_lens=sorted({1, plan.k + 1}), num_slots=1)
            n += pair.drafter.capture_graphs(pair.target, plan.k)
    return {"warmup_graph_s": time.perf_counter() - t0, "cuda_graphs": n}


def warmup(plan: RunPlan, work: Prepared, pair: Pair) -> dict:
    """Graph capture (graphs/full, or engine.cuda_graph) and untimed generations (jit/full) of each warmup
    length, through the spec pair and through the target-only path the baseline runs.
    warmup_first_batch_ms: the first warmup batch's first request, what the first request costs with no plan."""
    from attnlab.workloads import synthetic_prompts

    m: dict = {}
    if plan.engine.cuda_graph:
        m.update(capture_graphs(plan, pair))
    if not plan.warmup.generates:
        return m
    t0, first = time.perf_counter(), None
    paths = [(pair, None)] + ([(pair.target_only(), 0)] if plan.draft.kind != "none" else [])
    for length in work.warmup_lengths:
        prompts = synthetic_prompts([length], plan.workload.batch_size, work.model_config.vocab_size,
                                    plan.seed + 1, special_ids(work.model_config))
        for p, k in paths:
            out = decode(p, plan, work, prompts, k=k, max_new_tokens=plan.warmup.max_new_tokens, eos_ids=set(),
                         desc="warmup")
            first = first if first is not None else out.requests[0].latency_ms
    m.update(warmup_jit_s=time.perf_counter() - t0, warmup_first_batch_ms=first,
             warmup_lengths=list(work.warmup_lengths))
    return m


def describe(plan: RunPlan, work: Prepared) -> dict:
    """What a job measured, named in metrics.json: backend pair, drafter, k/topk, precision per side, sizes."""
    d = plan.draft
    if d.kind == "self":
        drafter = "self" if work.draft_layers is None else f"self[{len(work.draft_layers)}L]"
    elif d.kind == "model":
        drafter = f"model:{d.model.name or d.model.path}"
    elif d.kind == "ngram":
        drafter = f"ngram(n<={d.ngram_n})"
    elif d.kind == "eagle":
        drafter = f"eagle:{d.head or plan.model.name}"
    else:
        drafter = "none"
    p = plan.precision
    return {
        "backend_pair": f"{plan.draft_backend or '-'}/{plan.verify}",
        "backend": plan.draft_backend, "verify": plan.verify,
        "model": plan.model.name or plan.model.path, "drafter": drafter, "draft_kind": d.kind,
        "draft_layers": list(work.draft_layers) if work.draft_layers is not None else None,
        "num_draft_tokens": plan.k, "topk": plan.spec.topk, "temperature": plan.spec.temperature,
        **{f"precision_{k}": v for k, v in plan_dict(p).items() if k != "kv_scale"}, "kv_scale": p.kv_scale,
        "page_size": work.page_size, "max_context": work.max_context, "device": plan.device,
        "batch_size": plan.workload.batch_size, "warmup_plan": plan.warmup.plan,
        "cuda_graph": plan.engine.cuda_graph, "fused_ops": plan.engine.fused_ops,
        "gemm": plan.engine.gemm, "gemm_split": plan.engine.gemm_split if plan.engine.gemm in TRITON_GEMMS else None,
        "gemm_prefetch": plan.engine.gemm_prefetch,
        "pdl": plan.engine.pdl,
    }


def _timed_spec(plan: RunPlan, work: Prepared, pair: Pair, prompts, desc: str, on_batch=None):
    """One timed spec run; returns (output, {side: KV pages used max}, peak memory bytes) over it alone."""
    runners = {"target": pair.target, "draft": pair.draft_runner}
    runners = {side: r for side, r in runners.items() if r is not None}
    for r in runners.values():
        r.allocator.max_pages_used = r.allocator.num_used  # the peak starts now, not at warmup
    reset_peak_memory(plan.device)
    _sync(plan.device)
    out = decode(pair, plan, work, prompts, desc=desc, on_batch=on_batch)
    return out, {side: r.allocator.max_pages_used for side, r in runners.items()}, peak_memory_bytes(plan.device)


def graph_counts(target, draft=None) -> dict[str, tuple[int, dict]]:
    """Each side's graph counters now ({side: (replays, {miss key: count})}; engine.runner.ModelRunner's), of the
    sides with graphs."""
    runners = {"target": target, "draft": draft}
    return {side: (r.graph_replays, dict(r.graph_misses)) for side, r in runners.items()
            if r is not None and getattr(r, "graphs", None) is not None}


def eager_passes(before: dict[str, tuple[int, dict]], after: dict[str, tuple[int, dict]]) -> tuple[int, dict]:
    """Between two ``graph_counts``: (passes replayed, {"side bB qQ slot S[ variant V]": passes run eager})."""
    replayed, eager = 0, {}
    for side, (n, miss) in after.items():
        n0, miss0 = before.get(side, (0, {}))
        replayed += n - n0
        for key, c in miss.items():
            if c > miss0.get(key, 0):
                label = f"{side} b{key[0]} q{key[1]} slot {key[2]}"
                label += f" variant {key[3]}" if key[3] is not None else ""
                eager[label] = c - miss0.get(key, 0)
    return replayed, eager


def eager_keys(eager: dict[str, int]) -> list[str]:
    """``eager_passes``' counts as "label xN", most first."""
    return [f"{label} x{n}" for label, n in sorted(eager.items(), key=lambda x: (-x[1], x[0]))]


def graph_metrics(before: dict[str, tuple[int, dict]], after: dict[str, tuple[int, dict]]) -> dict:
    """The timed runs' graph-eligible passes between two ``graph_counts``: replayed, eager (no graph of their key),
    and the eager passes' keys, most first (``eager_keys``). Empty where no side has graphs."""
    if not after:
        return {}
    replayed, eager = eager_passes(before, after)
    return {"graph_passes_replayed": replayed, "graph_passes_eager": sum(eager.values()),
            "graph_eager_keys": eager_keys(eager)}


def cold_kind(cold: dict | None) -> dict:
    """Which cold start first_request_ms_cold is (metrics.json ``cold_start``)."""
    before = _JOBS_MEASURED[0]
    if cold is not None:
        kind = "fresh_process_empty_caches" if cold.get("empty_caches") else "fresh_process"
    else:
        kind = "first_job_in_process" if before == 0 else "after_jobs_in_process"
    return {"cold_start": kind, "jobs_before_in_process": before}


def measure(plan: RunPlan, work: Prepared, pair: Pair, cold: dict | None = None, on_batch=None) -> Measured:
    """Warmup, then bench.repeats x (timed spec run, timed target-only run). ``cold``: what a fresh-process
    cold start measured (attnlab.coldstart), else the first timed request of this process is the cold one.
    ``on_batch``: told of each batch the first timed spec run finishes (what an interrupt keeps)."""
    from attnlab.metrics.perf import memory_metrics, summarize
    from attnlab.metrics.repeats import repeat_metrics

    if plan.workload.serving:  # arrivals and continuous batching: the engine's own timed runs
        from attnlab.measure_serving import measure_serving

        return measure_serving(plan, work, pair, cold, on_batch)
    kind = cold_kind(cold)
    _JOBS_MEASURED[0] += 1
    m = warmup(plan, work, pair)
    prompts, res = list(work.prompts), Measured([], [])
    pages: dict[str, int] = {}
    peak = 0
    graphs0 = graph_counts(pair.target, pair.draft_runner)
    for i in range(plan.bench.repeats):
        tag = f" {i + 1}/{plan.bench.repeats}" if plan.bench.repeats > 1 else ""
        out, used, mem = _timed_spec(plan, work, pair, prompts, "workload" + tag, on_batch if i == 0 else None)
        res.spec.append(out)
        pages = {side: max(n, pages.get(side, 0)) for side, n in used.items()}
        peak = max(peak, mem)
        if plan.draft.kind != "none":
            _sync(plan.device)
            res.base.append(decode(pair.target_only(), plan, work, prompts, k=0, desc="target-only" + tag))
    graphed = graph_metrics(graphs0, graph_counts(pair.target, pair.draft_runner))
    # The first request right after the warmup plan vs the same batch once everything ran (same kind of run).
    first = res.spec[0].requests[0].latency_ms
    if len(res.spec) > 1:
        warm = res.spec[1].requests[0].latency_ms
    else:
        warm = _timed_spec(plan, work, pair, prompts[: plan.workload.batch_size], "warm re-run")[0]
        warm = warm.requests[0].latency_ms
    cold_ms = cold["first_request_ms"] if cold is not None else first

    m.update(repeat_metrics([summarize(o, work.page_size) for o in res.spec], [summarize(o) for o in res.base],
                            plan.bench.noisy_ratio))
    m.update(kind, first_request_ms_cold=cold_ms, first_request_ms_in_process=first, first_request_ms_warm=warm,
             first_request_gap_frac=cold_ms / max(warm, 1e-9) - 1)
    if cold is not None:
        m.update({f"cold_{k}": v for k, v in cold.items() if k not in ("first_request_ms", "empty_caches")})
    m["kv_pages_used_max"] = pages["target"]
    if "draft" in pages:
        m["kv_pages_used_max_draft"] = pages["draft"]
    m["peak_mem_bytes"] = peak
    m.update(memory_metrics({"target": pair.target, "draft": pair.draft_runner}))
    m.update(describe(plan, work))
    m.update(graphed)
    warn_eager(graphed)
    if m.get("noisy"):
        log.warning("noisy timings: %s spread more than %.2fx over %d repeats (max/min %s); host load %s",
                    ", ".join(m["noisy_keys"]), plan.bench.noisy_ratio, plan.bench.repeats,
                    ", ".join(f"{m[k + '_spread']:.2f}" if m[k + "_spread"] else "inf" for k in m["noisy_keys"]),
                    _load())
    res.metrics = m
    return res


def warn_eager(graphed: dict) -> None:
    """One warning where timed graph-eligible passes ran eager: their time is not the graphs' (engine.cuda_graph)."""
    if graphed.get("graph_passes_eager"):
        n, total = graphed["graph_passes_eager"], graphed["graph_passes_eager"] + graphed["graph_passes_replayed"]
        keys = graphed["graph_eager_keys"]
        log.warning("%d of %d graph-eligible timed passes ran eager, no graph captured for them: %s%s", n, total,
                    "; ".join(keys[:4]), f"; {len(keys) - 4} more keys" if len(keys) > 4 else "")


def _load() -> str:
    import os

    try:
        return " ".join(f"{x:.2f}" for x in os.getloadavg())
    except OSError:
        return "n/a"
