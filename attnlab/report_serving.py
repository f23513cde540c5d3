"""The serving part of ``python -m attnlab.report``: jobs run with workload.arrival = all_at_once | poisson |
closed (attnlab.measure_serving).

- a table (printed on stdout after the main table, and in report.md): backend pair, drafter, arrival and load
  (rate or concurrency), requests/s, tok/s, goodput, TTFT / TPOT / ITL p50 and p99, peak KV pages (target,
  draft), preemptions, speedup vs target-only;
- latency_throughput.png: per backend pair and drafter, one line through its jobs in order of load (a rate or
  concurrency sweep), measured output tokens/s on x, ITL p50 / ITL p99 / TTFT p99 on three panels;
- kv_timeline.png: KV pages in use on the target side over each job's first timed spec run, from the
  ``kv_timeline`` rows of its events.jsonl.
"""

from __future__ import annotations

import json
from pathlib import Path

from attnlab.report import _num, _plt, _wrap, job_row, markdown_table, sweep_labels, varied_overrides

COLUMNS = ("draft/verify", "drafter", "arrival", "load", "req/s", "tok/s", "goodput req/s", "TTFT p50 ms",
           "TTFT p99 ms", "TPOT p50 ms", "TPOT p99 ms", "ITL p50 ms", "ITL p99 ms", "peak KV pages", "preempt",
           "speedup", "status")
HEADING = "## Serving (continuous batching)"
PANELS = (("itl_ms_p50", "ITL p50 (ms)"), ("itl_ms_p99", "ITL p99 (ms)"), ("ttft_ms_p99", "TTFT p99 (ms)"))


def is_serving(job: dict) -> bool:
    return job["metrics"].get("arrival") in ("all_at_once", "poisson", "closed")


def load(m: dict) -> float:
    """The offered load a sweep varies: the Poisson rate, the closed loop's concurrency (0 for all at once)."""
    return m.get("request_rate") or m.get("concurrency") or 0.0


def _load_label(m: dict) -> str:
    if m.get("arrival") == "poisson":
        return f"{_num(m.get('request_rate'), '.3g')} req/s"
    if m.get("arrival") == "closed":
        return f"c={m.get('concurrency')}"
    return "t=0"


def serving_row(job: dict) -> dict:
    m, base = job["metrics"], job_row(job)
    pages = _num(m.get("kv_pages_used_max"), "d")
    if m.get("kv_pages_used_max_draft") is not None:
        pages += f" / {_num(m['kv_pages_used_max_draft'], 'd')}"
    return {
        "job": job["name"], "draft/verify": base["draft/verify"], "drafter": base["drafter"],
        "arrival": m.get("arrival", "?"), "load": _load_label(m),
        "req/s": _num(m.get("requests_per_s"), ".2f"), "tok/s": _num(m.get("output_tokens_per_s"), ".1f"),
        "goodput req/s": _num(m.get("goodput_requests_per_s"), ".2f"),
        **{f"{name} p{q} ms": _num(m.get(f"{key}_p{q}"), ".2f") for key, name in
           (("ttft_ms", "TTFT"), ("tpot_ms", "TPOT"), ("itl_ms", "ITL")) for q in (50, 99)},
        "peak KV pages": pages, "preempt": _num(m.get("preemptions"), "d"),
        "speedup": base["speedup"], "status": base["status"],
    }


def serving_table(jobs: list[dict]) -> str:
    varying = varied_overrides(jobs)
    rows = [{**serving_row(j), **{k: j["overrides"].get(k, "-") for k in varying}} for j in jobs]
    return markdown_table(rows, ("job", *varying, *COLUMNS))


def curves(jobs: list[dict]) -> dict[str, list[dict]]:
    """Jobs grouped by backend pair, drafter and arrival kind, each group in order of load."""
    groups: dict[str, list[dict]] = {}
    for j in jobs:
        r = job_row(j)
        groups.setdefault(f"{r['draft/verify']} {r['drafter']} {j['metrics'].get('arrival')}", []).append(j)
    return {k: sorted(v, key=lambda j: load(j["metrics"])) for k, v in groups.items()}


def latency_throughput_figure(jobs: list[dict]):
    """Latency vs measured throughput, one line per backend pair and drafter (None: no job has both)."""
    plt = _plt()
    groups = {k: [j for j in v if j["metrics"].get("output_tokens_per_s") is not None] for k, v in curves(jobs).items()}
    groups = {k: v for k, v in groups.items() if v}
    if not groups:
        return None
    fig, axes = plt.subplots(1, len(PANELS), figsize=(5.2 * len(PANELS), 4.4))
    for ax, (key, title) in zip(axes, PANELS):
        for name, js in groups.items():
            pts = [(j["metrics"]["output_tokens_per_s"], j["metrics"].get(key)) for j in js]
            pts = [(x, y) for x, y in pts if isinstance(y, (int, float))]
            if pts:
                ax.plot([x for x, _ in pts], [y for _, y in pts], marker="o", label=_wrap(name, 36))
        ax.set_xlabel("measured output tokens/s")
        ax.set_ylabel(title)
        ax.set_title(f"{title} vs throughput (one point per load)", fontsize=9)
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=7)
    fig.tight_layout()
    return fig


def kv_timeline(job_dir: Path, run: str = "spec", repeat: int = 0) -> list[dict]:
    """The kv_timeline rows of one timed run from a job's events.jsonl ([] when there are none)."""
    path = Path(job_dir) / "events.jsonl"
    if not path.is_file():
        return []
    rows = []
    for line in path.read_text().splitlines():
        try:
            e = json.loads(line)
        except ValueError:
            continue
        if e.get("event") == "kv_timeline" and e.get("run") == run and e.get("repeat") == repeat:
            rows.append(e)
    return rows


def kv_timeline_figure(jobs: list[dict]):
    """Target KV pages in use over time, one line per job (None: no job has a timeline)."""
    plt = _plt()
    label_of = dict(zip((j["name"] for j in jobs), sweep_labels(jobs)))
    series = [(label_of[j["name"]], kv_timeline(j["dir"])) for j in jobs]
    series = [(n, s) for n, s in series if s]
    if not series:
        return None
    fig, ax = plt.subplots(figsize=(7.2, 4.4))
    for name, s in series:
        ax.step([e["t_s"] for e in s], [e["pages_target"] for e in s], where="post", label=_wrap(name, 40))
    ax.set_xlabel("seconds since the first arrival (first timed spec run)")
    ax.set_ylabel("target KV pages in use (after each engine step)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    fig.tight_layout()
    return fig


def serving_markdown(jobs: list[dict]) -> str:
    """The serving heading and table ("" when no job served): printed after the main table, and in report.md."""
    jobs = [j for j in jobs if is_serving(j)]
    return f"{HEADING}\n\n{serving_table(jobs)}" if jobs else ""


def serving_section(jobs: list[dict], out_dir: Path, plots: bool = True) -> str:
    """report.md's serving section ("" when no job served): the table and the two plots."""
    jobs = [j for j in jobs if is_serving(j)]
    if not jobs:
        return ""
    text = f"\n{serving_markdown(jobs)}\n"
    if plots:
        plt = _plt()
        for name, fig in (("latency_throughput.png", latency_throughput_figure(jobs)),
                          ("kv_timeline.png", kv_timeline_figure(jobs))):
            if fig is None:
                continue
            fig.savefig(out_dir / name, dpi=120, bbox_inches="tight")
            plt.close(fig)
            text += f"\n![{Path(name).stem}]({name})\n"
    return text
