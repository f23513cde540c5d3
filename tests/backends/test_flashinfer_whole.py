"""flashinfer's verify_split_kv=auto (CPU, through the fake module): an fa2 verify / extend plans without split-KV
where the rule says the split does not pay, and in CUDA-graph mode each choice is a plan variant with its own wrapper
(and its own graph in the engine: tests/engine/test_graph_variants.py, tests/integration/test_gpu_engine.py)."""

import pytest
import torch

from attnlab.backends.base import Mode
from attnlab.backends.flashinfer import NOMINAL_SMS, verify_whole_kv
from attnlab.backends.hybrid import HybridBackend, HybridSpec
from attnlab.backends.triton import TritonBackend
from tests.backends.test_flashinfer import backend as fi_backend
from tests.backends.test_flashinfer import cpu_case, meta_over, reference, run_all_layers

AUTO = {"verify_split_kv": "auto"}


def backend(case, **kw):
    return fi_backend(case, **{**AUTO, **kw})

# (model, batch, context, time without split-KV / time with it), bench.kernels on an H200, bf16, page 16, k = 4,
# 50 runs a CUDA-graph replay, both plans in one process: experiments/h200-2026-12-04g/results/split1.md (contexts
# 512-2048) and experiments/h200-2026-12-04/results/fi9.md (4096). The rule was fitted on the first 24.
MEASURED = [
    ("smollm2", 1, 512, 0.88), ("smollm2", 1, 1024, 1.10), ("smollm2", 1, 2048, 1.68),
    ("smollm2", 4, 512, 0.80), ("smollm2", 4, 1024, 1.09), ("smollm2", 4, 2048, 1.95),
    ("smollm2", 16, 512, 0.84), ("smollm2", 16, 1024, 1.09), ("smollm2", 16, 2048, 1.34),
    ("smollm2", 64, 512, 0.81), ("smollm2", 64, 1024, 0.85), ("smollm2", 64, 2048, 0.90),
    ("llama8b", 1, 512, 1.76), ("llama8b", 1, 1024, 2.97), ("llama8b", 1, 2048, 4.57),
    ("llama8b", 4, 512, 1.46), ("llama8b", 4, 1024, 2.20), ("llama8b", 4, 2048, 3.04),
    ("llama8b", 16, 512, 0.87), ("llama8b", 16, 1024, 1.07), ("llama8b", 16, 2048, 1.29),
    ("llama8b", 64, 512, 0.87), ("llama8b", 64, 1024, 0.92), ("llama8b", 64, 2048, 0.95),
    ("smollm2", 1, 4096, 3.24), ("smollm2", 16, 4096, 1.58), ("llama8b", 1, 4096, 7.89), ("llama8b", 16, 4096, 1.51),
]
HEADS = {"smollm2": (9, 3, 64), "llama8b": (32, 8, 128)}  # q heads, kv heads, head dim


@pytest.mark.parametrize("model,batch,context,ratio", MEASURED)
def test_the_rule_picks_the_faster_plan_in_every_measured_cell(model, batch, context, ratio):
    hq, hkv, d = HEADS[model]
    whole = verify_whole_kv(context, d, batch, hkv, 5, hq // hkv, NOMINAL_SMS)
    assert whole == (ratio < 1.0), f"{model} batch {batch} x {context}: without split-KV at {ratio}x of the split"


def test_the_rule_is_monotone_in_length_and_grid():
    """Longer KV never turns a split pass whole; more programs never turn a whole pass split."""
    for d, hkv, group in ((64, 3, 3), (128, 8, 4)):
        for batch in (1, 2, 4, 8, 16, 32, 64, 128):
            picks = [verify_whole_kv(n, d, batch, hkv, 5, group, 132) for n in range(16, 8192, 16)]
            assert picks == sorted(picks, reverse=True), (d, batch)
        for n in (256, 512, 1024, 4096):
            picks = [verify_whole_kv(n, d, b, hkv, 5, group, 132) for b in range(1, 257)]
            assert picks == sorted(picks), (d, n)


def test_eager_auto_plans_short_verify_whole_and_long_verify_split(fake_fi):
    """Without graphs the rule picks per pass, on one wrapper; both kinds of plan attend the reference; the split
    choice shows in kernel_info."""
    case = cpu_case([5, 5], [900, 40], gqa=3)  # 2 kv heads, head_dim 64: whole up to 768 tokens at this grid
    be = backend(case)
    g = torch.Generator().manual_seed(3)
    for kv_lens, whole in (([900, 40], False), ([700, 40], True), ([769, 12], False)):
        meta = meta_over(case, kv_lens, [5, 5])
        be.plan(meta)
        plan = be.active_plan
        assert plan.wrapper.plans[-1]["disable_split_kv"] is whole and plan.variant is None, kv_lens
        q = torch.randn(10, case.num_q_heads, case.head_dim, generator=g).bfloat16()
        torch.testing.assert_close(run_all_layers(be, case, q), reference(case, meta, q), atol=2e-2, rtol=2e-2)
    assert be.kernel_info() == {"verify": "fa2+fa2:whole"}


def test_graph_mode_variants_have_their_own_wrappers_and_keep_their_plans(fake_fi):
    """cuda_graph=True: a verify bucket's plans are the variants "split" and "whole", each on its own wrapper (a
    graph captured over one never replays the other's launches); a whole plan is kept whatever the page counts (its
    schedule is one per rows and q_len); a forced variant overrides the rule; decode passes have one variant."""
    case = cpu_case([5, 5], [900, 400], gqa=3)  # page tables for every pass below
    be = backend(case, cuda_graph=True, max_batch_size=2, max_context=1024)
    assert be.graph_variants(5, False) == ("split", "whole")
    assert be.graph_variants(1, False) == be.graph_variants(5, True) == (None,)  # decode; tree masks keep the split
    g = torch.Generator().manual_seed(4)
    wrappers = {}
    for kv_lens, variant in (([700, 40], "whole"), ([900, 40], "split"), ([300, 17], "whole"), ([760, 400], "whole")):
        meta = meta_over(case, kv_lens, [5, 5])
        be.plan(meta)
        assert be.slot_variant(0) == variant, kv_lens
        wrappers.setdefault(variant, set()).add(id(be.active_plan.wrapper))
        q = torch.randn(10, case.num_q_heads, case.head_dim, generator=g).bfloat16()
        torch.testing.assert_close(run_all_layers(be, case, q), reference(case, meta, q), atol=2e-2, rtol=2e-2)
    assert len(wrappers["whole"]) == 1 and wrappers["whole"].isdisjoint(wrappers["split"])
    assert be.plan_counts() == (2, 2)  # the whole wrapper planned once, then kept for other page counts
    with be.forcing("split"):  # a capture of the split graph over short dummy lengths
        be.plan(meta_over(case, [40, 30], [5, 5]))
    assert be.slot_variant(0) == "split" and be.kernel_info() == {"verify": "fa2+fa2:whole"}  # forced: unrecorded
    be.plan(meta_over(case, [12, 40], [1, 1]))
    assert be.slot_variant(0) is None


def test_auto_leaves_prefills_and_single_token_passes_to_flashinfer(fake_fi):
    """The rule was fitted on verify passes: a short uniform prefill (fa2 below prefill_min_q_len) and a q_len-1
    verify-mode pass keep FlashInfer's own plan (split-KV allowed), eager or graph mode."""
    case = cpu_case([5, 5], [400, 400], gqa=3)
    for kw in ({}, {"cuda_graph": True, "max_batch_size": 2, "max_context": 1024}):
        be = backend(case, **kw)
        for meta in (meta_over(case, [40, 30], [40, 30], mode=Mode.PREFILL),
                     meta_over(case, [64, 64], [64, 64], mode=Mode.PREFILL),
                     meta_over(case, [40, 30], [1, 1], mode=Mode.VERIFY)):
            be.plan(meta)
            plans = be.active_plan.wrapper.plans
            assert not plans[-1].get("disable_split_kv", False), (kw, meta.q_lens, meta.mode)
            assert be.slot_variant(0) is None


@pytest.mark.parametrize("split", [True, False])
def test_a_fixed_choice_has_one_variant(fake_fi, split):
    case = cpu_case([5, 5], [900, 40], gqa=3)
    be = backend(case, cuda_graph=True, max_batch_size=2, verify_split_kv=split)
    assert be.graph_variants(5, False) == (None,)
    for kv_lens in ([900, 40], [40, 30]):
        be.plan(meta_over(case, kv_lens, [5, 5]))
        assert be.slot_variant(0) is None and be.active_plan.wrapper.plans[-1]["disable_split_kv"] is not split


def test_hybrid_variants_are_its_sides_alone_and_their_pairs(fake_fi):
    """A graph-mode hybrid's variants: (side, flashinfer's, triton's): "both" for each pair, a graph each, and "short"
    / "long" for a batch routed one way, which that side plans alone. Forcing a variant forces each side and the
    routing; a bucket's padding (kv_len = q_len) goes with the real requests; plans ahead (plan_steps) and eager
    plans are as before; a slot planned ahead has the "both" variants only."""
    from attnlab.backends.flashinfer import FlashInferBackend
    from attnlab.backends.registry import bind_options

    fi = bind_options(FlashInferBackend, {**AUTO, "workspace_bytes": 1 << 16})
    cls = HybridBackend.with_classes(HybridSpec("flashinfer", "triton", 256), fi, TritonBackend)
    case = cpu_case([5, 5], [900, 900], gqa=3)  # page tables for 900 tokens each; the passes use fewer
    be = cls(case.pool, case.num_q_heads, case.num_kv_heads, case.head_dim, case.scale, torch.bfloat16,
             cuda_graph=True, max_batch_size=2, max_q_len=8, max_context=1024)
    assert be.graph_variants(5, False) == (("both", "split", None), ("both", "whole", None), ("short", "split", None),
                                           ("short", "whole", None), ("long", None, None))
    assert be.graph_variants(5, True) == (None,)
    assert be.graph_variants(1, False) == (("both", None, None), ("short", None, None), ("long", None, None))
    be.plan(meta_over(case, [900, 40], [5, 5]))  # flashinfer holds request 1 (40 tokens) and a dummy: whole
    assert be.slot_variant(0) == ("both", "whole", None) and len(be.active_plan.routes) == 2
    with be.forcing(("both", "split", None)):
        be.plan(meta_over(case, [900, 40], [5, 5]))
        assert be.short.forced_variant == "split"
    assert be.slot_variant(0) == ("both", "split", None) and be.short.forced_variant is None
    for kv_lens, variant in (([900, 300], ("long", None, None)), ([900, 5], ("long", None, None)),  # 5: padding
                             ([40, 5], ("short", "whole", None)), ([5, 5], ("short", "whole", None))):
        be.plan(meta_over(case, kv_lens, [5, 5]))
        (route,) = be.active_plan.routes
        assert be.slot_variant(0) == variant and route.backend is (be.long if variant[0] == "long" else be.short)
        assert be.active_plan.select_long is None
    with be.forcing(("long", None, None)):  # a capture's forced side, whatever the lengths
        be.plan(meta_over(case, [40, 5], [5, 5]))
    assert be.slot_variant(0) == ("long", None, None)
    with pytest.raises(ValueError, match="hybrid: update_mask on a graph-mode plan"):
        be.write_mask(be.active_plan, torch.ones(10, dtype=torch.bool))
    assert be.graph_variants(5, False, 2, slot=1) == (("both", "split", None), ("both", "whole", None))
    be.plan_steps([meta_over(case, [900, 300], [5, 5])])  # ahead: "both" serves any routing
    assert be.plan_variant(be._slots[1])[0] == "both"
    eager = cls(case.pool, case.num_q_heads, case.num_kv_heads, case.head_dim, case.scale, torch.bfloat16)
    eager.plan(meta_over(case, [900, 40], [5, 5], mode=Mode.VERIFY))
    assert eager.graph_variants(5, False) == (None,) and eager.slot_variant(0) is None


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("gqa,head_dim", [(3, 64), (4, 128)])
def test_gpu_both_plans_attend_the_reference(gqa, head_dim):
    """The real FlashInfer, graph-mode wrappers, verify_split_kv=auto: passes the rule plans whole (disable_split_kv:
    one chunk a request, no merge; kept for other page counts) and split, in turn, each equal to the reference."""
    from attnlab.backends.flashinfer import FlashInferBackend
    from tests.backends.cases import GPU_TOL, make_case

    if why := FlashInferBackend.available():
        pytest.skip(why)
    case = make_case(kv_lens=[1500, 1500, 1500], q_lens=[5] * 3, page_size=16, num_kv_heads=2, gqa=gqa,
                     head_dim=head_dim, dtype=torch.bfloat16, device="cuda", num_layers=2, mode=Mode.VERIFY)
    be = FlashInferBackend(case.pool, case.num_q_heads, case.num_kv_heads, case.head_dim, case.scale,
                           torch.bfloat16, cuda_graph=True, max_batch_size=3, max_context=2048, **AUTO)
    g = torch.Generator(device="cuda").manual_seed(gqa)
    seen = []
    for kv_lens in ([100, 7, 300], [1500, 20, 900], [250, 240, 9], [60, 1200, 33]):
        meta = meta_over(case, kv_lens, [5] * 3)
        be.plan(meta)
        seen.append(be.slot_variant(0))
        q = torch.randn(15, case.num_q_heads, case.head_dim, device="cuda", generator=g).bfloat16()
        tol = GPU_TOL[torch.bfloat16]
        torch.testing.assert_close(run_all_layers(be, case, q), reference(case, meta, q), atol=tol, rtol=tol)
    whole = 48 * 1024 // head_dim  # tokens: these grids stay below the rule's knee
    assert seen == ["whole" if max(k) <= whole else "split" for k in
                    ([100, 7, 300], [1500, 20, 900], [250, 240, 9], [60, 1200, 33])]
    assert "whole" in seen and "split" in seen and be.plans_kept >= 1
