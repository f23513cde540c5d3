"""What attnlab.bench.serving serves: its arrival settings (how many requests each, how many warm up) and its
prompts with their output budgets, the way the main job's ``workload=sharegpt workload.output_len=recorded``
prepares them (attnlab.prepare, attnlab.workloads.lengths); its rows, table and latency-vs-throughput plot.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass

SYNTHETIC_LENGTHS = (48, 96)  # random weights: prompt lengths of the synthetic token prompts (as bench.spec)
POISSON_WARMUP = 8  # default warmup requests of a Poisson setting (a closed loop's default is its concurrency)
MIN_CLOSED, MIN_POISSON = 5, 40  # default measured requests: closed max(5, 2 C); Poisson max(40, rate x 1 s)
FIELDS = ("requests_per_s", "output_tokens_per_s", *(f"{k}_p{q}" for k in ("ttft_ms", "tpot_ms", "itl_ms")
                                                      for q in (50, 99)), "preemptions", "max_running")


@dataclass(frozen=True)
class Setting:
    """One arrival setting: ``requests`` served, the first ``warmup`` of them left out of the statistics;
    ``asked``: what the rule (or --requests-per-setting) asked for, before the cap by the prompts available."""

    arrival: str  # closed | poisson
    load: float  # closed: the concurrency C; poisson: the rate (requests per second)
    requests: int
    warmup: int
    asked: int

    @property
    def label(self) -> str:
        return f"closed c={self.load:g}" if self.arrival == "closed" else f"poisson {self.load:g} req/s"

    def source(self, seed: int):
        from attnlab.engine.arrivals import arrival_source

        return arrival_source(self.arrival, self.requests, rate=self.load, concurrency=int(self.load), seed=seed)


def asked(arrival: str, load: float, requests: int | None, warmup: int | None) -> tuple[int, int]:
    """(requests, warmup) a setting asks for before the cap. Defaults: a closed loop at C warms up with C
    requests (its ramp-up) and measures max(5, 2 C) more; a Poisson rate r warms up with 8 and measures
    max(40, r) more (at least a second of arrivals)."""
    if arrival == "closed":
        w = int(load) if warmup is None else warmup
        return (requests or w + max(MIN_CLOSED, 2 * int(load))), w
    w = POISSON_WARMUP if warmup is None else warmup
    return (requests or w + max(MIN_POISSON, math.ceil(load))), w


def settings(closed: list[int], rates: list[float], available: int, requests: int | None = None,
             warmup: int | None = None, reuse: bool = False) -> list[Setting]:
    """Every setting, its requests capped at the ``available`` prompts (and its warmup below that: at least
    one request is measured), unless ``reuse``: request i then serves prompt i mod available (``cycled``)."""
    out = []
    for arrival, loads in (("closed", closed), ("poisson", rates)):
        for load in loads:
            n, w = asked(arrival, load, requests, warmup)
            m = n if reuse else min(n, available)
            out.append(Setting(arrival, load, m, min(w, m - 1), n))
    return out


def cycled(items: list, n: int) -> list:
    """The first ``n`` of ``items`` repeated end to end (request i serves prompt i mod len(items))."""
    return [items[i % len(items)] for i in range(n)]


def serving_prompts(a, vocab_size: int, tokenizer, n: int) -> tuple[list[list[int]], list[int], str]:
    """(token ids, output budgets, a note on what was served) for ``n`` requests. Real weights: the builtin
    suite or ShareGPT's held-out split (``a.prompts``: builtin | sharegpt | an exported .jsonl(.gz)) with the
    chat template; ``a.output_len == "recorded"`` with ShareGPT: each answer's recorded length capped at
    ``a.max_new``, after bench_serving's filters (prompt <= 1024 tokens, prompt + answer <= 2048, both >= 4).
    Random weights: synthetic token prompts, every budget ``a.max_new``."""
    from attnlab.workloads import synthetic_prompts, tokenize_prompts

    if a.weights != "real":
        ids = [p.token_ids for p in synthetic_prompts(list(SYNTHETIC_LENGTHS), n, vocab_size, seed=a.seed)]
        lengths = "/".join(map(str, SYNTHETIC_LENGTHS))
        return ids, [a.max_new] * n, f"synthetic {lengths}-token prompts (random weights), {a.max_new} new tokens each"
    if a.prompts == "builtin":
        from attnlab.workloads.builtin import load_builtin

        ps = tokenize_prompts(load_builtin(n), tokenizer, chat_template=True)
        return [p.token_ids for p in ps], [a.max_new] * n, f"builtin, {a.max_new} new tokens each (none recorded)"
    from attnlab.workloads.sharegpt import load_sharegpt

    path = None if a.prompts == "sharegpt" else a.prompts
    source = f"ShareGPT held-out first turns ({path or 'package'})"
    if a.output_len == "fixed":
        ps = tokenize_prompts(load_sharegpt(n, "heldout", path), tokenizer, chat_template=True)
        return [p.token_ids for p in ps], [a.max_new] * len(ps), f"{source}, {a.max_new} new tokens each"
    from attnlab.config import WorkloadSchema
    from attnlab.workloads.lengths import select_by_length

    w = WorkloadSchema(kind="sharegpt", num_prompts=n, max_new_tokens=a.max_new, output_len="recorded")
    ps, skipped = select_by_length(load_sharegpt(None, "heldout", path), tokenizer,
                                   lambda p: tokenize_prompts([p], tokenizer, True), w)
    short, long_ = skipped["prompts_skipped_too_short"], skipped["prompts_skipped_too_long"]
    note = f"{source}, recorded answer lengths capped at {a.max_new} (skipped {short} too short, {long_} too long)"
    return [p.token_ids for p in ps], [p.max_new_tokens for p in ps], note


def latency_figure(rows: list[dict]):
    """TPOT p50 vs output tok/s: one line per drafter and backend pair through its settings in order of load,
    a panel per arrival kind (closed, poisson), each point labelled with its load. None: no row to draw."""
    from attnlab.report import _plt, _wrap

    kinds = [k for k in ("closed", "poisson") if any(r["arrival"] == k for r in rows)]
    if not kinds:
        return None
    plt = _plt()
    fig, axes = plt.subplots(1, len(kinds), figsize=(6.0 * len(kinds), 4.6), squeeze=False)
    for ax, kind in zip(axes[0], kinds):
        lines: dict[str, list[dict]] = {}
        for r in rows:
            if r["arrival"] == kind:
                lines.setdefault(f"{r['drafter']} {r['pair']}", []).append(r)
        for name, rs in lines.items():
            rs = sorted(rs, key=lambda r: r["load"])
            ax.plot([r["output_tokens_per_s"] for r in rs], [r["tpot_ms_p50"] for r in rs], marker="o",
                    linestyle="--" if name.startswith("none") else "-", label=_wrap(name, 36))
            for r in rs:
                ax.annotate(f"{r['load']:g}", (r["output_tokens_per_s"], r["tpot_ms_p50"]), fontsize=6,
                            textcoords="offset points", xytext=(3, 3))
        ax.set_xlabel("measured output tokens/s")
        ax.set_ylabel("TPOT p50 (ms)")
        ax.set_title("closed loop (points: concurrency)" if kind == "closed" else "Poisson (points: req/s)",
                     fontsize=9)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    fig.tight_layout()
    return fig


def make_row(drafter: str, draft_backend: str, verify: str, s: Setting, m: dict) -> dict:
    """One table row from a run's serving_summary ``m`` (kept whole under "metrics"); the speedup and the
    share of outputs equal to target-only are the caller's (they need the matching none row)."""
    return {"drafter": drafter, "pair": f"{draft_backend} / {verify}", "backend": draft_backend, "verify": verify,
            "arrival": s.arrival, "load": s.load, "setting": s.label, "requests": s.requests,
            "warmup_requests": s.warmup, "measured_requests": m["measured_requests"], **{k: m[k] for k in FIELDS},
            "kv_pages_used_max": m["kv_pages_used_max"], "kv_pages_used_max_draft": m.get("kv_pages_used_max_draft"),
            "tau": m["accept_len_mean"] if drafter != "none" else None, "speedup": None, "tpot_gain": None,
            "same_as_target_only": None, "metrics": m}


def _num(x, fmt: str) -> str:
    return "-" if x is None else format(x, fmt)


def _spread(r: dict) -> str:
    """' (min-max)' of a row's tok/s over its repeats (bench.serving --repeats), '' for one run."""
    toks = [x["output_tokens_per_s"] for x in r.get("repeats", [])]
    return f" ({min(toks):.0f}-{max(toks):.0f})" if len(toks) > 1 else ""


def table(rows: list[dict]) -> list[str]:
    out = [("| drafter | draft / verify | arrival | requests (measured) | req/s | tok/s | TTFT p50 / p99 ms | "
           "TPOT p50 / p99 ms | ITL p50 / p99 ms | peak KV pages target / draft | preempt | tau | tok/s vs none | "
           "TPOT p50 gain vs none | outputs = target-only |"), "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lat = " | ".join(f"{r[f'{k}_p50']:.2f} / {r[f'{k}_p99']:.2f}" for k in ("ttft_ms", "tpot_ms", "itl_ms"))
        pages = f"{r['kv_pages_used_max']}" + (f" / {r['kv_pages_used_max_draft']}"
                                                 if r["kv_pages_used_max_draft"] is not None else "")
        same = "" if r["same_as_target_only"] is None else f"{r['same_as_target_only']:.0%}"
        speedup = "" if r["speedup"] is None else f"{r['speedup']:.2f}x"
        gain = "" if r.get("tpot_gain") is None else f"{r['tpot_gain']:.2f}x"
        out.append(f"| {r['drafter']} | {r['pair']} | {r['setting']} | {r['requests']} ({r['measured_requests']}) | "
                   f"{r['requests_per_s']:.2f} | {r['output_tokens_per_s']:.1f}{_spread(r)} | {lat} | {pages} | "
                   f"{r['preemptions']} | {_num(r['tau'], '.2f')} | {speedup} | {gain} | {same} |")
    return out


def write_plot(rows: list[dict], path: str) -> str:
    """PREFIX_latency.png -> the markdown line that shows it (or says why there is none)."""
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        return "\n(no latency plot: matplotlib is not installed)"
    fig = latency_figure(rows)
    if fig is None:
        return "\n(no latency plot: no row)"
    fig.savefig(path, dpi=120, bbox_inches="tight")
    from attnlab.report import _plt

    _plt().close(fig)
    return f"\n![TPOT p50 vs throughput]({os.path.basename(path)})"
