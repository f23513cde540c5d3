"""The parity passes of one job (DESIGN.md levels 1-4): untimed, after the timed runs (attnlab.measure).

Inputs are explicit: the plan, the prepared workload, the run's pair and its timed outputs (tokens only:
timed runs record no logits). What needs more than tokens runs here as its own pass:

- tokens: the timed spec run vs the timed target-only run of the same job, and vs the reference (target-only
  decoding with parity.reference at the run's precision or fp32). When the run's verify side *is* that
  reference, the timed target-only run is the reference run. draft=none is not compared with itself.
- logits: an untimed spec run that records the target's logits at every emitted position, vs the reference
  model's logits for the same prefixes (one teacher-forced prefill of prompt + output per batch), so every
  position is compared, also after a token divergence. Skipped (with a note) when the run's verify side is
  the reference: only the shapes of the passes would differ.
- acceptance: the run's pair vs (reference, reference), same drafter, on the parity prompts.
- divergences (greedy): for each request whose output differs from the run it is compared with, the margin
  of that run's logits at the first divergence (attnlab.metrics.parity.divergence_entry), so that a rounding
  flip at a near-tie is told from a bug. The logits read are the ones that *chose* the base run's token
  there: for the timed target-only run, its own q_len-1 decode step at that position, in its own batch
  (timed runs record nothing, so the batches holding a divergence are decoded again, untimed, with logits
  recorded, and must repeat the timed tokens); for the reference, its decode records them as it runs. A
  teacher-forced prefill would give other logits: another pass shape (q_len = the whole prefix) rounds
  differently, the very effect being diagnosed. A near-tie is a gap below eps: parity.near_tie_ulps ulps of the
  target's compute dtype at that row's top logit (the GPU tests' rule), or parity.near_tie_eps fixed nats. Each
  unexplained divergence is logged at WARNING, one line each (metrics.parity.format_unexplained).
- rounding (parity.rounding, greedy, where the reference is decoded at the run's precision): the reference's own
  top-2 margins in its decode against its teacher-forced prefill of the same tokens, every row: a measured scale of
  what rounding does at this precision. Each unexplained divergence gets the share of those rows whose margin moved
  by at least its gap (``within_rounding``: 1% or more, metrics.parity.ROUNDING_SHARE). A second opinion beside the
  ulps rule, which was set for bf16 and knows nothing of an fp8 KV's requantization; it changes no near-tie verdict.
- noise floor (parity.noise_floor): target-only at batch 1 vs the timed target-only run at batch B, same
  prompts and target runner: what batching alone changes.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import replace

from attnlab.config import compute_dtype
from attnlab.plan import RunPlan
from attnlab.prepare import Prepared
from attnlab.sides import Pair, build, build_pair, decode, reference_spec, target_only

log = logging.getLogger("attnlab")


def reference_is_run(plan: RunPlan) -> bool:
    """The run's target side is the reference: parity.reference backend at the reference precision."""
    p, par = plan.precision, plan.parity
    ref_prec = (p.target, p.kv_target) if par.reference_precision == "same" else ("fp32", "fp32")
    return (plan.verify, p.target, p.kv_target) == (par.reference, *ref_prec)


def reference_logits(runner, prompts: list[list[int]], outputs: list[list[int]], batch_size: int,
                     columns: list | None = None) -> list:
    """Teacher forcing: the logits ``runner`` gives each output token of each request, from one prefill of
    prompt + output[:-1] per batch (only the output rows go through the LM head). -> [len(output), V] fp32 CPU;
    with ``columns`` (per request a [len(output), c] long tensor) only those columns of each row, gathered on the
    device: [len(output), c] (the rounding probe's top two: no [rows, V] copy on the host)."""
    import torch

    from attnlab.backends.base import Mode

    out = []
    for b in range(0, len(prompts), batch_size):
        ps, os_ = prompts[b:b + batch_size], outputs[b:b + batch_size]
        reqs = [("teacher_forced", b + i) for i in range(len(ps))]
        seqs = [list(p) + list(o[:-1]) for p, o in zip(ps, os_)]
        rows, offset = [], 0
        for p, o, s in zip(ps, os_, seqs):
            rows += range(offset + len(p) - 1, offset + len(p) - 1 + len(o))
            offset += len(s)
        dev = runner.device
        ids = torch.tensor([t for s in seqs for t in s], dtype=torch.long, device=dev)
        p = runner.prepare(reqs, [0] * len(seqs), [len(s) for s in seqs], Mode.PREFILL)
        runner.plan(p)
        logits = runner.forward(p, ids, torch.tensor(rows, dtype=torch.long, device=dev))
        if columns is not None:
            logits = logits.gather(1, torch.cat(list(columns[b:b + batch_size])).to(dev))
        logits = logits.float().cpu()
        for r in reqs:
            runner.release(r)
        start = 0
        for o in os_:
            out.append(logits[start:start + len(o)])
            start += len(o)
    return out


def _batches_of(indices, batch_size: int, total: int) -> list[list[int]]:
    """The workload batches (prompt indices, as ``decode`` cut them from 0) that hold any of ``indices``."""
    starts = sorted({i // batch_size * batch_size for i in indices})
    return [list(range(s, min(s + batch_size, total))) for s in starts]


def near_tie(plan: RunPlan) -> tuple[Callable, str]:
    """The job's near-tie rule: (eps_of(row) -> nats, the rule in words), on the target's compute dtype."""
    from attnlab.metrics.parity import describe_near_tie_rule, near_tie_rule

    par, dtype = plan.parity, compute_dtype(plan.precision.target)
    return (near_tie_rule(dtype, par.near_tie_ulps, par.near_tie_eps),
            describe_near_tie_rule(dtype, par.near_tie_ulps, par.near_tie_eps))


def log_divergences(comparison: str, base: str, summary: dict) -> None:
    """One INFO line with the comparison's counts, then one WARNING line per unexplained divergence (request,
    position, tokens and ranks, gap, margin, top-1 logit, eps), so that a run's log alone says what to look at.
    ``base``: what the run was compared with (the run whose logits were read)."""
    from attnlab.metrics.parity import format_unexplained

    odd = [(i, e) for i, e in enumerate(summary["per_request"]) if e is not None and not e.get("near_tie")]
    worst = summary["unexplained_margin_max"]
    detail = f"max margin {worst:.3g} nats; " if worst is not None else ""
    log.info("parity %s: %d divergences, %d near-ties, %d unexplained (%s%s)", comparison, summary["divergences"],
             summary["near_tie"], summary["unexplained"], detail, summary["rule"])
    for i, e in odd:
        log.warning("parity %s: %s", comparison, format_unexplained(i, e, base))


def _diagnose(logits, rerun: list[int], base: list[int], other: list[int],
              eps_of: Callable) -> dict | None:
    """The first divergence of ``other`` from ``base``, with the margin of ``logits`` [len(rerun), V] there
    (``rerun``: the tokens of the pass that recorded them, which must repeat ``base`` up to it), judged with
    eps_of(that row) (near_tie)."""
    from attnlab.metrics.parity import divergence_entry, first_divergence, length_entry, not_reproduced_entry

    d = first_divergence(other, base)
    if d is None:
        return None
    if d >= len(base) or d >= len(other):
        return length_entry(d)
    j = first_divergence(rerun[: d + 1], base[: d + 1])
    if j is not None:
        return not_reproduced_entry(d, j)
    return divergence_entry(logits[d], d, base[d], other[d], eps_of(logits[d]))


def recorded_divergences(pair: Pair, plan: RunPlan, work: Prepared, batches: list[list[int]],
                         against: dict[str, dict[int, list[int]]], desc: str,
                         expect: list[list[int]] | None = None,
                         calibrate: Callable | None = None) -> tuple[dict[int, list[int]], dict[str, dict]]:
    """Decode each batch (indices into work.prompts, one generate call each) through ``pair`` with k = 0 and
    the target's logits recorded; for each query ``name -> {prompt index: another run's tokens}``, diagnose
    that run's first divergence from this decode (or from ``expect[i]``, the timed run this decode repeats).
    Logits are reduced batch by batch: one batch's [tokens, vocab] rows are held at a time (``calibrate(batch,
    decoded)``, where given, reads them first: the rounding probe adds that batch's teacher-forced prefill on the
    device, its LM head's [tokens, vocab] there too, and brings back two columns a row).
    -> ({index: tokens decoded}, {name: {index: entry}})."""
    eps_of, _ = near_tie(plan)
    ids: dict[int, list[int]] = {}
    found: dict[str, dict] = {name: {} for name in against}
    for batch in batches:
        out = decode(pair, plan, work, [work.prompts[i] for i in batch], k=0, record_logits=True, desc=desc)
        if calibrate is not None:
            calibrate(batch, out)
        for i, r in zip(batch, out.requests):
            ids[i] = list(r.output_ids)
            base = expect[i] if expect is not None else ids[i]
            for name, others in against.items():
                if i in others:
                    entry = _diagnose(r.logits, ids[i], base, others[i], eps_of)
                    if entry is not None:
                        found[name][i] = entry
            r.logits = None
    return ids, found


def noise_floor_pass(plan: RunPlan, work: Prepared, pair: Pair, prompts, base_ids: list[list[int]]) -> tuple[dict, list]:
    """Target-only at batch 1 vs the timed target-only run (batch workload.batch_size): -> (the level's
    token parity, batch-1 tokens)."""
    from attnlab.metrics.parity import token_parity

    one = replace(plan, workload=replace(plan.workload, batch_size=1))
    b1 = [r.output_ids for r in decode(pair.target_only(), one, work, prompts, k=0,
                                       desc="noise floor (batch 1)").requests]
    res = {"batch_sizes": [1, plan.workload.batch_size], **token_parity(b1, base_ids)}
    if plan.workload.batch_size == 1:
        res["note"] = "workload.batch_size=1: both runs are at batch 1, this is run-to-run repeatability"
    return res, b1


def _rounding_probe(reference_target: Callable, work: Prepared, changes: list) -> Callable:
    """parity.rounding: a ``calibrate`` for recorded_divergences over the reference's decode. Each batch's decoded
    tokens are prefilled again, teacher-forced, by the same reference runner, and every row's top-2 margin change
    between the two (metrics.parity.margin_changes) is appended to ``changes``: what rounding alone (another pass
    shape; with an fp8 KV, K / V requantized from other hidden states) does to the reference's margins. Only each
    row's top two columns (the decode's) come back from the prefill."""
    from attnlab.metrics.parity import margin_changes

    def calibrate(batch: list[int], out) -> None:
        kept = [(i, r) for i, r in zip(batch, out.requests) if r.logits is not None and len(r.output_ids)]
        if not kept:
            return
        decoded = [r.logits[: len(r.output_ids)] for _, r in kept]  # the rows that chose each output token
        tops = [x.topk(2, dim=-1).indices for x in decoded]
        forced = reference_logits(reference_target(), [work.prompts[i].token_ids for i, _ in kept],
                                  [list(r.output_ids) for _, r in kept], len(kept), columns=tops)
        for x, top, f in zip(decoded, tops, forced):
            changes.append(margin_changes(x.gather(1, top), f))
    return calibrate


def run_parity(plan: RunPlan, work: Prepared, pair: Pair, spec_out, base_out) -> tuple[dict, dict, list[dict]]:
    """-> (parity.json, metrics.json keys, per-request rows). ``spec_out``/``base_out``: the first timed spec
    and target-only runs (``base_out`` None with draft=none)."""
    from attnlab.metrics.parity import (
        acceptance_parity,
        divergence_summary,
        logits_parity,
        mark_rounding,
        rounding_scale,
        token_parity,
    )
    from attnlab.metrics.perf import summarize

    par = plan.parity
    ref = reference_spec(plan, work)
    result: dict = {"reference": {"backend": par.reference, "precision": ref.dtype, "kv_precision": ref.kv_dtype}}
    m: dict = {}
    if par.kernel:
        result["kernel"] = kernel_parity_pass(plan, work)
    prompts = list(work.prompts[: par.max_prompts] if par.max_prompts else work.prompts)
    n, none = len(prompts), plan.draft.kind == "none"
    per_request: list[dict] = [{} for _ in range(n)]
    run_ids = [r.output_ids for r in spec_out.requests[:n]]
    same = reference_is_run(plan)
    ref_target = None

    def reference_target():
        nonlocal ref_target
        if ref_target is None:  # same dtype: share the loaded weights; an fp32 reference loads them again
            share = pair.target if ref.dtype == plan.precision.target else None
            ref_target = build(ref, share_weights_with=share)
        return ref_target

    greedy = plan.spec.temperature == 0
    # the timed target-only run: with draft=none the timed run itself is target-only decoding
    base_all = [r.output_ids for r in (spec_out if none else base_out).requests]
    if par.tokens:
        ref_found: dict = {}
        changes: list = []  # the reference's own margin changes, decode vs teacher-forced (parity.rounding)
        if none:
            vs_base = {"note": "draft=none: the run is target-only decoding; nothing to compare it with"}
        else:
            vs_base = token_parity(run_ids, base_all[:n])
        if same and none:
            vs_ref = {"note": "the run is target-only decoding with the reference backend and precision"}
        elif same:  # the timed target-only run used the reference backend at the reference precision
            vs_ref = {**vs_base, "reference_run": "the timed target-only run"}
        else:  # the reference decode records its logits as it goes: its margins cost no extra pass
            queries = {"ref": dict(enumerate(run_ids))} if greedy else {}
            batches = _batches_of(range(n), plan.workload.batch_size, n)
            # the reference's rounding stands for the run's only at the run's precision (reference_precision=same)
            at_run = (ref.dtype, ref.kv_dtype) == (plan.precision.target, plan.precision.kv_target)
            probe = greedy and par.rounding and at_run
            calibrate = _rounding_probe(reference_target, work, changes) if probe else None
            ref_ids, ref_found = recorded_divergences(target_only(reference_target()), plan, work, batches,
                                                      queries, "reference", calibrate=calibrate)
            vs_ref = token_parity(run_ids, [ref_ids[i] for i in range(n)])
        result["tokens"] = {"greedy": greedy, "vs_target_only": vs_base, "vs_reference": vs_ref}
        noise = None
        if par.noise_floor:
            noise, b1_ids = noise_floor_pass(plan, work, pair, prompts, base_all[:n])
            result["noise_floor"] = noise
            m["parity_noise_floor_token_match"] = noise["match_rate"]
        if not greedy:
            for level in (vs_base, vs_ref, noise or {}):
                if "match_rate" in level:
                    level["divergences"] = {"note": "sampling (spec.temperature > 0): outputs are random, a "
                                                    "mismatch is no divergence to explain"}
        else:
            # the timed target-only batches that hold a divergence, decoded again with their logits recorded
            queries = {}
            if not none:
                queries["base"] = {i: run_ids[i] for i, d in enumerate(vs_base["first_divergence"]) if d is not None}
            if noise is not None:
                queries["noise"] = {i: b1_ids[i] for i, d in enumerate(noise["first_divergence"]) if d is not None}
            wanted = set().union(*queries.values()) if queries else set()
            batches = _batches_of(wanted, plan.workload.batch_size, len(work.prompts))
            _, found = recorded_divergences(pair.target_only(), plan, work, batches, queries,
                                            "target-only again (margins)", expect=base_all)
            found["ref"] = found.get("base", {}) if same else ref_found.get("ref", {})
            _, rule = near_tie(plan)
            scale, srt = rounding_scale(changes)
            if changes:
                result["tokens"]["reference_rounding"] = {
                    **scale, "what": "how far the reference's top-2 margin moved between its own decode and its "
                                     "teacher-forced prefill of the same tokens (nats): rounding alone, at this "
                                     "precision; an unexplained divergence within it is marked within_rounding"}
                m["parity_rounding_margin_change_max"] = scale["margin_change_max"]
            bs = plan.workload.batch_size
            # (name, level, requests.jsonl key, metrics suffix, log label, the run compared with)
            levels = [("base", vs_base, "vs_target_only", "", "vs target-only" + " (= vs reference)" * same,
                       "target-only"),
                      ("ref", vs_ref, "vs_reference", "_ref", "vs reference", "reference")]
            if noise is not None:
                levels.append(("noise", noise, "noise_floor", "_noise_floor", f"noise floor (batch 1 vs {bs})",
                               f"target-only at batch {bs}"))
            for name, level, row_key, suffix, label, against in levels:
                if "match_rate" not in level:
                    continue
                summary = divergence_summary([found.get(name, {}).get(i) for i in range(n)], rule)
                mark_rounding(summary, srt)
                level["divergences"] = summary
                if name == "noise":
                    keys = tuple(f"parity_noise_floor_{x}" for x in ("divergences", "near_tie", "unexplained",
                                                                       "unexplained_margin_max"))
                else:
                    keys = tuple(f"parity_divergences{x}{suffix}"
                                 for x in ("", "_near_tie", "_unexplained", "_unexplained_margin_max"))
                m.update(zip(keys, (summary["divergences"], summary["near_tie"], summary["unexplained"],
                                    summary["unexplained_margin_max"])))
                if srt is not None:
                    m[keys[2] + "_within_rounding"] = summary["unexplained_within_rounding"]
                for i, e in enumerate(summary["per_request"]):
                    if e is not None:
                        per_request[i][f"divergence_{row_key}"] = e
                if not (name == "ref" and same):  # that is the vs target-only comparison, logged once
                    log_divergences(label, against, summary)
            # the rule, not one eps: each entry holds the eps its row was judged with
            m["parity_near_tie_ulps"] = par.near_tie_ulps if par.near_tie_eps is None else None
            m["parity_near_tie_eps"] = par.near_tie_eps
        for key, tp in (("first_divergence_vs_target_only", vs_base), ("first_divergence_vs_reference", vs_ref)):
            for i, d in enumerate(tp.get("first_divergence", ())):  # none where nothing was compared
                per_request[i][key] = d
        m["parity_token_match"] = vs_base.get("match_rate")
        m["parity_token_match_ref"] = vs_ref.get("match_rate")

    recorded = None
    if par.logits and same:
        result["logits"] = {"note": f"verify={plan.verify} at {plan.precision.target} is the reference: nothing to "
                                    f"compare (use another verify backend or parity.reference_precision=fp32)"}
    elif par.logits:
        recorded = decode(pair, plan, work, prompts, record_logits=True, desc="parity (logits)")
        ids = [r.output_ids for r in recorded.requests]
        ref_logits = reference_logits(reference_target(), [p.token_ids for p in prompts], ids,
                                      plan.workload.batch_size)
        result["logits"] = {**logits_parity([r.logits for r in recorded.requests], ref_logits, ids, ids),
                            "reference_run": "teacher-forced on the run's tokens"}
        m["parity_logits_max_abs_err"] = result["logits"]["max_abs_err"]
        m["parity_logits_mean_kl"] = result["logits"]["mean_kl"]
        m["parity_logits_top1_agree"] = result["logits"]["top1_agree"]

    if par.acceptance and plan.k:
        if (plan.backend, plan.verify) == (par.reference, par.reference) and same:
            result["acceptance"] = {"note": "the run is the reference pair"}
        else:
            p = plan.precision
            acc_target = reference_target() if (ref.dtype, ref.kv_dtype) == (p.target, p.kv_target) else None
            acc = build_pair(plan, work, par.reference, par.reference, target=acc_target, graphs=False, tag="_acc",
                             draft_weights=pair.draft_runner)
            acc_out = decode(acc, plan, work, prompts, desc="acceptance ref")
            if n == len(work.prompts):
                run_out = spec_out
            else:  # per-position rates need the iterations of a run over exactly these prompts
                run_out = recorded or decode(pair, plan, work, prompts, desc="parity (acceptance)")
            result["acceptance"] = acceptance_parity(summarize(run_out), summarize(acc_out))
    return result, m, per_request


def kernel_parity_pass(plan: RunPlan, work: Prepared) -> dict:
    """Level 1: each side's backend vs the reference on a random paged case of the run's shapes and dtypes."""
    from attnlab.backends.registry import get_backend_class
    from attnlab.metrics.kernel_parity import kernel_parity

    p, out = plan.precision, {}
    sides = [("verify", plan.verify, work.model_config, p.target, p.kv_target)]
    if plan.draft.runs_attention:  # an EAGLE head has the target's attention shapes
        sides.append(("backend", plan.backend, work.draft_config or work.model_config, p.draft, p.kv_draft))
    longest = max(len(q.token_ids) for q in work.prompts)
    for side, name, mc, dt, kvdt in sides:
        if name == plan.parity.reference:
            out[side] = {"backend": name, "note": "is the reference"}
            continue
        options = plan.options_for("target" if side == "verify" else "draft", name)
        cls = get_backend_class(name, options, f"{side}.options")  # as the run built it
        res = kernel_parity(cls, num_q_heads=mc.num_heads, num_kv_heads=mc.num_kv_heads,
                            head_dim=mc.head_dim, dtype=compute_dtype(dt), kv_dtype=kvdt, page_size=work.page_size,
                            device=plan.device, prompt_len=min(longest, 256), k=plan.k,
                            batch=min(plan.workload.batch_size, 4), seed=plan.seed)
        out[side] = {"backend": name, **res}
    return out
