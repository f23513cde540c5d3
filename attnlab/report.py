"""``python -m attnlab.report <run or sweep folder>``: a markdown table across jobs + PNG plots.

Finds every job folder (one holding status.json) under the given folder and prints one row per job: a column
for each override the sweep varied (from .hydra/overrides.yaml), then the backend pair, drafter, precision,
page size, k, repeats, tau, tok/s with its min-max over the repeats, ms per iteration, speedup with its
min-max, TTFT and TPOT p50, peak memory, the logits error, the token match, the divergences vs target-only
(how many at near-ties, how many unexplained), the noise floor's token match and the status. It writes
report.md, throughput_tau.png (tok/s and tau, one bar per job) and accept_rate_pos.png (acceptance rate per
draft position, one line per job) into the folder (or --out); serving jobs add a latency table (printed
after the main one), latency_throughput.png and kv_timeline.png (attnlab.report_serving).

Folders with a status.json that are not speculative-decoding runs (``python -m attnlab.train_draft`` writes one
too, e.g. beside the runs under outputs/) are skipped and named in a note (stderr and report.md). ``--keys``
takes metrics.json keys or dotted .hydra/config.yaml keys; a key no job has is refused (exit 2) with the
closest keys the jobs do have.
"""

from __future__ import annotations

import argparse
import difflib
import json
import math
import re
import sys
import textwrap
from pathlib import Path

from attnlab.cli import EXIT_USAGE

FIXED_COLUMNS = ("draft/verify", "drafter", "precision", "page", "k", "graphs", "repeats", "tau", "tok/s",
                 "tok/s min-max", "ms/iter", "speedup", "speedup min-max", "TTFT p50 ms", "TPOT p50 ms", "peak mem",
                 "logits err", "token match", "divergences", "noise floor", "invariant", "status")
COLUMNS = ("job", *FIXED_COLUMNS)  # + one column per varied override, after "job"
# top-level groups of a speculative-decoding run's config (conf/config.yaml); conf/train_draft.yaml has none
RUN_GROUPS = ("draft", "verify", "spec", "workload")


class ReportInputError(Exception):
    """The user's input (folder, --keys) cannot make a report: one line on stderr, exit 2."""


def _read_json(path: Path) -> dict:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def _read_config(job: Path) -> dict:
    path = job / ".hydra" / "config.yaml"
    if not path.is_file():
        return {}
    from omegaconf import OmegaConf

    try:
        return OmegaConf.to_container(OmegaConf.load(path), resolve=False)
    except Exception:  # noqa: BLE001 - a report over a broken folder still shows the other jobs
        return {}


def _natural(path: Path):
    return [int(t) if t.isdigit() else t for t in re.split(r"(\d+)", str(path))]


def find_jobs(root: Path) -> list[Path]:
    return sorted({p.parent for p in Path(root).glob("**/status.json") if "wandb" not in p.parts}, key=_natural)


def _read_overrides(job: Path) -> dict[str, str]:
    """The job's command-line overrides (Hydra's .hydra/overrides.yaml) as {key: value}; a key's ``+`` / ``++`` (which
    the CLI adds to backend options and model overrides) dropped, so it names the config key."""
    path = job / ".hydra" / "overrides.yaml"
    try:
        import yaml

        items = yaml.safe_load(path.read_text()) or []
    except Exception:  # noqa: BLE001 - a missing or broken file only costs the plot labels
        return {}
    return dict(str(o).lstrip("+").split("=", 1) for o in items if "=" in str(o))


def job_kind(job: dict) -> str:
    """"run" (a speculative-decoding run of ``python -m attnlab``, or a folder whose config is missing or
    unreadable: its other files still make a row), "train_draft" (``python -m attnlab.train_draft``: a
    ``train`` group, no draft / verify / spec / workload) or "other" (a config that is neither)."""
    c = job["config"]
    if not isinstance(c, dict):
        return "other"
    if not c or any(k in c for k in RUN_GROUPS):
        return "run"
    return "train_draft" if "train" in c else "other"


def split_jobs(jobs: list[dict]) -> tuple[list[dict], dict[str, list[dict]]]:
    """(the speculative-decoding runs, {kind: the other folders}) of ``jobs``."""
    runs, skipped = [], {}
    for j in jobs:
        kind = job_kind(j)
        if kind == "run":
            runs.append(j)
        else:
            skipped.setdefault(kind, []).append(j)
    return runs, skipped


def skip_note(skipped: dict[str, list[dict]]) -> str:
    """One line naming the folders left out ("" when none), e.g. "skipped 1 train_draft folder (...): t1"."""
    parts = []
    for kind, js in sorted(skipped.items()):
        names = [j["name"] for j in js]
        shown = ", ".join(names[:5]) + (f", ... ({len(names) - 5} more)" if len(names) > 5 else "")
        what = ("train_draft folder" if kind == "train_draft" else "folder") + ("s" if len(js) > 1 else "")
        why = ("python -m attnlab.train_draft output; its results are in summary.json" if kind == "train_draft"
               else "not an attnlab run: its .hydra/config.yaml has no " + "/".join(RUN_GROUPS))
        parts.append(f"skipped {len(js)} {what} ({why}): {shown}")
    return "; ".join(parts)


def load_job(job: Path, root: Path) -> dict:
    return {"dir": job, "name": str(job.relative_to(root)) if job != root else job.name,
            "config": _read_config(job), "metrics": _read_json(job / "metrics.json"),
            "parity": _read_json(job / "parity.json"), "status": _read_json(job / "status.json"),
            "overrides": _read_overrides(job)}


def varied_overrides(jobs: list[dict]) -> list[str]:
    """The override keys whose value differs between the jobs (what the sweep varied), sorted."""
    keys = sorted({k for j in jobs for k in j["overrides"]})
    return [k for k in keys if len({j["overrides"].get(k) for j in jobs}) > 1]


def sweep_labels(jobs: list[dict]) -> list[str]:
    """Per job, the overrides that differ between the jobs, e.g. "draft.layers=10"; the job name where nothing
    varies."""
    varying = varied_overrides(jobs)
    return [", ".join(f"{k}={j['overrides'][k]}" for k in varying if k in j["overrides"]) or j["name"]
            for j in jobs]


def _num(x, fmt: str) -> str:
    return "-" if x is None or not isinstance(x, (int, float)) or (isinstance(x, float) and math.isnan(x)) \
        else format(x, fmt)


def _range(m: dict, key: str, fmt: str) -> str:
    """min-max over the repeats ("-" for one repeat: no spread)."""
    lo, hi = m.get(f"{key}_min"), m.get(f"{key}_max")
    if (m.get("bench_repeats") or 1) < 2 or lo is None or hi is None:
        return "-"
    return f"{_num(lo, fmt)}-{_num(hi, fmt)}"


def _bytes(x) -> str:
    if not isinstance(x, (int, float)):
        return "-"
    return f"{x / 2 ** 30:.2f} GiB" if x >= 2 ** 30 else f"{x / 2 ** 20:.0f} MiB"


def _group(c, name: str) -> dict:
    """The config group ``name`` as a mapping ({} when absent, or not a mapping: never an AttributeError)."""
    g = c.get(name) if isinstance(c, dict) else None
    return g if isinstance(g, dict) else {}


def _graphs_cell(m: dict, c: dict) -> str:
    """"no", "yes", or "yes, N of M eager" where timed graph-eligible passes ran eager (measure.graph_metrics)."""
    if not (m.get("cuda_graphs") or _group(c, "engine").get("cuda_graph")):
        return "no"
    eager = m.get("graph_passes_eager") or 0
    return f"yes, {eager} of {eager + (m.get('graph_passes_replayed') or 0)} eager" if eager else "yes"


def job_row(job: dict) -> dict:
    c, m, st = job["config"], job["metrics"], job["status"]
    draft = _group(c, "draft")
    kind = draft.get("kind", "?")
    k = m.get("num_draft_tokens", _group(c, "spec").get("num_draft_tokens"))
    drafter = {"model": draft.get("name") or "model", "self": f"self{_layers(draft.get('layers'))}"}.get(kind, kind)
    # the draft-side backend only matters when the drafter runs attention
    backend = _group(c, "backend").get("name", "?") if kind in ("self", "model", "eagle") else "-"
    prec = (f"{m['precision_target']}/{m['precision_draft']}" if "precision_target" in m
            else _group(c, "precision").get("name", "?"))
    if any(str(m.get(f"precision_kv_{side}") or "").startswith("fp8") for side in ("target", "draft")):
        prec += f" kv {m.get('precision_kv_target')}/{m.get('precision_kv_draft')}"
    return {
        "job": job["name"],
        "draft/verify": f"{backend}/{_group(c, 'verify').get('name', '?')}",
        "drafter": drafter,
        "precision": prec,
        "page": str(m.get("page_size", _group(c, "kv").get("page_size", "?"))),
        "k": str(k if k is not None else "?"),
        "graphs": _graphs_cell(m, c),
        "repeats": (str(m["bench_repeats"]) + (" noisy" if m.get("noisy") else "")) if "bench_repeats" in m else "-",
        "tau": _num(m.get("accept_len_mean"), ".2f"),
        "tok/s": _num(m.get("output_tokens_per_s"), ".1f"),
        "tok/s min-max": _range(m, "output_tokens_per_s", ".1f"),
        "ms/iter": _num(m.get("iteration_ms"), ".2f"),
        "speedup": _num(m.get("speedup_vs_target_only"), ".2f"),
        "speedup min-max": _range(m, "speedup_vs_target_only", ".2f"),
        "TTFT p50 ms": _num(m.get("ttft_ms_p50"), ".1f"),
        "TPOT p50 ms": _num(m.get("tpot_ms_p50"), ".2f"),
        "peak mem": _bytes(m.get("peak_mem_bytes")),
        "logits err": _num(m.get("parity_logits_max_abs_err"), ".1e"),
        "token match": _num(m.get("parity_token_match"), ".3f"),
        "divergences": _divergences(m),
        "noise floor": _num(m.get("parity_noise_floor_token_match"), ".3f"),
        "invariant": _invariant(m),
        "status": str(st.get("status", "?")) + (f": {st['error']}" if st.get("error") else ""),
    }


def _invariant(m: dict) -> str:
    """engine.invariant runs: "exact", or "BROKEN: n req." (the job failed); "-" elsewhere."""
    if "invariant_exact" not in m or m["invariant_exact"] is None:
        return "-"
    return "exact" if m["invariant_exact"] else f"BROKEN: {m.get('invariant_mismatched_requests', '?')} req."


def _divergences(m: dict) -> str:
    """"n: t tie, u unexpl." (requests diverging from target-only, at near-ties, not), with " (w in rounding)" where
    parity.rounding measured how many unexplained ones the reference's own rounding reaches; "-" where not compared."""
    n = m.get("parity_divergences")
    if not isinstance(n, int):
        return "-"
    odd, within = m.get("parity_divergences_unexplained", 0), m.get("parity_divergences_unexplained_within_rounding")
    extra = f" ({within} in rounding)" if odd and isinstance(within, int) else ""
    return f"{n}: {m.get('parity_divergences_near_tie', 0)} tie, {odd} unexpl.{extra}"


def _layers(layers) -> str:
    if layers is None:
        return ""
    return f"[{layers}]" if isinstance(layers, int) else f"[{len(layers)}L]"


def markdown_table(rows: list[dict], columns=COLUMNS) -> str:
    def esc(s: str) -> str:
        return str(s).replace("|", "\\|").replace("\n", " ")

    lines = ["| " + " | ".join(columns) + " |", "|" + "|".join("---" for _ in columns) + "|"]
    lines += ["| " + " | ".join(esc(r.get(c, "-")) for c in columns) + " |" for r in rows]
    return "\n".join(lines)


def table_rows(jobs: list[dict]) -> tuple[list[dict], tuple[str, ...]]:
    """One row per job with a column per varied override (after "job"); returns (rows, columns)."""
    varying = varied_overrides(jobs)
    rows = []
    for j in jobs:
        row = job_row(j)
        row.update({k: j["overrides"].get(k, "-") for k in varying})
        rows.append(row)
    return rows, ("job", *varying, *FIXED_COLUMNS)


def _wrap(text: str, width: int) -> str:
    return "\n".join(textwrap.wrap(text, width, break_on_hyphens=False, break_long_words=False)) or text


def _plt():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def throughput_figure(jobs: list[dict], rows: list[dict]):
    """tok/s (median; the bar's whisker spans min-max over the repeats) and tau: one bar per job, labelled by
    what the sweep varied, or by backend pair and drafter when nothing did. Nothing is averaged."""
    plt = _plt()

    names = sweep_labels(jobs)
    if len(jobs) > 1 and names == [j["name"] for j in jobs]:  # nothing varied (or no overrides files)
        names = [f"{j['name']}: {r['draft/verify']} {r['drafter']}" for j, r in zip(jobs, rows)]
    done = [(n, j["metrics"]) for n, j in zip(names, jobs) if j["metrics"].get("output_tokens_per_s") is not None]
    if not done:
        return None
    labels = [_wrap(n, 24) for n, _ in done]
    fig, axes = plt.subplots(1, 2, figsize=(max(8.0, 1.1 * len(done) + 5), 4.8))
    panels = ((axes[0], "output_tokens_per_s", "output tokens/s (median; whiskers: min-max over the repeats)",
               "tab:blue"), (axes[1], "accept_len_mean", "tau: tokens per verify pass", "tab:orange"))
    for ax, key, title, color in panels:
        vals = [m.get(key) or 0.0 for _, m in done]
        err = None
        if key == "output_tokens_per_s":
            lo = [v - (m.get(key + "_min") if m.get(key + "_min") is not None else v) for v, (_, m) in zip(vals, done)]
            hi = [(m.get(key + "_max") if m.get(key + "_max") is not None else v) - v for v, (_, m) in zip(vals, done)]
            err = [lo, hi] if any(lo) or any(hi) else None
        ax.bar(range(len(done)), vals, yerr=err, capsize=4 if err else 0, color=color)
        ax.set_xticks(range(len(done)), labels, fontsize=7, rotation=30, ha="right")
        ax.set_title(_wrap(title, 40), fontsize=9)
        ax.grid(axis="y", alpha=0.3)
    fig.tight_layout()
    return fig


def accept_figure(jobs: list[dict]):
    """Acceptance rate per draft position, one line per job."""
    plt = _plt()

    label_of = dict(zip((j["name"] for j in jobs), sweep_labels(jobs)))
    fig, ax = plt.subplots(figsize=(6.4, 4.4))
    drawn, last = 0, 0
    for j in jobs:
        m = j["metrics"]
        pos = sorted((int(k[len("accept_rate_pos"):]), v) for k, v in m.items()
                     if re.fullmatch(r"accept_rate_pos\d+", k))
        if pos:
            ax.plot([p for p, _ in pos], [v for _, v in pos], marker="o", label=_wrap(label_of[j["name"]], 40))
            drawn, last = drawn + 1, max(last, pos[-1][0])
    if last:
        ax.set_xticks(range(1, last + 1))
    ax.set_xlabel("draft position i")
    ax.set_ylabel("acceptance rate of draft token i")
    ax.set_title("per verify pass that drafted position i", fontsize=9)
    ax.set_ylim(0, 1.05)
    ax.grid(alpha=0.3)
    if drawn:
        ax.legend(fontsize=7)
    fig.tight_layout()
    return fig


def plot(jobs: list[dict], rows: list[dict], out_dir: Path) -> list[Path]:
    """throughput_tau.png and accept_rate_pos.png (saved with every artist inside the image)."""
    plt = _plt()
    if not any(j["metrics"].get("output_tokens_per_s") is not None for j in jobs):
        return []
    paths = []
    for name, fig in (("throughput_tau.png", throughput_figure(jobs, rows)), ("accept_rate_pos.png",
                                                                             accept_figure(jobs))):
        if fig is None:
            continue
        paths.append(out_dir / name)
        fig.savefig(paths[-1], dpi=120, bbox_inches="tight")
        plt.close(fig)
    return paths


def _flat(c, prefix: str = "") -> dict:
    """A config's leaves by dotted key, e.g. {"kv.page_size": 16}."""
    out = {}
    for k, v in (c.items() if isinstance(c, dict) else ()):
        if isinstance(v, dict) and v:
            out.update(_flat(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out


def job_keys(job: dict) -> dict:
    """What ``--keys`` can show for a job: its metrics.json keys, then its dotted config keys
    (.hydra/config.yaml, e.g. workload.rate) where metrics.json lacks the name."""
    return {**_flat(job["config"]), **job["metrics"]}


def check_keys(jobs: list[dict], keys: list[str]) -> None:
    """Refuse a key that no job has (a typo would print a column of "-"), with the closest keys they have."""
    valid = sorted(set().union(*(job_keys(j) for j in jobs)))
    bad = []
    for k in dict.fromkeys(keys):
        if k in valid:
            continue
        close = difflib.get_close_matches(k, valid, n=3, cutoff=0.6)
        close += [v for v in valid if k.lower() in v.lower() and v not in close][:5 - len(close)]
        bad.append(f"{k} (did you mean {', '.join(close)}?)" if close else
                   f"{k} (no close match; docs/usage.md, 'The run folder', lists the metrics.json keys)")
    if bad:
        one = len(bad) == 1
        raise ReportInputError(f"unknown --keys key{'' if one else 's'} {'; '.join(bad)}: no job has "
                               f"{'it' if one else 'them'} in metrics.json or .hydra/config.yaml")


def key_table(jobs: list[dict], keys: list[str]) -> str:
    """job, the varied overrides, then the given keys' values as they are (e.g. a cold-start table): metrics.json
    keys, or dotted config keys; "-" for a job without the key."""
    varying = varied_overrides(jobs)
    rows = []
    for j in jobs:
        m = job_keys(j)
        row = {"job": j["name"], **{k: j["overrides"].get(k, "-") for k in varying}}
        for k in keys:
            v = m.get(k)
            if isinstance(v, list):  # e.g. <key>_repeats
                row[k] = ", ".join(_num(x, ".4g") if isinstance(x, (int, float)) else str(x) for x in v) or "-"
            elif isinstance(v, (int, float)) and not isinstance(v, bool):
                row[k] = _num(v, ".4g")
            else:
                row[k] = "-" if v is None else str(v)
        rows.append(row)
    return markdown_table(rows, ("job", *varying, *keys))


def report(root: Path, out_dir: Path | None = None, plots: bool = True, keys: list[str] | None = None,
           notes: list[str] | None = None) -> str:
    """The job table (or, with ``keys``, a table of those keys) -> report.md (+ plots). Returns what the CLI
    prints: the table, then the serving table when some jobs served. Folders that are not speculative-decoding
    runs are left out; ``notes`` (when given) receives the line that says so."""
    root = Path(root)
    jobs, skipped = split_jobs([load_job(j, root) for j in find_jobs(root)])
    note = skip_note(skipped)
    if not jobs:
        if note:
            raise ReportInputError(f"no attnlab speculative-decoding run folders under {root}: {note}")
        raise FileNotFoundError(f"no attnlab job folders (with status.json) under {root}")
    if keys:
        check_keys(jobs, keys)
        table = key_table(jobs, keys)
    else:
        rows, columns = table_rows(jobs)
        table = markdown_table(rows, columns)
    if note and notes is not None:
        notes.append(note)
    out_dir = Path(out_dir or root)
    out_dir.mkdir(parents=True, exist_ok=True)
    text = f"# attnlab report: {root}\n\n{table}\n" + (f"\nNote: {note}.\n" if note else "")
    printed = table
    if plots and not keys:
        for p in plot(jobs, rows, out_dir):
            text += f"\n![{p.stem}]({p.name})\n"
    if not keys:  # serving jobs (workload.arrival != batch): their latency table and plots
        from attnlab.report_serving import serving_markdown, serving_section

        text += serving_section(jobs, out_dir, plots)
        serving = serving_markdown(jobs)
        if serving:
            printed += f"\n\n{serving}"
    (out_dir / "report.md").write_text(text)
    return printed


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m attnlab.report", description=__doc__.splitlines()[0])
    ap.add_argument("folder", type=Path, help="a run folder or a sweep folder")
    ap.add_argument("--out", type=Path, default=None, help="where report.md and the PNGs go (default: folder)")
    ap.add_argument("--no-plots", action="store_true")
    ap.add_argument("--keys", default=None, help="comma-separated metrics.json keys (or dotted config keys, "
                                                 "e.g. workload.rate): print a table of those instead (e.g. "
                                                 "first_request_ms_cold,first_request_ms_warm)")
    args = ap.parse_args(argv)
    if not args.folder.is_dir():
        print(f"attnlab.report: error: {args.folder}: no such folder", file=sys.stderr)
        return EXIT_USAGE
    if args.out is not None and args.out.exists() and not args.out.is_dir():
        print(f"attnlab.report: error: --out {args.out}: not a folder", file=sys.stderr)
        return EXIT_USAGE
    notes: list[str] = []
    try:
        keys = [k.strip() for k in args.keys.split(",") if k.strip()] if args.keys else None
        printed = report(args.folder, args.out, plots=not args.no_plots, keys=keys, notes=notes)
    except (FileNotFoundError, ReportInputError) as e:
        print(f"attnlab.report: error: {e}", file=sys.stderr)
        return EXIT_USAGE
    print(printed)
    for note in notes:
        print(f"attnlab.report: note: {note}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
