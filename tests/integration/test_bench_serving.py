"""attnlab.bench.serving on CPU with the tiny model: every (pair, drafter, setting) row from one process, the
speedup against the matching target-only row, lossless outputs, the files --out writes, skipped cells."""

import json

import pytest

from attnlab.bench import serving
from attnlab.bench.serving_work import settings

TINY = ["--device", "cpu", "--model", "tiny-llama", "--backends", "torch", "--max-new", "4"]


def test_serving_bench_rows_for_every_setting_lossless_and_written(tmp_path):
    common = [*TINY, "--requests-per-setting", "4", "--warmup-requests", "1"]
    a = serving.parse([*common, "--drafters", "ngram,none", "--closed", "1,2", "--poisson", "500"])
    assert a.weights == "random" and a.dtype == "fp32" and a.max_running == 2
    res = serving.run(a)
    rows = res["rows"]
    assert [(r["drafter"], r["pair"], r["setting"]) for r in rows] == [
        (d, "- / torch", s) for d in ("none", "ngram") for s in ("closed c=1", "closed c=2", "poisson 500 req/s")]
    ref = {r["setting"]: r for r in rows if r["drafter"] == "none"}
    for r, outs in zip(rows, res["outputs"]):
        assert r["requests"] == 4 and r["measured_requests"] == 4 - 1 == r["requests"] - r["warmup_requests"]
        assert len(outs) == 4 and all(len(o) == 4 for o in outs)  # random weights: no EOS, every budget in full
        assert r["kv_pages_used_max"] > 0 and r["preemptions"] == 0  # reserve: back-pressure, never preemption
        assert r["output_tokens_per_s"] > 0 and r["tpot_ms_p50"] > 0 and r["ttft_ms_p99"] >= r["ttft_ms_p50"]
        assert r["max_running"] <= 2
        if r["drafter"] == "none":
            assert r["speedup"] is None and r["tau"] is None
        else:  # against the same verify backend's target-only row at the same setting; greedy fp32: lossless
            base = ref[r["setting"]]
            assert r["speedup"] == pytest.approx(r["output_tokens_per_s"] / base["output_tokens_per_s"])
            assert r["tpot_gain"] == pytest.approx(base["tpot_ms_p50"] / r["tpot_ms_p50"])
            assert r["same_as_target_only"] == 1.0 and r["tau"] >= 1.0
    assert res["outputs"][3:] == res["outputs"][:3]  # ngram rows decode what the none rows decode
    assert "| ngram | - / torch | closed c=2 | 4 (3) |" in res["markdown"] and "Random weights" in res["markdown"]

    prefix = tmp_path / "out" / "serve"  # the folder does not exist yet: --out makes it
    assert serving.main([*common, "--drafters", "none", "--closed", "1,2", "--poisson", "", "--out", str(prefix)]) == 0
    saved = json.loads((tmp_path / "out" / "serve.json").read_text())
    assert len(saved["rows"]) == 2 and saved["skipped"] == [] and saved["args"]["closed"] == [1, 2]
    assert saved["rows"][1]["metrics"]["measured_requests"] == 3 and saved["settings"][1]["label"] == "closed c=2"
    md = (tmp_path / "out" / "serve.md").read_text()
    assert "| none | - / torch | closed c=2 | 4 (3) |" in md
    pytest.importorskip("matplotlib")
    assert (tmp_path / "out" / "serve_latency.png").stat().st_size > 0 and "serve_latency.png" in md


def test_serving_bench_eagle_rows_unsupported_and_failing_cells(tmp_path, monkeypatch):
    """eagle on a head for the tiny model: its draft side's KV pages, lossless; a verify backend that cannot run
    on CPU (flashinfer) and an eagle draft side that cannot are skipped cells with their reasons; a cell that
    raises (a bug: ngram made to fail here) is a failed cell, and the next cell on the same target still runs."""
    from attnlab.spec.drafters import NgramDrafter
    from tests.cli.test_eagle_cli import _head_for_tiny_llama

    def broken(self, *args, **kwargs):
        raise RuntimeError("boom")

    monkeypatch.setattr(NgramDrafter, "propose", broken)
    head = _head_for_tiny_llama(tmp_path / "head")
    a = serving.parse([*TINY, "--backends", "torch,flashinfer", "--draft-backends", "torch,flashinfer",
                       "--drafters", "ngram,eagle,none", "--eagle-head", str(head), "--k", "2", "--closed", "2",
                       "--poisson", "", "--requests-per-setting", "3"])
    res = serving.run(a)
    assert res["failed"] == ["ngram - / torch (warm run): RuntimeError: boom"] and "Failed" in res["markdown"]
    rows = {r["drafter"]: r for r in res["rows"]}
    assert [(r["drafter"], r["pair"]) for r in res["rows"]] == [("none", "- / torch"), ("eagle", "torch / torch")]
    e = rows["eagle"]
    assert e["warmup_requests"] == 2 and e["measured_requests"] == 1  # closed c=2: its ramp-up is the warmup
    assert e["kv_pages_used_max_draft"] > 0 and rows["none"]["kv_pages_used_max_draft"] is None
    assert e["same_as_target_only"] == 1.0 and 1.0 <= e["tau"] <= 3 and e["speedup"] > 0
    assert res["outputs"][1] == res["outputs"][0]
    assert len(res["skipped"]) == 2, res["skipped"]
    assert res["skipped"][0].startswith("eagle drafter on backend=flashinfer (verify=torch): backend=flashinfer")
    assert res["skipped"][1].startswith("verify=flashinfer") and "cpu" in res["skipped"][1]
    assert "Skipped (cannot run here)" in res["markdown"]


def test_serving_bench_with_no_backend_that_runs_here_writes_the_skips(tmp_path, capsys):
    assert serving.main([*TINY, "--backends", "flashinfer", "--closed", "1", "--poisson", "",
                         "--out", str(tmp_path / "s")]) == 0
    saved = json.loads((tmp_path / "s.json").read_text())
    assert saved["rows"] == [] and len(saved["skipped"]) == 1 and saved["skipped"][0].startswith("verify=flashinfer")
    assert "Traceback" not in capsys.readouterr().err and not (tmp_path / "s_latency.png").exists()
    assert "no latency plot: no row" in (tmp_path / "s.md").read_text()


def test_serving_bench_settings_rule():
    """Defaults: closed C warms up with C and measures max(5, 2 C); Poisson r warms up with 8 and measures
    max(40, r); every count capped by the prompts available, at least one measured."""
    s = settings([1, 8, 100], [8.0, 128.0], available=212)
    assert [(x.label, x.requests, x.warmup, x.asked) for x in s] == [
        ("closed c=1", 6, 1, 6), ("closed c=8", 24, 8, 24), ("closed c=100", 212, 100, 300),
        ("poisson 8 req/s", 48, 8, 48), ("poisson 128 req/s", 136, 8, 136)]
    assert [(x.requests, x.warmup) for x in settings([4], [], available=3)] == [(3, 2)]
    assert [(x.requests, x.warmup) for x in settings([4], [2.0], 50, requests=10, warmup=3)] == [(10, 3), (10, 3)]
    # reuse: nothing is cut, request i serves prompt i mod available
    assert [(x.requests, x.warmup) for x in settings([100], [], available=212, reuse=True)] == [(300, 100)]


def test_serving_bench_reuses_prompts_by_default(tmp_path):
    """More requests than prompts: served over the prompts in order (a closed loop stays at its concurrency
    instead of draining); --no-prompt-reuse caps the setting and says so."""
    common = [*TINY, "--drafters", "none", "--closed", "2", "--poisson", "", "--num-prompts", "3",
              "--requests-per-setting", "7", "--warmup-requests", "2"]
    res = serving.run(serving.parse(common))
    outs = res["outputs"][0]
    assert res["rows"][0]["requests"] == 7 and len(outs) == 7
    assert outs[3:6] == outs[:3] and outs[6] == outs[0]  # greedy: a reused prompt decodes what it did first
    assert "Prompts reused (3 available" in res["markdown"] and "closed c=2 7 requests" in res["markdown"]
    capped = serving.run(serving.parse([*common, "--no-prompt-reuse"]))
    assert capped["rows"][0]["requests"] == 3 and "Cut by the prompts available (3)" in capped["markdown"]


@pytest.mark.parametrize("bad", [["--drafters", "medusa"], ["--drafters", "self"], ["--closed", "0"],
                                 ["--closed", "x"], ["--poisson", "-1"], ["--closed", "", "--poisson", ""],
                                 ["--k", "0"], ["--requests-per-setting", "3", "--warmup-requests", "3"]])
def test_serving_bench_rejects_bad_arguments(bad, capsys):
    with pytest.raises(SystemExit) as e:
        serving.parse([*TINY, *bad])
    assert e.value.code == 2 and "error:" in capsys.readouterr().err


def test_serving_bench_repeats_run_in_rounds(monkeypatch):
    """--repeats: every setting's runs go round-robin over the cells of a verify backend (target-only first); a
    row holds each repeat's tok/s and TPOT p50, its fields are medians, its speedup and TPOT gain the medians of
    the per-round ratios to target-only."""
    from attnlab.bench.serving import _Server

    order, serve = [], _Server.serve

    def logged(self, s, *args):
        order.append((s.label, self.name))
        return serve(self, s, *args)

    monkeypatch.setattr(_Server, "serve", logged)
    a = serving.parse([*TINY, "--drafters", "ngram,none", "--closed", "1,2", "--poisson", "", "--repeats", "3",
                       "--requests-per-setting", "3", "--warmup-requests", "1"])
    res = serving.run(a)
    assert order == [(s, d) for s in ("closed c=1", "closed c=2") for _ in range(3) for d in ("none", "ngram")]
    rows = {(r["drafter"], r["setting"]): r for r in res["rows"]}
    assert [(r["drafter"], r["setting"]) for r in res["rows"]] == [
        (d, s) for d in ("none", "ngram") for s in ("closed c=1", "closed c=2")]
    for s in ("closed c=1", "closed c=2"):
        ref, r = rows[("none", s)], rows[("ngram", s)]
        assert len(r["repeats"]) == len(ref["repeats"]) == 3
        toks = sorted(x["output_tokens_per_s"] for x in r["repeats"])
        assert r["output_tokens_per_s"] == pytest.approx(toks[1])
        ratios = sorted(x["output_tokens_per_s"] / y["output_tokens_per_s"] for x, y in zip(r["repeats"], ref["repeats"]))
        assert r["speedup"] == pytest.approx(ratios[1]) and r["same_as_target_only"] == 1.0
        gains = sorted(y["tpot_ms_p50"] / x["tpot_ms_p50"] for x, y in zip(r["repeats"], ref["repeats"]))
        assert r["tpot_gain"] == pytest.approx(gains[1])
    assert "3 timed runs per row, in rounds" in res["header"]
    lo, hi = min(x["output_tokens_per_s"] for x in r["repeats"]), max(x["output_tokens_per_s"] for x in r["repeats"])
    assert f"{r['output_tokens_per_s']:.1f} ({lo:.0f}-{hi:.0f}) |" in res["markdown"]


@pytest.mark.parametrize("fail_at", [1, 2, 4])
def test_serving_bench_cell_failing_mid_setting(monkeypatch, fail_at):
    """A cell that raises during its fail_at-th timed run is a failed cell from then on: rows only for the settings
    it completed (each with its speedup), its pages freed on the target, the others served on, the progress bar
    full."""
    import tqdm.auto

    from attnlab.bench.serving import _Server

    bars = []

    class Bar:
        def __init__(self, total=0, **kw):
            self.total, self.n = total, 0
            bars.append(self)

        def update(self, n=1):
            self.n += n

        def close(self):
            pass

        @staticmethod
        def write(*a, **k):
            pass

    calls, serve = [0], _Server.serve

    def flaky(self, s, *args):
        if self.name == "ngram":
            calls[0] += 1
            if calls[0] == fail_at:
                self.dec.target.allocator.allocate("stuck", 5)  # as a run that died holding pages
                raise RuntimeError("mid")
        return serve(self, s, *args)

    monkeypatch.setattr(tqdm.auto, "tqdm", Bar)
    monkeypatch.setattr(_Server, "serve", flaky)
    a = serving.parse([*TINY, "--drafters", "ngram,none", "--closed", "1,2", "--poisson", "", "--repeats", "2",
                       "--requests-per-setting", "3", "--warmup-requests", "1"])
    res = serving.run(a)
    done = (fail_at - 1) // 2  # settings whose 2 runs completed before the failure
    assert res["failed"] == [f"ngram - / torch ({('closed c=1', 'closed c=2')[done]}): RuntimeError: mid"]
    assert [(r["drafter"], r["setting"]) for r in res["rows"]] == [
        ("none", "closed c=1"), ("none", "closed c=2"), *[("ngram", s) for s in ("closed c=1",)[:done]]]
    assert all(r["speedup"] > 0 for r in res["rows"] if r["drafter"] == "ngram")
    assert bars[-1].n == bars[-1].total
