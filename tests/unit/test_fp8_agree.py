"""attnlab.bench.fp8_agree: its emulated fp8 numerics against the GEMM kernel (interpreter), the tau walk, a CPU run."""

from __future__ import annotations

import json

import pytest
import torch

from attnlab.bench import fp8_agree
from attnlab.kernels import gemm
from attnlab.models.fp8 import quantize_rows


def test_emulated_linear_is_the_weight_only_gemms_numerics():
    """EmulatedLinear's bf16 / f16 modes give what attnlab's GEMM gives for e4m3 weights (the default fp8 mode and
    half, a saturating activation included), up to fp32 summation order (two ulps of bf16); a bias adds to the fp32 sum;
    the W8A8 variant is FP8Linear's own emulation."""
    g = torch.Generator().manual_seed(3)
    x = torch.randn(5, 256, generator=g).to(torch.bfloat16)
    x[2, 9] = 2.0e5  # above f16's range: half saturates it
    w = (torch.randn(96, 256, generator=g) / 16).to(torch.bfloat16)
    w8, scale = quantize_rows(w)
    for mode, arm in (("bf16", "fill/ticket+f8wide"), ("f16", "fill/ticket+f8half")):
        with gemm.arm(arm):
            want = gemm.linear(x, w8, w_scale=scale.view(-1))
        got = fp8_agree.EmulatedLinear(w, mode)(x)
        assert torch.isfinite(got.float()).all()
        torch.testing.assert_close(got.float(), want.float(), atol=2e-2, rtol=2 * 2.0**-7)  # two bf16 ulps
    bias = torch.randn(96, generator=g).to(torch.bfloat16)
    torch.testing.assert_close(fp8_agree.EmulatedLinear(w, "bf16", bias)(x).float(),
                               (fp8_agree.EmulatedLinear(w, "bf16")(x).float() + bias.float()), atol=2e-2, rtol=2 * 2.0**-7)
    with pytest.raises(ValueError, match="choose from"):
        fp8_agree.EmulatedLinear(w, "w8a8")  # FP8Linear(emulate=True) is W8A8's emulation


def test_walk_is_greedy_decodings_walk():
    """The first continuation token is the prefill's (no pass starts at entry 0); a pass accepts the run of agreements
    from its start, at most k, plus the target's token; passes whose k drafts run past the end are not walked."""
    assert fp8_agree.walk([True] * 10, 4) == [5, 5]  # starts 1 and 6
    assert fp8_agree.walk([False] * 6, 4) == [1, 1]  # starts 1, 2 (the last with 4 entries left)
    assert fp8_agree.walk([True, True, False, True, True, True], 2) == [2, 3]  # starts 1 (1 + 1), 3 (2 + 1); 6 past
    assert fp8_agree.walk([True] * 3, 4) == []  # shorter than k: no pass


def test_cpu_run_on_the_tiny_model(tmp_path):
    """Every variant on the tiny random model: the target's own row agrees (near-ties aside), the rows' figures are in
    range, the report and its json are written; bad arguments are argparse errors."""
    out = tmp_path / "agree"
    assert fp8_agree.main(["--model", "tiny-llama", "--weights", "random", "--num-prompts", "2", "--new", "6",
                           "--k", "2,3", "--out", str(out)]) == 0
    res = json.loads((tmp_path / "agree.json").read_text())
    rows = res["variants"]
    assert list(rows) == list(fp8_agree.VARIANTS)
    assert rows["bf16"]["agreement"] >= 0.9 and rows["bf16"]["kl"] < 1e-3
    for r in rows.values():
        assert 0 <= r["agreement"] <= 1 and r["positions"] == 12 and r["kl"] >= 0
        assert all(1 <= t <= int(k) + 1 for k, t in r["tau"].items()) and all(n > 0 for n in r["passes"].values())
    assert "| fp8wh/f16 |" in (tmp_path / "agree.md").read_text()
    for bad in (["--k", "0"], ["--variants", "fp8x"], ["--new", "0"]):
        with pytest.raises(SystemExit):
            fp8_agree.parse(["--model", "tiny-llama", "--weights", "random", *bad])
