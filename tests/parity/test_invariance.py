"""Parity under engine.invariant=true is exact (issue 18): any token mismatch vs target-only, in any timed run,
is an error, not a rate; the job writes its outputs, then fails (status.json "failed", exit code 1 as any bug)."""

from __future__ import annotations

import dataclasses
import json

import pytest

from attnlab.metrics.invariance import InvarianceBroken, invariance_check, raise_if_broken

BASE = [[1, 2, 3], [4, 5, 6]]


def test_identical_runs_are_exact():
    check = invariance_check([BASE, [list(x) for x in BASE]], BASE, greedy=True)
    assert check == {"exact": True, "requests": 2, "spec_runs_compared": 2, "mismatched": []}
    raise_if_broken(check)  # nothing raised


def test_one_token_in_a_later_repeat_breaks_it():
    check = invariance_check([BASE, [[1, 2, 3], [4, 9, 6]]], BASE, greedy=True)
    assert check["exact"] is False
    assert check["mismatched"] == [{"request": 1, "repeat": 1, "first_divergence": 1}]
    with pytest.raises(InvarianceBroken, match=r"1 of 2 requests differ from target-only \(first: request 1 at "
                                               r"output token 1, timed run 1\)"):
        raise_if_broken(check)


def test_a_shorter_output_and_the_noise_floor_count():
    check = invariance_check([[[1, 2], [4, 5, 6]]], BASE, greedy=True,
                             noise_floor={"first_divergence": [None, 2]})
    assert check["mismatched"] == [{"request": 0, "repeat": 0, "first_divergence": 2}]
    assert check["noise_floor_mismatched"] == [{"request": 1, "first_divergence": 2}]
    with pytest.raises(InvarianceBroken, match="1 requests differ between batch 1 and the workload batch"):
        raise_if_broken(check)
    only_noise = invariance_check([BASE], BASE, greedy=True, noise_floor={"first_divergence": [None, 0]})
    assert only_noise["exact"] is False and not only_noise["mismatched"]


def test_sampling_and_draft_none_are_not_judged():
    assert invariance_check([BASE], [[9]] * 2, greedy=False)["exact"] is None
    none = invariance_check([BASE], None, greedy=True)
    assert none["exact"] is True and "draft=none" in none["note"]


@pytest.mark.slow
def test_a_run_with_a_mismatch_writes_its_outputs_then_fails(tmp_path, monkeypatch):
    """The whole job in-process on the tiny model: the plan says invariant (CPU cannot build an invariant side,
    so the sides are built as a normal run's), one timed spec output gets one token changed."""
    from attnlab import job, measure, sides
    from attnlab.cli import main
    from tests.cli.helpers import TINY

    real_validate, real_build_pair, real_measure = job.validate, sides.build_pair, measure.measure

    def invariant(plan, on=True):
        return dataclasses.replace(plan, engine=dataclasses.replace(plan.engine, invariant=on))

    def corrupted(plan, work, pair, cold, on_batch=None):
        out = real_measure(plan, work, pair, cold, on_batch=on_batch)
        out.spec[0].requests[1].output_ids[3] += 1
        return out

    monkeypatch.setattr(job, "validate", lambda cfg: invariant(real_validate(cfg)))
    monkeypatch.setattr(sides, "build_pair", lambda plan, *a, **kw: real_build_pair(invariant(plan, False), *a, **kw))
    monkeypatch.setattr(measure, "measure", corrupted)
    out = tmp_path / "run"
    with pytest.raises(InvarianceBroken, match="1 of 2 requests differ from target-only"):
        main([*TINY, "parity=off", "bench.repeats=1", f"hydra.run.dir={out}"])
    status = json.loads((out / "status.json").read_text())
    assert status["status"] == "failed" and status["error_type"] == "InvarianceBroken"
    assert "request 1 at output token 3" in status["error"]
    inv = json.loads((out / "parity.json").read_text())["invariance"]
    assert inv["exact"] is False and inv["mismatched"][0]["request"] == 1
    metrics = json.loads((out / "metrics.json").read_text())
    assert (metrics["invariant_exact"], metrics["invariant_mismatched_requests"]) == (False, 1)
    assert (out / "requests.jsonl").is_file()
