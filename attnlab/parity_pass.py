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
"""

from __future__ import annotations

import logging

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


def reference_logits(runner, prompts: list[list[int]], outputs: list[list[int]], batch_size: int) -> list:
    """Teacher forcing: the logits ``runner`` gives each output token of each request, from one prefill of
    prompt + output[:-1] per batch (only the output rows go through the LM head). -> [len(output), V] fp32 CPU."""
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
        logits = runner.forward(p, ids, torch.tensor(rows, dtype=torch.long, device=dev)).float().cpu()
        for r in reqs:
            runner.release(r)
        start = 0
        for o in os_:
            out.append(logits[start:start + len(o)])
            start += len(o)
    return out


def run_parity(plan: RunPlan, work: Prepared, pair: Pair, spec_out, base_out) -> tuple[dict, dict, list[dict]]:
    """-> (parity.json, metrics.json keys, per-request rows). ``spec_out``/``base_out``: the first timed spec
    and target-only runs (``base_out`` None with draft=none)."""
    from attnlab.metrics.parity import acceptance_parity, logits_parity, token_parity
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

    if par.tokens:
        if none:
            vs_base = {"note": "draft=none: the run is target-only decoding; nothing to compare it with"}
        else:
            vs_base = token_parity(run_ids, [r.output_ids for r in base_out.requests[:n]])
        if same and none:
            vs_ref = {"note": "the run is target-only decoding with the reference backend and precision"}
        elif same:  # the timed target-only run used the reference backend at the reference precision
            vs_ref = {**vs_base, "reference_run": "the timed target-only run"}
        else:
            ref_out = decode(target_only(reference_target()), plan, work, prompts, k=0, desc="reference")
            vs_ref = token_parity(run_ids, [r.output_ids for r in ref_out.requests])
        result["tokens"] = {"greedy": plan.spec.temperature == 0, "vs_target_only": vs_base, "vs_reference": vs_ref}
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
