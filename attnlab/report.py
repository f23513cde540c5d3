"""``python -m attnlab.report <run or sweep folder>``: a markdown table across jobs + PNG plots.

Finds every job folder (one holding status.json) under the given folder, prints one row per job
(backend pair, drafter, precision, page size, k, tau, tok/s, speedup, parity token match, status) and
writes report.md, throughput_tau.png (tok/s and tau per backend pair) and accept_rate_pos.png (acceptance
rate per draft position) into the folder (or --out).
"""

from __future__ import annotations

import argparse
import json
import math
import re
import sys
from collections import defaultdict
from pathlib import Path

COLUMNS = ("job", "draft/verify", "drafter", "precision", "page", "k", "graphs", "tau", "tok/s", "speedup",
           "token match", "status")


def _read_json(path: Path) -> dict:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return {}


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
    """The job's command-line overrides (Hydra's .hydra/overrides.yaml) as {key: value}."""
    path = job / ".hydra" / "overrides.yaml"
    try:
        import yaml

        items = yaml.safe_load(path.read_text()) or []
    except Exception:  # noqa: BLE001 - a missing or broken file only costs the plot labels
        return {}
    return dict(str(o).split("=", 1) for o in items if "=" in str(o))


def load_job(job: Path, root: Path) -> dict:
    return {"dir": job, "name": str(job.relative_to(root)) if job != root else job.name,
            "config": _read_config(job), "metrics": _read_json(job / "metrics.json"),
            "parity": _read_json(job / "parity.json"), "status": _read_json(job / "status.json"),
            "overrides": _read_overrides(job)}


def sweep_labels(jobs: list[dict]) -> list[str]:
    """Per job, the overrides that differ between the jobs (what the sweep varied), e.g. "draft.layers=10";
    the job name where nothing varies."""
    keys = sorted({k for j in jobs for k in j["overrides"]})
    varying = [k for k in keys if len({j["overrides"].get(k) for j in jobs}) > 1]
    return [", ".join(f"{k}={j['overrides'][k]}" for k in varying if k in j["overrides"]) or j["name"]
            for j in jobs]


def _num(x, fmt: str) -> str:
    return "-" if x is None or (isinstance(x, float) and math.isnan(x)) else format(x, fmt)


def job_row(job: dict) -> dict:
    c, m, st = job["config"], job["metrics"], job["status"]
    draft = c.get("draft", {})
    kind = draft.get("kind", "?")
    k = m.get("num_draft_tokens", c.get("spec", {}).get("num_draft_tokens"))
    drafter = {"model": draft.get("name") or "model", "self": f"self{_layers(draft.get('layers'))}"}.get(kind, kind)
    # the draft-side backend only matters when the drafter runs attention
    backend = c.get("backend", {}).get("name", "?") if kind in ("self", "model", "eagle") else "-"
    prec = (f"{m['precision_target']}/{m['precision_draft']}" if "precision_target" in m
            else c.get("precision", {}).get("name", "?"))
    if m.get("precision_kv_target", "").startswith("fp8") or m.get("precision_kv_draft", "").startswith("fp8"):
        prec += f" kv {m.get('precision_kv_target')}/{m.get('precision_kv_draft')}"
    return {
        "job": job["name"],
        "draft/verify": f"{backend}/{c.get('verify', {}).get('name', '?')}",
        "drafter": drafter,
        "precision": prec,
        "page": str(m.get("page_size", c.get("kv", {}).get("page_size", "?"))),
        "k": str(k if k is not None else "?"),
        "graphs": "yes" if m.get("cuda_graphs") or c.get("engine", {}).get("cuda_graph") else "no",
        "tau": _num(m.get("accept_len_mean"), ".2f"),
        "tok/s": _num(m.get("output_tokens_per_s"), ".1f"),
        "speedup": _num(m.get("speedup_vs_target_only"), ".2f"),
        "token match": _num(m.get("parity_token_match"), ".3f"),
        "status": st.get("status", "?") + (f": {st['error']}" if st.get("error") else ""),
    }


def _layers(layers) -> str:
    if layers is None:
        return ""
    return f"[{layers}]" if isinstance(layers, int) else f"[{len(layers)}L]"


def markdown_table(rows: list[dict]) -> str:
    def esc(s: str) -> str:
        return str(s).replace("|", "\\|").replace("\n", " ")

    lines = ["| " + " | ".join(COLUMNS) + " |", "|" + "|".join("---" for _ in COLUMNS) + "|"]
    lines += ["| " + " | ".join(esc(r[c]) for c in COLUMNS) + " |" for r in rows]
    return "\n".join(lines)


def plot(jobs: list[dict], rows: list[dict], out_dir: Path) -> list[Path]:
    """tok/s and tau per backend pair (mean over jobs); acceptance rate per position (one line per job)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    label_of = dict(zip((j["name"] for j in jobs), sweep_labels(jobs)))
    done = [(j, r) for j, r in zip(jobs, rows) if j["metrics"].get("output_tokens_per_s") is not None]
    if not done:
        return []
    paths = []
    by_pair: dict[str, list[dict]] = defaultdict(list)
    for j, r in done:
        graphs = " graphs" if r["graphs"] == "yes" else ""
        by_pair[f"{r['draft/verify']}{graphs}\n{r['drafter']} {r['precision']}"].append(j["metrics"])
    labels = list(by_pair)
    fig, axes = plt.subplots(1, 2, figsize=(max(6, 1.6 * len(labels) + 3), 4))
    for ax, key, title in ((axes[0], "output_tokens_per_s", "output tokens/s"), (axes[1], "accept_len_mean", "tau")):
        vals = [sum(m.get(key) or 0 for m in ms) / len(ms) for ms in by_pair.values()]
        ax.bar(range(len(labels)), vals, color="tab:blue" if key.startswith("output") else "tab:orange")
        ax.set_xticks(range(len(labels)), labels, fontsize=7)
        ax.set_title(title + " per backend pair (draft/verify)")
        ax.grid(axis="y", alpha=0.3)
    fig.tight_layout()
    paths.append(out_dir / "throughput_tau.png")
    fig.savefig(paths[-1], dpi=120)
    plt.close(fig)

    fig, ax = plt.subplots(figsize=(6, 4))
    drawn, last = 0, 0
    for j, r in done:
        m = j["metrics"]
        pos = sorted((int(k[len("accept_rate_pos"):]), v) for k, v in m.items() if k.startswith("accept_rate_pos"))
        if pos:
            ax.plot([p for p, _ in pos], [v for _, v in pos], marker="o", label=label_of[j["name"]])
            drawn, last = drawn + 1, max(last, pos[-1][0])
    if last:
        ax.set_xticks(range(1, last + 1))
    ax.set_xlabel("draft position i")
    ax.set_ylabel("fraction of verify passes accepting draft token i")
    ax.set_ylim(0, 1.05)
    ax.grid(alpha=0.3)
    if drawn:
        ax.legend(fontsize=7)
    fig.tight_layout()
    paths.append(out_dir / "accept_rate_pos.png")
    fig.savefig(paths[-1], dpi=120)
    plt.close(fig)
    return paths


def report(root: Path, out_dir: Path | None = None, plots: bool = True) -> str:
    root = Path(root)
    jobs = [load_job(j, root) for j in find_jobs(root)]
    if not jobs:
        raise FileNotFoundError(f"no attnlab job folders (with status.json) under {root}")
    rows = [job_row(j) for j in jobs]
    table = markdown_table(rows)
    out_dir = Path(out_dir or root)
    out_dir.mkdir(parents=True, exist_ok=True)
    text = f"# attnlab report: {root}\n\n{table}\n"
    if plots:
        for p in plot(jobs, rows, out_dir):
            text += f"\n![{p.stem}]({p.name})\n"
    (out_dir / "report.md").write_text(text)
    return table


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m attnlab.report", description=__doc__.splitlines()[0])
    ap.add_argument("folder", type=Path, help="a run folder or a sweep folder")
    ap.add_argument("--out", type=Path, default=None, help="where report.md and the PNGs go (default: folder)")
    ap.add_argument("--no-plots", action="store_true")
    args = ap.parse_args(argv)
    if not args.folder.is_dir():
        print(f"attnlab.report: error: {args.folder}: no such folder", file=sys.stderr)
        return 2
    try:
        print(report(args.folder, args.out, plots=not args.no_plots))
    except FileNotFoundError as e:
        print(f"attnlab.report: error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
