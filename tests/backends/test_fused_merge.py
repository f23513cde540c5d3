"""triton's fused split merge (backend option fused_merge): the last split program of each (query block, kv head)
merges the partials inside the attention kernel. Same outputs as the separate merge launch, counters back at 0
after every launch (so a graph replays on them), for decode, causal verify, tree verify and padded rows. Without
a CUDA GPU the kernels run under Triton's interpreter, which runs the programs one after another; the GPU cases
(`gpu` mark) race them for real."""

import pytest
import torch

from attnlab.backends.registry import require_available
from attnlab.errors import ConfigError
from attnlab.kernels import pdl
from tests.backends.cases import make_case

CUDA = torch.cuda.is_available()
DEVICE = "cuda" if CUDA else "cpu"
TritonBackend = require_available("triton")
TOL = {torch.float32: {"atol": 2e-5, "rtol": 2e-5}, torch.bfloat16: {"atol": 1e-2, "rtol": 1e-2}}  # fused vs launch
REF_TOL = {torch.float32: {"atol": 2e-4, "rtol": 2e-4}, torch.bfloat16: {"atol": 2e-2, "rtol": 2e-2}}  # test_triton's


def run_layers(case, fused: bool | str, num_splits: int, repeat: int = 1):
    be = case.backend(TritonBackend)
    be.num_splits, be.fused_merge = num_splits, fused
    be.plan(case.meta)
    for _ in range(repeat):  # the same plan launched again: its counters must be back at 0
        out = torch.stack([be.run(case.q, layer) for layer in range(case.pool.num_layers)])
    return be, out


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("kind", ["decode", "verify", "tree"])
@pytest.mark.parametrize("page_size,gqa,num_splits", [(1, 3, 3), (16, 1, 5), (16, 4, 2)])
def test_fused_merge_equals_the_merge_launch(kind, page_size, gqa, num_splits, dtype):
    q_lens = [1, 1, 0, 1] if kind == "decode" else [3, 3, 3, 3]
    contexts = [300, 0, 17, 1]  # an empty prefix and a short one: most of their splits are empty
    case = make_case(kv_lens=[c + q for c, q in zip(contexts, q_lens)], q_lens=q_lens, page_size=page_size,
                     num_kv_heads=2, gqa=gqa, head_dim=64, dtype=dtype, device=DEVICE, seed=gqa,
                     tree_mask=kind == "tree")
    _, ref = run_layers(case, False, num_splits)
    be, out = run_layers(case, True, num_splits, repeat=2)
    plan = be.active_plan
    assert plan.counters is not None and plan.params.num_splits == num_splits
    assert plan.counters.eq(0).all()
    assert "merge=fused" in next(iter(be.kernel_info().values()))
    torch.testing.assert_close(out.float(), ref.float(), **TOL[dtype])
    torch.testing.assert_close(out.float(), case.reference(), **REF_TOL[dtype])


def test_unsplit_plans_take_no_counters_and_bad_values_are_refused():
    case = make_case(kv_lens=[5, 9], q_lens=[1, 1], page_size=16, num_kv_heads=2, gqa=2, head_dim=64,
                     dtype=torch.float32, device=DEVICE)
    be, _ = run_layers(case, True, 1)
    assert be.active_plan.counters is None
    with pytest.raises(ConfigError, match="fused_merge='yes'"):
        TritonBackend.check_options({"fused_merge": "yes"}, "verify.options")


@pytest.mark.parametrize("bad", ["yes", 1, 0, None, "Auto"])
def test_fused_merge_values_other_than_true_false_auto_are_refused(bad):
    with pytest.raises(ConfigError, match="must be true, false or auto"):
        TritonBackend.check_options({"fused_merge": bad}, "backend.options")
    case = make_case(kv_lens=[5], q_lens=[1], page_size=16, num_kv_heads=2, gqa=2, head_dim=64, dtype=torch.float32,
                     device=DEVICE)
    with pytest.raises(ConfigError, match="triton.fused_merge"):
        TritonBackend(case.pool, 4, 2, 64, 0.125, torch.float32, fused_merge=bad)


def test_fuses_merge_decides_per_launch():
    """The option's rule on each kind of launch: auto fuses a split decode of one-tile splits (and CAPPED_TILE's
    loops: the next test), nothing else."""
    from attnlab.kernels.heuristics import LaunchParams
    from attnlab.kernels.merge import fuses_merge

    def params(kind, splits, one_tile=False):
        return LaunchParams(kind, 16, 64, 64, 1, splits, num_warps=4, num_stages=1, one_tile=one_tile)

    cases = {("decode", 4, True): (True, True, False), ("decode", 4, False): (True, False, False),
             ("decode", 1, True): (False, False, False), ("extend", 4, True): (True, False, False),
             ("invariant", 1, False): (True, False, False)}
    for (kind, splits, one), want in cases.items():
        got = tuple(fuses_merge(opt, params(kind, splits, one)) for opt in (True, "auto", False))
        assert got == want, (kind, splits, one)


def test_auto_fuses_loops_of_the_capped_tile_up_to_16_splits_under_the_register_cap():
    """Splits of several tiles fuse under auto only at CAPPED_TILE (head dim 128's 64-token tile of 4 warps and 3
    stages: Llama-8B's) and at most CAPPED_MAX_SPLITS splits, and those fused launches, auto's or true's, carry the
    128-register cap; nothing else does (the merge launch, one-tile splits, other tiles, an override's stages, true
    past 16 splits, where the merge spills under the cap)."""
    from attnlab.kernels.heuristics import LaunchParams, decode_params
    from attnlab.kernels.merge import CAPPED_MAX_SPLITS, fused_launch_args, fuses_merge

    def params(splits, block_d=128, warps=4, stages=3, one_tile=False, kind="decode"):
        return LaunchParams(kind, 16, 64, block_d, 1, splits, num_warps=warps, num_stages=stages, one_tile=one_tile)

    assert CAPPED_MAX_SPLITS == 16
    for p, auto, cap in [(params(2), True, True), (params(16), True, True), (params(32), False, False),
                         (params(1), False, False), (params(4, block_d=64), False, False),
                         (params(4, stages=1), False, False), (params(4, warps=8), False, False),
                         (params(4, one_tile=True), True, False), (params(4, kind="extend"), False, False)]:
        assert fuses_merge("auto", p) is auto, p
        assert fused_launch_args(p, fuses_merge(True, p)) == ({"maxnreg": 128} if cap else {}), p
        assert fused_launch_args(p, False) == {}, p
    llama = {"num_kv_heads": 8, "group": 4, "head_dim": 128, "sms": 132}  # the heuristic's own launches
    for batch, ctx, auto in [(4, 4096, True), (16, 4096, True), (32, 16384, True), (1, 16384, False), (2, 16384, False),
                             (64, 4096, False)]:
        p = decode_params(batch=batch, max_kv_len=ctx, **llama)
        assert fuses_merge("auto", p) is auto and not p.one_tile, (batch, ctx, p)
    smollm2 = decode_params(batch=4, num_kv_heads=3, group=3, head_dim=64, max_kv_len=4096, sms=132)
    assert smollm2.num_splits > 1 and not smollm2.one_tile and not fuses_merge("auto", smollm2)


@pytest.mark.parametrize("kind,num_splits,head_dim,fused", [("decode", 3, 64, True), ("decode", 2, 64, False),
                                                             ("verify", 3, 64, False), ("decode", 2, 128, True)],
                         ids=["decode-one-tile", "decode-two-tiles", "verify", "decode-capped-tile-loop"])
def test_auto_fuses_the_decodes_of_one_tile_splits_and_capped_loops(kind, num_splits, head_dim, fused):
    """fused_merge=auto (the default): a decode whose 300-token context splits into 3 splits of one 128-token tile
    (head dim 64) merges inside the kernel, counters back at 0; 2 splits (two tiles each) and a verify keep the merge
    launch; at head dim 128 two splits of three 64-token tiles (CAPPED_TILE's loop) merge inside it too, launched
    under the register cap. Outputs as the merge launch's either way."""
    q_lens = [1, 1, 0, 1] if kind == "decode" else [3, 3, 3, 3]
    case = make_case(kv_lens=[c + q for c, q in zip([300, 0, 17, 1], q_lens)], q_lens=q_lens, page_size=16,
                     num_kv_heads=2, gqa=3, head_dim=head_dim, dtype=torch.float32, device=DEVICE, seed=5)
    assert case.backend(TritonBackend).fused_merge == "auto"
    _, ref = run_layers(case, False, num_splits)
    be, out = run_layers(case, "auto", num_splits, repeat=2)
    plan = be.active_plan
    assert plan.params.num_splits == num_splits and (plan.counters is not None) == fused
    assert ("merge=fused" in next(iter(be.kernel_info().values()))) == fused
    from attnlab.kernels.merge import fused_launch_args

    capped = {"maxnreg": 128} if head_dim == 128 else {}  # what paged_decode adds to this plan's launch
    assert fused_launch_args(plan.params, plan.counters is not None) == capped, plan.params
    if fused:
        assert plan.counters.eq(0).all()
    torch.testing.assert_close(out.float(), ref.float(), **TOL[torch.float32])
    torch.testing.assert_close(out.float(), case.reference(), **REF_TOL[torch.float32])


@pytest.mark.gpu
@pytest.mark.skipif(not CUDA, reason="needs a CUDA GPU: the split programs race only there")
@pytest.mark.parametrize("splits", [32, 11])
@pytest.mark.parametrize("kind", ["decode", "verify"])
@pytest.mark.parametrize("shape", ["llama8b-b16", "smollm2-b1", "pdl"])
def test_gpu_fused_merge_under_races_and_graph_replay(kind, splits, shape):
    """Many splits racing on the GPU (Llama-8B's heads at batch 16, or SmolLM2's at batch 1 with a padding request;
    4k context, 32 splits, and 11: the merge's unrolled loops masked past the split count), launched 50 times and
    replayed from a CUDA graph: every launch equals the separate merge's result to bf16 rounding, and the counters end
    at 0. ``pdl``: Llama-8B's case with programmatic dependent launch, its graph four fused launches back to back, so
    each launch's programs start while the one before still runs and merges (its wait holds them before they read
    anything the other writes, the counters included)."""
    q_len = 1 if kind == "decode" else 5
    if shape == "smollm2-b1":
        case = make_case(kv_lens=[4096, 0], q_lens=[q_len, 0], page_size=16, num_kv_heads=3, gqa=3, head_dim=64,
                         dtype=torch.bfloat16, device="cuda", num_layers=1)
    else:
        case = make_case(kv_lens=[4096 - 37 * i for i in range(16)], q_lens=[q_len] * 16, page_size=16,
                         num_kv_heads=8, gqa=4, head_dim=128, dtype=torch.bfloat16, device="cuda", num_layers=1)
    if shape == "pdl" and pdl.unsupported("cuda"):
        pytest.skip(f"engine.pdl: {pdl.unsupported('cuda')}")
    with pdl.using(shape == "pdl", "cuda"):
        _race(case, splits, launches_per_graph=4 if shape == "pdl" else 1)


@pytest.mark.gpu
@pytest.mark.skipif(not CUDA, reason="needs a CUDA GPU: the split programs race only there")
@pytest.mark.parametrize("use_pdl", [False, True], ids=["pdl-off", "pdl-on"])
@pytest.mark.parametrize("model", ["smollm2", "llama8b"])
def test_gpu_auto_fuses_the_batch1_decode_under_races_and_graph_replay(model, use_pdl):
    """The default (fused_merge=auto, the heuristic's splits) at the decode floor's cell, batch 1 x 4k: its splits
    are one tile each, so the decode merges inside the kernel; raced and replayed as above against the merge launch."""
    heads = {"smollm2": (3, 3, 64), "llama8b": (8, 4, 128)}[model]
    case = make_case(kv_lens=[4096], q_lens=[1], page_size=16, num_kv_heads=heads[0], gqa=heads[1],
                     head_dim=heads[2], dtype=torch.bfloat16, device="cuda", num_layers=1)
    if use_pdl and pdl.unsupported("cuda"):
        pytest.skip(f"engine.pdl: {pdl.unsupported('cuda')}")
    with pdl.using(use_pdl, "cuda"):
        be = _race(case, None, launches_per_graph=4 if use_pdl else 1, option="auto")
    assert be.active_plan.params.one_tile and be.active_plan.params.num_splits > 1


@pytest.mark.gpu
@pytest.mark.skipif(not CUDA, reason="needs a CUDA GPU: the split programs race only there")
@pytest.mark.parametrize("use_pdl", [False, True], ids=["pdl-off", "pdl-on"])
@pytest.mark.parametrize("batch,ctx", [(4, 4096), (16, 16384)])
def test_gpu_auto_fuses_the_capped_tiles_loop_under_races_and_graph_replay(batch, ctx, use_pdl, monkeypatch):
    """Llama-8B's splits of several 64-token tiles (CAPPED_TILE; 132 SMs set, an H100's, so the plan is the same on
    any card): auto fuses them under the 128-register cap; raced and replayed against the merge launch."""
    from attnlab.kernels import heuristics

    monkeypatch.setattr(heuristics, "sm_count", lambda device_index=0: 132)
    if use_pdl and pdl.unsupported("cuda"):
        pytest.skip(f"engine.pdl: {pdl.unsupported('cuda')}")
    case = make_case(kv_lens=[ctx - 7 * i for i in range(batch)], q_lens=[1] * batch, page_size=16, num_kv_heads=8,
                     gqa=4, head_dim=128, dtype=torch.bfloat16, device="cuda", num_layers=1)
    with pdl.using(use_pdl, "cuda"):
        be = _race(case, None, launches_per_graph=4 if use_pdl else 1, option="auto")
    params = be.active_plan.params
    assert not params.one_tile and 1 < params.num_splits <= 16 and params.block_n == 64, params


def _race(case, splits: int | None, launches_per_graph: int, option: bool | str = True):
    _, ref = run_layers(case, False, splits)
    be = case.backend(TritonBackend)
    be.num_splits, be.fused_merge = splits, option
    be.plan(case.meta)
    assert be.active_plan.counters is not None
    for _ in range(50):
        torch.testing.assert_close(be.run(case.q, 0).float(), ref[0].float(), **TOL[torch.bfloat16])
    g, stream = torch.cuda.CUDAGraph(), torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        be.run(case.q, 0)
        with torch.cuda.graph(g, stream=stream):
            for _ in range(launches_per_graph):
                out = be.run(case.q, 0)
    torch.cuda.current_stream().wait_stream(stream)
    for _ in range(50):
        g.replay()
        torch.testing.assert_close(out.float(), ref[0].float(), **TOL[torch.bfloat16])
    assert be.active_plan.counters.eq(0).all()
    return be


def test_warmup_compiles_the_fused_variants():
    """A warmup plan of a fused_merge backend launches the split variants with their counters (what the runs use)."""
    case = make_case(kv_lens=[5], q_lens=[1], page_size=16, num_kv_heads=2, gqa=2, head_dim=64, dtype=torch.float32,
                     device=DEVICE)
    be = case.backend(TritonBackend)
    be.num_splits, be.fused_merge = 3, True
    records = be.warmup(batch_sizes=(1,), q_lens=(1, 4), kv_lens=(600,))
    assert {r["params"].kind for r in records} == {"decode", "extend"}
    assert all(r["params"].num_splits == 3 and r["fused_merge"] for r in records)


def test_warmup_under_auto_compiles_the_decode_fused_and_the_extend_not():
    case = make_case(kv_lens=[5], q_lens=[1], page_size=16, num_kv_heads=2, gqa=2, head_dim=64, dtype=torch.float32,
                     device=DEVICE)
    be = case.backend(TritonBackend)
    be.num_splits, be.fused_merge = 3, "auto"
    records = be.warmup(batch_sizes=(1,), q_lens=(1, 4), kv_lens=(300,))
    assert {(r["params"].kind, r["fused_merge"]) for r in records} == {("decode", True), ("extend", False)}
    be.invariant = True
    assert not be.warmup()[0]["fused_merge"]  # the invariant kernel keeps its merge launch under auto


@pytest.mark.parametrize("q_lens", [[1, 1, 0, 1], [3, 3, 3, 3]], ids=["decode", "verify"])
def test_fused_merge_keeps_the_invariant_kernel_bitwise(q_lens):
    """engine.invariant's kernel with its merge inside (fused_merge): the same bits as its merge_ordered launch, for
    decode and verify rows, one split and several (a 300-token context crosses two 256-token splits)."""
    contexts = [300, 0, 17, 1]
    case = make_case(kv_lens=[c + q for c, q in zip(contexts, q_lens)], q_lens=q_lens, page_size=16,
                     num_kv_heads=2, gqa=3, head_dim=64, dtype=torch.float32, device=DEVICE, seed=3)
    outs = []
    for fused in (False, True):
        be = case.backend(TritonBackend)
        be.invariant, be.fused_merge = True, fused
        be.plan(case.meta)
        outs.append(torch.stack([be.run(case.q, layer) for layer in range(case.pool.num_layers)]))
        assert (be.active_plan.counters is not None) == fused and be.active_plan.params.kind == "invariant"
        assert be.active_plan.params.num_splits == 2
        if fused:
            assert be.active_plan.counters.eq(0).all()
            assert be.warmup()[0]["fused_merge"]
    assert torch.equal(outs[0], outs[1])


@pytest.mark.gpu
@pytest.mark.skipif(not CUDA, reason="needs a CUDA GPU: the split programs race only there")
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=["bf16", "fp32"])
def test_gpu_fused_merge_keeps_the_invariant_kernel_bitwise(dtype):
    """Compiled (FMA contraction, the real tl.dot) and racing: the invariant kernel's fused merge gives exactly the
    bits of its merge_ordered launch, over 16 requests of up to 4k context (16 splits) in decode and verify."""
    for q_len in (1, 5):
        case = make_case(kv_lens=[4096 - 37 * i for i in range(16)], q_lens=[q_len] * 16, page_size=16,
                         num_kv_heads=8, gqa=4, head_dim=128, dtype=dtype, device="cuda", num_layers=1)
        outs = []
        for fused in (False, True):
            be = case.backend(TritonBackend)
            be.invariant, be.fused_merge = True, fused
            be.plan(case.meta)
            outs.append([be.run(case.q, 0).clone() for _ in range(10)])
        assert all(torch.equal(o, outs[0][0]) for o in outs[0] + outs[1])


def test_fused_merge_in_graph_mode_plans_and_device_planned_steps():
    """The static plan of a graph-mode backend (split for max_context, replanned in place for shorter passes) and
    the device-planned decode steps carry their own counters and give the merge launch's results, the counters at 0."""
    case = make_case(kv_lens=[301, 18], q_lens=[1, 1], page_size=16, num_kv_heads=2, gqa=3, head_dim=64,
                     dtype=torch.float32, device=DEVICE, seed=4)
    outs = []
    for fused in (False, True):
        be = case.backend(TritonBackend)
        be.cuda_graph, be.max_context, be.fused_merge, be.num_splits = True, 1024, fused, 4
        be.plan(case.meta)
        outs.append(torch.stack([be.run(case.q, layer) for layer in range(case.pool.num_layers)]))
        plan = be.active_plan
        assert plan.params.num_splits == 4 and (plan.counters is not None) == fused
        # device-planned steps over the same layout: step 0's lengths are the pass's
        lay = case.meta.layout
        kv_lens = lay.kv_lens.to(torch.int32).reshape(1, -1).clone()
        steps = be.device_step_plans(2, 1, lay.kv_indptr.to(torch.int32), lay.kv_indices.to(torch.int32), kv_lens,
                                     max_kv_len=1024)
        assert steps[0].params.num_splits == 4 and (steps[0].counters is not None) == fused
        be.use_step(0)
        step_out = torch.stack([be.run(case.q, layer) for layer in range(case.pool.num_layers)])
        torch.testing.assert_close(step_out, outs[-1], **TOL[torch.float32])
        if fused:
            assert plan.counters.eq(0).all() and steps[0].counters.eq(0).all()
    torch.testing.assert_close(outs[1], outs[0], **TOL[torch.float32])
