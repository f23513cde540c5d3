"""The engine's graph per plan variant, on CPU: flashinfer (the fake module) with verify_split_kv=auto and a stand-in
for CUDA graphs that keeps their contract (a replay runs the launches of its capture, i.e. the wrapper its capture's
plan used, on the current contents of the static buffers). A verify bucket is captured once per variant, and each
pass replays the graph of the variant its plan took; replaying the other one would run a stale plan (the fake kernel
asserts its chunks cover the lengths)."""

from __future__ import annotations

import pytest
import torch

from attnlab.backends.base import Mode
from attnlab.backends.flashinfer import FlashInferBackend
from attnlab.engine import graphs as graphs_mod
from attnlab.engine.graphs import GraphCache
from attnlab.engine.runner import ModelRunner
from attnlab.kvcache import KVPool, PageAllocator
from tests.backends.fakes import FakeDecode, FakePrefill
from tests.spec.tiny import tiny_config, tiny_model

CFG = tiny_config(vocab=64, layers=2, heads=6, kv_heads=2, head_dim=64, hidden=96)
BUCKET, K1 = 4, 5  # a bucket of 4 requests, verify passes of 5 tokens


def _baked(plan) -> list:
    """What a real graph bakes into its launches from each FlashInfer plan it ran (the fake's plan info): a prefill
    plan's grid (padded work count), query tile and whether the kernel splits the KV and a merge follows; a CUDA-core
    decode plan's (the verify as decode rows) padded batch and split."""
    routes = getattr(plan, "routes", None)
    plans = [r.plan for r in routes] if routes is not None else [plan]
    return [_launch(getattr(p.wrapper, "_plan_info", None), p.wrapper) for p in plans]


def _launch(info, wrapper):
    if isinstance(wrapper, FakePrefill) and info is not None and len(info) == 15:
        return info[0], info[3], info[14]
    if isinstance(wrapper, FakeDecode) and info is not None and len(info) == 10:
        return info[0], info[9]
    return None


class GraphStandIn:
    """What a captured graph replays: the pass ``fn`` computed, on the plan active at capture (the launches it
    recorded), into the outputs of the capture. A replay whose wrapper now holds a plan with other launches (grid,
    tile, split and merge) than the capture's fails: a real graph would run the capture's launches over it."""

    def __init__(self, fn, backend, outputs):
        self.fn, self.backend, self.plan, self.outputs = fn, backend, backend.active_plan, outputs
        self.baked = _baked(self.plan)
        self.replays = 0

    def replay(self):
        assert _baked(self.plan) == self.baked, "the capture's launches no longer match its wrapper's plan"
        active, self.backend._plan = self.backend._plan, self.plan
        try:
            for mine, new in zip(self.outputs, self.fn()):
                if mine is not None:
                    mine.copy_(new)
        finally:
            self.backend._plan = active
        self.replays += 1


@pytest.fixture
def stand_in_graphs(monkeypatch):
    made = []

    def record(self, fn):
        out = fn()
        made.append(GraphStandIn(fn, self.runner.backend, out))
        return made[-1], out

    monkeypatch.setattr(GraphCache, "record", record)
    monkeypatch.setattr(graphs_mod.torch.cuda, "graph_pool_handle", lambda: "pool")
    return made


def fi_runner(max_context=1024, **options) -> ModelRunner:
    pages = BUCKET * -(-max_context // 16)
    pool = KVPool(CFG.num_layers, pages, 16, CFG.num_kv_heads, CFG.head_dim, torch.bfloat16, "cpu")
    be = FlashInferBackend(pool, CFG.num_heads, CFG.num_kv_heads, CFG.head_dim, CFG.head_dim ** -0.5,
                           torch.bfloat16, cuda_graph=True, max_batch_size=BUCKET, max_context=max_context,
                           workspace_bytes=1 << 16, **options)
    r = ModelRunner(tiny_model(CFG, seed=0, dtype=torch.bfloat16), CFG, None, pool, PageAllocator(pages, 16), be,
                    max_context, "target", max_batch=BUCKET)
    r.graph_argmax = False
    return r


def hybrid_runner(threshold: int, max_context=1024, bucket=BUCKET, **options) -> ModelRunner:
    """flashinfer (auto, and ``options``) on both sides of a hybrid routing by ``threshold`` tokens, graph mode, up
    to ``bucket`` requests."""
    from attnlab.backends.hybrid import HybridBackend, HybridSpec
    from attnlab.backends.registry import bind_options

    fi = bind_options(FlashInferBackend, {"verify_split_kv": "auto", "workspace_bytes": 1 << 16, **options})
    cls = HybridBackend.with_classes(HybridSpec("flashinfer", "flashinfer", threshold), fi, fi)
    pages = bucket * -(-max_context // 16)
    pool = KVPool(CFG.num_layers, pages, 16, CFG.num_kv_heads, CFG.head_dim, torch.bfloat16, "cpu")
    be = cls(pool, CFG.num_heads, CFG.num_kv_heads, CFG.head_dim, CFG.head_dim ** -0.5, torch.bfloat16,
             cuda_graph=True, max_batch_size=bucket, max_q_len=8, max_context=max_context)
    r = ModelRunner(tiny_model(CFG, seed=0, dtype=torch.bfloat16), CFG, None, pool, PageAllocator(pages, 16), be,
                    max_context, "target", max_batch=bucket)
    r.graph_argmax = False
    return r


def verify_logits(r: ModelRunner, ctx, g: torch.Generator) -> torch.Tensor:
    """Prefill 3 requests to ``ctx`` tokens (one length, or one per request), then one verify pass of K1 tokens each:
    its logits."""
    reqs = [0, 1, 2]
    ctx = [ctx] * 3 if isinstance(ctx, int) else list(ctx)
    ids = torch.randint(0, CFG.vocab_size, (sum(ctx),), generator=g)
    r.run(reqs, [0] * 3, ctx, ids, Mode.PREFILL)
    p = r.prepare(reqs, ctx, [K1] * 3, Mode.VERIFY)
    r.plan(p)
    out = r.forward(p, torch.randint(0, CFG.vocab_size, (3 * K1,), generator=g)).clone()
    for req in reqs:
        r.release(req)
    return out


def test_each_pass_replays_the_graph_of_its_plans_variant(fake_fi, stand_in_graphs):
    """Whole (short KV) and split (long KV) passes in turn: each replays its own variant's graph, and its logits are
    those of an eager runner over the same passes (the stand-in runs the same fake kernels: exact)."""
    graphed, eager = fi_runner(verify_split_kv="auto"), fi_runner(verify_split_kv="auto")
    graphed.graphs = GraphCache(graphed)
    assert graphed.graphs.capture([BUCKET], [K1], range(1)) == 2
    by_variant = {key[5]: g for key, g in graphed.graphs.graphs.items()}
    assert set(by_variant) == {"split", "whole"}
    # the capture planned each variant whatever the dummy lengths said, and recorded neither as a pass's kernel
    assert by_variant["split"].graph.plan.variant == "split" and graphed.backend.kernel_info() == {}
    whole_tokens = 48 * 1024 // CFG.head_dim  # 768: this grid stays below the rule's knee
    seen = []
    for i, ctx in enumerate((100, 900, 400, 1000, 40)):
        got, want = (verify_logits(r, ctx, torch.Generator().manual_seed(i)) for r in (graphed, eager))
        variant = graphed.backend.slot_variant(0)
        seen.append(variant)
        assert variant == ("whole" if ctx + K1 <= whole_tokens else "split")
        torch.testing.assert_close(got, want, atol=0, rtol=0)
    replays = {v: g.graph.replays for v, g in by_variant.items()}
    assert seen == ["whole", "split", "whole", "split", "whole"] and replays == {"whole": 3, "split": 2}
    assert graphed.backend.kernel_info()["verify"] == "fa2+fa2:whole"


def test_replaying_the_other_variant_would_run_a_stale_plan(fake_fi, stand_in_graphs):
    """Why the key holds the variant: the split graph, replayed for a pass planned whole, runs the split wrapper's
    plan of its capture (the dummies' lengths), which the fake kernel refuses."""
    r = fi_runner(verify_split_kv="auto")
    r.graphs = GraphCache(r)
    r.graphs.capture([BUCKET], [K1], range(1))
    g = torch.Generator().manual_seed(0)
    verify_logits(r, 700, g)  # whole: fine (700 tokens, where the split capture's chunks cover 128)
    split_graph = r.graphs.graphs[(BUCKET, K1, 0, None, False, "split")]
    with pytest.raises(AssertionError, match="cover fewer"):
        split_graph.graph.replay()


@pytest.mark.parametrize("split", [True, False])
def test_a_fixed_choice_captures_one_graph(fake_fi, stand_in_graphs, split):
    r = fi_runner(verify_split_kv=split)
    r.graphs = GraphCache(r)
    assert r.graphs.capture([BUCKET], [1, K1], range(1)) == 2
    assert {key[5] for key in r.graphs.graphs} == {None}
    verify_logits(r, 300, torch.Generator().manual_seed(1))
    assert r.graphs.graphs[(BUCKET, K1, 0, None, False, None)].graph.replays == 1


def test_a_capture_whose_plan_ignores_the_forced_variant_fails_loudly(fake_fi, stand_in_graphs, monkeypatch):
    r = fi_runner(verify_split_kv="auto")
    monkeypatch.setattr(type(r.backend), "forcing", lambda self, v: torch.no_grad())  # a backend that ignores it
    r.graphs = GraphCache(r)
    with pytest.raises(RuntimeError, match="forced plan variant 'split'"):
        r.graphs.capture([BUCKET], [K1], range(1))


def test_a_hybrid_replays_the_graph_of_its_sides_pair(fake_fi, stand_in_graphs):
    """flashinfer (auto) on both sides of a hybrid, graph mode: a verify bucket gets a graph per pair of variants
    ("both") and per variant of each side alone ("short", "long"); each pass replays the one it planned (mixed: the
    short side over its own requests and the long side's as dummies, and the other way round; one way: that side
    alone, the bucket's padding request with it), with an eager hybrid's exact logits."""
    passes = (([100, 900, 100], ("both", "whole", "split")), ([600, 600, 100], ("both", "whole", "whole")),
              ([900, 40, 1000], ("both", "whole", "split")), ([900, 400, 1000], ("long", None, "split")),
              ([100, 40, 200], ("short", "whole", None)))
    graphs = replay_hybrid_passes(8, passes)
    sides = ("split", "whole")
    assert set(graphs) == ({("both", a, b) for a in sides for b in sides} | {("short", a, None) for a in sides}
                           | {("long", None, b) for b in sides})
    assert {v: g.replays for v, g in graphs.items() if g.replays} == {
        ("both", "whole", "split"): 2, ("both", "whole", "whole"): 1, ("long", None, "split"): 1,
        ("short", "whole", None): 1}


def replay_hybrid_passes(n_graphs: int, passes, **options) -> dict:
    """A graphed hybrid (threshold 300, flashinfer with ``options`` on both sides) captures ``n_graphs`` verify graphs,
    then runs ``passes`` ((contexts, the pair of variants its sides must plan)) beside an eager hybrid (the same
    sides' classes, planned per sub-batch): each replay equals the eager logits exactly. -> the graphs by pair."""
    graphed, eager = hybrid_runner(300, **options), hybrid_runner(300, **options)
    eager.backend.cuda_graph = False
    graphed.graphs = GraphCache(graphed)
    assert graphed.graphs.capture([BUCKET], [K1], range(1)) == n_graphs
    for i, (ctx, pair) in enumerate(passes):
        got, want = (verify_logits(r, ctx, torch.Generator().manual_seed(i)) for r in (graphed, eager))
        assert graphed.backend.slot_variant(0) == pair, ctx
        torch.testing.assert_close(got, want, atol=0, rtol=0)
    return {key[5]: g.graph for key, g in graphed.graphs.graphs.items()}


def test_auto_rows_are_a_third_graph_replayed_where_the_batch_k_is_small(fake_fi, stand_in_graphs):
    """verify_as_decode=auto and verify_split_kv=auto: the verify bucket gets a graph per variant (split, whole,
    rows), and each pass replays the one its plan took: rows where the rows' reads are small and a request holds
    >= 256 tokens (5 x (3 x 305 and a dummy's 5) x 64; at 3 x 505 + 5 too, the eager pass's 3 x 505 alike), whole
    past that bound or under 256 tokens, split past whole's, each exactly an eager (unpadded) runner's logits."""
    opts = {"verify_as_decode": "auto", "verify_split_kv": "auto"}
    graphed, eager = fi_runner(**opts), fi_runner(**opts)
    graphed.graphs = GraphCache(graphed)
    assert graphed.graphs.capture([BUCKET], [1, K1], range(1)) == 4
    by_variant = {key[5]: g.graph for key, g in graphed.graphs.graphs.items() if key[1] == K1}
    assert set(by_variant) == {"split", "whole", "rows"}
    seen = []
    for i, ctx in enumerate((300, 900, 600, 100, 500)):
        got, want = (verify_logits(r, ctx, torch.Generator().manual_seed(i)) for r in (graphed, eager))
        seen.append(graphed.backend.slot_variant(0))
        assert eager.backend.active_plan.family == graphed.backend.active_plan.family
        torch.testing.assert_close(got, want, atol=0, rtol=0)
    assert seen == ["rows", "split", "whole", "whole", "rows"]
    assert {v: g.replays for v, g in by_variant.items()} == {"rows": 2, "split": 1, "whole": 2}
    assert graphed.backend.kernel_info()["verify"] == "cuda-core:rows+fa2+fa2:whole"


@pytest.mark.parametrize("split", [True, False])
def test_auto_rows_beside_a_fixed_split_capture_every_bucket(fake_fi, stand_in_graphs, split):
    """verify_as_decode=auto with verify_split_kv fixed: the fa2 plan is the "prefill" variant in every bucket, and
    "rows" a second one only in buckets where the rule can hold (bucket 16 is past ROWS_MAX_BATCH); a pass in a
    bucket without rows replays its prefill graph."""
    r = fi_runner(verify_as_decode="auto", verify_split_kv=split)
    r.graphs = GraphCache(r)
    r.backend.max_batch_size = 16  # the buckets' largest (the pool is the runner's: 4 requests are enough here)
    assert r.graphs.capture([1, 4, 16], [K1], range(1)) == 5
    assert {(key[0], key[5]) for key in r.graphs.graphs} == {(1, "prefill"), (1, "rows"), (4, "prefill"),
                                                             (4, "rows"), (16, "prefill")}
    verify_logits(r, 900, torch.Generator().manual_seed(0))
    assert r.backend.slot_variant(0) == "prefill" and r.graphs.graphs[(4, K1, 0, None, False, "prefill")].graph.replays
    verify_logits(r, 300, torch.Generator().manual_seed(1))
    assert r.backend.slot_variant(0) == "rows" and r.graphs.graphs[(4, K1, 0, None, False, "rows")].graph.replays


def test_rows_verify_captures_one_graph_and_matches_fa2(fake_fi, stand_in_graphs):
    """verify_as_decode: the verify bucket is one graph (the rows plan has no variants, even under auto), each replay
    equal to an eager rows runner exactly and to the default fa2 plan within bf16 rounding."""
    graphed = fi_runner(verify_as_decode=True, verify_split_kv="auto")
    eager, fa2 = fi_runner(verify_as_decode=True), fi_runner()
    graphed.graphs = GraphCache(graphed)
    assert graphed.graphs.capture([BUCKET], [1, K1], range(1)) == 2
    assert {key[5] for key in graphed.graphs.graphs} == {None}
    for i, ctx in enumerate((100, 900, (40, 700, K1))):
        got, want, ref = (verify_logits(r, ctx, torch.Generator().manual_seed(i)) for r in (graphed, eager, fa2))
        assert graphed.backend.active_plan.family == "rows"
        torch.testing.assert_close(got, want, atol=0, rtol=0)
        torch.testing.assert_close(got, ref, atol=3e-2, rtol=3e-2)
    verify_graph = graphed.graphs.graphs[(BUCKET, K1, 0, None, False, None)].graph
    assert verify_graph.replays == 3 and verify_graph.baked == [(64 // CFG.num_kv_heads, 1)]  # a split decode launch
    assert graphed.backend.kernel_info()["verify"] == "cuda-core:rows"


def test_a_hybrid_with_auto_rows_replays_its_sides_pair(fake_fi, stand_in_graphs):
    """verify_as_decode=auto on both sides of a hybrid: 3 x 3 variant pairs and 3 + 3 one-sided variants, a graph
    each; each side picks its plan over its own requests and the other side's as dummies (5 tokens each), as an eager
    hybrid picks it over its own requests alone, with that hybrid's exact logits."""
    passes = (([260, 900, 100], ("both", "rows", "rows")), ([100, 900, 900], ("both", "whole", "split")),
              ([1000, 260, 1000], ("both", "rows", "split")))
    graphs = replay_hybrid_passes(15, passes, verify_as_decode="auto")
    assert {v: g.replays for v, g in graphs.items() if g.replays} == {p: 1 for _, p in passes}


def test_the_runner_counts_replays_and_the_eager_passes_of_missing_graphs(fake_fi, stand_in_graphs):
    """Graph-eligible passes are counted: a replay where the key's graph exists; where a variant's graph is missing
    (dropped here, as an uncaptured variant would be) the pass runs eager, exactly as an eager runner, and its key
    (bucket, q_len, slot, variant) is counted; a prefill is never eligible. measure.graph_metrics turns two counts
    into the run's metrics, the keys most first."""
    from attnlab.measure import graph_counts, graph_metrics

    graphed, eager = fi_runner(verify_split_kv="auto"), fi_runner(verify_split_kv="auto")
    graphed.graphs = GraphCache(graphed)
    graphed.graphs.capture([BUCKET], [K1], range(1))
    del graphed.graphs.graphs[(BUCKET, K1, 0, None, False, "split")]
    before = graph_counts(graphed)
    assert before == {"target": (0, {})}  # the capture's own passes are not counted
    for i, ctx in enumerate((100, 900, 1000)):  # whole, split, split
        got, want = (verify_logits(r, ctx, torch.Generator().manual_seed(i)) for r in (graphed, eager))
        torch.testing.assert_close(got, want, atol=0, rtol=0)
    assert graphed.graph_replays == 1 and graphed.graph_misses == {(BUCKET, K1, 0, "split"): 2}
    assert eager.graph_replays == 0 and eager.graph_misses == {}  # no graphs: nothing is eligible
    assert graph_metrics(before, graph_counts(graphed)) == {
        "graph_passes_replayed": 1, "graph_passes_eager": 2, "graph_eager_keys": ["target b4 q5 slot 0 variant split x2"]}
    assert graph_metrics({}, graph_counts(eager)) == {}  # no side with graphs: no metrics


def test_a_mixed_hybrid_batch_replays_every_pass_of_the_speculative_loop(fake_fi, stand_in_graphs):
    """The end-to-end shape of experiment=hybrid_routing at batch 8 (H100 2026-12-05b: the hybrid took 2.0x triton's
    iteration there): 4 short and 4 long prompts through the n-gram speculative loop, graphs of buckets 1-8 at q_len
    1 and 5. Every verify pass replays a graph (mixed ones "both", one-sided ones after requests finish): none runs
    eager; the tokens are an eager hybrid's."""
    from attnlab.spec.decoder import SpecParams, SpeculativeDecoder
    from attnlab.spec.drafters import NgramDrafter

    graphed, eager = hybrid_runner(100, max_context=512, bucket=8), hybrid_runner(100, max_context=512, bucket=8)
    eager.backend.cuda_graph = False
    graphed.graphs = GraphCache(graphed)
    graphed.graphs.capture([1, 2, 4, 8], [1, K1], range(1))
    g = torch.Generator().manual_seed(0)
    prompts = [torch.randint(0, CFG.vocab_size, (20 if i % 2 else 300,), generator=g).tolist() for i in range(8)]
    budgets = [24 - i for i in range(8)]  # requests finish one by one: buckets 8, 4, 2, 1
    got, want = (SpeculativeDecoder(r, NgramDrafter("cpu"), SpecParams(K1 - 1)).generate(prompts, budgets)
                 for r in (graphed, eager))
    assert [o.output_ids for o in got.requests] == [o.output_ids for o in want.requests]
    assert graphed.graph_misses == {} and graphed.graph_replays == len(got.iterations)
    sides = {key[5][0] for key, c in graphed.graphs.graphs.items() if key[1] == K1 and c.graph.replays}
    assert "both" in sides and sides - {"both"}, sides  # mixed passes, then one-sided ones as requests finish
