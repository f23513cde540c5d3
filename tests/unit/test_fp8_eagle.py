"""attnlab.bench.fp8_eagle: an EAGLE head's fp8 variants (swapped in and out, their draft tokens), the tau walk over a
teacher-forced unroll, a CPU run on the tiny model."""

import json

import pytest
import torch

from attnlab.bench import fp8_eagle
from attnlab.bench.fp8_agree import EmulatedLinear
from tests.spec.tiny import tiny_config, tiny_eagle, tiny_model


@pytest.fixture
def head():
    cfg = tiny_config(vocab=96, heads=4, kv_heads=2, head_dim=16, hidden=48)
    target = tiny_model(cfg, seed=0, dtype=torch.bfloat16)
    h = tiny_eagle(target, cfg, seed=1).to(torch.bfloat16)
    return target, h.bind(target.embed_tokens, target.lm_head)


def test_a_variant_swaps_the_layer_while_entered_and_drafts_through_its_rows(head):
    _, h = head
    before = {n: getattr(h, n) for n in fp8_eagle.HEAD_LINEARS}
    v = fp8_eagle.Variant(h, "all8/f16")
    x = torch.randn(5, h.config.hidden_size).bfloat16()
    with v:
        for n in fp8_eagle.HEAD_LINEARS:
            m = getattr(h, n)
            assert isinstance(m, fp8_eagle.HeadLinear) and m.weight is before[n].weight  # the head's dtype stays
            xn = torch.randn(3, before[n].in_features).bfloat16()
            torch.testing.assert_close(m(xn), EmulatedLinear(before[n].weight, "f16")(xn), atol=0, rtol=0)
    assert {n: getattr(h, n) for n in fp8_eagle.HEAD_LINEARS} == before  # restored
    rows = h._rows if h.config.draft_vocab_size else h.shared[1].weight
    ids = EmulatedLinear(rows, "f16")(x).argmax(-1)
    assert torch.equal(v.tokens(x), h.d2t[ids] if h.config.draft_vocab_size else ids)
    assert torch.equal(fp8_eagle.Variant(h, "bf16").tokens(x), h.greedy_tokens(x))  # bf16: the head as it is


def test_measure_walks_each_variant(head):
    """On the tiny model: every variant's tau is in [1, 1 + k] over the same passes' starts, its per-step top-1 in
    [0, 1]; the bf16 variant's matches are the unrolled head's own greedy drafts (an untrained head: few)."""
    target, h = head
    prompts = [[1, 5, 9, 2, 7, 3], [4, 4, 8, 1]]
    res = fp8_eagle.measure(target, h, prompts, 10, [2, 3], set(), progress=False)
    assert [len(c) for c in res["continuations"]] == [10, 10]
    for name, r in res["variants"].items():
        assert set(r["tau"]) == {2, 3} and len(r["top1"]) == 3, name
        for k, t in r["tau"].items():
            assert 1 <= t <= 1 + k and r["passes"][k] > 0, (name, k, t)
        assert all(0 <= x <= 1 for x in r["top1"]), name
    assert list(res["variants"]) == list(fp8_eagle.VARIANTS)


def test_cpu_run_on_the_tiny_preset(tmp_path):
    out = tmp_path / "eagle"
    assert fp8_eagle.main(["--model", "tiny-llama", "--weights", "random", "--num-prompts", "2", "--new", "6",
                           "--k", "2", "--out", str(out)]) == 0
    res = json.loads((tmp_path / "eagle.json").read_text())
    assert list(res["variants"]) == list(fp8_eagle.VARIANTS)
    text = (tmp_path / "eagle.md").read_text()
    assert "| head8/f16 |" in text and "untrained head" in text
    for bad in (["--k", "0"], ["--variants", "head9"], ["--num-prompts", "0"]):
        with pytest.raises(SystemExit):
            fp8_eagle.parse(["--model", "tiny-llama", "--weights", "random", *bad])


def test_the_study_emulates_the_built_fp8_head(head):
    """all8/f16 is what ``draft=eagle precision=fp8w-draft precision.fp8_lm_head=true`` runs (EagleHead.quantize_fp8,
    the weight-only GEMM in fp8 mode half under the interpreter): the same e4m3 weights and scales, projections equal
    to fp32 summation order, the same draft tokens."""
    import copy

    from attnlab.kernels import gemm

    assert gemm.fp8_mode() == "half"  # precision.fp8_mma=auto's choice for weight-only fp8
    _, h = head
    built = copy.deepcopy(h).bind(*h.shared).quantize_fp8(small_m="weight_only", lm_head=True)
    v = fp8_eagle.Variant(h, "all8/f16")
    g = torch.Generator().manual_seed(5)
    with v:
        for n in fp8_eagle.HEAD_LINEARS:
            x = torch.randn(4, getattr(built, n).in_features, generator=g).bfloat16()
            torch.testing.assert_close(getattr(built, n)(x), getattr(h, n)(x), atol=2e-2, rtol=2**-7)
    x = torch.randn(16, h.config.hidden_size, generator=g).bfloat16()
    assert torch.equal(built.greedy_tokens(x), v.tokens(x))


@pytest.mark.parametrize("study", ["fp8_eagle", "fp8_agree"])
def test_a_k_the_continuations_cannot_hold_is_refused_up_front(study, capsys):
    """tau at k walks passes of k drafts after a continuation token: --new 8 holds k = 7 at most, so the default
    --k 4,8 exits 2 in one line before any model loads (it printed nan)."""
    from attnlab.bench import fp8_agree

    mod = fp8_eagle if study == "fp8_eagle" else fp8_agree
    with pytest.raises(SystemExit) as e:
        mod.parse(["--model", "tiny-llama", "--weights", "random", "--num-prompts", "1", "--new", "8"])
    assert e.value.code == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err.startswith(f"python -m attnlab.bench.{study}: error: --k 8 "), err
    assert "raise --new to >= 9" in err
    a = mod.parse(["--model", "tiny-llama", "--weights", "random", "--new", "9"])
    assert a.ks == [4, 8]


def test_a_k_without_passes_prints_a_dash_and_a_note():
    """EOS can still cut every continuation short of k + 1 tokens: that k's tau is -, not nan."""
    nan = float("nan")
    res = {"variants": {name: {"tau": {2: 1.5, 4: nan}, "passes": {2: 3, 4: 0}, "top1": [0.5, nan, nan, nan]}
                        for name in ("bf16", "head8")}, "continuations": [[1, 2, 3]]}
    text = "\n".join(fp8_eagle.table(res, [2, 4]))
    assert "| head8 | 1.500 (+0.0%) | - | 50.0% | - | - | - |" in text and "nan" not in text
    assert "-: no pass of k=4 drafts fit a continuation" in text


@pytest.mark.parametrize("study", ["fp8_eagle", "fp8_agree"])
def test_usage_names_the_module(study, capsys):
    from attnlab.bench import fp8_agree

    with pytest.raises(SystemExit):
        (fp8_eagle if study == "fp8_eagle" else fp8_agree).parse(["--help"])
    assert capsys.readouterr().out.startswith(f"usage: python -m attnlab.bench.{study} ")
