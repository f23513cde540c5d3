"""bench.gemm_fused: its arms, and its CPU smoke (--interpret) end to end."""

from __future__ import annotations

import json

import pytest

from attnlab.bench import gemm_fused as bench


def test_arms_are_split_modes():
    assert bench.parse_splits("fill/pass, lean/ticket") == ["fill/pass", "lean/ticket"]
    for bad in ("fill", "fill/pass:exact", ""):
        with pytest.raises(ValueError, match="--splits"):
            bench.parse_splits(bad)


def test_interpret_smoke(capsys, tmp_path):
    """Every arm of the four fused calls runs, matches the first arm and keeps rows invariant."""
    out = tmp_path / "fused.json"
    assert bench.main(["--interpret", "--ms", "1,3", "--out", str(out)]) == 0
    text = capsys.readouterr().out
    assert "| tiny | 3 | lean/ticket |" in text and "| tiny | 1 | cuBLAS |" in text
    rows = json.loads(out.read_text())["rows"]
    assert len(rows) == 2 * 4 and all(r.get("same_as_first", True) and r.get("invariant", True) for r in rows)
    assert bench.main(["--interpret", "--splits", "fill"]) == 2


def test_interpret_smoke_norm_places(capsys, tmp_path):
    """The calls follow the arm's norm place: +normtail's o / down end with the next norm, +normpro's qkv / gate_up
    take the prologue, and the layer of +normsep (the default) times its two norm launches too; the streams match."""
    from attnlab.kernels import gemm

    calls = []
    real = gemm.gemm
    out = tmp_path / "fused.json"
    gemm.gemm = lambda *a, **k: calls.append((k.get("tail_norm") is not None, k.get("norm_weight") is not None)) \
        or real(*a, **k)
    try:
        assert bench.main(["--interpret", "--ms", "1,2", "--splits", "fill/ticket+normtail,fill/ticket+normpro",
                           "--out", str(out)]) == 0
    finally:
        gemm.gemm = real
    rows = json.loads(out.read_text())["rows"]
    assert all(r.get("same_as_first", True) and r.get("invariant", True) for r in rows)
    assert (True, False) in calls and (False, True) in calls
    assert "| tiny | 2 | fill/ticket+normpro |" in capsys.readouterr().out


def test_bench_pdl_arms():
    """bench.pdl: PDL off and on for every engine, then PDL-on arms for the further ``--gemm-splits``."""
    from attnlab.bench import pdl as bench_pdl

    assert bench_pdl.arms_for("fused", ["fill/ticket"]) == [(False, "fill/ticket"), (True, "fill/ticket")]
    arms = bench_pdl.arms_for("gemm", ["fill/ticket", "fill/pass", "lean/ticket"])
    assert arms == [(False, "fill/ticket"), (True, "fill/ticket"), (True, "fill/pass"), (True, "lean/ticket")]
    assert bench_pdl.arm_name("gemm", arms[2]) == "PDL on, fill/pass" and bench_pdl.arm_name("fused", arms[0]) == "PDL off"
    # every engine runs every arm; a cuBLAS engine's name shows only the switches that act on it
    arms = bench_pdl.arms_for("fused", ["fill/ticket", "fill/ticket+kvsep"])
    assert arms[2] == (True, "fill/ticket+kvsep") and bench_pdl.arm_name("fused", arms[2]) == "PDL on, +kvsep"
    assert bench_pdl.arm_name("gemm-attn", arms[2]) == "PDL on, fill/ticket+kvsep"
    assert bench_pdl.ENGINES["gemm-attn"] == "gemm_attn"
    # arms whose fp32 sums may run in another order may decode other tokens at near-ties; stages never do
    assert bench_pdl.sums_differ("fill/ticket", "fill/ticket+k256s3w4")
    assert bench_pdl.sums_differ("fill/ticket", "lean/ticket") and bench_pdl.sums_differ("fill/ticket", "fill/pass+normpro")
    assert not bench_pdl.sums_differ("fill/ticket+k128s3w4", "fill/pass+k128s5w4+kvsep")
    assert bench_pdl.sums_differ("fill/ticket+k128s3w4", "fill/ticket+k128s3w8")  # warps may change the MMA
    assert not bench_pdl.sums_differ("fill/ticket", "fill/ticket+normpro", norms=False)  # gemm-attn has no prologue
    assert bench_pdl.sums_differ("fill/ticket", "fill/ticket+normtail")  # the tail sums the squares in its own order
    assert not bench_pdl.sums_differ("fill/ticket", "fill/pass+o.lean")  # o's default policy under fill
    assert bench_pdl.sums_differ("fill/ticket", "fill/ticket+o.fill")  # o split as before 12-04c
    assert bench_pdl.sums_differ("fill/ticket", "fill/ticket+k128s3w4")  # the default's BLOCK_K depends on K
    assert bench_pdl.sums_differ("fill/ticket", "fill/ticket+qkv.k128s4w4")  # one role's loop
    assert not bench_pdl.sums_differ("fill/ticket+qkv.k128s3w4", "fill/ticket+qkv.k128s4w4")  # its stages only
    assert bench_pdl.sums_differ("fill/ticket", "fill/ticket+pair2")  # the paired GEMMs' MMA: another sum order
    assert not bench_pdl.sums_differ("fill/ticket", "fill/pass+pair1")
    assert bench_pdl.sums_differ("fill/ticket+qkv.k128s4w4", "fill/ticket+o.k128s4w4")
    assert bench_pdl.sums_differ("fill/ticket", "fill/ticket+f8x2", fp8=True)  # fp8 weights split otherwise
    assert not bench_pdl.sums_differ("fill/ticket", "fill/ticket+f8x2")  # a bf16 side's GEMMs do not see it
    assert not bench_pdl.sums_differ("fill/ticket+f8wide", "fill/ticket+f8cast", fp8=True)  # cast / ptx / wide: the same
    assert bench_pdl.sums_differ("fill/ticket+f8wide", "fill/ticket", fp8=True)  # the default, half: f16 activations
    assert not bench_pdl.sums_differ("fill/ticket", "fill/ticket+f8half", fp8=True)
    assert not bench_pdl.sums_differ("fill/ticket", "fill/ticket+bm16", fp8=True)  # the batch tile: the same bits
    assert not bench_pdl.sums_differ("fill/ticket", "fill/ticket+f8half")  # a bf16 side's GEMMs do not see it
    for bad in (["--weights", "fp4"], ["--weights", ","]):
        with pytest.raises(SystemExit):
            bench_pdl.main(bad)
    with pytest.raises(SystemExit):  # argparse's error: exit 2 before anything runs
        bench_pdl.main(["--gemm-splits", "fill/pass:exact"])


def test_roofline_is_batch_times_bandwidth_over_weight_bytes():
    from attnlab.bench.e2e import roofline_tok_s

    assert roofline_tok_s(15_010_000_000, 1, 4248.0) == pytest.approx(283.0, abs=0.1)  # Llama-3.1-8B on an H200
    assert roofline_tok_s(15_010_000_000, 16, 4248.0) == pytest.approx(16 * 283.0, abs=2)
    for bad in ((0, 1, 4000.0), (1, 0, 4000.0), (1, 1, 0.0)):
        with pytest.raises(ValueError, match="roofline_tok_s"):
            roofline_tok_s(*bad)


def test_split_mode_parsing_is_shared():
    from attnlab.kernels import gemm

    assert gemm.parse_split_modes(" fill/pass, lean/ticket,fill/pass") == ["fill/pass", "lean/ticket"]
    assert gemm.parse_split_modes("fill/ticket,fill/ticket+pf4") == ["fill/ticket", "fill/ticket+pf4"]
    for bad in ("", "fill", "fill/pass:exact", "fill/ticket+pf17", "fill/ticket+4", "fill/ticket+pf"):
        with pytest.raises(ValueError, match="split mode"):
            gemm.parse_split_modes(bad)


def test_arm_sets_and_restores_the_split_mode_and_the_prefetch():
    from attnlab.kernels import gemm

    before = gemm.split_mode(), gemm.prefetch_chunks()
    with gemm.arm("lean/pass+pf8"):
        assert (gemm.split_mode(), gemm.prefetch_chunks()) == ("lean/pass", 8)
        with gemm.arm("fill/ticket"):  # no suffix: the engine's default prefetch
            assert (gemm.split_mode(), gemm.prefetch_chunks()) == ("fill/ticket", gemm.DEFAULT_PREFETCH)
        with gemm.arm("fill/ticket+pf0"):
            assert gemm.prefetch_chunks() == 0
    assert (gemm.split_mode(), gemm.prefetch_chunks()) == before
    for bad in (-1, 17, True, 2.0):
        with pytest.raises(ValueError, match="gemm prefetch"):
            gemm.set_prefetch(bad)


def test_bench_pdl_weights_rounds_and_table_with_fake_sides(monkeypatch, tmp_path, capsys):
    """bench.pdl --weights bf16,fp8w end to end on fake sides (the CUDA parts stubbed): every arm on each side in the
    same rounds, tokens compared within a side, each fp8w row's ratio to the bf16 row of its arm, its own roofline."""
    import contextlib
    import types

    import torch

    from attnlab.bench import pdl as bench_pdl

    speed = {"bf16": 100.0, "fp8w": 150.0}
    built = []

    def fake_side(model, backend, batch, graphs, ctx, fused=False, weights="bf16"):
        built.append((model, fused, weights))
        return types.SimpleNamespace(model=weights, model_config=types.SimpleNamespace(vocab_size=1000), device="cpu",
                                     weights=weights)

    def fake_decode(runner, prompts, new):  # fp8w decodes other tokens than bf16; PDL on is 10% faster
        return speed[runner.weights] * (1.1 if bench_pdl.pdl.enabled() else 1.0), [[len(runner.weights)]]

    monkeypatch.setattr(bench_pdl, "side", fake_side)
    monkeypatch.setattr(bench_pdl, "timed_decode", fake_decode)
    monkeypatch.setattr(bench_pdl, "set_host_path", lambda runner, host: None)
    monkeypatch.setattr(bench_pdl, "step_weight_bytes", lambda model: {"bf16": 2000, "fp8w": 1000}[model])
    monkeypatch.setattr(bench_pdl, "copy_bandwidth_gb_s", lambda: 1e-6)  # roofline = 1e3 / bytes tok/s
    monkeypatch.setattr(bench_pdl, "versions", dict)
    monkeypatch.setattr(bench_pdl.pdl, "unsupported", lambda device: None)
    flag = {"on": False}
    monkeypatch.setattr(bench_pdl.pdl, "enabled", lambda: flag["on"])

    @contextlib.contextmanager
    def using(on, device):
        old, flag["on"] = flag["on"], on
        yield
        flag["on"] = old

    monkeypatch.setattr(bench_pdl.pdl, "using", using)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda: "fake")
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: None)
    out = tmp_path / "w"
    assert bench_pdl.main(["--models", "llama-3.2-1b", "--engines", "gemm", "--weights", "bf16,fp8w", "--rounds", "2",
                           "--gemm-splits", "fill/ticket,fill/ticket+qkv.k128s4w4", "--out", str(out)]) == 0
    assert [w for _, _, w in built] == ["bf16", "fp8w"]
    rows = __import__("json").loads(out.with_suffix(".json").read_text())["rows"]
    assert [(r["weights"], r["pdl"], r["arm"]) for r in rows] == [
        (w, on, arm) for w in ("bf16", "fp8w") for on, arm in
        ((False, "fill/ticket"), (True, "fill/ticket"), (True, "fill/ticket+qkv.k128s4w4"))]
    assert all(r["same_tokens"] for r in rows)  # within a side; the sides' tokens differ
    for r in rows:
        assert r["vs_first_weights"] == pytest.approx([1.0, 1.0] if r["weights"] == "bf16" else [1.5, 1.5])
        assert r["ratio"] == pytest.approx([1.1, 1.1] if r["pdl"] else [1.0, 1.0])  # to its own side's first arm
        assert r["roofline_tok_s"] == pytest.approx({"bf16": 0.5, "fp8w": 1.0}[r["weights"]])
    assert "| llama-3.2-1b | 1 | gemm, fp8w | thin8 | PDL on, fill/ticket | " in capsys.readouterr().out
    assert "vs its side's first arm, per round (min-max) | vs bf16, same arm (min-max) |" in out.with_suffix(".md").read_text()
