"""The ``hybrid`` backend: routing by context length, against the torch reference; capabilities; config errors.

On CPU the two sides are torch and triton (under TRITON_INTERPRET=1, as tests/conftest.py sets it), or the
fake flashinfer of test_flashinfer.py for the CUDA-graph plan buffers; GPU: flashinfer + triton, captured.
"""

from __future__ import annotations

import os

import pytest
import torch

from attnlab.backends.base import Capabilities, Mode
from attnlab.backends.hybrid import HybridBackend, HybridSpec, intersect, parse_hybrid_options
from attnlab.backends.registry import get_backend_class
from attnlab.backends.torch_ref import TorchBackend
from attnlab.errors import ConfigError
from tests.backends.cases import GPU_TOL, make_case
from tests.backends.test_flashinfer import SMALL_WS, meta_over

CUDA = torch.cuda.is_available()
# CPU tests whose long side is triton on CPU tensors: a machine whose Triton compiles for a GPU (no interpreter) cannot
# run them (found on the H200, 2026-12-03b); CI's CPU machine runs them under the interpreter
cpu_triton = pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1",
                                reason="triton on CPU tensors needs the interpreter (TRITON_INTERPRET=1, CPU-only "
                                       "machines)")
DEVICE = "cuda" if CUDA else "cpu"
TOL = {torch.float32: {"atol": 2e-4, "rtol": 2e-4}, torch.bfloat16: {"atol": 2e-2, "rtol": 2e-2}}
THRESHOLD = 64  # kv_len <= 64: short


def lens(contexts, q_lens):
    return [c + q for c, q in zip(contexts, q_lens)]


# (q_lens, contexts before the new tokens, mode, tree): both sides get requests, incl. q_len 0 and 1
PASSES = {
    "decode": ([1, 1, 0, 1], [300, 17, 5, 1], Mode.DECODE, False),
    "verify": ([4, 4, 4], [300, 0, 17], Mode.VERIFY, False),
    "tree": ([3, 3], [300, 17], Mode.VERIFY, True),
    "prefill": ([40, 0, 5, 1], [0, 17, 300, 1], Mode.PREFILL, False),
}


def hybrid_class(short="torch", long="triton", threshold=THRESHOLD, **kw):
    return get_backend_class("hybrid", {"short": short, "long": long, "threshold": threshold, **kw}, "verify.options")


def run_layers(be, q, num_layers):
    return torch.stack([be.run(q, layer).float() for layer in range(num_layers)])


# (page size, GQA) pairs and (head_dim, dtype) pairs rather than the full product: each backend has its own
# product grid; here what is tested is the routing (sub-batches, gathers, disjoint rows) on every pass kind.
@pytest.mark.parametrize("head_dim,dtype", [(64, torch.float32), (128, torch.bfloat16)], ids=["d64-fp32", "d128-bf16"])
@pytest.mark.parametrize("page_size,gqa", [(1, 3), (16, 1)], ids=["p1-gqa3", "p16-gqa1"])
@pytest.mark.parametrize("kind", list(PASSES))
def test_matches_reference(kind, page_size, gqa, head_dim, dtype):
    q_lens, contexts, mode, tree = PASSES[kind]
    case = make_case(kv_lens=lens(contexts, q_lens), q_lens=q_lens, page_size=page_size, num_kv_heads=2, gqa=gqa,
                     head_dim=head_dim, dtype=dtype, device=DEVICE, mode=mode, tree_mask=tree, num_layers=2,
                     seed=gqa + page_size)
    be = case.backend(hybrid_class())
    be.plan(case.meta)
    out = run_layers(be, case.q, case.pool.num_layers)
    assert out.shape[1:] == case.q.shape
    torch.testing.assert_close(out, case.reference(), **TOL[dtype])
    routes = be.active_plan.routes
    assert [r.backend.name for r in routes] == ["torch", "triton"]  # both sides launched, disjoint rows
    rows = torch.cat([r.rows for r in routes]).tolist()
    assert len(rows) == len(set(rows)) == case.q.shape[0]


class Recorder(TorchBackend):
    """A torch backend that records the kv lengths of every pass it plans."""

    seen: list

    def make_plan(self, meta, slot=0):
        type(self).seen.append(list(meta.kv_lens_host))
        return super().make_plan(meta, slot)


def test_routes_each_request_by_context_length():
    short = type("Short", (Recorder,), {"seen": []})
    long_ = type("Long", (Recorder,), {"seen": []})
    cls = HybridBackend.with_classes(HybridSpec("torch", "torch", 20), short, long_)
    case = make_case(kv_lens=[5, 20, 21, 300, 1], q_lens=[1] * 5, page_size=4, num_kv_heads=1, gqa=2, head_dim=32,
                     dtype=torch.float32)
    be = case.backend(cls)
    be.plan(case.meta)
    torch.testing.assert_close(run_layers(be, case.q, 1), case.reference(), atol=1e-5, rtol=1e-5)
    assert short.seen == [[5, 20, 1]] and long_.seen == [[21, 300]]  # <= 20 tokens of context: short
    assert be.kernel_info()["routed_short"] == "3" and be.kernel_info()["routed_long"] == "2"
    m = meta_over(case, [5, 20, 1], [1, 1, 1])  # everyone short: one launch, no gather
    be.plan(m)
    assert len(be.active_plan.routes) == 1 and be.active_plan.routes[0].rows is None
    torch.testing.assert_close(be.run(case.q[:3], 0).float(), _ref(case, m, 0, case.q[:3]), atol=1e-5, rtol=1e-5)


class NewKV(TorchBackend):
    """The torch reference, recording what each ``run_new`` got: (its query rows, the new K / V it was handed)."""

    seen: list

    def run_new(self, q, k, v, layer):
        type(self).seen.append((q.shape[0], k, v))
        return super().run_new(q, k, v, layer)


def test_run_new_hands_each_side_its_own_new_kv():
    """A prefill's new K / V (what triton's contiguous kernel reads) reach each side: its own requests' rows in a
    mixed pass (torch short: 40 + 1 rows, torch long: 5), the tensors themselves in a one-way pass; outputs are the
    reference's."""
    from attnlab.backends.cases import new_kv

    short, long_ = type("Short", (NewKV,), {"seen": []}), type("Long", (NewKV,), {"seen": []})
    cls = HybridBackend.with_classes(HybridSpec("torch", "torch", THRESHOLD), short, long_)
    q_lens, contexts, mode, _ = PASSES["prefill"]
    case = make_case(kv_lens=lens(contexts, q_lens), q_lens=q_lens, page_size=16, num_kv_heads=2, gqa=3, head_dim=64,
                     dtype=torch.float32, mode=mode)
    be = case.backend(cls)
    be.plan(case.meta)
    k, v = new_kv(case.pool, case.meta, 0)
    torch.testing.assert_close(be.run_new(case.q, k, v, 0).float(), _ref(case, case.meta, 0), **TOL[torch.float32])
    (n_short, k_short, v_short), (n_long, k_long, v_long) = short.seen + long_.seen
    rows_short, rows_long = (r.rows for r in be.active_plan.routes)
    assert (n_short, n_long) == (41, 5) and torch.equal(k_long, k[rows_long]) and torch.equal(v_short, v[rows_short])
    assert torch.equal(k_short, k[rows_short]) and torch.equal(v_long, v[rows_long])
    one_way = meta_over(case, [40, 17, 6, 2], q_lens, mode=Mode.PREFILL)  # every context <= 64: short alone
    be.plan(one_way)
    k, v = new_kv(case.pool, one_way, 0)
    be.run_new(case.q, k, v, 0)
    assert short.seen[-1][1] is k and short.seen[-1][2] is v and len(long_.seen) == 1
    be.run(case.q, 0)  # no new K / V: run_new(q, None, None) on the side
    assert short.seen[-1][1:] == (None, None)
    q_lens, contexts, mode, _ = PASSES["decode"]  # a mixed decode: nothing to gather, no side reads a decode's K / V
    decode = make_case(kv_lens=lens(contexts, q_lens), q_lens=q_lens, page_size=16, num_kv_heads=2, gqa=3,
                       head_dim=64, dtype=torch.float32, mode=mode)
    be = decode.backend(cls)
    be.plan(decode.meta)
    k, v = new_kv(decode.pool, decode.meta, 0)
    torch.testing.assert_close(be.run_new(decode.q, k, v, 0).float(), _ref(decode, decode.meta, 0),
                               **TOL[torch.float32])
    assert len(be.active_plan.routes) == 2
    assert all(seen[1:] == (None, None) for seen in (short.seen[-1], long_.seen[-1]))


def test_plan_steps_keep_both_sides_per_slot():
    """Multi-step draft: k plans alive at once; use_step switches both sides' plans without planning."""
    cls = hybrid_class(short="triton", long="torch", threshold=40)
    case = make_case(kv_lens=[64, 64], q_lens=[1, 1], page_size=16, num_kv_heads=2, gqa=2, head_dim=32,
                     dtype=torch.float32, device=DEVICE)
    be = case.backend(cls)
    # kv [30, 60] (S, L), [35, 35] (S, S), [40, 10] (S, S): the routing changes from step to step
    metas = [meta_over(case, [30 + 5 * j, 60 - 25 * j], [1, 1]) for j in range(3)]
    be.plan_steps(metas)
    for j, m in enumerate(metas):
        be.use_step(j)
        torch.testing.assert_close(be.run(case.q, 0).float(), _ref(case, m, 0), **TOL[torch.float32])


@cpu_triton
@pytest.mark.parametrize("q_len", [1, 3], ids=["decode", "verify"])
def test_graph_mode_buffers_are_static_across_routing(fake_fi, q_len):
    """cuda_graph=True: both sides plan the whole bucket (the other side's requests as dummies) into their graph
    buffers; a later plan with another routing rewrites the same buffers (what a captured graph replays)."""
    cls = hybrid_class(short="flashinfer", long="triton", threshold=THRESHOLD,
                       short_options={"workspace_bytes": SMALL_WS})
    # page tables long enough for every pass below; the passes use shorter lengths
    case = make_case(kv_lens=[q_len + 300] * 4, q_lens=[q_len] * 4, page_size=16, num_kv_heads=2, gqa=4,
                     head_dim=64, dtype=torch.bfloat16, num_layers=2, mode=Mode.DECODE if q_len == 1 else Mode.VERIFY)
    be = cls(case.pool, case.num_q_heads, case.num_kv_heads, case.head_dim, case.scale, torch.bfloat16,
             cuda_graph=True, max_batch_size=4, max_q_len=4, max_context=512)
    seen = []
    for kv_lens in ([q_len + 300, q_len + 17, q_len + 90, q_len],  # routing L S L S, then S L S L
                    [q_len + 10, q_len + 200, q_len + 5, q_len + 70]):
        m = meta_over(case, kv_lens, [q_len] * 4)
        be.plan(m)
        plan = be.active_plan
        assert plan.select_long is not None
        assert plan.select_long.view(-1).tolist() == [n > THRESHOLD for n in kv_lens for _ in range(q_len)]
        seen.append((plan.select_long.data_ptr(), plan.routes[0].plan.wrapper, id(plan.routes[1].plan)))
        torch.testing.assert_close(run_layers(be, case.q, 2), torch.stack(
            [_ref(case, m, layer) for layer in range(2)]), atol=2e-2, rtol=2e-2)
    assert seen[0] == seen[1], "select buffer, flashinfer graph wrapper and triton static plan are reused"
    w = seen[0][1]
    # verify: the second routing's schedule is the first's (FlashInfer's chunks are >= 8 pages), a kept plan whose
    # layout the pass rewrote (the outputs above are the reference's); decode at GQA 4 runs the tensor-core decode,
    # whose plans are not kept
    assert w.use_cuda_graph and (len(w.plans), be.short.plans_kept) == ((2, 0) if q_len == 1 else (1, 1))
    if q_len > 1:  # the fa2 verify wrapper gets the exact uniform q_len (dummies have it too)
        assert w.plans[-1]["uniform_q_len"] == q_len and w.plans[-1]["backend"] == "fa2"


def _ref(case, meta, layer, q=None):
    ref = case.backend(TorchBackend)
    ref.plan(meta)
    return ref.run((case.q if q is None else q).float(), layer)


@cpu_triton
def test_graph_mode_ragged_pass_compacts(fake_fi):
    cls = hybrid_class(short="flashinfer", long="triton", threshold=THRESHOLD,
                       short_options={"workspace_bytes": SMALL_WS})
    case = make_case(kv_lens=[300, 20, 33], q_lens=[5, 20, 1], page_size=16, num_kv_heads=2, gqa=4, head_dim=64,
                     dtype=torch.bfloat16, mode=Mode.PREFILL)
    be = cls(case.pool, case.num_q_heads, case.num_kv_heads, case.head_dim, case.scale, torch.bfloat16,
             cuda_graph=True, max_batch_size=4, max_q_len=4, max_context=512)
    be.plan(case.meta)
    assert be.active_plan.select_long is None and [r.rows.numel() for r in be.active_plan.routes] == [21, 5]
    torch.testing.assert_close(run_layers(be, case.q, 1), case.reference(), atol=2e-2, rtol=2e-2)


# -- capabilities and config errors ---------------------------------------------------------------------


def test_capabilities_are_the_intersection(fake_fi):
    fi_tr = hybrid_class(short="flashinfer", long="triton").capabilities()
    fi, tr = get_backend_class("flashinfer").capabilities(), get_backend_class("triton").capabilities()
    assert fi_tr.devices == fi.devices & tr.devices and fi_tr.dtypes == {"fp16", "bf16"}
    assert fi_tr.kv_dtypes == fi.kv_dtypes & tr.kv_dtypes and fi_tr.head_dims == {64, 128, 256}
    assert fi_tr.cuda_graph == {Mode.DECODE, Mode.VERIFY} and fi_tr.custom_mask
    torch_tr = hybrid_class().capabilities()
    assert torch_tr.cuda_graph == frozenset() and "no CUDA graphs: torch has none" in torch_tr.notes
    assert "fp32" in torch_tr.dtypes and "fp32" not in fi_tr.dtypes


def test_page_size_rules_of_both_sides():
    def caps(rule):
        return Capabilities(frozenset({"cuda"}), frozenset({"bf16"}), frozenset({"bf16"}), frozenset({64}),
                            page_sizes=rule)

    both = intersect(caps("contiguous"), caps("multiple:256"))
    assert both.page_size_ok(512, 300) and not both.page_size_ok(300, 300) and not both.page_size_ok(256, 300)
    assert intersect(caps("any"), caps("multiple:256")).page_sizes == "multiple:256"
    msg = both.problems(device="cuda", dtype="bf16", kv_dtype="bf16", head_dim=64, page_size=16, max_context=300)
    assert msg == ["page_size 16 (supported: contiguous and a multiple of 256)"]


@pytest.mark.parametrize("options,needle", [
    ({"long": "triton", "threshold": 8}, "verify.options.short is required for backend=hybrid"),
    ({"short": "torch", "long": "torch", "threshold": 8}, "short and long are both 'torch' with the same options"),
    ({"short": "hybrid", "long": "torch", "threshold": 8}, "verify.options.short=hybrid: a hybrid cannot route"),
    ({"short": "torch", "long": "flash", "threshold": 8}, "verify.options.long='flash': unknown backend"),
    ({"short": "torch", "long": "triton", "threshold": 0}, "verify.options.threshold=0: must be an int >= 1"),
    ({"short": "torch", "long": "triton", "threshold": "1k"}, "verify.options.threshold='1k'"),
    ({"short": "torch", "long": "triton", "threshold": 8, "treshold": 9}, "verify.options.treshold: unknown option"),
    ({"short": "torch", "long": "triton", "threshold": 8, "long_options": {"splits": 2}},
     "verify.options.long_options.splits: unknown option for backend 'triton'"),
])
def test_impossible_hybrids_fail_one_line(options, needle):
    with pytest.raises(ConfigError) as e:
        get_backend_class("hybrid", options, "verify.options")
    assert needle in str(e.value) and "\n" not in str(e.value), str(e.value)


def test_same_backend_with_other_options_is_a_hybrid():
    spec = parse_hybrid_options({"short": "triton", "long": "triton", "threshold": 8,
                                 "long_options": {"num_splits": 4}})
    assert spec.long_options == {"num_splits": 4}


def test_unbound_hybrid_says_what_it_needs():
    assert "short=<backend> long=<backend> threshold=<tokens>" in HybridBackend.available()
    assert not HybridBackend.capabilities().devices


def _validate(*overrides):
    from attnlab.config import validate
    from tests.test_config import _compose

    return validate(_compose("model=tiny-llama", "device=cpu", *overrides))


@pytest.mark.parametrize("overrides,needle", [
    (["verify=hybrid"], "verify.options.short=flashinfer does not support device 'cpu'"),
    (["verify=hybrid", "verify.options.short=torch", "verify.options.long=torch"], "short and long are both"),
    (["draft=self", "backend=hybrid", "backend.options.long=hybrid"], "backend.options.long=hybrid"),
    (["verify=hybrid", "verify.options.short=torch", "+verify.options.long_options={num_splits: -1}"],
     "verify.options.long_options.num_splits=-1"),
])
def test_config_validation_checks_both_sides(overrides, needle):
    with pytest.raises(ConfigError) as e:
        _validate(*overrides)
    assert needle in str(e.value) and "\n" not in str(e.value), str(e.value)


@cpu_triton
def test_config_validation_accepts_torch_and_triton():
    assert _validate("verify=hybrid", "verify.options.short=torch", "verify.options.threshold=16").k == 4


@cpu_triton
def test_cli_run_with_hybrid_verify(tmp_path):
    """End to end on the tiny model: options reach the backend through the job; output files say what ran."""
    from tests.cli.helpers import TINY, read_json, run_cli

    # prompts of 4 and 40 tokens: the first stays at or under 12 tokens of context for its first steps
    proc = run_cli([*TINY, "workload=synthetic", "workload.lengths=[4,40]", "verify=hybrid",
                    "verify.options.short=torch", "verify.options.threshold=12", "parity.logits=false",
                    "parity.tokens=false",
                    f"hydra.run.dir={tmp_path}"], cwd=tmp_path, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    m = read_json(tmp_path / "metrics.json")
    info = m["attn_kernels_target"]
    assert info["short"] == "torch" and info["long"] == "triton" and info["threshold"] == "12"
    assert int(info["routed_short"]) > 0 and int(info["routed_long"]) > 0, info
    kernel = read_json(tmp_path / "parity.json")["kernel"]["verify"]  # level-1 parity of the hybrid as configured
    assert kernel["backend"] == "hybrid" and all(v["max_abs_err"] < 1e-3 for k, v in kernel.items() if k != "backend")


@pytest.mark.gpu
@pytest.mark.skipif(not CUDA, reason="needs a CUDA GPU (flashinfer + triton in CUDA graphs)")
@pytest.mark.parametrize("q_len", [1, 4], ids=["decode", "verify"])
def test_gpu_graph_replay_follows_routing(q_len):
    """flashinfer (short) + triton (long), graph mode: capture after one plan, then re-plan with another routing
    (same bucket) and replay: the real rows match the reference each time."""
    from attnlab.backends.flashinfer import FlashInferBackend

    if why := FlashInferBackend.available():
        pytest.skip(why)
    cls = hybrid_class(short="flashinfer", long="triton", threshold=256)
    # page tables for 1100 tokens per request; the two passes below use other (shorter) lengths
    case = make_case(kv_lens=[1100] * 8, q_lens=[q_len] * 8, page_size=16, num_kv_heads=2, gqa=4, head_dim=128,
                     dtype=torch.bfloat16, device="cuda", num_layers=3,
                     mode=Mode.DECODE if q_len == 1 else Mode.VERIFY)
    be = cls(case.pool, case.num_q_heads, case.num_kv_heads, case.head_dim, case.scale, torch.bfloat16,
             cuda_graph=True, max_batch_size=8, max_q_len=4, max_context=2048)
    q = case.q.clone()
    m1 = meta_over(case, [q_len + n for n in (1000, 20, 300, 40, 7, 600, 100, 256)], [q_len] * 8)
    be.plan(m1)
    eager = torch.stack([be.run(q, layer).float() for layer in range(3)])
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for layer in range(3):
            be.run(q, layer)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        outs = [be.run(q, layer) for layer in range(3)]
    graph.replay()
    torch.testing.assert_close(torch.stack(outs).float(), eager, atol=0, rtol=0)
    tol = GPU_TOL[torch.bfloat16]
    torch.testing.assert_close(eager, torch.stack([_ref(case, m1, layer, q) for layer in range(3)]), atol=tol,
                               rtol=tol)
    kv2 = [q_len + n for n in (30, 900, 250, 400, 7, 12, 1000, 300)]  # the routing flips for most requests
    m2 = meta_over(case, kv2, [q_len] * 8)
    q.copy_(torch.randn_like(q))
    be.plan(m2)
    graph.replay()
    want = torch.stack([_ref(case, m2, layer, q) for layer in range(3)])
    torch.testing.assert_close(torch.stack(outs).float(), want, atol=tol, rtol=tol)
