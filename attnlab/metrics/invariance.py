"""Parity under ``engine.invariant=true`` is exact: every timed speculative run must emit, request by request,
the same tokens as the first timed target-only run (greedy), and target-only at batch 1 the same as at the
workload's batch (the noise floor, when parity.noise_floor=true). A mismatch is not a rate to report: it is a
broken guarantee, so the job writes its outputs and then fails (``InvarianceBroken``: status.json "failed",
exit code 1 for a single run as for any attnlab bug, 3 for a sweep with such a job; docs/usage.md)."""

from __future__ import annotations

from collections.abc import Sequence

from attnlab.metrics.parity import first_divergence


class InvarianceBroken(RuntimeError):
    """engine.invariant=true and some output differs from target-only (a bug in an invariant op)."""


def invariance_check(spec_runs: Sequence[Sequence[Sequence[int]]], base: Sequence[Sequence[int]] | None,
                     greedy: bool, noise_floor: dict | None = None) -> dict:
    """spec_runs: the output ids of every timed spec run (per request); base: the first timed target-only
    run's (None with draft=none); noise_floor: parity.json's noise-floor level (its first_divergence list).
    -> parity.json's "invariance" block; ``exact`` False when anything differs."""
    if not greedy:
        return {"exact": None, "note": "sampling (spec.temperature > 0): speculative and target-only outputs are "
                                       "different samples of the same distribution; exactness is checked greedy"}
    mismatched = []
    if base is not None:
        for r, run in enumerate(spec_runs):
            if len(run) != len(base):
                raise ValueError(f"timed spec run {r}: {len(run)} outputs vs {len(base)} target-only outputs")
            mismatched += [{"request": i, "repeat": r, "first_divergence": d}
                           for i, (a, b) in enumerate(zip(run, base)) if (d := first_divergence(a, b)) is not None]
    noise = [] if noise_floor is None else [{"request": i, "first_divergence": d} for i, d in
                                            enumerate(noise_floor.get("first_divergence", ())) if d is not None]
    out = {"exact": not mismatched and not noise, "requests": len(base) if base is not None else 0,
           "spec_runs_compared": len(spec_runs) if base is not None else 0, "mismatched": mismatched}
    if base is None:
        out["note"] = "draft=none: the run is target-only decoding; nothing to compare it with"
    if noise_floor is not None:
        out["noise_floor_mismatched"] = noise
    return out


def raise_if_broken(check: dict) -> None:
    """InvarianceBroken, one line naming how many requests differ and the first of them, if not exact."""
    if check.get("exact") is not False:
        return
    parts = []
    if check["mismatched"]:
        first = check["mismatched"][0]
        reqs = len({m["request"] for m in check["mismatched"]})
        parts.append(f"{reqs} of {check['requests']} requests differ from target-only (first: request "
                     f"{first['request']} at output token {first['first_divergence']}, timed run {first['repeat']})")
    if check.get("noise_floor_mismatched"):
        first = check["noise_floor_mismatched"][0]
        parts.append(f"{len(check['noise_floor_mismatched'])} requests differ between batch 1 and the workload batch "
                     f"(first: request {first['request']} at output token {first['first_divergence']})")
    raise InvarianceBroken("engine.invariant=true but " + "; ".join(parts) + ": an op is not invariant "
                           "(parity.json 'invariance'; python -m attnlab.locate <run folder> names it)")
