"""attnlab.bench.spec on CPU with the tiny model: both engines, all drafters, lossless, and HF-identical."""

import pytest
import torch

from attnlab.bench import spec


def test_spec_bench_on_cpu_is_lossless_and_matches_hf():
    a = spec.parse(["--device", "cpu", "--model", "tiny-llama", "--backends", "torch", "--num-prompts", "2",
                    "--new", "12", "--k", "3", "--draft-layers", "1"])
    assert a.weights == "random" and a.dtype == "fp32"
    res = spec.run(a)
    rows, outs = res["rows"], res["outputs"]
    assert [(r["engine"], r["drafter"]) for r in rows] == [
        ("hf", "none"), ("hf", "ngram"), ("hf", "self"), ("attnlab", "none"), ("attnlab", "ngram"), ("attnlab", "self")]
    for r in rows:
        assert r["new_tokens"] == 2 * 12 and r["tok_s"] > 0 and r["target_passes"] >= 2
        if r["drafter"] != "none":  # greedy speculative decoding is lossless on both engines
            assert r["same_as_target_only"] == 1.0 and r["speedup"] > 0
            assert r["tokens_per_target_pass"] >= 1.0
    # fp32 greedy: attnlab decodes exactly what HF generate decodes from the same tensors
    assert outs[3] == outs[0]
    assert rows[4]["tau"] >= 1.0
    assert "| attnlab | 1 | self | 3 | chain | torch / torch |" in res["markdown"] and "Random weights" in res["markdown"]
    assert "= HF generate, token for token: 2 of 2 prompts" in res["markdown"]


def test_spec_bench_eagle_rows_at_two_batch_sizes(tmp_path):
    from tests.cli.test_eagle_cli import _head_for_tiny_llama

    head = _head_for_tiny_llama(tmp_path / "head")
    a = spec.parse(["--device", "cpu", "--model", "tiny-llama", "--backends", "torch", "--num-prompts", "2",
                    "--new", "10", "--k", "2,3", "--drafters", "eagle", "--eagle-head", str(head), "--batch", "1,2",
                    "--repeats", "2"])
    assert a.skip_hf and a.batches == [1, 2]
    res = spec.run(a)
    rows = res["rows"]
    assert [(r["batch"], r["drafter"], r["k"]) for r in rows] == [
        (1, "none", 0), (1, "eagle", 2), (1, "eagle", 3), (2, "none", 0), (2, "eagle", 2), (2, "eagle", 3)]
    for r in rows:
        assert len(r["repeats_s"]) == 2 and r["tok_s_min"] <= r["tok_s"] <= r["tok_s_max"]
        if r["drafter"] == "eagle":
            assert r["same_as_target_only"] == 1.0 and 1.0 <= r["tau"] <= r["k"] + 1
            assert set(r["phase_ms"]) == set(spec.PHASES) and r["phase_ms"]["draft_extend"] > 0
            # on CPU host and device time are one clock: the host split is the phase split
            assert r["host_ms"] == pytest.approx(r["phase_ms"])


def test_spec_bench_eagle_per_step_row_drafts_the_same(tmp_path):
    """eagle-per-step (a replay per head step, the previous path) sits beside eagle (the k - 1 steps as one
    multi-step pass): same outputs and acceptance, since both propose the same tokens."""
    from tests.cli.test_eagle_cli import _head_for_tiny_llama

    head = _head_for_tiny_llama(tmp_path / "head")
    a = spec.parse(["--device", "cpu", "--model", "tiny-llama", "--backends", "torch", "--num-prompts", "2",
                    "--new", "10", "--k", "3", "--drafters", "eagle,eagle-per-step", "--eagle-head", str(head),
                    "--repeats", "1"])
    assert a.skip_hf
    rows = {r["drafter"]: r for r in spec.run(a)["rows"]}
    assert set(rows) == {"none", "eagle", "eagle-per-step"}
    assert rows["eagle"]["tau"] == rows["eagle-per-step"]["tau"] and rows["eagle"]["same_as_target_only"] == 1.0


def test_spec_bench_draft_backends_pick_the_draft_side_alone():
    """--draft-backends: the self / eagle rows' draft side, independent of --backends (the verify side): one pair
    instead of the cross product; ngram rows (no draft side) are unaffected."""
    a = spec.parse(["--device", "cpu", "--model", "tiny-llama", "--backends", "torch", "--draft-backends", "triton",
                    "--drafters", "ngram,self", "--num-prompts", "1", "--new", "6", "--k", "2", "--draft-layers", "1",
                    "--skip-hf"])
    assert a.backends == ["torch"] and a.draft_backends == ["triton"]
    rows = spec.run(a)["rows"]
    assert [(r["drafter"], r["pair"]) for r in rows] == [("none", "- / torch"), ("ngram", "- / torch"),
                                                          ("self", "triton / torch")]
    assert rows[2]["same_as_target_only"] == 1.0
    assert spec.parse(["--device", "cpu", "--backends", "torch"]).draft_backends == ["torch"]  # the default


def test_spec_bench_backend_options_reach_the_side():
    """A backend label ``name/key=value`` builds that side with those options (flashinfer/device_steps=false is
    how the flashinfer draft's host-planned steps are measured beside its device-planned ones); an unknown option
    skips that cell with its reason."""
    a = spec.parse(["--device", "cpu", "--model", "tiny-llama", "--backends", "torch",
                    "--draft-backends", "triton/num_splits=2,triton/bogus=1", "--drafters", "self",
                    "--num-prompts", "1", "--new", "6", "--k", "2", "--draft-layers", "1", "--skip-hf"])
    res = spec.run(a)
    assert [(r["drafter"], r["pair"]) for r in res["rows"]] == [("none", "- / torch"),
                                                                 ("self", "triton/num_splits=2 / torch")]
    assert res["rows"][1]["same_as_target_only"] == 1.0
    assert any("triton/bogus=1" in s and "bogus" in s.split(":", 1)[1] for s in res["skipped"]), res["skipped"]


def test_spec_bench_rejects_unknown_drafter():
    with pytest.raises(SystemExit) as e:
        spec.parse(["--device", "cpu", "--model", "tiny-llama", "--drafters", "medusa"])
    assert e.value.code == 2


def test_spec_bench_refuses_fused_ops_off_cuda(capsys):
    with pytest.raises(SystemExit) as e:
        spec.parse(["--device", "cpu", "--model", "tiny-llama", "--fused-ops"])
    assert e.value.code == 2 and "--fused-ops needs --device cuda" in capsys.readouterr().err
    with pytest.raises(SystemExit) as e:
        spec.parse(["--device", "cpu", "--model", "tiny-llama", "--gemm", "triton_attn"])
    assert e.value.code == 2 and "--gemm triton_attn needs --device cuda" in capsys.readouterr().err


@pytest.mark.parametrize("flags,fused", [(["--device", "cpu"], False), (["--device", "cuda"], True),
                                         (["--device", "cuda", "--no-fused-ops"], False),
                                         (["--device", "cuda", "--fused-ops"], True)])
def test_spec_bench_fuses_the_layers_as_the_engine_does(flags, fused):
    """The default is engine.fused_ops=auto's: the fused Triton layer kernels with --device cuda, torch's on the CPU
    (the main job's default, so the bench times what a run runs); --no-fused-ops gives the unfused layers."""
    a = spec.parse([*flags, "--model", "tiny-llama", "--weights", "random"])
    assert a.fused_ops is fused
    assert f"fused layer ops {'on' if fused else 'off'}" in spec.header(a, torch.device("cpu"), 1)  # no GPU name here


@pytest.mark.parametrize("flags,needle", [(["--gemm", "triton"], "--gemm triton needs --device cuda"),
                                          (["--pdl"], "--pdl: engine.pdl=true"),
                                          (["--device", "cuda", "--invariant", "--gemm", "triton"],
                                           "does not combine with --gemm triton")])
def test_spec_bench_refuses_gpu_engine_options_off_cuda(capsys, flags, needle):
    with pytest.raises(SystemExit) as e:
        spec.parse(["--device", "cpu", "--model", "tiny-llama", *flags])
    assert e.value.code == 2 and needle in capsys.readouterr().err


def test_spec_bench_tree_rows_at_the_same_budget(tmp_path):
    """--trees: chain and tree rows at each budget k, all lossless; a shape that cannot fill a budget is skipped
    with the reason (2x3 holds at most 2 + 2 * 4 = 10 nodes, k=3 < num_steps would not be; 4x4 needs k >= 4)."""
    a = spec.parse(["--device", "cpu", "--model", "tiny-llama", "--backends", "torch", "--num-prompts", "2",
                    "--new", "10", "--k", "3,4", "--drafters", "self", "--draft-layers", "1", "--trees",
                    "chain,2x3,4x4,2x3-steps", "--skip-hf", "--out", str(tmp_path / "t")])
    assert a.trees == [(1, None, False), (2, 3, False), (4, 4, False), (2, 3, True)]
    res = spec.run(a)
    rows = [(r["k"], r["tree"]) for r in res["rows"] if r["drafter"] == "self"]
    assert rows == [(3, "chain"), (3, "2x3"), (3, "2x3-steps"), (4, "chain"), (4, "2x3"), (4, "4x4"), (4, "2x3-steps")]
    for r in res["rows"]:
        if r["drafter"] == "self":
            assert r["same_as_target_only"] == 1.0 and 1.0 <= r["tau"] <= 5
    assert any("tree 4x4 at k=3" in s and "spec.num_steps=4 > spec.num_draft_tokens=3" in s for s in res["skipped"])
    assert "| attnlab | 1 | self | 4 | 4x4 | torch / torch |" in res["markdown"]


@pytest.mark.parametrize("bad", ["1x3", "4", "4x0", "", "chain-steps", "4x3-step"])
def test_spec_bench_rejects_bad_tree_shapes(bad):
    with pytest.raises(SystemExit) as e:
        spec.parse(["--device", "cpu", "--model", "tiny-llama", "--trees", bad])
    assert e.value.code == 2


def test_spec_bench_invariant_needs_cuda_graphs(capsys):
    for argv in (["--device", "cpu", "--invariant"], ["--device", "cuda", "--invariant", "--no-graphs"]):
        with pytest.raises(SystemExit) as e:
            spec.parse(["--model", "tiny-llama", *argv])
        assert e.value.code == 2 and "--invariant needs --device cuda with CUDA graphs" in capsys.readouterr().err


def test_invariance_broken_names_the_row_prompt_and_token():
    """--invariant's verdict: each speculative row against the target-only row of its batch and verify backend."""
    def row(drafter, outs, pair="- / triton", batch=1):
        return spec.Row("attnlab", drafter, pair, 1.0, 1, 1, outs, batch=batch, k=0 if drafter == "none" else 4)

    ref = [[1, 2, 3], [4, 5, 6]]
    rows = [spec.Row("hf", "none", "sdpa", 1.0, 1, 1, [[9]]), row("none", ref), row("ngram", [[1, 2, 3], [4, 5, 6]]),
            row("eagle", [[1, 2, 3], [4, 7, 6]], "triton / triton"), row("none", [[1], [2]], batch=2),
            row("ngram", [[1], [2]], batch=2)]
    assert spec.invariance_broken(rows) == [("BROKEN: eagle triton / triton k=4 batch 1, round 1: 1 of 2 prompts "
                                             "differ from target-only (first: prompt 1 at token 1)")]
    shorter = [row("none", ref), row("ngram", [[1, 2, 3], [4, 5]])]  # a prefix: differs where it ends
    assert spec.invariance_broken(shorter)[0].endswith("(first: prompt 1 at token 2)")
    assert spec.invariance_broken(rows[:3]) == []
    # every round counts, not the last one only: round 2 of 3 differs here
    late = row("ngram", ref)
    late.outputs_rounds = [ref, [[1, 2, 3], [4, 5, 7]], ref]
    base = row("none", ref)
    base.outputs_rounds = [ref] * 3
    assert spec.invariance_broken([base, late]) == [("BROKEN: ngram - / triton k=4 batch 1, round 2: 1 of 2 "
                                                     "prompts differ from target-only (first: prompt 1 at token 2)")]
    # no speculative row ran (every one skipped): nothing was checked, which is no verdict of exactness
    assert spec.invariance_broken([row("none", ref)]) == ["NOTHING CHECKED: no speculative attnlab row ran (see Skipped)"]


def test_spec_bench_ignore_eos_decodes_new_tokens():
    """--ignore-eos: no request stops at EOS (the header says so). Real weights stop at the model's EOS ids unless
    it is given; random weights never stop early."""
    from types import SimpleNamespace

    a = spec.parse(["--device", "cpu", "--model", "tiny-llama", "--backends", "torch", "--drafters", "ngram",
                    "--num-prompts", "2", "--new", "6", "--k", "2", "--skip-hf", "--ignore-eos"])
    cfg = SimpleNamespace(eos_token_ids=[2, 7])
    assert spec.stop_tokens(a, cfg) == set()
    for weights, ignore, want in (("real", False, {2, 7}), ("real", True, set()), ("random", False, set())):
        assert spec.stop_tokens(SimpleNamespace(weights=weights, ignore_eos=ignore), cfg) == want
    res = spec.run(a)
    assert all(r["new_tokens"] == 12 for r in res["rows"]) and "EOS ignored" in res["header"]
    assert res["invariance_broken"] == []


def test_spec_bench_invariant_refuses_trees(capsys):
    with pytest.raises(SystemExit) as e:
        spec.parse(["--device", "cuda", "--model", "tiny-llama", "--invariant", "--trees", "chain,4x3"])
    assert e.value.code == 2 and "tree verify is not invariant" in capsys.readouterr().err


@pytest.mark.gpu
@pytest.mark.skipif(not __import__("torch").cuda.is_available(), reason="needs a CUDA GPU")
def test_gpu_spec_bench_invariant_rows_are_exact():
    """bf16 on the tiny model: under --invariant every speculative row equals target-only; a verify backend with no
    invariant mode is skipped with the reason."""
    a = spec.parse(["--device", "cuda", "--model", "tiny-llama", "--backends", "triton,torch", "--drafters", "ngram",
                    "--num-prompts", "4", "--batch", "1,4", "--new", "24", "--k", "3", "--repeats", "1",
                    "--invariant", "--ignore-eos", "--skip-hf"])
    res = spec.run(a)
    rows = [r for r in res["rows"] if r["drafter"] == "ngram"]
    assert [r["batch"] for r in rows] == [1, 4] and all(r["same_as_target_only"] == 1.0 for r in rows)
    assert res["invariance_broken"] == [] and "Invariance: exact" in res["markdown"]
    assert any("verify=torch" in s and "invariant" in s for s in res["skipped"]), res["skipped"]


def test_spec_bench_repeats_run_in_rounds_and_the_speedup_is_per_round(monkeypatch):
    """The repeats of a (batch, verify) group run round-robin over its rows (target-only first), so a drift of
    the device's speed lands on every row of a round; a row's speedup is the median of its per-round ratios to the
    target-only row, with their spread."""
    from attnlab.spec.decoder import SpeculativeDecoder

    order, generate = [], SpeculativeDecoder.generate

    def logged(self, prompts, max_new_tokens, *args, **kwargs):
        if max_new_tokens == 6:  # a timed repeat (the warm run decodes 8)
            order.append(self.drafter.kind)
        return generate(self, prompts, max_new_tokens, *args, **kwargs)

    monkeypatch.setattr(SpeculativeDecoder, "generate", logged)
    a = spec.parse(["--device", "cpu", "--model", "tiny-llama", "--backends", "torch", "--drafters", "ngram,self",
                    "--draft-layers", "1", "--num-prompts", "1", "--new", "6", "--k", "2", "--repeats", "3",
                    "--skip-hf"])
    res = spec.run(a)
    assert order == ["none", "ngram", "self"] * 3
    ref, *rows = res["rows"]
    for r in rows:
        ratios = sorted(t0 / t for t0, t in zip(ref["repeats_s"], r["repeats_s"]))
        assert r["speedup_rounds"] == pytest.approx(ratios) and r["speedup"] == pytest.approx(ratios[1])
        assert f"{r['speedup']:.2f}x ({ratios[0]:.2f}-{ratios[-1]:.2f})" in res["markdown"]
    assert ref["speedup"] is None and ref["speedup_rounds"] == []


def test_host_profile_sees_the_drafters_phases_only(tmp_path, capsys):
    """--host-profile: after the timed rounds each speculative row runs once more with cProfile on inside the
    drafter's propose / extend; the table names the draft path's functions, none of the verify pass's."""
    from tests.cli.test_eagle_cli import _head_for_tiny_llama

    head = _head_for_tiny_llama(tmp_path / "head")
    a = spec.parse(["--device", "cpu", "--model", "tiny-llama", "--backends", "torch", "--num-prompts", "2",
                    "--new", "8", "--k", "3", "--drafters", "eagle", "--eagle-head", str(head), "--repeats", "1",
                    "--host-profile", "40"])
    rows = spec.run(a)["rows"]
    out = capsys.readouterr().out
    assert "### host profile: eagle torch / torch, batch 1, k=3" in out and "calls of propose, extend" in out
    cumulative, own = out.split("### host profile")[1].split("-- by cumulative time")[1].split("-- by tottime time")
    assert "decode_steps" in cumulative and "(extend)" in cumulative  # the k - 1 head steps, the draft-extend
    assert "verify" not in out.split("calls of")[1].split("\n", 1)[0] and "function calls" in own
    assert [r["drafter"] for r in rows] == ["none", "eagle"]  # the profiled pass adds no row
    with pytest.raises(SystemExit):
        spec.parse(["--device", "cpu", "--host-profile", "-1"])


def test_host_profile_restores_the_drafters_methods():
    from attnlab.bench.host_profile import drafter_profile

    class D:
        def propose(self):
            return sum(range(100))

    d = D()
    text = drafter_profile(d, lambda: [d.propose() for _ in range(3)], 5)
    assert text.startswith("3 calls of propose:") and "propose" in d.__class__.__dict__ and "propose" not in vars(d)
    assert drafter_profile(d, lambda: None, 5).startswith("no calls of propose")  # an empty profile is no error
    with pytest.raises(RuntimeError):  # run() failing: the methods are restored all the same
        drafter_profile(d, lambda: (_ for _ in ()).throw(RuntimeError("x")), 5)
    assert "propose" not in vars(d)


def test_host_profile_of_a_tree_row(capsys):
    """Tree rows draft through propose_tree / extend_tree: profiled too (an empty profile crashed the bench)."""
    a = spec.parse(["--device", "cpu", "--model", "tiny-llama", "--backends", "torch", "--num-prompts", "1",
                    "--new", "6", "--k", "4", "--drafters", "self", "--draft-layers", "1", "--trees", "2x3",
                    "--skip-hf", "--repeats", "1", "--host-profile", "5"])
    rows = spec.run(a)["rows"]
    assert [r["tree"] for r in rows if r["k"]] == ["2x3"]
    assert "calls of propose_tree" in capsys.readouterr().out


def test_floor_verdicts_come_from_the_medians_interval(capsys):
    """--floor: every speculative row is met / missed / undecided by the order-statistic interval of its per-round
    median, in the markdown and the JSON; a floor below every round is met, one above every round missed."""
    base = ["--device", "cpu", "--model", "tiny-llama", "--backends", "torch", "--num-prompts", "2", "--new", "8",
            "--k", "3", "--drafters", "ngram", "--skip-hf", "--repeats", "3"]
    for floor, want in ((0.01, "met"), (1000.0, "missed")):
        res = spec.run(spec.parse(base + ["--floor", str(floor)]))
        row = res["rows"][1]
        lo, hi = row["speedup_ci"]
        assert lo == min(row["speedup_rounds"]) and hi == max(row["speedup_rounds"])  # 3 rounds: min-max, 75%
        assert row["speedup_ci_coverage"] == pytest.approx(0.75) and row["floor_verdict"] == want
        assert f"**{want}**, median" in res["markdown"] and "75.0% interval" in res["markdown"]
    assert res["rows"][0]["floor_verdict"] is None  # target-only: no floor
    for bad in ("0", "-1"):
        with pytest.raises(SystemExit):
            spec.parse(base + ["--floor", bad])


def test_batch_interleaving_runs_every_row_on_a_batch_before_the_next(monkeypatch):
    """--interleave batch: within a round every row decodes prompt batch i before any decodes batch i + 1; the rows,
    their outputs and their rounds are those of --interleave round."""
    from attnlab.spec.decoder import SpeculativeDecoder

    calls = []
    real = SpeculativeDecoder.generate

    def spy(self, prompts, *args, **kwargs):
        calls.append((type(self.drafter).__name__, tuple(map(tuple, prompts))))
        return real(self, prompts, *args, **kwargs)

    monkeypatch.setattr(SpeculativeDecoder, "generate", spy)
    base = ["--device", "cpu", "--model", "tiny-llama", "--backends", "torch", "--num-prompts", "3", "--new", "6",
            "--k", "2", "--drafters", "ngram", "--skip-hf", "--repeats", "2"]
    results = {}
    for mode in ("round", "batch"):
        calls.clear()
        res = spec.run(spec.parse(base + ["--interleave", mode]))
        results[mode] = res
        timed = calls[-12:]  # 2 rounds x 2 rows x 3 prompts (batch 1); the warm-ups come first
        first_round = [name for name, _ in timed[:6]]
        if mode == "round":
            assert first_round == ["NoDrafter"] * 3 + ["NgramDrafter"] * 3
        else:
            assert first_round == ["NoDrafter", "NgramDrafter"] * 3
            assert timed[0][1] == timed[1][1] != timed[2][1]  # both rows on the same prompt, then the next
    assert "interleaved by prompt batch" in results["batch"]["markdown"]
    assert results["round"]["outputs"] == results["batch"]["outputs"]
    assert all(len(r["repeats_s"]) == 2 for r in results["batch"]["rows"])


def test_several_gemm_arms_build_and_time_their_rows_in_the_same_rounds(monkeypatch):
    """--gemm-split a,b: every row once per arm, built, warmed and timed under its arm's switches, the arms' rows in
    the same rounds; each arm's speedups against its own target-only row, its tok/s against the first arm's. (On the
    CPU the arms' GEMM switches act on nothing; they are set around the runs all the same, which is what is checked.)"""
    from attnlab.kernels import gemm
    from attnlab.spec.decoder import SpeculativeDecoder

    order, generate = [], SpeculativeDecoder.generate

    def logged(self, prompts, max_new_tokens, *args, **kwargs):
        if max_new_tokens == 6:  # a timed repeat (the warm run decodes 8)
            order.append((self.drafter.kind, gemm.norm_place(), gemm.split_mode()))
        return generate(self, prompts, max_new_tokens, *args, **kwargs)

    monkeypatch.setattr(SpeculativeDecoder, "generate", logged)
    a = spec.parse(["--device", "cpu", "--model", "tiny-llama", "--backends", "torch", "--drafters", "ngram",
                    "--num-prompts", "1", "--new", "6", "--k", "2", "--repeats", "3", "--skip-hf"])
    a.arms = ["fill/ticket", "lean/ticket+normsep"]  # what --gemm triton --gemm-split would give (CUDA only)
    res = spec.run(a)
    assert order == [("none", "auto", "fill/ticket"), ("ngram", "auto", "fill/ticket"),
                     ("none", "sep", "lean/ticket"), ("ngram", "sep", "lean/ticket")] * 3
    rows = res["rows"]
    assert [(r["drafter"], r["arm"]) for r in rows] == [("none", a.arms[0]), ("ngram", a.arms[0]),
                                                         ("none", a.arms[1]), ("ngram", a.arms[1])]
    for ref, r in (rows[:2], rows[2:]):  # each arm's speedup: against its own target-only row, round by round
        ratios = sorted(t0 / t for t0, t in zip(ref["repeats_s"], r["repeats_s"]))
        assert r["speedup_rounds"] == pytest.approx(ratios) and r["same_as_target_only"] == 1.0
    md = res["markdown"]
    assert "| - / torch [lean/ticket+normsep] |" in md and "Arms against the first (fill/ticket)" in md
    tok = lambda r, i: r["new_tokens"] / r["repeats_s"][i]
    want = sorted(tok(rows[3], i) / tok(rows[1], i) for i in range(3))
    assert f"- ngram - / torch k=2 chain batch 1, lean/ticket+normsep: {want[1]:.3f}x" in md
    assert gemm.norm_place() == gemm.DEFAULT_NORM_PLACE and gemm.split_mode() == gemm.DEFAULT_SPLIT_MODE


@pytest.mark.parametrize("same", [False, True])
def test_same_rounds_time_every_verify_backend_together(monkeypatch, same):
    """--same-rounds: the verify backends' rows of a batch are one group, timed in the same rounds (without it: a group
    per verify backend, one after the other); each row's speedup is against its own verify backend's target-only row,
    and a line under the table gives its tok/s against the first verify backend's same row, round by round."""
    from attnlab.spec.decoder import SpeculativeDecoder

    order, generate = [], SpeculativeDecoder.generate

    def logged(self, prompts, max_new_tokens, *args, **kwargs):
        if max_new_tokens == 6:  # a timed repeat (the warm run decodes 8)
            order.append((self.drafter.kind, type(self.target.backend).__name__))
        return generate(self, prompts, max_new_tokens, *args, **kwargs)

    monkeypatch.setattr(SpeculativeDecoder, "generate", logged)
    other = "triton"  # under the Triton interpreter here
    a = spec.parse(["--device", "cpu", "--model", "tiny-llama", "--backends", f"torch,{other}", "--drafters", "ngram",
                    "--num-prompts", "1", "--new", "6", "--k", "2", "--repeats", "3", "--skip-hf",
                    *(["--same-rounds"] if same else [])])
    res = spec.run(a)
    one = [("none", "TorchBackend"), ("ngram", "TorchBackend")]
    two = [("none", "TritonBackend"), ("ngram", "TritonBackend")]
    assert order == ((one + two) * 3 if same else one * 3 + two * 3)
    rows = res["rows"]
    assert [r["pair"] for r in rows] == ["- / torch", "- / torch", f"- / {other}", f"- / {other}"]
    for ref, r in (rows[:2], rows[2:]):  # each verify backend's speedup against its own target-only row
        ratios = sorted(t0 / t for t0, t in zip(ref["repeats_s"], r["repeats_s"]))
        assert r["speedup_rounds"] == pytest.approx(ratios) and r["same_as_target_only"] == 1.0
    md = res["markdown"]
    tok = lambda r, i: r["new_tokens"] / r["repeats_s"][i]
    if not same:
        assert "Verify backends against the first" not in md and "same rounds" not in md.split("\n")[0]
        return
    assert "every verify backend in the same rounds" in md.split("\n")[0]
    assert "Verify backends against the first (torch), the same rounds" in md
    for i, j in ((2, 0), (3, 1)):
        want = sorted(tok(rows[i], n) / tok(rows[j], n) for n in range(3))
        r = rows[i]
        assert f"- {r['drafter']} - / {other} k={r['k']} chain batch 1: {want[1]:.3f}x" in md
        assert r["vs_first_verify_rounds"] == pytest.approx(want) and r["vs_first_verify"] == pytest.approx(want[1])
    assert rows[0]["vs_first_verify"] is None and rows[1]["vs_first_verify_rounds"] == []


@pytest.mark.parametrize("backends,needle", [("torch", "--backends torch is one"),
                                             ("torch,triton,torch", "names a backend twice")])
def test_same_rounds_is_checked(capsys, backends, needle):
    with pytest.raises(SystemExit) as e:
        spec.parse(["--device", "cpu", "--model", "tiny-llama", "--backends", backends, "--same-rounds"])
    assert e.value.code == 2 and needle in capsys.readouterr().err


def test_profiles_run_after_every_group_is_timed(monkeypatch):
    """--kernel-profile / --host-profile: every group (here one a verify backend) is timed before any row is profiled
    (the torch profiler leaves CUPTI attached, which slowed the host of the groups timed after a profile)."""
    from attnlab.spec.decoder import SpeculativeDecoder

    events, generate = [], SpeculativeDecoder.generate

    def logged(self, prompts, max_new_tokens, *args, **kwargs):
        if max_new_tokens == 6:  # a timed repeat (the warm run decodes 8, the profile --new and 1)
            events.append(("timed", type(self.target.backend).__name__))
        return generate(self, prompts, max_new_tokens, *args, **kwargs)

    real = spec.kernel_profile

    def profiled(run, new, dev, top):
        events.append(("profile",))
        return real(run, new, dev, top)

    monkeypatch.setattr(SpeculativeDecoder, "generate", logged)
    monkeypatch.setattr(spec, "kernel_profile", profiled)
    a = spec.parse(["--device", "cpu", "--model", "tiny-llama", "--backends", "torch,triton", "--drafters", "ngram",
                    "--num-prompts", "1", "--new", "6", "--k", "2", "--repeats", "1", "--skip-hf",
                    "--kernel-profile", "3"])
    res = spec.run(a)
    first = events.index(("profile",))  # (a profile's own runs decode --new tokens too: logged after it)
    assert events[:first] == [("timed", "TorchBackend")] * 2 + [("timed", "TritonBackend")] * 2
    assert events.count(("profile",)) == 4
    assert all(r["kernel_profile"]["iterations"] >= 1 for r in res["rows"])


def test_spec_bench_gemm_arms_are_checked(capsys):
    with pytest.raises(SystemExit) as e:
        spec.parse(["--device", "cpu", "--model", "tiny-llama", "--gemm-split", "fill/ticket,fill/tickets"])
    assert e.value.code == 2 and "--gemm-split" in capsys.readouterr().err


def test_spec_bench_fp8_draft_weights_rows_beside_bf16(tmp_path, monkeypatch):
    """--draft-weights bf16,fp8wh: each self / eagle row once per weights, in the same rounds, built with those weights;
    the fp8 rows stay lossless and each is compared with its bf16 row under the table. CPU: the weight-only GEMM under
    the Triton interpreter (<= 16 rows), torch._scaled_mm's CPU path for the prefills."""
    from attnlab.engine import eagle_side
    from attnlab.models.fp8 import FP8Linear, has_fp8_linears
    from tests.spec.test_eagle_fp8 import _scaled_mm_on_cpu

    if not _scaled_mm_on_cpu():
        pytest.skip("this torch has no CPU torch._scaled_mm (row-wise): the fp8 prefills cannot run here")
    built = []  # (drafter kind, its model) of every draft side the bench builds
    build_side, build_eagle = spec.build_side, eagle_side.build_eagle_side

    def side(sp, *a, **kw):
        r = build_side(sp, *a, **kw)
        if sp.name == "draft":
            built.append(("self", r.model))
        return r

    def eagle(*a, **kw):
        r = build_eagle(*a, **kw)
        built.append(("eagle", r.model))
        return r

    monkeypatch.setattr(spec, "build_side", side)
    monkeypatch.setattr(eagle_side, "build_eagle_side", eagle)
    # an untrained head of the target's shapes (--eagle-head random: any preset, random weights)
    a = spec.parse(["--device", "cpu", "--model", "tiny-llama", "--backends", "torch", "--num-prompts", "1",
                    "--new", "6", "--k", "2", "--drafters", "self,eagle", "--eagle-head", "random", "--weights", "random",
                    "--dtype", "bf16", "--draft-layers", "1", "--draft-weights", "bf16,fp8wh", "--repeats", "2",
                    "--skip-hf"])
    res = spec.run(a)
    rows = res["rows"]
    assert [(r["drafter"], r["draft_weights"]) for r in rows] == [
        ("none", "bf16"), ("self", "bf16"), ("self+fp8wh", "fp8wh"), ("eagle", "bf16"), ("eagle+fp8wh", "fp8wh")]
    assert all(r["same_as_target_only"] == 1.0 for r in rows[1:])
    # the rows ran what they say: bf16 drafters, then e4m3 layers and LM head (a self-drafter's own copy, an EAGLE
    # head's scored rows)
    assert [(kind, has_fp8_linears(m)) for kind, m in built] == [
        ("self", False), ("self", True), ("eagle", False), ("eagle", True)]
    assert isinstance(built[1][1].parent.lm_head, FP8Linear) and built[3][1]._rows8 is not None
    md = res["markdown"]
    assert "draft weights bf16,fp8wh" in md and "Draft weights against bf16" in md
    for name in ("self+fp8wh", "eagle+fp8wh"):
        assert f"- {name} torch / torch k=2 chain batch 1: " in md


@pytest.mark.parametrize("flags,needle", [
    (["--draft-weights", "fp8"], "--draft-weights: unknown ['fp8']"),
    (["--draft-weights", "bf16,fp8w,bf16", "--dtype", "bf16"], "each at most once"),
    (["--draft-weights", "fp8w"], "add --dtype bf16"),
    (["--draft-weights", "fp8w", "--dtype", "bf16", "--drafters", "ngram"], "applies to the self and eagle drafters")])
def test_spec_bench_draft_weights_are_checked(capsys, flags, needle):
    with pytest.raises(SystemExit):
        spec.parse(["--device", "cpu", "--model", "tiny-llama", *flags])
    assert needle in capsys.readouterr().err


def test_spec_bench_fp8_draft_weights_need_a_device_that_runs_them(capsys, monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    with pytest.raises(SystemExit):
        spec.parse(["--device", "cpu", "--model", "tiny-llama", "--dtype", "bf16", "--draft-weights", "bf16,fp8w"])
    assert "runs under the Triton interpreter only" in capsys.readouterr().err


def test_spec_bench_random_head_needs_random_weights(capsys, monkeypatch):
    """--eagle-head random on real weights would report an untrained head's tau: refused once the weights resolved."""
    monkeypatch.setattr(spec, "resolve_weights", lambda ap, model, weights: "real")
    with pytest.raises(SystemExit):
        spec.parse(["--device", "cpu", "--model", "smollm2-135m", "--drafters", "eagle", "--eagle-head", "random"])
    assert "an untrained head times the draft on random weights only" in capsys.readouterr().err
    monkeypatch.setattr(spec, "resolve_weights", lambda ap, model, weights: "random")
    assert spec.parse(["--device", "cpu", "--model", "tiny-llama", "--drafters", "eagle", "--eagle-head",
                       "random"]).eagle_head == "random"


@pytest.mark.parametrize("drafters,says", [("ngram", False), ("ngram,self", True), ("self", True)])
def test_the_header_names_the_self_drafts_layers_only_where_it_runs(drafters, says):
    import torch

    a = spec.parse(["--device", "cpu", "--model", "tiny-llama", "--weights", "random", "--drafters", drafters,
                    "--draft-layers", "1"])
    head = spec.header(a, torch.device("cpu"), 2)
    assert ("self-draft layers=1, " in head) is says, head
    assert "k=4, " in head and "2 synthetic 48/96-token prompts" in head


def test_prompt_lengths_mix_the_synthetic_prompts_of_a_batch():
    """--prompt-lengths 5,30: prompt i has the (i mod 2)-th length, so a batch of 2 holds one of each; the run's
    header says so; every row decodes its tokens."""
    a = spec.parse(["--device", "cpu", "--model", "tiny-llama", "--weights", "random", "--backends", "torch",
                    "--drafters", "ngram", "--skip-hf", "--prompt-lengths", "5,30", "--num-prompts", "3", "--new", "4",
                    "--batch", "2"])
    assert a.lengths == [5, 30]
    prompts = spec.load_prompts(a.weights, 3, 256, None, a.prompts, a.lengths)
    assert [len(p) for p in prompts] == [5, 30, 5]
    res = spec.run(a)
    assert "3 synthetic 5/30-token prompts" in res["header"], res["header"]
    assert all(r["new_tokens"] > 0 for r in res["rows"])


@pytest.mark.parametrize("value,needle", [("0,30", "token counts >= 1"), ("a", "token counts >= 1"),
                                          (",", "token counts >= 1")])
def test_prompt_lengths_are_checked(capsys, value, needle):
    with pytest.raises(SystemExit):
        spec.parse(["--device", "cpu", "--model", "tiny-llama", "--weights", "random", "--prompt-lengths", value])
    assert needle in capsys.readouterr().err


def test_prompt_lengths_need_random_weights(capsys, monkeypatch):
    monkeypatch.setattr(spec, "resolve_weights", lambda ap, model, weights: "real")
    with pytest.raises(SystemExit):
        spec.parse(["--device", "cpu", "--model", "smollm2-135m", "--prompt-lengths", "200,4000"])
    assert "synthetic prompts are for random weights" in capsys.readouterr().err


@pytest.mark.parametrize("tool", ["e2e", "gemm", "gemm_fused", "kernels", "launch_floor", "pdl", "profile", "serving",
                                  "spec"])
def test_bench_usage_names_the_module(tool, capsys):
    """``python -m attnlab.bench.X --help`` says that, not ``X.py``."""
    import importlib

    mod = importlib.import_module(f"attnlab.bench.{tool}")
    with pytest.raises(SystemExit) as e:
        (mod.parse if hasattr(mod, "parse") else mod.main)(["--help"])
    assert e.value.code == 0
    assert capsys.readouterr().out.startswith(f"usage: python -m attnlab.bench.{tool} ")


def test_kernel_profile_per_iteration_of_every_row(capsys):
    """--kernel-profile: after the timed rounds every attnlab row (target-only too) runs once more under the torch
    profiler; each row gets its per-iteration kernel time (on CPU the ops' CPU time) in the JSON and the report."""
    a = spec.parse(["--device", "cpu", "--model", "tiny-llama", "--backends", "torch", "--num-prompts", "2",
                    "--new", "8", "--k", "3", "--drafters", "ngram", "--repeats", "1", "--skip-hf",
                    "--kernel-profile", "6"])
    res = spec.run(a)
    rows = res["rows"]
    assert [r["drafter"] for r in rows] == ["none", "ngram"]  # the profiled pass adds no row
    for r in rows:
        kp = r["kernel_profile"]
        assert kp["iterations"] >= 1 and kp["us_per_iteration"] > 0 and kp["launches_per_iteration"] > 0
        assert 1 <= len(kp["top"]) <= 6 and all(t["name"].startswith("aten::") for t in kp["top"])
        assert [t["us_per_iteration"] for t in kp["top"]] == sorted((t["us_per_iteration"] for t in kp["top"]),
                                                                    reverse=True)
        assert sum(x["share"] for x in kp["roles"]) == pytest.approx(1.0)
        assert kp["launches"] == {}  # launch shapes are CUDA kernels' (none on CPU)
        assert f"### kernel profile: {r['drafter']} - / torch, batch 1" in res["markdown"]
    # target-only: one token an iteration after each prompt's prefill (its first token); the ngram row: no more
    assert rows[0]["kernel_profile"]["iterations"] == rows[0]["new_tokens"] - 2
    assert rows[1]["kernel_profile"]["iterations"] <= rows[1]["new_tokens"]
    out = capsys.readouterr()
    assert "CPU op time per iteration" in res["markdown"] and out.err.count("### kernel profile:") == 2
    # progress on stderr: the group's rows built, then each timed round
    assert "batch 1, verify torch: 2 rows built, captured and warmed in" in out.err
    assert "batch 1, verify torch: round 1 of 1 timed in" in out.err
    with pytest.raises(SystemExit):
        spec.parse(["--device", "cpu", "--kernel-profile", "-1"])


def test_kernel_profile_subtracts_the_prefills():
    """The profile is of the decode iterations: a run to one token (its prefills) is taken off a run to --new, op by
    op; where no prompt decodes past its first token there is nothing to profile, and the timed rows still stand."""
    from attnlab.bench.kernel_profile import kernel_profile

    calls = []

    def run(new):  # a fake row: the prefill is one 'prefill' op, each iteration one 'step' op
        calls.append(new)
        with torch.profiler.record_function("prefill"):
            torch.ones(64).sum()
        for _ in range(new - 1):
            with torch.profiler.record_function("step"):
                torch.ones(8).sum()
        return new - 1

    text, prof = kernel_profile(run, 5, torch.device("cpu"), 20)
    assert calls == [5, 1] and prof["iterations"] == 4 and "prefills' kernels subtracted" in text
    names = {t["name"]: t["launches_per_iteration"] for t in prof["top"]}
    assert names["step"] == 1 and "prefill" not in names
    text, prof = kernel_profile(run, 1, torch.device("cpu"), 20)
    assert prof is None and "nothing to profile" in text
    a = spec.parse(["--device", "cpu", "--model", "tiny-llama", "--backends", "torch", "--num-prompts", "1",
                    "--new", "1", "--drafters", "ngram", "--k", "2", "--repeats", "1", "--skip-hf",
                    "--kernel-profile", "3"])
    res = spec.run(a)
    assert all("nothing to profile" in r["kernel_profile"]["markdown"] for r in res["rows"])
