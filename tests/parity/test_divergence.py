"""Divergence diagnostics (issue 18): each token mismatch vs target-only carries the target-only run's margin
at the first divergence, so rounding at a near-tie is told from a bug; the noise floor (batch 1 vs batch B).

Near-ties are constructed: the verify passes of the run's target boost each row's runner-up token by delta, so
the speculative output flips exactly where the target-only margin is below delta (a rounding-sized change),
while a "bug" (a large bias on one token) flips far from any tie."""

from __future__ import annotations

import logging
import math

import pytest
import torch

from attnlab.backends.base import Mode
from attnlab.measure import measure
from attnlab.metrics.parity import (
    NEAR_TIE_ULPS,
    describe_near_tie_rule,
    divergence_entry,
    divergence_summary,
    near_tie_rule,
    ulp,
)
from attnlab.parity_pass import _diagnose, run_parity
from attnlab.sides import decode
from tests.test_measure import _job


def test_the_rule_is_ulps_at_the_row_top_unless_a_fixed_eps_overrides():
    row = lambda top: torch.tensor([top, top - 3.0, 0.0])
    rule = near_tie_rule("bf16")  # 4 bf16 ulps at the row's top logit
    assert (rule(row(5.0)), rule(row(16.0)), rule(row(40.0))) == (0.125, 0.5, 1.0)
    assert near_tie_rule("fp16", 2)(row(16.0)) == 2 / 64 and near_tie_rule("fp32")(row(1.0)) == 4 * 2.0 ** -23
    assert near_tie_rule("bf16", eps=0.1)(row(40.0)) == 0.1
    assert describe_near_tie_rule("bf16") == "gap < 4 bf16 ulps at the row's top logit"
    assert describe_near_tie_rule("bf16", eps=0.1) == "gap < 0.1 nats"
    from attnlab.config import ParitySchema  # torch-free config module: the default is a literal there
    assert ParitySchema().near_tie_ulps == NEAR_TIE_ULPS == 4


def test_a_gap_between_the_old_fixed_eps_and_the_row_rule_is_a_near_tie():
    """At a top logit of 32 one bf16 ulp is 0.25: the old fixed 0.25 nats was 1 ulp there, the row rule is 4."""
    row = torch.tensor([0.0, 32.0, 31.5, 30.5])  # runner-up 0.5 behind, token 3 1.5 behind
    rule = near_tie_rule("bf16")
    tie = divergence_entry(row, 3, base_token=1, run_token=2, eps=rule(row))
    assert tie["near_tie"] and tie["eps"] == 1.0 and tie["gap"] == 0.5  # >= 0.25: unexplained under the old eps
    far = divergence_entry(row, 3, base_token=1, run_token=3, eps=rule(row))
    assert not far["near_tie"] and far["gap"] == 1.5 and far["run_token_rank"] == 3 and far["base_token_rank"] == 1


def test_entry_reads_margin_gap_and_rank():
    row = torch.tensor([1.0, 5.0, 4.9, 3.0])  # winner 1, runner-up 2 (margin 0.1), token 3 trails by 2
    e = divergence_entry(row, 7, base_token=1, run_token=2, eps=0.25)
    assert e["index"] == 7 and e["margin"] == pytest.approx(0.1) and e["gap"] == pytest.approx(0.1)
    assert (e["run_token_rank"], e["top2_token"], e["near_tie"], e["base_is_argmax"]) == (2, 2, True, True)
    assert (e["base_token_rank"], e["eps"]) == (1, 0.25)
    far = divergence_entry(row, 7, base_token=1, run_token=3, eps=0.25)  # the top-2 race is close, token 3 is not
    assert far["margin"] == pytest.approx(0.1) and far["gap"] == pytest.approx(2.0)
    assert far["run_token_rank"] == 3 and not far["near_tie"]
    s = divergence_summary([None, e, far, None], "gap < 0.25 nats")
    assert (s["divergences"], s["near_tie"], s["unexplained"]) == (2, 1, 1)
    assert s["summary"] == "2 divergences, 1 at near-ties (gap < 0.25 nats), 1 unexplained"
    assert s["per_request"][0] is None and s["per_request"][1]["index"] == 7
    assert s["unexplained_margin_max"] == pytest.approx(0.1)  # far's margin: its top-2 race was close
    assert divergence_summary([None, e], "r")["unexplained_margin_max"] is None


def test_diagnose_needs_the_rerun_to_repeat_the_base():
    logits = torch.zeros(4, 5)
    logits[2, 3], logits[2, 4] = 2.0, 1.9
    eps = lambda row: 0.25
    ok = _diagnose(logits, [0, 1, 3, 0], [0, 1, 3, 0], [0, 1, 4, 4], eps)
    assert ok["index"] == 2 and ok["near_tie"] and ok["margin"] == pytest.approx(0.1)
    moved = _diagnose(logits, [0, 2, 3, 0], [0, 1, 3, 0], [0, 1, 4, 4], eps)  # re-run differs at token 1
    assert moved["margin"] is None and "re-run" in moved["note"] and not moved["near_tie"]
    assert _diagnose(logits, [0, 1, 3], [0, 1, 3], [0, 1, 3], eps) is None
    assert divergence_summary([moved], "r")["not_reproduced"] == 1


def _perturb(runner, monkeypatch, when, change):
    """Wrap ``runner._forward`` (under both ``forward`` and ``forward_greedy``): ``change(logits)`` on the passes
    where ``when(p)`` holds; their argmax tokens are then recomputed from the changed logits (tokens None)."""
    real = runner._forward

    def _forward(p, input_ids, rows, features):
        logits, tokens = real(p, input_ids, rows, features)
        return (change(logits.clone()), None) if when(p) else (logits, tokens)

    monkeypatch.setattr(runner, "_forward", _forward)


def _boost_runner_up(delta):
    def change(logits):
        second = logits.topk(2, dim=-1).indices[:, 1:]
        return logits.scatter_add(1, second, torch.full_like(second, delta, dtype=logits.dtype))
    return change


def _target_only_margins(plan, work, pair) -> list[float]:
    out = decode(pair.target_only(), plan, work, list(work.prompts), k=0, record_logits=True)
    vals = torch.cat([r.logits for r in out.requests]).topk(2, dim=-1).values
    return sorted((vals[:, 0] - vals[:, 1]).tolist())


@pytest.mark.parametrize("bug", [False, True], ids=["near_tie", "bug"])
def test_divergences_are_explained_by_the_target_only_margin(monkeypatch, bug):
    plan, work, pair = _job("parity.logits=false", "parity.kernel=false",
                            "parity.near_tie_eps=1e-3" if bug else "parity.near_tie_eps=100")
    margins = _target_only_margins(plan, work, pair)
    delta = margins[len(margins) // 3]  # a third of the positions are closer races than delta
    verify = lambda p: p.meta.mode == Mode.VERIFY
    if bug:  # verify passes favour one fixed token by a lot: the spec run emits it whatever the margins say
        def change(logits):
            logits[:, 5] += 1000.0
            return logits
        _perturb(pair.target, monkeypatch, verify, change)
    else:
        _perturb(pair.target, monkeypatch, verify, _boost_runner_up(delta))
    measured = measure(plan, work, pair)
    parity, m, rows = run_parity(plan, work, pair, measured.spec[0], measured.base[0])
    div = parity["tokens"]["vs_target_only"]["divergences"]
    firsts = parity["tokens"]["vs_target_only"]["first_divergence"]
    assert div["divergences"] == sum(d is not None for d in firsts) >= 2
    assert m["parity_divergences"] == div["divergences"] and m["parity_near_tie_eps"] == plan.parity.near_tie_eps
    assert m["parity_near_tie_ulps"] is None  # a fixed eps overrides the ulps rule
    entries = [e for e in div["per_request"] if e is not None]
    assert [e["index"] for e in entries] == [d for d in firsts if d is not None]
    base = [r.output_ids for r in measured.base[0].requests]
    for i, e in enumerate(div["per_request"]):
        if e is None:
            continue
        assert rows[i]["divergence_vs_target_only"] == e and e["base_token"] == base[i][e["index"]]
        assert e["base_is_argmax"] and e["margin"] <= e["gap"]
        if bug:
            assert e["run_token"] == 5 and e["gap"] >= 1e-3 and not e["near_tie"]
        else:  # the flip happened at a race closer than delta, to the runner-up (fp32: verify = decode to ~1e-5)
            assert e["run_token_rank"] == 2 and e["gap"] == e["margin"] < delta + 1e-4 and e["near_tie"]
    if bug:
        assert (m["parity_divergences_near_tie"], m["parity_divergences_unexplained"]) == (0, div["divergences"])
    else:
        assert (m["parity_divergences_near_tie"], m["parity_divergences_unexplained"]) == (div["divergences"], 0)
    # torch fp32 is the reference: vs_reference is the same comparison, with the same diagnosis
    assert parity["tokens"]["vs_reference"]["divergences"]["per_request"] == div["per_request"]


def _scaled_job(monkeypatch, boost, *overrides):
    """A bf16 job whose target logits lie at 32-48 (tiny-llama's top logits of 0.5-0.9, x32 + 16): one bf16 ulp is
    0.25 there, as at a chat LLM's top logits of 32+, so the old fixed 0.25 nats was 1 ulp. Its verify passes
    boost each row's runner-up by ``boost``: the spec run flips wherever the target-only margin is below it."""
    plan, work, pair = _job("precision=bf16", "parity.logits=false", "parity.kernel=false", *overrides)
    _perturb(pair.target, monkeypatch, lambda p: True, lambda logits: logits.float() * 32 + 16)
    _perturb(pair.target, monkeypatch, lambda p: p.meta.mode == Mode.VERIFY, _boost_runner_up(boost))
    measured = measure(plan, work, pair)
    parity, m, _ = run_parity(plan, work, pair, measured.spec[0], measured.base[0])
    return parity["tokens"]["vs_target_only"]["divergences"], m


def _records(caplog, level):
    return [r.getMessage() for r in caplog.records if r.name == "attnlab" and r.levelno == level]


def test_flips_within_4_ulps_are_near_ties_and_a_fixed_eps_overrides(monkeypatch, caplog):
    caplog.set_level(logging.INFO, logger="attnlab")
    div, m = _scaled_job(monkeypatch, 0.9)  # flips with gaps < 0.9 nats, under 4 ulps (>= 1.0) at these tops
    entries = [e for e in div["per_request"] if e is not None]
    assert entries and all(e["near_tie"] and e["eps"] == 4 * ulp("bf16", e["top1_logit"]) >= 1.0 for e in entries)
    assert any(e["gap"] >= 0.25 for e in entries)  # what the old fixed 0.25 nats called unexplained
    assert (m["parity_divergences_unexplained"], m["parity_divergences_unexplained_margin_max"]) == (0, None)
    assert (m["parity_near_tie_ulps"], m["parity_near_tie_eps"]) == (4, None)
    assert _records(caplog, logging.WARNING) == []
    assert (f"parity vs target-only (= vs reference): {len(entries)} divergences, {len(entries)} near-ties, "
            f"0 unexplained (gap < 4 bf16 ulps at the row's top logit)") in _records(caplog, logging.INFO)
    caplog.clear()
    div, m = _scaled_job(monkeypatch, 0.9, "parity.near_tie_eps=0.1")  # the same flips, judged with 0.1 nats
    entries = [e for e in div["per_request"] if e is not None]
    assert all(e["eps"] == 0.1 and e["near_tie"] == (e["gap"] < 0.1) for e in entries)
    odd = [e for e in entries if not e["near_tie"]]
    assert odd and m["parity_divergences_unexplained"] == len(odd) == len(_records(caplog, logging.WARNING))
    assert (m["parity_near_tie_ulps"], m["parity_near_tie_eps"]) == (None, 0.1)


def test_an_unexplained_divergence_is_logged_with_its_fields(monkeypatch, caplog):
    caplog.set_level(logging.INFO, logger="attnlab")
    div, m = _scaled_job(monkeypatch, 3.0)  # flips with gaps up to 3 nats: those >= 4 ulps (1.0) are unexplained
    entries = {i: e for i, e in enumerate(div["per_request"]) if e is not None}
    assert all(e["near_tie"] == (e["gap"] < e["eps"]) for e in entries.values())
    odd = {i: e for i, e in entries.items() if not e["near_tie"]}
    assert odd and m["parity_divergences_unexplained"] == len(odd)
    assert m["parity_divergences_unexplained_margin_max"] == max(e["margin"] for e in odd.values())
    warnings = _records(caplog, logging.WARNING)
    assert len(warnings) == len(odd)
    for line, (i, e) in zip(warnings, odd.items()):
        assert line == (f"parity vs target-only (= vs reference): request {i}: output token {e['index']}: first "
                        f"divergence, not at a near-tie: run token {e['run_token']} (rank {e['run_token_rank']}) "
                        f"vs target-only {e['base_token']} (rank 1): gap {e['gap']:.4g}, margin {e['margin']:.4g} "
                        f"(top-1 logit {e['top1_logit']:.4g}) >= eps {e['eps']:.4g}")
    worst = max(odd.values(), key=lambda e: e["margin"])
    summary = [x for x in _records(caplog, logging.INFO) if x.startswith("parity vs target-only")]
    assert summary == [(f"parity vs target-only (= vs reference): {len(entries)} divergences, "
                        f"{len(entries) - len(odd)} near-ties, {len(odd)} unexplained (max margin "
                        f"{worst['margin']:.3g} nats; gap < 4 bf16 ulps at the row's top "
                        f"logit)")]


def test_reference_margins_come_from_the_reference_decode(monkeypatch):
    """bf16 run vs the fp32 reference: the reference decode records its own logits (its margins cost no extra pass)."""
    plan, work, pair = _job("precision=bf16", "parity.reference_precision=fp32", "parity.logits=false",
                            "parity.kernel=false")
    _perturb(pair.target, monkeypatch, lambda p: p.meta.mode == Mode.VERIFY, _boost_runner_up(1.0))
    measured = measure(plan, work, pair)
    parity, m, _ = run_parity(plan, work, pair, measured.spec[0], measured.base[0])
    ref = parity["tokens"]["vs_reference"]
    assert ref["divergences"]["divergences"] == sum(d is not None for d in ref["first_divergence"]) >= 1
    assert m["parity_divergences_ref"] == ref["divergences"]["divergences"]
    assert (plan.parity.near_tie_eps, m["parity_near_tie_ulps"]) == (None, 4)  # the default: the row rule
    for e in ref["divergences"]["per_request"]:
        if e is not None and e.get("margin") is not None:
            assert e["base_is_argmax"] and e["gap"] >= e["margin"] >= 0
            assert e["eps"] == 4 * 2.0 ** (math.floor(math.log2(e["top1_logit"])) - 7)  # 4 bf16 ulps there


def test_noise_floor_batch_1_vs_batch_b(monkeypatch):
    plan, work, pair = _job("parity.noise_floor=true", "parity.logits=false", "parity.kernel=false",
                            "parity.near_tie_eps=100")
    measured = measure(plan, work, pair)
    parity, m, _ = run_parity(plan, work, pair, measured.spec[0], measured.base[0])
    noise = parity["noise_floor"]
    assert noise["batch_sizes"] == [1, 2] and noise["num_requests"] == 4
    assert m["parity_noise_floor_token_match"] == noise["match_rate"]
    assert m["parity_noise_floor_divergences"] == noise["divergences"]["divergences"]
    # batched decode passes favour each row's runner-up a little: batch 2 now differs from batch 1 at near-ties
    margins = _target_only_margins(plan, work, pair)
    batched = lambda p: p.meta.mode == Mode.DECODE and len(p.reqs) > 1
    _perturb(pair.target, monkeypatch, batched, _boost_runner_up(margins[len(margins) // 3]))
    measured = measure(plan, work, pair)
    parity, m, rows = run_parity(plan, work, pair, measured.spec[0], measured.base[0])
    noise = parity["noise_floor"]
    assert noise["match_rate"] < 1 and noise["divergences"]["divergences"] >= 1
    assert m["parity_noise_floor_near_tie"] == noise["divergences"]["divergences"]  # eps 100: all near-ties
    assert any("divergence_noise_floor" in r for r in rows)
    off = _job()[0]
    assert not off.parity.noise_floor


def test_no_divergence_no_rerun(generate_calls_spy):
    """fp32 on the torch backend: identical outputs, so no batch is decoded again."""
    plan, work, pair = _job("parity.logits=false", "parity.kernel=false")
    measured = measure(plan, work, pair)
    generate_calls_spy.clear()
    parity, m, _ = run_parity(plan, work, pair, measured.spec[0], measured.base[0])
    assert parity["tokens"]["vs_target_only"]["divergences"]["divergences"] == 0 == m["parity_divergences"]
    assert generate_calls_spy == []


@pytest.fixture
def generate_calls_spy(monkeypatch):
    from attnlab.spec.decoder import SpeculativeDecoder

    calls = []
    real = SpeculativeDecoder.generate

    def spy(self, prompts, *a, **kw):
        calls.append(len(prompts))
        return real(self, prompts, *a, **kw)

    monkeypatch.setattr(SpeculativeDecoder, "generate", spy)
    return calls


def test_near_tie_eps_is_checked():
    from attnlab.config import validate
    from attnlab.errors import ConfigError
    from tests.test_config import _compose
    from tests.test_measure import TINY

    with pytest.raises(ConfigError, match="parity.near_tie_eps"):
        validate(_compose(*TINY, "parity.near_tie_eps=-1"))
    assert validate(_compose(*TINY, "parity.near_tie_eps=0.5")).parity.near_tie_eps == 0.5
    default = validate(_compose(*TINY)).parity
    assert (default.near_tie_eps, default.near_tie_ulps) == (None, 4)
    assert validate(_compose(*TINY, "parity.near_tie_ulps=2.5")).parity.near_tie_ulps == 2.5


@pytest.mark.parametrize("value", ["0", "-1", "inf", "true", "four"])
def test_near_tie_ulps_is_checked_in_one_line(value):
    from attnlab.cli import one_line
    from attnlab.config import validate
    from tests.test_config import _compose
    from tests.test_measure import TINY

    with pytest.raises(Exception) as e:  # a string fails at compose (the typed schema), the rest in validate
        validate(_compose(*TINY, f"parity.near_tie_ulps={value}"))
    msg = one_line(e.value)
    assert "\n" not in msg and "parity.near_tie_ulps" in msg, msg


def test_report_shows_divergences_and_noise_floor():
    from attnlab.report import job_row

    m = {"parity_divergences": 3, "parity_divergences_near_tie": 2, "parity_divergences_unexplained": 1,
         "parity_noise_floor_token_match": 0.9876}
    row = job_row({"name": "0", "config": {}, "metrics": m, "status": {"status": "complete"}})
    assert (row["divergences"], row["noise floor"]) == ("3: 2 tie, 1 unexpl.", "0.988")
    empty = job_row({"name": "0", "config": {}, "metrics": {}, "status": {}})
    assert (empty["divergences"], empty["noise floor"]) == ("-", "-")
    m["parity_divergences_unexplained_within_rounding"] = 1  # parity.rounding measured it
    row = job_row({"name": "0", "config": {}, "metrics": m, "status": {"status": "complete"}})
    assert row["divergences"] == "3: 2 tie, 1 unexpl. (1 in rounding)"


def test_margin_changes_rounding_scale_and_marks():
    from attnlab.metrics.parity import ROUNDING_SHARE, margin_changes, mark_rounding, rounding_scale

    decoded = torch.tensor([[3.0, 1.0], [2.0, 1.5], [5.0, 1.0]])  # each row's top two (the decode's), in order
    forced = torch.tensor([[3.0, 1.5], [2.0, 1.5], [4.0, 1.2]])
    ch = margin_changes(decoded, forced)
    assert ch.tolist() == pytest.approx([0.5, 0.0, 1.2])
    with pytest.raises(ValueError, match="the same n"):
        margin_changes(decoded, forced[:2])  # a misaligned pair is an error, not a silent truncation
    changes = [ch, torch.linspace(0.0, 0.1, 97)]  # 100 rows: 97 small, then 0.5, 1.2 (and one 0.0)
    scale, srt = rounding_scale(changes)
    assert scale["rows"] == 100 and scale["margin_change_max"] == pytest.approx(1.2)
    assert scale["margin_change_p99"] == pytest.approx(0.5) and scale["margin_change_median"] < 0.1  # nearest rank
    assert rounding_scale([]) == ({"rows": 0, "margin_change_median": None, "margin_change_p99": None,
                                   "margin_change_max": None}, None)
    tie = {"near_tie": True, "gap": 0.01}
    at = {"near_tie": False, "gap": 0.5}  # a gap equal to a recorded change: 2 of 100 rows moved >= it
    mid = {"near_tie": False, "gap": 1.0}  # only the 1.2 row: 1%, the threshold
    far, note = {"near_tie": False, "gap": 9.0}, {"near_tie": False, "gap": None}
    s = {"per_request": [None, tie, at, mid, far, note]}
    mark_rounding(s, srt)
    assert "rounding_share" not in tie and "rounding_share" not in note  # near-ties and unreadable ones untouched
    assert at["rounding_share"] == pytest.approx(0.02) and at["within_rounding"]
    assert mid["rounding_share"] == pytest.approx(ROUNDING_SHARE) and mid["within_rounding"]
    assert far["rounding_share"] == 0.0 and not far["within_rounding"]
    assert s["unexplained_within_rounding"] == 2
    rare = {"per_request": [{"near_tie": False, "gap": 1.0}]}
    mark_rounding(rare, rounding_scale([ch, torch.zeros(197)])[1])  # 1 row in 200 moved >= 1.0: under the share
    assert not rare["per_request"][0]["within_rounding"] and rare["unexplained_within_rounding"] == 0
    unmeasured = {"per_request": [{"near_tie": False, "gap": 0.3}]}
    mark_rounding(unmeasured, None)
    assert unmeasured["unexplained_within_rounding"] is None and "rounding_share" not in unmeasured["per_request"][0]


@pytest.mark.parametrize("ref_noise", [0.0, 2.0], ids=["quiet_reference", "noisy_reference"])
def test_unexplained_divergences_are_judged_against_the_references_own_rounding(monkeypatch, caplog, ref_noise):
    """A bf16 run whose verify boosts runner-ups by 1 nat (far past 4 bf16 ulps at these logits) against a bf16
    reference decoded on its own (reference_is_run forced false: the same backend stands in for another). The
    reference's teacher-forced margins differ from its decode's by ``ref_noise``: a reference that rounds that much
    explains those divergences, a quiet one does not."""
    import attnlab.parity_pass as pp

    caplog.set_level(logging.INFO, logger="attnlab")
    plan, work, pair = _job("precision=bf16", "parity.logits=false", "parity.kernel=false")
    _perturb(pair.target, monkeypatch, lambda p: p.meta.mode == Mode.VERIFY, _boost_runner_up(1.0))
    monkeypatch.setattr(pp, "reference_is_run", lambda plan: False)
    real = pp.reference_logits
    # the probe reads each row's top two columns (the decode's, in order): the runner-up's moved by ref_noise
    monkeypatch.setattr(pp, "reference_logits",
                        lambda *a, **kw: [x + x.new_tensor([0.0, ref_noise]) for x in real(*a, **kw)])
    measured = measure(plan, work, pair)
    parity, m, _ = run_parity(plan, work, pair, measured.spec[0], measured.base[0])
    scale = parity["tokens"]["reference_rounding"]
    assert scale["rows"] == sum(len(r.output_ids) for r in measured.base[0].requests[:len(work.prompts)])
    assert m["parity_rounding_margin_change_max"] == scale["margin_change_max"]
    if ref_noise:  # every row's top-2 margin moved by the boost
        assert scale["margin_change_median"] == pytest.approx(ref_noise, abs=0.02)
    else:  # the same bf16 model: decode and teacher-forced prefill differ by rounding only
        assert scale["margin_change_max"] < 0.1
    div = parity["tokens"]["vs_reference"]["divergences"]
    odd = [e for e in div["per_request"] if e is not None and not e["near_tie"] and e.get("gap") is not None]
    assert odd, "the boost must leave divergences the ulps rule cannot explain"
    for e in odd:
        assert e["within_rounding"] == (e["rounding_share"] >= 0.01)
    assert div["unexplained_within_rounding"] == sum(e["within_rounding"] for e in odd)
    assert m["parity_divergences_unexplained_ref_within_rounding"] == div["unexplained_within_rounding"]
    assert div["unexplained_within_rounding"] == (len(odd) if ref_noise else 0)
    words = "within the reference's own rounding" if ref_noise else "beyond the reference's own rounding (0% of"
    warnings = [w for w in _records(caplog, logging.WARNING) if w.startswith("parity vs reference")]
    assert warnings and all(words in w for w in warnings)


def test_the_rounding_probe_needs_the_runs_precision_and_can_be_off(monkeypatch):
    """An fp32 reference's rounding says nothing of a bf16 run's; parity.rounding=false skips the probe."""
    import attnlab.parity_pass as pp

    for extra in (("parity.reference_precision=fp32",), ("parity.rounding=false",)):
        plan, work, pair = _job("precision=bf16", "parity.logits=false", "parity.kernel=false", *extra)
        monkeypatch.setattr(pp, "reference_is_run", lambda plan: False)
        _perturb(pair.target, monkeypatch, lambda p: p.meta.mode == Mode.VERIFY, _boost_runner_up(1.0))
        measured = measure(plan, work, pair)
        parity, m, _ = run_parity(plan, work, pair, measured.spec[0], measured.base[0])
        div = parity["tokens"]["vs_reference"]["divergences"]
        assert "reference_rounding" not in parity["tokens"] and "parity_rounding_margin_change_max" not in m
        assert div["divergences"] >= 1 and div["unexplained_within_rounding"] is None
        assert all("within_rounding" not in e for e in div["per_request"] if e is not None)
