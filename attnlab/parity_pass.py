"""The parity passes of one job (DESIGN.md levels 1-4) and the target-only baseline behind the speedup.

Functions of a prepared ``SpecJob`` (attnlab.job): they build the reference sides and decode through it.
"""

from __future__ import annotations

from types import SimpleNamespace

from attnlab.config import compute_dtype
from attnlab.spec.drafters import make_drafter


def _subset(out, n: int):
    """The first n requests of a GenerateOutput, for summaries over the parity prompts only."""
    return SimpleNamespace(requests=out.requests[:n], iterations=[], wall_s=out.wall_s,
                           num_draft_tokens=out.num_draft_tokens)


def run_parity(job, target, out, m: dict) -> tuple[dict, list[dict]]:
    """Levels 1-4 of DESIGN.md, plus the target-only baseline behind speedup_vs_target_only.

    The reference is target-only decoding with the torch backend at the run's precision (or fp32, per
    parity.reference_precision). It doubles as the baseline when the run's verify side is exactly that
    (torch, same precision); otherwise the baseline is a target-only pass with the run's verify backend.
    """
    from attnlab.metrics.parity import acceptance_parity, logits_parity, token_parity
    from attnlab.metrics.perf import summarize

    cfg, par, prec = job.cfg, job.cfg.parity, job.prec
    ref_prec, ref_kv = ((prec["target"], prec["kv_target"]) if par.reference_precision == "same"
                        else ("fp32", "fp32"))
    result: dict = {"reference": {"backend": par.reference, "precision": ref_prec, "kv_precision": ref_kv}}
    if par.kernel:
        result["kernel"] = kernel_parity_pass(job)
    prompts = job._parity_prompts()
    n = len(prompts)
    run_ids = [r.output_ids for r in out.requests[:n]]
    per_request: list[dict] = [{} for _ in range(n)]
    none = make_drafter("none", device=target.device)

    same_as_run = (cfg.verify.name, prec["target"], prec["kv_target"]) == (par.reference, ref_prec, ref_kv)
    ref_target = ref_out = None
    if par.tokens or par.logits or par.acceptance:
        if same_as_run:
            ref_target = target
        else:  # same dtype: share the loaded weights; fp32 reference: load again in fp32
            share = target if ref_prec == prec["target"] else None
            ref_target = job.build(cfg.model, par.reference, ref_prec, ref_kv, "reference",
                                    share_weights_with=share, graphs=False)
    if par.tokens or par.logits:
        ref_out = job.decode(ref_target, none, prompts, k=0, record_logits=par.logits, desc="reference")

    base_out = None
    if cfg.draft.kind != "none":
        if same_as_run and ref_out is not None and n == len(job.prompts):
            base_out = ref_out
        else:
            base_out = job.decode(target, none, job.prompts, k=0, desc="target-only")
        base_tps = summarize(base_out)["output_tokens_per_s"]
        m["target_only_tokens_per_s"] = base_tps
        m["speedup_vs_target_only"] = m["output_tokens_per_s"] / base_tps if base_tps else None

    if par.tokens:
        ref_ids = [r.output_ids for r in ref_out.requests]
        base_ids = [r.output_ids for r in base_out.requests[:n]] if base_out is not None else run_ids
        vs_base, vs_ref = token_parity(run_ids, base_ids), token_parity(run_ids, ref_ids)
        result["tokens"] = {"greedy": cfg.spec.temperature == 0, "vs_target_only": vs_base,
                            "vs_reference": vs_ref}
        for i in range(n):
            per_request[i]["first_divergence_vs_target_only"] = vs_base["first_divergence"][i]
            per_request[i]["first_divergence_vs_reference"] = vs_ref["first_divergence"][i]
        m["parity_token_match"] = vs_base["match_rate"]
        m["parity_token_match_ref"] = vs_ref["match_rate"]
    if par.logits:
        result["logits"] = logits_parity([r.logits for r in out.requests[:n]],
                                         [r.logits for r in ref_out.requests], run_ids,
                                         [r.output_ids for r in ref_out.requests])
        m["parity_logits_max_abs_err"] = result["logits"]["max_abs_err"]
        m["parity_logits_mean_kl"] = result["logits"]["mean_kl"]
        m["parity_logits_top1_agree"] = result["logits"]["top1_agree"]
    if par.acceptance and job.k:
        if (cfg.backend.name, cfg.verify.name) == (par.reference, par.reference) and same_as_run:
            result["acceptance"] = {"note": "the run is the reference pair"}
        else:
            acc_target = ref_target if ref_prec == prec["target"] and ref_kv == prec["kv_target"] else None
            t2, d2 = job.build_pair(par.reference, par.reference, acc_target, tag="_acc")
            acc_out = job.decode(t2, d2, prompts, desc="acceptance ref")
            run_m = summarize(out) if n == len(job.prompts) else summarize(_subset(out, n))
            result["acceptance"] = acceptance_parity(run_m, summarize(acc_out))
    return result, per_request

def kernel_parity_pass(job) -> dict:
    from attnlab.backends.registry import get_backend_class
    from attnlab.metrics.kernel_parity import kernel_parity

    cfg, out = job.cfg, {}
    sides = [("verify", cfg.verify.name, job.mcfg, job.prec["target"], job.prec["kv_target"])]
    if cfg.draft.kind in ("self", "model", "eagle"):  # an EAGLE head has the target's attention shapes
        dm = job.dcfg or job.mcfg
        sides.append(("backend", cfg.backend.name, dm, job.prec["draft"], job.prec["kv_draft"]))
    longest = max(len(p.token_ids) for p in job.prompts)
    for side, name, mc, dt, kvdt in sides:
        if name == cfg.parity.reference:
            out[side] = {"backend": name, "note": "is the reference"}
            continue
        cls = get_backend_class(name, cfg[side].get("options"), f"{side}.options")  # as the run built it
        res = kernel_parity(cls, num_q_heads=mc.num_heads, num_kv_heads=mc.num_kv_heads,
                            head_dim=mc.head_dim, dtype=compute_dtype(dt), kv_dtype=kvdt,
                            page_size=job.page_size,
                            device=job.device, prompt_len=min(longest, 256), k=job.k,
                            batch=min(cfg.workload.batch_size, 4), seed=cfg.seed)
        out[side] = {"backend": name, **res}
    return out
