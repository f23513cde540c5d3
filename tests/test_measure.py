"""Measurement (issue 14): timed runs record nothing and measure only decoding, warmup leaves no trace in the
workload's metrics, repeats give a spread, cold is what metrics.json says it is, parity is never
self-compared. In-process on the tiny random model (CPU, a few seconds each)."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pytest

from attnlab.config import validate
from attnlab.measure import measure
from attnlab.parity_pass import reference_logits, run_parity
from attnlab.prepare import prepare
from attnlab.sides import build_pair, decode
from attnlab.spec.decoder import SpeculativeDecoder
from tests.test_config import _compose

TINY = ("model=tiny-llama", "device=cpu", "logger=none", "workload=synthetic", "workload.lengths=[12,20]",
        "workload.num_prompts=4", "workload.batch_size=2", "workload.max_new_tokens=8")


def _job(*overrides):
    plan = validate(_compose(*TINY, *overrides))
    work = prepare(plan)
    return plan, work, build_pair(plan, work, plan.verify, plan.backend)


def _runs(kinds) -> list[str]:
    """Consecutive generate calls of one drafter kind are one run (one call per batch)."""
    from itertools import groupby

    return [k for k, _ in groupby(kinds)]


@pytest.fixture
def generate_calls(monkeypatch):
    """Every SpeculativeDecoder.generate call: (phase, drafter kind, record_logits); set calls.phase."""

    class Calls(list):
        phase = "setup"

    calls = Calls()
    real = SpeculativeDecoder.generate

    def spy(self, prompts, max_new_tokens, eos_ids=frozenset(), record_logits=False, progress=None):
        calls.append((calls.phase, self.drafter.kind, record_logits))
        return real(self, prompts, max_new_tokens, eos_ids, record_logits, progress)

    monkeypatch.setattr(SpeculativeDecoder, "generate", spy)
    return calls


def test_timed_runs_record_no_logits(generate_calls):
    """parity.logits on (the default) and a logits pass that has something to compare (bf16 run vs fp32
    reference): the timed spec and target-only runs record nothing; the untimed parity pass does."""
    plan, work, pair = _job("precision=bf16", "parity.reference_precision=fp32", "bench.repeats=2")
    assert plan.parity.logits
    generate_calls.phase = "measure"
    measured = measure(plan, work, pair)
    timed = [c for c in generate_calls if c[0] == "measure"]
    assert _runs(kind for _, kind, _ in timed) == ["ngram", "none", "ngram", "none"]  # spec, target-only, ...
    assert not any(rec for _, _, rec in timed)
    assert all(r.logits is None for out in measured.spec + measured.base for r in out.requests)
    generate_calls.phase = "parity"
    parity, m, _ = run_parity(plan, work, pair, measured.spec[0], measured.base[0])
    assert any(rec for phase, _, rec in generate_calls if phase == "parity")
    assert parity["logits"]["positions"] == sum(len(r.output_ids) for r in measured.spec[0].requests)
    assert m["parity_logits_top1_agree"] > 0.9
    docs = _docs()
    assert all(_documented(k, docs) for k in {**measured.metrics, **m}), "document every metrics.json key"


def test_pages_and_max_context_do_not_depend_on_warmup():
    """A warmup prompt far longer than the workload's (200 vs 12-20 tokens) neither raises max_context nor
    leaves its pages in kv_pages_used_max (on today's code: max_context 213 and the warmup's pages)."""
    base = measure(*_job()).metrics
    warm = measure(*_job("warmup=jit", "warmup.lengths=[200]", "warmup.max_new_tokens=4")).metrics
    assert warm["max_context"] == base["max_context"] == 20 + 8 + 4 + 1
    assert warm["kv_pages_used_max"] == base["kv_pages_used_max"]
    assert warm["warmup_lengths"][0] < 200 and "warmup_jit_s" in warm


def test_warmup_also_warms_the_target_only_path(generate_calls):
    """The baseline runs under the spec run's conditions: the warmup plan goes through both paths."""
    plan, work, pair = _job("warmup=jit", "warmup.lengths=[8]", "warmup.max_new_tokens=2")
    generate_calls.phase = "measure"
    measure(plan, work, pair)
    runs = _runs(kind for _, kind, _ in generate_calls)
    assert runs[:2] == ["ngram", "none"]  # warmup: spec and target-only, before any timed run
    assert runs[2:] == ["ngram", "none", "ngram"]  # timed spec, timed target-only, warm re-run (repeats=1)


def test_repeats_give_median_min_max_and_cold_warm_from_the_same_kind_of_run():
    plan, work, pair = _job("bench.repeats=3")
    measured = measure(plan, work, pair)
    m = measured.metrics
    assert m["bench_repeats"] == 3 and len(measured.spec) == len(measured.base) == 3
    for key in ("output_tokens_per_s", "iteration_ms", "target_only_tokens_per_s", "speedup_vs_target_only"):
        vals = m[f"{key}_repeats"]
        assert len(vals) == 3 and m[key] == sorted(vals)[1]
        assert (m[f"{key}_min"], m[f"{key}_max"]) == (min(vals), max(vals))
        assert m[f"{key}_spread"] == pytest.approx(max(vals) / min(vals))
    tps = [len(r.output_ids) for r in measured.spec[0].requests]
    assert m["speedup_vs_target_only_repeats"][0] == pytest.approx(
        (sum(tps) / measured.spec[0].wall_s) / (sum(len(r.output_ids) for r in measured.base[0].requests)
                                                / measured.base[0].wall_s))
    assert isinstance(m["noisy"], bool) and m["noisy"] == bool(m["noisy_keys"])
    # cold: the first timed request; warm: the first request of the second timed spec run (same kind of run)
    assert m["first_request_ms_cold"] == measured.spec[0].requests[0].latency_ms
    assert m["first_request_ms_warm"] == measured.spec[1].requests[0].latency_ms
    assert m["cold_start"] in ("first_job_in_process", "after_jobs_in_process")


def test_noisy_flag_and_warning():
    from attnlab.metrics.repeats import repeat_metrics

    def run(tps, it=10.0):
        return {"output_tokens_per_s": tps, "iteration_ms": it, "accept_len_mean": 2.0}

    quiet = repeat_metrics([run(100), run(104), run(102)], [run(50), run(51), run(50)], 1.1)
    assert quiet["noisy"] is False and quiet["output_tokens_per_s"] == 102 and quiet["speedup_vs_target_only"] > 1.9
    loud = repeat_metrics([run(100), run(130)], [run(50), run(50)], 1.1)
    assert loud["noisy"] is True and "output_tokens_per_s" in loud["noisy_keys"]
    assert loud["output_tokens_per_s"] == 115 and loud["output_tokens_per_s_spread"] == pytest.approx(1.3)
    single = repeat_metrics([run(100)], [run(50)], 1.1)
    assert single["noisy"] is None and single["output_tokens_per_s_spread"] is None


def test_cold_kind_is_recorded_and_a_second_job_is_not_cold():
    from attnlab import measure as meas

    meas._JOBS_MEASURED[0] = 0
    first = measure(*_job()).metrics
    second = measure(*_job()).metrics
    assert (first["cold_start"], first["jobs_before_in_process"]) == ("first_job_in_process", 0)
    assert (second["cold_start"], second["jobs_before_in_process"]) == ("after_jobs_in_process", 1)


def test_draft_none_parity_is_not_self_compared():
    """draft=none: the run is target-only decoding. Today's code compared it with itself (always 1.0)."""
    plan, work, pair = _job("draft=none")
    measured = measure(plan, work, pair)
    assert measured.base == [] and "speedup_vs_target_only" not in measured.metrics
    parity, m, rows = run_parity(plan, work, pair, measured.spec[0], None)
    assert "match_rate" not in parity["tokens"]["vs_target_only"] and "note" in parity["tokens"]["vs_target_only"]
    assert "match_rate" not in parity["tokens"]["vs_reference"]  # torch fp32 is the reference: also itself
    assert m["parity_token_match"] is None and "first_divergence_vs_target_only" not in rows[0]
    # a reference that is not the run itself is compared
    plan, work, pair = _job("draft=none", "precision=bf16", "parity.reference_precision=fp32")
    measured = measure(plan, work, pair)
    parity, m, _ = run_parity(plan, work, pair, measured.spec[0], None)
    assert parity["tokens"]["vs_reference"]["num_requests"] == 4 and m["parity_token_match_ref"] is not None


def test_teacher_forced_reference_logits_equal_the_decoded_ones():
    """The logits level's reference: one prefill of prompt + output gives the logits target-only decoding
    computes step by step (fp32, same backend)."""
    import torch

    plan, work, pair = _job("draft=none")
    out = decode(pair, plan, work, list(work.prompts), record_logits=True)
    prompts = [p.token_ids for p in work.prompts]
    ref = reference_logits(pair.target, prompts, [r.output_ids for r in out.requests], plan.workload.batch_size)
    for r, x in zip(out.requests, ref):
        assert x.shape == r.logits.shape
        torch.testing.assert_close(x, r.logits, atol=2e-4, rtol=1e-4)  # fp32: prefill vs decode rounding
    assert pair.target.allocator.num_used == 0  # the teacher-forced requests were released


def test_metrics_name_what_was_measured_and_every_key_is_documented():
    plan, work, pair = _job("draft=self", "draft.layers=1", "bench.repeats=2", "parity.acceptance=true")
    measured = measure(plan, work, pair)
    m = dict(measured.metrics)
    m.update(run_parity(plan, work, pair, measured.spec[0], measured.base[0])[1])
    assert (m["backend_pair"], m["drafter"], m["num_draft_tokens"], m["topk"]) == ("torch/torch", "self[1L]", 4, 1)
    assert m["precision_target"] == "fp32" and m["cold_start"] and m["bench_repeats"] == 2
    docs = _docs()
    missing = [k for k in m if not _documented(k, docs)]
    assert not missing, f"metrics.json keys missing from docs/usage.md: {missing}"


def _docs() -> str:
    return (Path(__file__).resolve().parents[1] / "docs" / "usage.md").read_text()


def _documented(key: str, docs: str) -> bool:
    """The key in backticks, or its family: accept_rate_pos{i}, ttft_ms_p{50,90,99}, <key>_{min,max,...}."""
    forms = {key, re.sub(r"pos\d+$", "pos{i}", key), re.sub(r"_p(50|90|99)$", "_p{50,90,99}", key),
             re.sub(r"_(target|draft)$", "_{side}", key)}
    for suffix in ("_min", "_max", "_spread", "_repeats"):
        if key.endswith(suffix):
            forms.add(key[: -len(suffix)] + "_{min,max,spread,repeats}")
    return any(f"`{f}`" in docs for f in forms)


@pytest.mark.parametrize("cold", ["empty_caches"])
def test_cold_start_in_a_fresh_process(cold, tmp_path):
    """bench.cold=empty_caches: the first batch runs in a child process with empty JIT cache folders."""
    from attnlab.coldstart import CACHE_ENV, cold_start
    from attnlab.config import to_container

    cfg = _compose(*TINY, f"bench.cold={cold}")
    r = cold_start(to_container(cfg), empty_caches=True, timeout_s=300)
    assert r["pid"] != os.getpid() and r["first_request_ms"] > 0 and r["spawn_to_first_request_s"] > 0
    assert set(r["caches_empty_at_start"]) == set(CACHE_ENV) and all(r["caches_empty_at_start"].values())
    plan, work, pair = _job(f"bench.cold={cold}")
    m = measure(plan, work, pair, cold=r).metrics
    assert m["cold_start"] == "fresh_process_empty_caches" and m["first_request_ms_cold"] == r["first_request_ms"]
    assert m["first_request_ms_in_process"] != m["first_request_ms_cold"] and m["cold_pid"] == r["pid"]
    json.dumps(m)
    docs = _docs()
    assert all(_documented(k, docs) for k in m), [k for k in m if not _documented(k, docs)]


def test_a_serving_job_measures_through_the_engine_and_documents_its_keys():
    """workload.arrival=poisson: measure() hands over to measure_serving (warmup, spec run, target-only run,
    same arrival schedule), leaves the warmup requests out, and returns the KV timeline for events.jsonl."""
    plan, work, pair = _job("workload.arrival=poisson", "workload.rate=50", "workload.warmup_requests=1",
                            "bench.repeats=2")
    measured = measure(plan, work, pair)
    m = measured.metrics
    assert m["arrival"] == "poisson" and m["measured_requests"] == plan.workload.num_prompts - 1
    assert len(measured.spec) == len(measured.base) == 2 and m["speedup_vs_target_only"] > 0
    arrivals = [[r.arrival_s for r in o.requests] for o in (*measured.spec, *measured.base)]
    assert all(a == arrivals[0] for a in arrivals) and arrivals[0] == sorted(arrivals[0])  # one fixed schedule
    assert not measured.spec[0].requests[0].measured and all(r.measured for r in measured.spec[0].requests[1:])
    runs = {(e["run"], e["repeat"]) for e in measured.events}
    assert runs == {("spec", 0), ("spec", 1), ("target_only", 0), ("target_only", 1)}
    assert all(e["event"] == "kv_timeline" and "pages_target" in e for e in measured.events)
    assert pair.target.allocator.num_used == 0
    m.update(run_parity(plan, work, pair, measured.spec[0], measured.base[0])[1])
    missing = [k for k in m if not _documented(k, _docs())]
    assert not missing, f"metrics.json keys missing from docs/usage.md: {missing}"
