"""The pure parts of issue 15's checks: unknown-key detection and suggestions, KV pool bytes against free
memory, the page-size clamp, the sweep summary."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from attnlab.compose import CONF_DIR, compose
from attnlab.errors import ConfigError
from attnlab.keys import check_keys, suggest, unknown_keys
from attnlab.kvcache import budget
from attnlab.kvcache.pool import KVPool

GROUPS = ("model", "draft", "backend", "verify", "precision", "kv", "warmup", "spec", "workload", "logger",
          "parity", "experiment")


@pytest.mark.parametrize("key,hint", [
    ("kv.pagesize", "did you mean kv.page_size?"),
    ("kvv.page_size", "did you mean kv.page_size?"),
    ("page_size", "did you mean kv.page_size?"),  # the right name in the wrong place
    ("spec.k", "did you mean spec.num_draft_tokens?"),  # not topk: the paper's name for k
    ("workload.feild", "did you mean workload.field?"),
    ("kv.zzz", "valid keys of kv: layout, page_size"),
])
def test_suggest_names_the_closest_valid_key(key, hint):
    assert hint in suggest(key)


def test_unknown_keys_are_found_where_plus_put_them():
    cfg = compose(["model=tiny-llama", "+kv.pagesize=4", "+foo=1", "+verify.options.x=1",
                   "+model.overrides.num_layers=1", "+draft.overrides.anything=2"])
    # overrides and backend options are free-form here: ModelConfig and the backend's OPTIONS check them later
    assert sorted(unknown_keys(cfg)) == ["foo", "kv.pagesize"]
    with pytest.raises(ConfigError, match=r"unknown key.*\(and 1 more: "):
        check_keys(cfg)


@pytest.mark.parametrize("group,option", [(g, p.stem) for g in GROUPS for p in sorted((CONF_DIR / g).glob("*.yaml"))])
def test_every_shipped_config_has_only_known_keys(group, option):
    assert unknown_keys(compose([f"{group}={option}"])) == []


def test_hydra_typo_error_suggests_the_key_not_the_plus():
    from attnlab.cli import one_line

    with pytest.raises(Exception) as e:
        compose(["kv.pagesize=4"])
    assert one_line(e.value) == "kv.pagesize: unknown key (did you mean kv.page_size?)"


def test_pool_bytes_is_the_pool_tensor_size():
    pool = KVPool(3, 5, 4, 2, 8, torch.bfloat16, "cpu")
    assert budget.pool_bytes(3, 5, 4, 2, 8, torch.bfloat16) == pool.kv.numel() * pool.kv.element_size()


def test_a_pool_larger_than_free_memory_is_refused_before_allocation(monkeypatch):
    monkeypatch.setattr(budget, "free_bytes", lambda device: 10 * 2**30)
    with pytest.raises(ConfigError, match=r"would take 1\.5 TiB, but only 10\.0 GiB is free on cpu"):
        KVPool(2, 100_000_000, 16, 2, 32, torch.float32, "cpu")  # 1.5 TiB: torch.zeros never runs


def test_free_bytes_on_cpu_is_positive():
    free = budget.free_bytes("cpu")
    assert free is None or free > 0


def test_page_size_is_clamped_to_the_max_context_at_the_backends_step(monkeypatch):
    from types import SimpleNamespace

    from attnlab import preflight

    cfg = SimpleNamespace(verify="fa", verify_options={}, backend="torch", backend_options={},
                          draft=SimpleNamespace(runs_attention=False))  # the RunPlan fields page_size reads
    monkeypatch.setattr(preflight, "_granule", lambda name, options, field: 256 if name == "fa" else 1)  # FA2: 256·n
    assert preflight.page_size(cfg, 1024, 300) == 512
    assert preflight.page_size(cfg, 256, 300) == 256  # not larger than needed: kept
    monkeypatch.setattr(preflight, "_granule", lambda name, options, field: 1)
    assert preflight.page_size(cfg, 100_000_000, 300) == 300
    assert preflight.page_size(cfg, 16, 300) == 16


def _job(folder: Path, name: str, status: str, error: str | None = None):
    (folder / name).mkdir(parents=True)
    (folder / name / "status.json").write_text(json.dumps({"status": status, "error": error}))


def test_sweep_summary_counts_and_interrupted_wording(tmp_path):
    from attnlab.sweep import count_jobs, summary_line

    _job(tmp_path, "0", "complete")
    _job(tmp_path, "1", "failed", "verify=fa runs on CUDA GPUs only")
    _job(tmp_path, "2", "running")
    line, done, failed = summary_line(tmp_path)  # a finished sweep: a job left "running" crashed
    assert (done, failed) == (1, 2) and line.startswith("attnlab sweep: 3 jobs, 1 complete, 2 failed (1: verify=fa")
    line, done, failed = summary_line(tmp_path, planned=5, interrupted="SIGTERM")
    assert line.startswith("attnlab sweep: interrupted by SIGTERM after 3 of 5 jobs: 1 complete, 1 failed, "
                           "1 interrupted, 2 not started")
    assert count_jobs(["verify=torch,triton", "kv.page_size=1,16,64", "device=cpu"]) == 6


class _Job:
    """What record_interrupt reads of a SpecJob."""

    def __init__(self, n_prompts: int):
        from attnlab.lifecycle import Progress
        from attnlab.workloads import Prompt

        self.prompts = [Prompt(f"p{i}", "test", f"prompt {i}", token_ids=[1, 2, 3]) for i in range(n_prompts)]
        self.progress, self.page_size, self.metrics = Progress(), 4, {"warmup_jit_s": 0.5}

    def decode_text(self, ids):
        return " ".join(map(str, ids))

    def finish_batch(self, i: int):
        from attnlab.spec.records import GenerateOutput, IterRecord, RequestOutput

        req = RequestOutput([1, 2, 3], [7, 8, 9], [2, 1], "length", 1.0, 3.0, [1.0, 2.0, 3.0])
        it = IterRecord(1, 2, [2], 0.1, 0.2, 0.0, 0.0, 0.3)
        self.progress.add(self.prompts[i:i + 1], GenerateOutput([req], [it, it], 0.1, 0.5, 2), planned=3)


@pytest.mark.parametrize("exc,name", [("KeyboardInterrupt", "SIGINT"), ("Terminated", "SIGTERM")])
def test_record_interrupt_keeps_the_finished_batches(tmp_path, exc, name):
    from attnlab import lifecycle
    from attnlab.metrics.outputs import StatusFile

    job = _Job(3)
    job.finish_batch(0)
    error = lifecycle.Terminated() if exc == "Terminated" else KeyboardInterrupt()
    msg = lifecycle.record_interrupt(error, tmp_path, StatusFile(tmp_path), job)
    assert msg.startswith(f"interrupted by {name}: 1 of 3 requests finished")
    assert lifecycle.exit_code(error) == (143 if name == "SIGTERM" else 130)
    rows = [json.loads(ln) for ln in (tmp_path / "requests.jsonl").read_text().splitlines()]
    assert [r["id"] for r in rows] == ["p0"] and rows[0]["output_token_ids"] == [7, 8, 9]
    m = json.loads((tmp_path / "metrics.json").read_text())
    assert m["partial"] is True and m["interrupted_by"] == name and m["num_requests"] == 1
    assert m["requests_completed"] == 1 and m["requests_planned"] == 3 and m["warmup_jit_s"] == 0.5
    status = json.loads((tmp_path / "status.json").read_text())
    assert status["status"] == "interrupted" and status["error"] == f"by {name}; 1 of 3 requests finished"


def test_record_interrupt_after_the_files_were_written_keeps_them(tmp_path):
    from attnlab import lifecycle
    from attnlab.metrics.outputs import StatusFile

    job = _Job(1)
    job.finish_batch(0)
    (tmp_path / "metrics.json").write_text('{"output_tokens_per_s": 5.0, "parity_token_match": 1.0}')
    (tmp_path / "requests.jsonl").write_text('{"id": "p0", "first_divergence_vs_target_only": null}\n')
    job.progress.files_written = True
    lifecycle.record_interrupt(KeyboardInterrupt(), tmp_path, StatusFile(tmp_path), job)
    assert json.loads((tmp_path / "metrics.json").read_text()) == {"output_tokens_per_s": 5.0,
                                                                   "parity_token_match": 1.0}
    assert "first_divergence" in (tmp_path / "requests.jsonl").read_text()
    assert json.loads((tmp_path / "status.json").read_text())["status"] == "interrupted"


def test_a_run_without_a_job_records_the_interrupt(tmp_path):
    from attnlab import lifecycle
    from attnlab.metrics.outputs import StatusFile

    msg = lifecycle.record_interrupt(lifecycle.Terminated(), tmp_path, StatusFile(tmp_path), None)
    assert msg.startswith("interrupted by SIGTERM: 0 requests finished")
    assert (tmp_path / "requests.jsonl").read_text() == ""
    assert json.loads((tmp_path / "metrics.json").read_text())["requests_completed"] == 0
