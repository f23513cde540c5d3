"""The bf16 serving-vs-static criterion (issue 19, attnlab.metrics.parity.explain_vs_reference) on CPU: a tiny
bf16 model served with Poisson arrivals against its static run. The torch backend on CPU is batch-invariant
(served == static bit for bit), so divergences are planted in the served target's passes:

- a near-tie flip: every row whose top-2 margin is below half the bound swaps to its runner-up (a rounding-sized
  change) -> the criterion passes, and it did see divergences;
- a corrupted KV page (one page of one request negated mid-run) and a wrong token fed back (one row's logits
  pushed far onto another token) -> it fails, naming the request, position, tokens and margin."""

from __future__ import annotations

import pytest
import torch

from attnlab.backends.base import Mode
from attnlab.engine.arrivals import arrival_source
from attnlab.engine.scheduler import Scheduler
from attnlab.engine.serve import ServingEngine, StepClock
from attnlab.metrics.parity import (
    NEAR_TIE_ULPS,
    explain_vs_reference,
    format_unexplained,
    row_near_tie_eps,
    ulp,
)
from attnlab.parity_pass import reference_logits
from attnlab.spec.decoder import SpecParams, SpeculativeDecoder
from attnlab.spec.drafters import ModelDrafter
from tests.spec.tiny import perturbed, prompts, runner, tiny_config, tiny_model

CFG = tiny_config()
TARGET = tiny_model(CFG, seed=0).to(dtype=torch.bfloat16)
DRAFT = perturbed(TARGET, seed=1, noise=0.2)
PS = prompts(6, CFG.vocab_size, seed=3)
BUDGETS = [16, 5, 12, 20, 9, 14]
K, PAGE = 3, 4
eps_of = lambda row: row_near_tie_eps(row, "bf16", NEAR_TIE_ULPS)


def _decoder():
    return SpeculativeDecoder(runner(TARGET, CFG, PAGE), ModelDrafter(runner(DRAFT, CFG, PAGE, name="draft")),
                              SpecParams(K))


@pytest.fixture(scope="module")
def static():
    return _decoder().generate(PS, BUDGETS, record_logits=True).requests


def serve(fault=None) -> list[list[int]]:
    """The Poisson serving run. ``fault(runner, p, run) -> logits`` stands in for every target pass ``p``, where
    ``run()`` computes its logits (request id i is prompt i: a fresh decoder numbers its requests from 0)."""
    dec = _decoder()
    tgt = dec.target
    if fault is not None:
        real = tgt._forward

        def _forward(p, input_ids, rows, features):  # tokens None: the argmax is taken from the returned logits
            return fault(tgt, p, lambda: real(p, input_ids, rows, features)[0].clone()), None

        tgt._forward = _forward
    allocs = [tgt.allocator, dec.drafter.runner.allocator]
    sched = Scheduler(allocs, max_running=4, k=K, max_context=256, policy="reserve")
    out = ServingEngine(dec, sched, frozenset(), StepClock(0.01)).run(
        PS, BUDGETS, arrival_source("poisson", len(PS), rate=30.0, seed=1))
    assert any(s["step"] == "prefill" and s["running"] > 1 for s in out.timeline)  # a prefill joined a batch
    return [r.output_ids for r in out.requests]


def nth_verify(n, act):
    """A fault that calls ``act(runner, p, run)`` on the n-th verify pass and runs every other pass as is."""
    seen = [0]

    def fault(tgt, p, run):
        if p.meta.mode == Mode.VERIFY:
            seen[0] += 1
            if seen[0] == n:
                return act(tgt, p, run)
        return run()
    return fault


def check(served, static):
    forced = reference_logits(runner(TARGET, CFG, PAGE, name="forced"), PS, served, 4)
    res = [explain_vs_reference(s, r.output_ids, r.logits, eps_of, f) for s, r, f in zip(served, static, forced)]
    return res, [format_unexplained(i, x["unexplained"]) for i, x in enumerate(res) if x["unexplained"]]


def _row_eps(logits):  # [R, V] -> [R, 1]: NEAR_TIE_ULPS bf16 ulps at each row's top logit (row_near_tie_eps)
    top = logits.max(dim=-1, keepdim=True).values.abs().clamp_min(2.0 ** -126)
    return NEAR_TIE_ULPS * torch.exp2(torch.floor(torch.log2(top)) - 7)


def test_clean_serving_is_identical_and_the_bound_covers_bf16_rounding(static):
    served = serve()
    res, bad = check(served, static)
    assert served == [r.output_ids for r in static] and not bad
    assert all(x["divergence"] is None for x in res)
    # The bound's premise on this model: the top-2 logit difference of a bf16 run strays from fp32's by at most
    # NEAR_TIE_ULPS / 2 ulps (so two bf16 runs disagree on it by at most NEAR_TIE_ULPS ulps); measured on CPU:
    # 1.57 here, 1.63 at the GPU test's shapes.
    exact = reference_logits(runner(tiny_model(CFG, seed=0), CFG, PAGE), PS, [r.output_ids for r in static], 4)
    worst = 0.0
    for r, x in zip(static, exact):
        top2 = x.topk(2, dim=-1).indices
        stray = (r.logits - x).gather(1, top2)
        for row, s in zip(x, stray):
            worst = max(worst, abs(float(s[0] - s[1])) / ulp("bf16", float(row.max())))
    assert 0 < worst <= NEAR_TIE_ULPS / 2, worst


def test_near_tie_flips_pass(static):
    def flip_near_ties(_, p, run):  # runner-up + eps/2 where the race is closer than eps/2
        logits = run()
        vals, idx = logits.topk(2, dim=-1)
        half = _row_eps(logits) / 2
        bump = torch.where(vals[:, :1] - vals[:, 1:] < half, half, torch.zeros_like(half))
        return logits.scatter_add(1, idx[:, 1:], bump)

    served = serve(flip_near_ties)
    res, bad = check(served, static)
    assert not bad, "\n".join(bad)
    divs = [x["divergence"] for x in res if x["divergence"] is not None]
    assert len(divs) >= 2  # the planted flips did change outputs
    assert all(e["near_tie"] and e["run_token_rank"] == 2 and e["gap"] < e["eps"] / 2 for e in divs)


def test_corrupted_kv_page_fails(static):
    """Before the 4th verify pass reads it, one page of its first request is negated (K and V, every layer)."""
    hit = []

    def corrupt(tgt, p, run):
        tgt.pool.kv[:, :, tgt.allocator.page_tables[p.reqs[0]][0]].neg_()
        hit.append(p.reqs[0])
        return run()

    served = serve(nth_verify(4, corrupt))
    _, bad = check(served, static)
    assert hit and bad
    assert any(line.startswith(f"request {hit[0]}: ") for line in bad), bad
    assert all(">= eps" in line for line in bad), bad


def test_wrong_token_fed_back_fails(static):
    """The 3rd verify pass's first row picks its least likely token (fed back as the next pass's input)."""
    wrong = {}

    def push(_, p, run):
        logits = run()
        wrong[p.reqs[0]] = tok = int(logits[0].argmin())
        logits[0, tok] += 1000.0
        return logits

    served = serve(nth_verify(3, push))
    res, bad = check(served, static)
    (req, tok), = wrong.items()
    assert bad and bad[0].startswith(f"request {req}: ") and "first divergence, not at a near-tie" in bad[0], bad
    e = res[req]["unexplained"]
    assert e["run_token"] == tok and e["gap"] > e["eps"] and e["run_token_rank"] > 2


def test_ulp_and_row_bound():
    assert ulp("bf16", 16.0) == 0.125 and ulp("bf16", 5.0) == ulp("bf16", -7.9) == 1 / 32 and ulp("fp32", 1.0) == 2.0 ** -23
    assert float(torch.tensor(5.0, dtype=torch.bfloat16) + ulp("bf16", 5.0)) == 5.03125  # the next bf16 number
    assert row_near_tie_eps(torch.tensor([-1.0, 4.5, 2.0]), "bf16", 4) == 0.125


def test_explain_vs_reference_cases():
    """Synthetic logits (eps 0.25): identical; a near-tie flip with a sound continuation; a bug after that flip;
    a flip at a clear margin; a length difference."""
    V = 6
    ref = [1, 2, 3, 4]
    ref_logits = torch.zeros(4, V)
    for t, tok in enumerate(ref):
        ref_logits[t, tok] = 5.0
    ref_logits[2, 5] = 4.9  # position 2: token 5 trails the winner 3 by 0.1 (a near-tie)
    run = [1, 2, 5, 0]
    run_logits = torch.zeros(4, V)
    run_logits[3, 0], run_logits[3, 1] = 5.0, 4.95  # the run's own prefix at 3: 0 wins (0.05 over 1)
    eps = lambda row: 0.25
    assert explain_vs_reference(ref, ref, ref_logits, eps) == {"divergence": None, "unexplained": None}
    ok = explain_vs_reference(run, ref, ref_logits, eps, run_logits)
    assert ok["unexplained"] is None and ok["divergence"]["index"] == 2 and ok["divergence"]["near_tie"]
    assert ok["divergence"]["gap"] == pytest.approx(0.1) and ok["divergence"]["run_token_rank"] == 2
    near = explain_vs_reference([1, 2, 5, 1], ref, ref_logits, eps, run_logits)  # 1 trails 0 by 0.05: rounding
    assert near["unexplained"] is None
    late = explain_vs_reference([1, 2, 5, 4], ref, ref_logits, eps, run_logits)  # token 4 trails by 5: a bug
    e = late["unexplained"]
    assert (e["index"], e["run_token"], e["base_token"]) == (3, 4, 0) and e["gap"] == pytest.approx(5.0)
    assert format_unexplained(7, e).startswith("request 7: output token 3: after a near-tie flip at 2: not the ")
    assert explain_vs_reference([1, 2, 5, 4], ref, ref_logits, eps)["unexplained"] is None  # no run logits: unchecked
    clear = explain_vs_reference([1, 0, 3, 4], ref, ref_logits, eps, run_logits)["unexplained"]
    assert clear["index"] == 1 and clear["gap"] == pytest.approx(5.0) and not clear["near_tie"]
    assert "gap 5, margin 5 (top-1 logit 5) >= eps 0.25" in format_unexplained(0, clear)
    short = explain_vs_reference([1, 2], ref, ref_logits, eps)["unexplained"]
    assert short["index"] == 2 and format_unexplained(0, short) == "request 0: output token 2: lengths differ (2 vs 4 tokens)"
