"""attnlab.bench.kernels' pure parts on CPU: backend specs with options, layouts per capability, kernel tags,
ratios and the table (the timing itself is GPU-only)."""

import pytest
import torch

from attnlab.bench.kernels import Cell, add_ratios, kernel_tag, layout_page_size, markdown, parse_spec, shapes


def test_parse_spec():
    assert parse_spec("triton") == ("triton", {})
    assert parse_spec("flashinfer/verify_backend=auto/prefill_min_q_len=64") == (
        "flashinfer", {"verify_backend": "auto", "prefill_min_q_len": 64})
    assert parse_spec("triton/num_splits=16") == ("triton", {"num_splits": 16})
    assert parse_spec("hybrid/short=flashinfer/long=triton/threshold=1024/short.verify_backend=auto") == (
        "hybrid", {"short": "flashinfer", "long": "triton", "threshold": 1024,
                   "short_options": {"verify_backend": "auto"}})
    assert parse_spec("flashinfer/decode_tensor_cores=false")[1] == {"decode_tensor_cores": False}
    with pytest.raises(ValueError, match="not key=value"):
        parse_spec("triton/num_splits")


def test_layout_page_size():
    assert layout_page_size("any", 16, 4096) == 16
    assert layout_page_size("contiguous", 16, 4096) == 4096  # fa3_fwd: one page per request
    assert layout_page_size("multiple:256", 16, 4096) == 256 and layout_page_size("multiple:256", 512, 4096) == 512
    assert layout_page_size("contiguous and multiple:256", 16, 4096) is None


def test_kernel_tags():
    assert kernel_tag({"decode": "fa2", "verify": "fa2", "prefill": "fa3"}, "prefill") == "fa3"
    assert kernel_tag({"decode": "decode BLOCK_M=16 BLOCK_N=128 splits=32 warps=4 stages=3"}, "decode") == "splits 32"
    assert kernel_tag({"all": "fa3_fwd (fa3_fwd_interface 0.0.3) graphs"}, "verify") == "fa3_fwd"
    contig = ("contig BLOCK_M=128 BLOCK_N=128 warps=8 stages=3 (new K/V from the projection; extend BLOCK_M=64 "
              "BLOCK_N=64 splits=1 warps=4 stages=3 where they are not at hand)")
    assert kernel_tag({"prefill": contig}, "prefill") == "contig"
    hybrid = {"short": "flashinfer", "long": "triton", "threshold": "1024", "routed_short": "0", "routed_long": "16",
              "long.verify": "extend BLOCK_M=32 BLOCK_N=64 splits=4 warps=4 stages=3"}
    assert kernel_tag(hybrid, "verify") == "triton:splits 4"


def test_shapes_cover_the_grid_and_cap_prefill():
    grid = list(shapes(["decode", "verify", "prefill"], ["smollm2"], [1, 16, 64], [512, 4096, 16384], [4]))
    assert ("decode", "smollm2", 64, 16384, 1) in grid and ("verify", "smollm2", 1, 512, 5) in grid
    prefill = {(b, c) for p, _, b, c, _ in grid if p == "prefill"}
    assert prefill == {(1, 512), (1, 4096), (1, 16384), (16, 512), (16, 4096), (64, 512)}  # batch x ctx <= 64k


def test_ratios_and_table():
    cells = [Cell("decode", "smollm2", 1, 4096, 1, "triton", ms=0.004, spread_pct=3.0, kv_gb_s=800, frac_copy=0.2,
                  tflops=1.0, kernel="splits 32", extra={"cuda_graph": True}),
             Cell("decode", "smollm2", 1, 4096, 1, "flashinfer", ms=0.008, spread_pct=1.0, kv_gb_s=400,
                  frac_copy=0.1, tflops=0.5, kernel="cuda-core", extra={"cuda_graph": True}),
             Cell("decode", "smollm2", 1, 4096, 1, "fa", status="unsupported: page_size 16 (supported: ...)")]
    add_ratios(cells, "triton")
    assert cells[0].ratio == 1.0 and cells[1].ratio == 2.0 and cells[2].ratio is None
    md = markdown(cells, ["triton", "flashinfer", "fa"], "triton", 4000.0, 3)
    row = md.splitlines()[2]
    assert "0.004 ms ±3% · 1.00x · 20% · splits 32" in row and "0.008 ms ±1% · 2.00x · 10% · cuda-core" in row
    assert "unsupported: page_size 16" in row and "ratio to triton" in md


def test_run_shape_on_cpu(monkeypatch, fake_fi, use_flavor):
    """run_shape end to end with CPU stand-ins (timing faked): every backend gets its layout's pool, graph-mode
    backends are built as the engine builds them, kernel tags and derived figures are filled in."""
    import argparse

    import torch

    from attnlab.backends.base import Mode
    from attnlab.backends.cases import random_paged_case
    from attnlab.backends.registry import get_backend_class
    from attnlab.bench import kernels
    from attnlab.bench.kernels import run_shape

    use_flavor("fa3_fwd")
    built = []

    def cpu_build(model, batch, context, q_len, page_size, dtype, seed=0):
        hq, hkv, d = kernels.HEADS[model]
        built.append(page_size)
        mode = Mode.DECODE if q_len == 1 else Mode.PREFILL if q_len == context else Mode.VERIFY  # as build
        pool, meta, q = random_paged_case(kv_lens=[context] * batch, q_lens=[q_len] * batch, page_size=page_size,
                                          num_q_heads=hq, num_kv_heads=hkv, head_dim=d, dtype=dtype, spare_pages=0,
                                          mode=mode)
        return pool, meta, q, 1

    class FakeTimer:
        def __init__(self, be, q, num_layers, graphable, reps, iters, kv=None, between=None):
            assert between is None  # no --cold, no --between
            self.out = be.run(q, 0) if kv is None else be.run_new(q, kv[0][0], kv[0][1], 0)
            assert torch.isfinite(self.out.float()).all()
            self.graph, self.graph_error, self.reps, self.iters = (object() if graphable else None), None, reps, iters
            self.between_ms = []
            self.graphable_cuda = getattr(be, "cuda_graph", False)

        def measure(self):
            return 0.5

    monkeypatch.setattr(kernels, "build", cpu_build)
    monkeypatch.setattr(kernels, "Timer", FakeTimer)
    specs = ["torch", "triton", "flashinfer/verify_split_kv=true/workspace_bytes=65536", "fa",
             "hybrid/short=torch/long=triton/threshold=8", "triton/num_splits=7", "flashinfer/workspace_bytes=65536",
             "flashinfer/verify_as_decode=true/workspace_bytes=65536"]
    classes = {s: get_backend_class(*parse_spec(s)) for s in specs}  # load_backends would ask for CUDA
    args = argparse.Namespace(page_size=16, reps=5, iters=10, repeats=2, copy_gb_s=1000.0)
    cells = run_shape(classes, "verify", "smollm2", 2, 40, 5, args, torch.bfloat16)
    by = {c.backend: c for c in cells}
    assert all(c.status == "ok" for c in cells), [(c.backend, c.status) for c in cells]
    assert sorted(set(built)) == [16, 40]  # the shared paged pool, and fa3_fwd's contiguous one
    assert by["fa"].page_size == 40 and by["triton"].page_size == 16
    assert by["flashinfer/verify_split_kv=true/workspace_bytes=65536"].kernel == "fa2" and by["fa"].kernel == "fa3_fwd"
    # a 40-token verify under verify_split_kv=auto (the default): fa2 without split-KV, which the cell names
    assert by["flashinfer/workspace_bytes=65536"].kernel == "fa2:whole"
    # the verify as decode rows (SmolLM2's GQA 3: the CUDA-core decode)
    assert by["flashinfer/verify_as_decode=true/workspace_bytes=65536"].kernel == "cuda-core:rows"
    assert by["triton/num_splits=7"].kernel == "splits 7" and by["hybrid/short=torch/long=triton/threshold=8"].kernel \
        == "triton:splits 1"
    assert by["triton"].extra["cuda_graph"] and not by["torch"].extra["cuda_graph"]
    assert by["triton"].samples_ms == [0.5, 0.5] and by["triton"].ms == 0.5 and by["triton"].spread_pct == 0
    assert by["triton"].kv_gb_s > 0 and by["triton"].tflops > 0
    assert all("launches" not in c.extra for c in cells)  # no --launches
    # --launches: each timed backend's launch shapes, profiled after the shape's timing
    seen = []
    monkeypatch.setattr(kernels, "profiled_launches", lambda t, label: seen.append(t) or {"k": [{"grid": [1, 1, 1]}]})
    args.launches = True
    cells = run_shape({"triton": classes["triton"]}, "verify", "smollm2", 2, 40, 5, args, torch.bfloat16)
    assert len(seen) == 1 and cells[0].extra["launches"] == {"k": [{"grid": [1, 1, 1]}]}
    args.launches = False
    # a backend that fails on a shape is an error cell and the others go on (fa3_fwd has no fp16)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a: None)
    cells = run_shape({"fa": classes["fa"], "triton": classes["triton"]}, "verify", "smollm2", 1, 40, 5,
                      argparse.Namespace(page_size=16, reps=5, iters=10, repeats=1, copy_gb_s=1000.0), torch.float16)
    assert cells[0].status.startswith("error: ConfigError: fa (fa3_fwd") and cells[1].status == "ok"
    # a prefill: triton runs the contiguous kernel on the new K / V (run_new) and says so; its hybrid side runs the
    # paged one (a hybrid hands its sides run, not run_new) and says that; prefill_contig=false is the paged kernel
    pre = {s: classes[s] for s in ("triton", "hybrid/short=torch/long=triton/threshold=8")}
    pre["triton/prefill_contig=false"] = get_backend_class(*parse_spec("triton/prefill_contig=false"))
    cells = run_shape(pre, "prefill", "smollm2", 1, 80, 80, args, torch.float32)
    by = {c.backend: c for c in cells}
    assert all(c.status == "ok" for c in cells), [(c.backend, c.status) for c in cells]
    assert by["triton"].kernel == "contig" and by["triton/prefill_contig=false"].kernel == "splits 1"
    # every request long: the hybrid's triton side gets the new K / V, as triton alone does (the paged extend
    # kernel, "splits 1", until 2026-12-05)
    assert by["hybrid/short=torch/long=triton/threshold=8"].kernel == "triton:contig"


def test_floors_script_on_fake_results(tmp_path):
    """experiments/fair-backends/floors.py turns a bench JSON and sweep folders into the floors table."""
    import importlib.util
    import json
    from dataclasses import asdict
    from pathlib import Path

    import yaml

    path = Path(__file__).parents[2] / "experiments" / "fair-backends" / "floors.py"
    spec = importlib.util.spec_from_file_location("floors", path)
    floors = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(floors)

    def c(phase, model, backend, ms, batch=1, kernel=""):
        q = 1 if phase == "decode" else 5
        return asdict(Cell(phase, model, batch, 4096, q, backend, ms=ms, kernel=kernel))

    bench = [c("decode", "smollm2", "flashinfer", 0.008), c("verify", "smollm2", "flashinfer", 0.009, kernel="fa2"),
             c("decode", "smollm2", "flashinfer/verify_backend=auto", 0.008),
             c("verify", "smollm2", "flashinfer/verify_backend=auto", 0.060),
             c("decode", "smollm2", "triton", 0.004, kernel="splits 32"),
             c("decode", "smollm2", "triton/num_splits=16", 0.007, kernel="splits 16")]
    (tmp_path / "k.json").write_text(json.dumps({"info": {}, "cells": bench}))

    def job(root, i, verify, graphs, batch, tok_s, lats):
        d = root / str(i)
        (d / ".hydra").mkdir(parents=True)
        (d / ".hydra" / "config.yaml").write_text(yaml.safe_dump(
            {"verify": {"name": verify}, "engine": {"cuda_graph": graphs}, "workload": {"batch_size": batch}}))
        (d / "metrics.json").write_text(json.dumps({"output_tokens_per_s": tok_s, "tpot_ms_p50": 2.0, "verify_ms": 1.5,
                                                    "attn_kernels_target": {"verify": "fa2"}}))
        (d / "requests.jsonl").write_text("".join(json.dumps({"prompt_tokens": n, "latency_ms": t}) + "\n"
                                                  for n, t in lats))

    job(tmp_path / "fa", 0, "triton", True, 1, 660.0, [])
    job(tmp_path / "fa", 1, "fa", True, 1, 600.0, [])
    job(tmp_path / "fa", 2, "fa", False, 1, 100.0, [])
    job(tmp_path / "hy", 0, "hybrid", True, 1, 500.0, [(200, 90.0), (4000, 150.0), (200, 110.0)])
    out = tmp_path / "floors.md"
    assert floors.main(["--kernels", str(tmp_path / "k.json"), "--e2e", str(tmp_path / "fa"), "--hybrid",
                        str(tmp_path / "hy"), "--out", str(out)]) == 0
    text = out.read_text()
    assert "| FlashInfer verify / own decode <= 1.3x | smollm2 b1 ctx4096 | 7.50x" in text and "1.12x" in text
    assert "1.75x faster | pass" in text and "n/a" in text  # llama8b cells missing: n/a, not a crash
    assert "| batch 1, triton 660 tok/s | 6.60x (100 tok/s eager) | 1.10x (600 tok/s) | pass |" in text
    assert "| hybrid | 1 | 500.0 | 2.0 | 1.5 | 100.0 | 150.0 | verify=fa2 |" in text


def test_pdl_specs(capsys):
    """``spec+pdl``: the same backend with PDL launches (an A/B in one process); refused with the reason where
    PDL cannot run (here: no sm_90 GPU), like any unavailable backend."""
    from attnlab.bench.kernels import load_backends, split_arm

    assert split_arm("triton+pdl") == ("triton", True, {})
    assert split_arm("triton/num_splits=64+pdl") == ("triton/num_splits=64", True, {})
    assert split_arm("triton/num_splits=64") == ("triton/num_splits=64", False, {})
    assert load_backends(["triton+pdl"]) == {}
    assert "skipping backend triton+pdl: +pdl:" in capsys.readouterr().err


@pytest.mark.parametrize("spec,want", [
    ("triton", ("triton", False, {})),
    ("triton/fused_merge=true+pdl+early16384", ("triton/fused_merge=true", True, {"early": 16384})),
    ("triton+early0+pdl", ("triton", True, {"early": 0})),
    ("triton+kvpf1+early8192", ("triton", False, {"early": 8192, "kvpf": 1})),
    ("triton+pdl+kvpf0", ("triton", True, {"kvpf": 0})),
    ("triton+vfirst0", ("triton", False, {"vfirst": 0})),
    ("triton+vfirst1+pdl+early16384", ("triton", True, {"vfirst": 1, "early": 16384})),
    ("triton+preload2+pdl", ("triton", True, {"preload": 2})),
    ("triton/decode_tiles=64x4x3+ahead1+pdl", ("triton/decode_tiles=64x4x3", True, {"ahead": 1})),
])
def test_arm_switches_parse_in_any_order(spec, want):
    from attnlab.bench.kernels import split_arm

    assert split_arm(spec) == want


@pytest.mark.parametrize("spec", ["triton+pdl+pdl", "triton+early", "triton+early-1", "triton+early1+early2",
                                  "triton+fast", "triton+", "triton+kvpf", "triton+kvpf0+kvpf1", "triton+pdl1",
                                  "triton+vfirst", "triton+vfirst0+vfirst1", "triton+preload",
                                  "triton+preload1+preload0", "triton+ahead", "triton+ahead1+ahead0"])
def test_arm_switches_refuse_unknown_or_repeated(spec):
    from attnlab.bench.kernels import split_arm

    with pytest.raises(ValueError, match="arm switch"):
        split_arm(spec)


def test_arm_switches_set_the_decode_for_their_block_and_refuse_bad_values(capsys):
    """``+early<elems>`` / ``+kvpf<tiles>`` / ``+vfirst<0|1>`` / ``+preload<0-2>``: the triton decode's early-tile gate,
    KV prefetch, load order and early tile's preload inside the arm's block (capture, timing), the process values
    restored after; a value out of range skips the spec with its reason."""
    from attnlab.bench.kernels import arm_switches, load_backends
    from attnlab.kernels import decode

    before = decode.early_tile_max(), decode.kv_prefetch()
    with arm_switches("triton+early16384"):
        assert (decode.early_tile_max(), decode.kv_prefetch()) == (16384, before[1])
    with arm_switches("triton+kvpf0+early0"):
        assert (decode.early_tile_max(), decode.kv_prefetch()) == (0, 0)
    with arm_switches("triton"):
        assert (decode.early_tile_max(), decode.kv_prefetch()) == before
    assert before == (decode.EARLY_TILE_MAX_ELEMS, decode.KV_PREFETCH_TILES)
    assert (decode.early_tile_max(), decode.kv_prefetch()) == before
    assert decode.v_first() == 0
    with arm_switches("triton+vfirst1"):  # no +pdl needed: the load order acts on every one-stage launch
        assert (decode.v_first(), decode.early_tile_max(), decode.kv_prefetch()) == (1, *before)
    assert decode.v_first() == 0
    assert decode.early_preload() == decode.EARLY_PRELOAD == 2
    with arm_switches("triton+preload0"):  # set here; load_backends refuses it without +pdl (below)
        assert (decode.early_preload(), decode.v_first(), decode.early_tile_max()) == (0, 0, before[0])
    assert decode.early_preload() == 2
    assert decode.page_ahead() == 0
    with arm_switches("triton+ahead1"):  # no +pdl needed: the loop's page-id loads, PDL or not
        assert (decode.page_ahead(), decode.v_first(), decode.early_tile_max()) == (1, 0, before[0])
    assert decode.page_ahead() == 0
    bad = ["triton+pdl+early99999", "triton+kvpf9+pdl", "triton+early16384", "flashinfer+pdl+kvpf1", "triton+vfirst2",
           "flashinfer+vfirst0", "triton+preload0", "triton+pdl+preload3", "triton+ahead2", "flashinfer+ahead1"]
    assert load_backends(bad) == {}
    assert set(load_backends(["triton+vfirst0", "triton+vfirst1"])) == {"triton+vfirst0", "triton+vfirst1"}
    err = capsys.readouterr().err
    assert "skipping backend triton+vfirst2: decode V-first order 2: 0 (K's load first) or 1 (V's)" in err
    assert "skipping backend triton+ahead2: decode page ids ahead 2: 0 (each tile's in its own iteration)" in err
    assert "skipping backend flashinfer+ahead1: +ahead: the triton decode's switches, not flashinfer's" in err
    assert "skipping backend flashinfer+vfirst0: +vfirst: the triton decode's switches, not flashinfer's" in err
    assert "skipping backend triton+pdl+early99999: decode early tile gate 99999" in err
    assert "skipping backend triton+kvpf9+pdl: decode KV prefetch 9" in err
    assert "skipping backend triton+early16384: +early act only with +pdl" in err  # it would time the plain launch
    assert "skipping backend flashinfer+pdl+kvpf1: +kvpf: the triton decode's switches, not flashinfer's" in err
    assert "skipping backend triton+preload0: +preload act only with +pdl" in err
    assert "skipping backend triton+pdl+preload3: decode early-tile preload 3: 0 (none before the PDL wait)" in err


def test_run_shape_captures_and_times_each_arm_under_its_switches(monkeypatch):
    """run_shape enters an arm's switches (the decode's early-tile gate and KV prefetch) around its capture and each
    measurement, and the process values are back between arms (``+pdl`` itself needs a Hopper GPU: not here)."""
    import argparse

    import torch

    from attnlab.backends.base import Mode
    from attnlab.backends.cases import random_paged_case
    from attnlab.backends.registry import get_backend_class
    from attnlab.bench import kernels
    from attnlab.kernels import decode

    def cpu_build(model, batch, context, q_len, page_size, dtype, seed=0):
        hq, hkv, d = kernels.HEADS[model]
        pool, meta, q = random_paged_case(kv_lens=[context] * batch, q_lens=[q_len] * batch, page_size=page_size,
                                          num_q_heads=hq, num_kv_heads=hkv, head_dim=d, dtype=dtype, spare_pages=0,
                                          mode=Mode.DECODE)
        return pool, meta, q, 1

    seen = []

    class FakeTimer:
        def __init__(self, be, q, num_layers, graphable, reps, iters, kv=None, between=None):
            seen.append(("capture", be.num_splits, decode.early_tile_max(), decode.kv_prefetch()))
            self.graph, self.graph_error, self.reps, self.iters, self.splits = object(), None, reps, iters, be.num_splits
            self.between_ms = []

        def measure(self):
            seen.append(("measure", self.splits, decode.early_tile_max(), decode.kv_prefetch()))
            return 0.5

    monkeypatch.setattr(kernels, "build", cpu_build)
    monkeypatch.setattr(kernels, "Timer", FakeTimer)
    labels = {"triton/num_splits=2+early16384+kvpf3": get_backend_class("triton", {"num_splits": 2}),
              "triton/num_splits=3": get_backend_class("triton", {"num_splits": 3})}  # told apart by num_splits
    args = argparse.Namespace(page_size=16, reps=5, iters=10, repeats=2, copy_gb_s=1000.0)
    cells = kernels.run_shape(labels, "decode", "smollm2", 1, 64, 1, args, torch.float32)
    assert all(c.status == "ok" for c in cells), [(c.backend, c.status) for c in cells]
    default = (decode.EARLY_TILE_MAX_ELEMS, decode.KV_PREFETCH_TILES)
    for what, splits, gate, tiles in seen:
        assert (gate, tiles) == ((16384, 3) if splits == 2 else default), (what, splits, gate, tiles)
    assert {splits for _, splits, *_ in seen} == {2, 3} and [w for w, *_ in seen].count("measure") == 4
    assert (decode.early_tile_max(), decode.kv_prefetch()) == default


def test_cold_timer_flushes_before_each_run_and_subtracts_the_flushes(monkeypatch):
    """--cold: a flush before every run, the flushes' own time (timed alone in the same sample) subtracted."""
    from attnlab.bench import kernels

    log = []

    class Be:
        def run(self, q, layer):
            log.append(("run", layer))
            return q

    class Flush:  # a CPU stand-in for the L2-sized buffer: its write is logged
        def zero_(self):
            log.append(("flush",))

    def timed(run):  # fake device time: 2 ms a run, 10 ms a flush
        n = len(log)
        run()
        return sum(2.0 if e[0] == "run" else 10.0 for e in log[n:])

    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a: None)
    monkeypatch.setattr(kernels, "event_ms", timed)
    t = kernels.Timer(Be(), torch.zeros(2), num_layers=3, graphable=False, reps=4, iters=5, between=Flush().zero_)
    assert t.reps == 4 and t.iters == 5
    log.clear()
    assert t.measure() == pytest.approx(2.0)  # (4 x 12 - 4 x 10) / 4
    assert t.between_ms == [pytest.approx(10.0)]  # what was subtracted, a run: recorded in the cell (between_ms)
    first = log[:8]  # the first sample's runs: a flush before each, the layers walked
    assert first == [("flush",), ("run", 0), ("flush",), ("run", 1), ("flush",), ("run", 2), ("flush",), ("run", 0)]
    assert log[8:12] == [("flush",)] * 4  # then the flushes alone
    warm = kernels.Timer(Be(), torch.zeros(2), num_layers=3, graphable=False, reps=4, iters=5)
    log.clear()
    assert warm.measure() == pytest.approx(2.0) and ("flush",) not in log and warm.between_ms == []


def test_mlp_between_runs_a_layers_mlp():
    """--between gemm: one layer's MLP (gate / up, SiLU-mul, down) at the model's hidden size, into buffers made once."""
    from attnlab.bench.between import make_between

    mlp = make_between("gemm", hidden=576, tokens=5, device="cpu")
    assert mlp.label == "gemm"
    assert mlp.w1.shape == (576, 3456) and mlp.w2.shape == (1728, 576) and mlp.out.shape == (5, 576)
    out = mlp.out
    mlp()
    gate, up = (mlp.x.float() @ mlp.w1.float()).chunk(2, dim=-1)
    want = (torch.nn.functional.silu(gate) * up) @ mlp.w2.float()
    assert mlp.out is out and torch.isfinite(out.float()).all() and out.float().abs().sum() > 0
    # bf16 rounding of y, z and out (3 roundings of ~0.4% each) against an fp32 chain from bf16 y
    torch.testing.assert_close(out.float(), want, atol=0.03, rtol=0.02)
    mm, ew = make_between("gemm-mm", 576, 5, "cpu"), make_between("gemm-ew", 576, 5, "cpu")
    mm()  # the GEMMs alone: the SiLU-mul's buffer untouched (zeros)
    assert mm.label == "gemm-mm" and mm.y.abs().sum() > 0 and mm.z.abs().sum() == 0
    ew.y.copy_(mm.y)
    ew.out.zero_()
    ew()  # the SiLU-mul alone: no GEMM writes
    assert ew.label == "gemm-ew" and ew.out.abs().sum() == 0
    gate, up = mm.y.chunk(2, dim=-1)
    torch.testing.assert_close(ew.z, torch.nn.functional.silu(gate) * up)


def test_weight_copies_cover_twice_the_l2():
    """A between GEMM walks over enough weight copies for twice the L2 (at least 64 MiB): one off CUDA."""
    from attnlab.bench.between import l2_bytes, weight_copies

    mib = 1 << 20
    assert l2_bytes("cpu") is None and weight_copies(32 * mib, None) == 1
    assert weight_copies(32 * mib, 50 * mib) == 4  # Llama-8B's output projection on an H100: 128 MiB for 100
    assert weight_copies(576 * 576 * 2, 50 * mib) == 159  # SmolLM2's: 0.63 MiB
    assert weight_copies(9 * 4096 * 4096 * 2, 50 * mib) == 1  # Llama-8B's MLP: past the L2 alone
    assert weight_copies(mib, 16 * mib) == 64  # a small L2: 64 MiB at least


def test_between_gemms_walk_their_weight_copies(monkeypatch):
    """--between gemm / oproj: copies of their own weights' size (gemm-ew, no GEMM: one, unasked), and each call takes
    the next copy, cyclically, and computes with that one; on a GPU the real count."""
    from attnlab.bench import between

    asked = []
    monkeypatch.setattr(between, "weight_copies", lambda nbytes, l2: asked.append(nbytes) or 3)
    mlp = between.make_between("gemm", hidden=64, tokens=2, device="cpu")
    assert asked == [9 * 64 * 64 * 2] and mlp.copies == 3 and len(mlp.weights) == 3
    assert len({w[0].data_ptr() for w in mlp.weights}) == 3
    used = []
    for _ in range(4):
        mlp()
        used.append(mlp.w1.data_ptr())
        gate, up = (mlp.x.float() @ mlp.w1.float()).chunk(2, dim=-1)
        torch.testing.assert_close(mlp.out.float(), (torch.nn.functional.silu(gate) * up) @ mlp.w2.float(),
                                   atol=0.03, rtol=0.02)
    assert used == [w[0].data_ptr() for w in mlp.weights] + [mlp.weights[0][0].data_ptr()]
    ew = between.make_between("gemm-ew", hidden=64, tokens=2, device="cpu")
    assert asked == [9 * 64 * 64 * 2] and ew.copies == 1 and len(ew.weights) == 1
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    t = between.make_between("oproj", hidden=64, tokens=2, device=dev)
    assert asked[1:] == [64 * 64 * 2] and t.copies == 3 and len(t.linears) == 3
    for i in range(4):
        t()
        assert t.linear is t.linears[i % 3]
        want = t.residual.float() + t.x.float() @ t.linear.weight.float().T
        torch.testing.assert_close(t.out.float(), want, atol=0.05, rtol=0.02)
    monkeypatch.undo()
    if dev == "cuda":
        big = between.make_between("oproj", hidden=4096, tokens=1, device=dev)
        assert big.copies == between.weight_copies(4096 * 4096 * 2, between.l2_bytes(dev)) > 1


@pytest.mark.parametrize("hidden", [64, 2048])
def test_oproj_between_is_the_engines_o_proj(hidden):
    """--between oproj: the output projection as the gemm path runs it on attnlab's Triton GEMM (the interpreter
    here): residual + x @ w.T, and the next RMSNorm from its tail at widths ``norm_tail`` takes (64), not past them
    (2048); more than its 16 rows is refused with the reason."""
    from attnlab.bench.between import make_between
    from attnlab.kernels import gemm

    dev = "cuda" if torch.cuda.is_available() else "cpu"
    t = make_between("oproj", hidden=hidden, tokens=3, device=dev)
    tail = gemm.norm_tail(hidden)
    assert tail == (hidden == 64)
    assert t.label == ("oproj+tail" if tail else "oproj") and t.linear.weight.shape == (hidden, hidden)
    t()
    want = t.residual.float() + t.x.float() @ t.linear.weight.float().T
    torch.testing.assert_close(t.out.float(), want, atol=0.05, rtol=0.02)  # bf16 output
    if tail:
        h = t.out.float()
        normed = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + 1e-5)
        torch.testing.assert_close(t.normed.float(), normed, atol=0.03, rtol=0.02)
    else:
        assert t.normed is None
    with pytest.raises(ValueError, match="at most 16 rows"):
        make_between("oproj", hidden=hidden, tokens=17, device=dev)


def test_no_smem_between_adds_one():
    from attnlab.bench.between import make_between

    dev = "cuda" if torch.cuda.is_available() else "cpu"
    t = make_between("smem-none", hidden=576, tokens=5, device=dev)
    assert t.label.startswith("smem-none (") and t.label.endswith(" B shared)")
    t.x.fill_(2.0)
    t()
    assert torch.equal(t.y, torch.full_like(t.x, 3.0))


@pytest.mark.parametrize("name", ["smem-low", "smem-high"])
def test_smem_between_computes_its_tile(name):
    """--between smem-*: every program stores A @ B (its label: the compiled kernel's shared memory, ? where the
    interpreter compiles none)."""
    from attnlab.bench.between import make_between

    dev = "cuda" if torch.cuda.is_available() else "cpu"
    t = make_between(name, hidden=576, tokens=5, device=dev)
    assert t.label.startswith(name + " (") and t.label.endswith(" B shared)")
    want = t.a.float() @ t.b.float()
    for c in t.c:
        torch.testing.assert_close(c, want, atol=1e-3, rtol=1e-4)  # bf16 inputs, fp32 sums: order only
    with pytest.raises(ValueError, match="one of gemm"):
        make_between("nope", hidden=576, tokens=5, device=dev)


def test_cold_and_between_are_exclusive(capsys):
    from attnlab.bench import kernels

    with pytest.raises(SystemExit):
        kernels.main(["--cold", "--between", "gemm"])
    assert "--cold and --between" in capsys.readouterr().err


def test_launch_shapes_from_a_chrome_trace():
    from attnlab.bench.kernel_profile import launch_lines, shapes_of_trace

    ev = lambda name, grid, smem=0, cat="kernel": {"ph": "X", "cat": cat, "name": name,
                                                   "args": {"grid": grid, "block": [128, 1, 1], "shared memory": smem}}
    trace = {"traceEvents": [ev("kernel_mha", [3, 1, 1], 1024), ev("kernel_mha", [3, 1, 1], 1024),
                             ev("kernel_mha", [3, 4, 1], 1024), ev("aten::mm", [1, 1, 1], cat="cpu_op"),
                             {"ph": "M", "name": "process_name"}]}
    got = shapes_of_trace(trace)
    assert list(got) == ["kernel_mha"]  # CPU ops and metadata are not kernels
    assert got["kernel_mha"] == [{"grid": [3, 1, 1], "block": [128, 1, 1], "shared_memory": 1024, "launches": 2},
                                 {"grid": [3, 4, 1], "block": [128, 1, 1], "shared_memory": 1024, "launches": 1}]
    lines = launch_lines(got, ["kernel_mha", "absent"])
    assert lines[2] == "| kernel_mha | [3, 1, 1] | [128, 1, 1] | 1024 | 2 |" and len(lines) == 4
    assert launch_lines(got, ["absent"]) == []
