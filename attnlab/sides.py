"""A job's model sides: the SideSpec of each, the (target, drafter) pair of a backend pair, and decoding a
list of prompts through a pair in batches.

``build_pair`` is the one place that turns the plan's drafter into runners: a new drafter kind is one more
branch there (and in ``spec.drafters.make_drafter``).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from attnlab.engine.build import SideSpec, build_side
from attnlab.plan import TRITON_GEMMS, RunPlan
from attnlab.prepare import Prepared, step
from attnlab.spec.drafters import Drafter, make_drafter


@dataclass
class Pair:
    """A target runner and the drafter that proposes to it (the drafter may hold its own runner)."""

    target: object  # engine.runner.ModelRunner
    drafter: Drafter

    @property
    def draft_runner(self):
        return self.drafter.runner

    def target_only(self) -> Pair:
        """The same target with no drafter: target-only decoding through the same loop and runner."""
        return target_only(self.target)


def target_only(target) -> Pair:
    return Pair(target, make_drafter("none", device=target.device))


def side_spec(plan: RunPlan, work: Prepared, side: str, backend: str, *, graphs: bool = True,
              name: str | None = None) -> SideSpec:
    """The SideSpec of ``side`` ("target" | "draft") with ``backend``. ``graphs=False`` builds a parity
    reference side: no CUDA graphs, never fused, never invariant. engine.invariant makes the run's target side
    invariant (and so fused); the draft side's proposals cannot change the target's output, so it stays as
    configured."""
    p = plan.precision
    draft = side == "draft"
    fast = graphs and plan.engine.cuda_graph
    invariant = graphs and not draft and plan.engine.invariant
    return SideSpec(
        model=plan.draft.model if draft and plan.draft.kind == "model" else plan.model,
        backend=backend,
        dtype=p.draft if draft else p.target,
        kv_dtype=p.kv_draft if draft else p.kv_target,
        page_size=work.page_size, max_context=work.max_context, max_batch=plan.workload.batch_size,
        device=plan.device, name=name or side, num_pages=plan.kv.num_pages,
        layers=work.draft_layers if draft and plan.draft.kind == "self" else None,
        kv_scale=p.kv_scale, fp8_gemm=p.fp8_gemm, fp8_lm_head=draft and p.fp8_lm_head, cuda_graph=fast,
        # graph buffers hold the longest pass: verify k + 1, a tree's topk-wide draft steps (sglang#27338)
        max_q_len=max(plan.k + 1, plan.spec.topk) if fast else 16,
        fused_ops=graphs and plan.engine.fused_ops or invariant, invariant=invariant,
        gemm=plan.engine.gemm if graphs else "cublas",
        decode_steps_per_sync=1 if draft else plan.engine.decode_steps_per_sync,
        backend_options=plan.options_for(side, backend),
    )


def build(spec: SideSpec, share_weights_with=None):
    with step(f"build {spec.name} ({spec.backend}, {spec.dtype}, kv {spec.kv_dtype})"):
        return build_side(spec, share_weights_with=share_weights_with)


def set_process_wide(plan: RunPlan) -> None:
    """The process-wide kernel settings a run's sides are built under (graphs record the launches of their capture):
    PDL (attnlab.kernels.pdl); the GEMM's fp8 mode (``precision.fp8_mma``: f16 takes gemm's ``half``, bf16 its exact one;
    only weight-only e4m3 weights, the draft's, see it); with attnlab's Triton GEMM its split mode and weight
    prefetch."""
    from attnlab.kernels import gemm, pdl

    pdl.set_enabled(plan.engine.pdl, plan.device)
    gemm.set_fp8_mode("half" if plan.precision.fp8_mma == "f16" else gemm.EXACT_FP8_MODE)
    if plan.engine.gemm in TRITON_GEMMS:
        gemm.set_split_mode(plan.engine.gemm_split)
        gemm.set_prefetch(plan.engine.gemm_prefetch)


def build_pair(plan: RunPlan, work: Prepared, verify: str, backend: str, *, target=None, graphs: bool = True,
               tag: str = "", draft_weights=None) -> Pair:
    """(target runner, drafter) for the backend pair (``backend`` drafts, ``verify`` verifies).

    ``target``: reuse a built target runner. ``graphs=False``: parity sides (unfused, no graphs), named with
    ``tag``. ``draft_weights``: a runner whose weights a ``draft=model`` drafter shares (parity pairs reuse the
    run's drafter weights instead of loading them again).
    """
    if graphs:  # parity sides (graphs=False) leave the process-wide settings as the run set them
        set_process_wide(plan)
    if target is None:
        target = build(side_spec(plan, work, "target", verify, graphs=graphs, name="target" + tag))
    kind, runner = plan.draft.kind, None
    spec = side_spec(plan, work, "draft", backend, graphs=graphs, name="draft" + tag)
    if kind == "self":  # the target's weights: a layer subset and/or another precision
        runner = build(spec, share_weights_with=target)
    elif kind == "model":  # its own weights
        runner = build(spec, share_weights_with=draft_weights)
    elif kind == "eagle":  # an EAGLE-3 head on the target's features, embedding and LM head
        from attnlab.engine.eagle_side import build_eagle_side

        with step(f"build {spec.name} (eagle head, {spec.backend}, {spec.dtype})"):
            runner = build_eagle_side(target, plan.draft.head, plan.model.name, spec)
    # ngram and none run no model on the draft side
    return Pair(target, make_drafter(kind, draft_runner=runner, ngram_n=plan.draft.ngram_n, device=target.device))


def reference_spec(plan: RunPlan, work: Prepared) -> SideSpec:
    """The parity reference target: parity.reference (torch) at the run's precision or fp32, unfused."""
    ref = plan.parity
    dtype, kv = ((plan.precision.target, plan.precision.kv_target) if ref.reference_precision == "same"
                 else ("fp32", "fp32"))
    return replace(side_spec(plan, work, "target", ref.reference, graphs=False, name="reference"), dtype=dtype,
                   kv_dtype=kv)


def decode(pair: Pair, plan: RunPlan, work: Prepared, prompts, *, k: int | None = None,
           record_logits: bool = False, max_new_tokens: int | None = None, eos_ids=None, seed: int | None = None,
           desc: str = "workload", on_batch=None):
    """Run ``prompts`` through the pair in batches of workload.batch_size; one merged GenerateOutput.

    Budgets: ``max_new_tokens`` for every prompt when given, else each prompt's own (``Prompt.max_new_tokens``,
    workload.output_len=recorded) or workload.max_new_tokens.
    Each batch is one ``generate`` call, timed inside it (wall_s); the progress bar moves between batches,
    outside the timed span. ``on_batch(prompts, output)``: told of each finished batch (the workload pass
    whose requests an interrupt keeps, attnlab.lifecycle).
    """
    from tqdm.auto import tqdm

    from attnlab.metrics.perf import merge_outputs
    from attnlab.spec.decoder import SpecParams, SpeculativeDecoder

    s, w = plan.spec, plan.workload
    tree = s.topk > 1 and k in (None, plan.k)  # another k (e.g. 0, target-only) decodes without a tree
    params = SpecParams(plan.k if k is None else k, s.topk if tree else 1, s.temperature, s.top_k, s.top_p,
                        s.num_steps if tree else None)
    dec = SpeculativeDecoder(pair.target, pair.drafter, params, seed=plan.seed if seed is None else seed)
    new = w.max_new_tokens if max_new_tokens is None else max_new_tokens
    eos = work.eos_ids if eos_ids is None else eos_ids
    outs = []
    with tqdm(total=len(prompts), desc=desc, unit="prompt", leave=False, disable=None) as bar:
        for i in range(0, len(prompts), w.batch_size):
            chunk = prompts[i:i + w.batch_size]
            batch = [p.token_ids for p in chunk]
            # one budget per prompt where the workload recorded them (workload.output_len=recorded)
            budget = new if max_new_tokens is not None else [p.max_new_tokens or new for p in chunk]
            outs.append(dec.generate(batch, budget, eos, record_logits=record_logits))
            bar.update(len(batch))
            if on_batch is not None:
                on_batch(prompts[i:i + w.batch_size], outs[-1])
    return merge_outputs(outs)
