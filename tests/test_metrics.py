"""Perf summary, parity levels, env info, loggers and the report, on hand-made records (no model)."""

from __future__ import annotations

import json
import math
import sys
from types import SimpleNamespace

import pytest
import torch

from attnlab.backends.cases import random_paged_case
from attnlab.metrics.env import env_info
from attnlab.metrics.kernel_parity import kernel_parity
from attnlab.metrics.loggers import JsonlLogger, flatten, wandb_credentials
from attnlab.metrics.outputs import StatusFile, request_rows, write_json
from attnlab.metrics.parity import acceptance_parity, first_divergence, logits_parity, token_parity
from attnlab.metrics.perf import accept_rates, kv_waste_frac, merge_outputs, percentile, summarize


def _req(prompt_len, out, taus, ttft, latency):
    return SimpleNamespace(prompt_ids=[1] * prompt_len, output_ids=list(out), accept_lens=list(taus),
                           finish_reason="length", ttft_ms=ttft, latency_ms=latency,
                           token_times_ms=[ttft] * len(out), logits=None)


def _it(taus, d, v, a, o):
    return SimpleNamespace(batch_size=len(taus), num_draft_tokens=2, accept_lens=taus, draft_ms=d, verify_ms=v,
                           accept_ms=a, other_ms=o, total_ms=d + v + a + o)


def _out():
    reqs = [_req(10, [5, 6, 7, 8, 9], [3, 1], 100.0, 180.0), _req(4, [1, 2, 3], [2], 50.0, 90.0)]
    its = [_it([3, 2], 1.0, 4.0, 0.5, 0.5), _it([1], 3.0, 6.0, 0.5, 1.5)]
    return SimpleNamespace(requests=reqs, iterations=its, wall_s=0.5, prefill_ms=10.0, num_draft_tokens=2)


def test_percentile_matches_numpy():
    import numpy as np

    xs = [3.0, 1.0, 7.0, 4.0, 10.0]
    for q in (50, 90, 99):
        assert percentile(xs, q) == pytest.approx(np.percentile(xs, q))
    assert math.isnan(percentile([], 50))


def test_summarize():
    m = summarize(_out(), page_size=4)
    assert m["output_tokens"] == 8 and m["output_tokens_per_s"] == pytest.approx(16.0)
    assert m["accept_len_mean"] == pytest.approx(2.0)
    # taus 3, 1, 2 with k = 2: pos1 accepted in 2 of 3 passes, pos2 in 1 of 3
    assert m["accept_rate_pos1"] == pytest.approx(2 / 3) and m["accept_rate_pos2"] == pytest.approx(1 / 3)
    assert m["accept_len_mean"] == pytest.approx(1 + m["accept_rate_pos1"] + m["accept_rate_pos2"])
    assert m["draft_ms"] == 2.0 and m["verify_ms"] == 5.0 and m["accept_ms"] == 0.5 and m["overhead_ms"] == 1.0
    assert m["ttft_ms_p50"] == pytest.approx(75.0)
    assert m["tpot_ms_p50"] == pytest.approx((20.0 + 20.0) / 2)  # (180-100)/4, (90-50)/2
    assert m["kv_waste_frac"] == pytest.approx(kv_waste_frac([15, 7], 4))


def test_kv_waste_and_accept_rates():
    assert kv_waste_frac([4, 8], 4) == 0.0
    assert kv_waste_frac([1], 16) == pytest.approx(15 / 16)
    assert accept_rates([1, 1], 3) == {"accept_rate_pos1": 0.0, "accept_rate_pos2": 0.0, "accept_rate_pos3": 0.0}
    assert accept_rates([], 3) == {}


def test_accept_rate_divides_by_the_passes_that_drafted_the_position():
    """Near max context k shrinks: a pass with k = 1 says nothing about positions 2..4 (today's code counts it
    as a rejection there: pos2 = 2/3 here)."""
    from attnlab.metrics.perf import accept_rates_by_pass

    its = [_it([5, 3], 1, 1, 1, 1), _it([2], 1, 1, 1, 1)]
    its[0].num_draft_tokens, its[1].num_draft_tokens = 4, 1
    reqs = [_req(4, range(7), [5, 2], 1.0, 2.0), _req(4, range(3), [3], 1.0, 2.0)]
    out = SimpleNamespace(requests=reqs, iterations=its, wall_s=1.0, num_draft_tokens=4)
    m = summarize(out)
    assert m["accept_rate_pos1"] == 1.0  # all three passes accepted position 1
    assert m["accept_rate_pos2"] == 1.0 and m["accept_rate_pos3"] == 0.5 and m["accept_rate_pos4"] == 0.5
    assert accept_rates_by_pass([(4, 5), (4, 3), (1, 2)]) == {k: m[k] for k in m if k.startswith("accept_rate")}
    assert accept_rates_by_pass([]) == {}


def test_merge_outputs_adds_wall_time():
    merged = merge_outputs([_out(), _out()])
    assert len(merged.requests) == 4 and len(merged.iterations) == 4 and merged.wall_s == 1.0


def test_token_parity():
    assert first_divergence([1, 2, 3], [1, 2, 3]) is None
    assert first_divergence([1, 2, 3], [1, 5, 3]) == 1
    assert first_divergence([1, 2], [1, 2, 3]) == 2
    t = token_parity([[1, 2, 3], [4, 5]], [[1, 2, 3], [4, 6]])
    assert t["match_rate"] == pytest.approx(4 / 5) and t["exact_frac"] == 0.5
    assert t["first_divergence"] == [None, 1] and t["first_divergence_min"] == 1


def test_logits_parity_stops_after_divergence():
    torch.manual_seed(0)
    ref = [torch.randn(4, 10)]
    same = logits_parity(ref, [ref[0].clone()], [[1, 2, 3, 4]], [[1, 2, 3, 4]])
    assert same["max_abs_err"] == 0 and same["mean_kl"] == pytest.approx(0, abs=1e-7)
    assert same["top1_agree"] == 1 and same["positions"] == 4
    noisy = ref[0].clone()
    noisy[3] += 100.0  # after the divergence at index 1: must be ignored
    noisy[0, 0] += 0.5
    p = logits_parity([noisy], ref, [[1, 9, 3, 4]], [[1, 2, 3, 4]])
    assert p["positions"] == 2 and p["max_abs_err"] == pytest.approx(0.5) and p["mean_kl"] > 0


def test_acceptance_parity():
    a = acceptance_parity({"accept_len_mean": 2.5, "accept_rate_pos1": 0.8},
                          {"accept_len_mean": 3.0, "accept_rate_pos1": 0.9})
    assert a["accept_len_delta"] == pytest.approx(-0.5) and a["accept_rate_pos1_delta"] == pytest.approx(-0.1)


def test_kernel_parity_torch_vs_itself_is_exact():
    from attnlab.backends.base import Mode
    from attnlab.backends.torch_ref import TorchBackend

    res = kernel_parity(TorchBackend, num_q_heads=4, num_kv_heads=2, head_dim=32, dtype="fp32", kv_dtype="fp32",
                        page_size=4, device="cpu", prompt_len=11, k=3, batch=2)
    assert set(res) == {"prefill", "decode", "verify"}
    assert all(r["max_abs_err"] == 0 for r in res.values())
    pool, meta, q = random_paged_case(kv_lens=[9, 5], q_lens=[4, 1], page_size=4, num_q_heads=4, num_kv_heads=2,
                                      head_dim=32, dtype=torch.float32, mode=Mode.VERIFY)
    assert q.shape == (5, 4, 32) and meta.kv_lens_host == [9, 5] and pool.num_pages >= 5


def test_kernel_parity_bf16_has_small_error():
    from attnlab.backends.torch_ref import TorchBackend

    res = kernel_parity(TorchBackend, num_q_heads=2, num_kv_heads=2, head_dim=32, dtype="bf16", kv_dtype="bf16",
                        page_size=16, device="cpu", prompt_len=20, k=2, batch=1)
    assert all(0 <= r["max_rel_err"] < 0.05 for r in res.values())


def test_gpu_clocks_from_nvidia_smi(monkeypatch):
    """GPU clocks come from nvidia-smi when present (parsed per GPU), else null."""
    import subprocess

    from attnlab.metrics import env

    out = "0, NVIDIA H200, 1980, 2619, 1980, 2619, 0x0000000000000000, 120.5, 700.00, 35, 0, P0\n"
    monkeypatch.setattr(env.subprocess, "run", lambda *a, **k: subprocess.CompletedProcess(a, 0, out, ""))
    clocks = env.gpu_clocks()
    assert clocks == [{"index": 0, "name": "NVIDIA H200", "clocks.sm": 1980, "clocks.mem": 2619,
                       "clocks.max.sm": 1980, "clocks.max.mem": 2619,
                       "clocks_throttle_reasons.active": "0x0000000000000000", "power.draw": 120.5,
                       "power.limit": 700.0, "temperature.gpu": 35, "utilization.gpu": 0, "pstate": "P0"}]

    def missing(*a, **k):
        raise FileNotFoundError("nvidia-smi")

    monkeypatch.setattr(env.subprocess, "run", missing)
    assert env.gpu_clocks() is None


def test_env_info():
    env = env_info()
    for key in ("git_sha", "git_dirty", "command", "packages", "cpu", "gpu_name", "cuda", "driver", "python",
                "load_avg", "gpu_clocks"):
        assert key in env
    assert len(env["load_avg"]) == 3 and all(x >= 0 for x in env["load_avg"])
    for pkg in ("torch", "triton", "flashinfer-python", "flash-attn", "transformers", "hydra-core"):
        assert pkg in env["packages"]
    json.dumps(env)


def test_outputs_and_jsonl_logger(tmp_path):
    st = StatusFile(tmp_path)
    assert json.loads((tmp_path / "status.json").read_text())["status"] == "running"
    st.finish("failed", error="boom")
    s = json.loads((tmp_path / "status.json").read_text())
    assert s["status"] == "failed" and s["error"] == "boom" and s["duration_s"] >= 0
    write_json(tmp_path / "m.json", {"a": float("nan"), "b": torch.tensor(2.0)})
    assert json.loads((tmp_path / "m.json").read_text()) == {"a": None, "b": 2.0}
    out = _out()
    prompts = [SimpleNamespace(id="p0", category="c", text="t0"), SimpleNamespace(id="p1", category="c", text="t1")]
    rows = request_rows(prompts, out.requests, lambda ids: " ".join(map(str, ids)), [{"x": 1}])
    assert rows[0]["output_text"] == "5 6 7 8 9" and rows[0]["x"] == 1 and rows[1]["accept_len_mean"] == 2
    log = JsonlLogger(tmp_path, {"seed": 0})
    log.log_metrics({"tok": 1.0})
    log.finish("complete")
    events = [json.loads(line)["event"] for line in (tmp_path / "events.jsonl").read_text().splitlines()]
    assert events == ["config", "metrics", "finish"]
    assert flatten({"a": {"b": 1}, "c": 2}) == {"a/b": 1, "c": 2}


def test_wandb_credentials_are_found_where_wandb_looks(tmp_path, monkeypatch):
    """logger.mode=online's key check (config validation) reads what wandb.init would, without importing wandb:
    WANDB_API_KEY, then a netrc entry for the W&B host (WANDB_BASE_URL, else the settings file's base_url, else
    api.wandb.ai), then an api_key in wandb's settings file."""
    monkeypatch.setitem(sys.modules, "wandb", None)  # an import of wandb would raise
    for var in ("WANDB_API_KEY", "WANDB_IDENTITY_TOKEN_FILE", "WANDB_BASE_URL"):
        monkeypatch.delenv(var, raising=False)
    netrc, settings = tmp_path / "netrc", tmp_path / "wandb" / "settings"
    monkeypatch.setenv("NETRC", str(netrc))
    monkeypatch.setenv("WANDB_CONFIG_DIR", str(settings.parent))
    assert wandb_credentials() is None  # no netrc file, no settings file
    netrc.write_text("machine wandb.example.com\n  login user\n  password k1\n")
    assert wandb_credentials() is None  # an entry for another host
    netrc.write_text(netrc.read_text() + "machine api.wandb.ai login user password k2\n")
    assert wandb_credentials() == str(netrc)
    netrc.write_text("machine wandb.example.com\n  login user\n  password k1\n")
    monkeypatch.setenv("WANDB_BASE_URL", "https://wandb.example.com")
    assert wandb_credentials() == str(netrc)
    monkeypatch.delenv("WANDB_BASE_URL")
    settings.parent.mkdir()
    settings.write_text("[default]\nbase_url = https://wandb.example.com\n")
    assert wandb_credentials() == str(netrc)
    netrc.unlink()
    assert wandb_credentials() is None
    settings.write_text("[default]\napi_key = k3\n")
    assert wandb_credentials() == "wandb settings"
    monkeypatch.setenv("WANDB_API_KEY", "k4")
    assert wandb_credentials() == "WANDB_API_KEY"


def _fake_job(root, name, status, verify, tps=None, tau=None):
    d = root / name
    (d / ".hydra").mkdir(parents=True)
    (d / ".hydra" / "config.yaml").write_text(
        f"draft: {{kind: ngram}}\nbackend: {{name: torch}}\nverify: {{name: {verify}}}\n"
        f"kv: {{page_size: 16}}\nspec: {{num_draft_tokens: 3}}\nprecision: {{name: fp32}}\n")
    (d / "status.json").write_text(json.dumps({"status": status, "error": None if status == "complete" else "x"}))
    if tps is not None:
        write_json(d / "metrics.json", {"output_tokens_per_s": tps, "accept_len_mean": tau, "num_draft_tokens": 3,
                                        "accept_rate_pos1": 0.7, "accept_rate_pos2": 0.4, "accept_rate_pos3": 0.1,
                                        "speedup_vs_target_only": 1.5, "parity_token_match": 1.0, "page_size": 16,
                                        "precision_target": "fp32", "precision_draft": "fp32"})


def test_report(tmp_path):
    from attnlab.report import main, report

    _fake_job(tmp_path, "0", "complete", "torch", 100.0, 2.5)
    _fake_job(tmp_path, "1", "failed", "flashinfer")
    _fake_job(tmp_path, "10", "complete", "triton", 150.0, 2.4)
    table = report(tmp_path).splitlines()
    assert len(table) == 5 and [ln.split("|")[1].strip() for ln in table[2:]] == ["0", "1", "10"]
    assert "| -/torch | ngram | fp32/fp32 | 16 | 3 | no | - | 2.50 | 100.0 | - | - | 1.50 | - |" in table[2]
    assert "failed: x" in table[3]
    for png in ("throughput_tau.png", "accept_rate_pos.png"):
        assert (tmp_path / png).read_bytes()[:4] == b"\x89PNG"
    assert "![throughput_tau]" in (tmp_path / "report.md").read_text()
    assert main([str(tmp_path / "nope")]) == 2


def test_phase_timer_host_time_and_its_metrics():
    from attnlab.engine.timers import PhaseTimer

    clock = iter([0.0, 0.001, 0.004, 0.0045])  # one reading per mark on CPU
    t = PhaseTimer(torch.device("cpu"), clock=lambda: next(clock))
    t.mark("draft")
    t.mark("verify")
    t.mark("draft")  # a phase marked twice adds up
    t.stop()
    assert t.host() == pytest.approx({"draft": 1.5, "verify": 3.0}) and t.read() == pytest.approx(t.host())
    out = _out()
    out.iterations[0].host_ms = {"draft": 0.5, "verify": 1.0, "sync": 3.0, "other": 0.25}
    out.iterations[0].sync_ms = 0.5
    m = summarize(out)
    assert m["draft_host_ms"] == pytest.approx(0.25) and m["verify_host_ms"] == pytest.approx(0.5)
    assert m["overhead_host_ms"] == pytest.approx(0.125) and m["draft_extend_host_ms"] == 0.0
    assert m["sync_host_ms"] == pytest.approx(1.5) and m["sync_ms"] == pytest.approx(0.25)
