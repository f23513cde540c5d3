"""attnlab.bench.fp8_agree: its emulated fp8 numerics against the GEMM kernel (interpreter), the tau walk, a CPU run."""

from __future__ import annotations

import json

import pytest
import torch

from attnlab.bench import fp8_agree
from attnlab.kernels import gemm
from attnlab.models.fp8 import FP8Linear, quantize_rows


def test_emulated_linear_is_the_weight_only_gemms_numerics():
    """EmulatedLinear's bf16 / f16 modes give what attnlab's GEMM gives for e4m3 weights (the default fp8 mode and
    half, a saturating activation included) and its w8a8 mode FP8Linear's emulated W8A8, up to fp32 summation order
    (two ulps of bf16; W8A8's scales apply in another order, so looser there); a bias adds to the fp32 sum."""
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
    lin = torch.nn.Linear(256, 96, bias=False).to(torch.bfloat16)
    lin.weight.data.copy_(w)
    torch.testing.assert_close(fp8_agree.EmulatedLinear(w, "w8a8")(x).float(),
                               FP8Linear.from_linear(lin, emulate=True)(x).float(), atol=0.5, rtol=2 * 2.0**-7)
    bias = torch.randn(96, generator=g).to(torch.bfloat16)
    torch.testing.assert_close(fp8_agree.EmulatedLinear(w, "bf16", bias)(x).float(),
                               (fp8_agree.EmulatedLinear(w, "bf16")(x).float() + bias.float()), atol=2e-2, rtol=2 * 2.0**-7)
    with pytest.raises(ValueError, match="choose from"):
        fp8_agree.EmulatedLinear(w, "e5m2")


def test_walk_tau_accepts_runs_of_agreement():
    assert fp8_agree.walk_tau([True] * 10, 4) == 5.0  # two full rounds of k + 1
    assert fp8_agree.walk_tau([False] * 3, 4) == 1.0  # the target's token each round
    assert fp8_agree.walk_tau([True, False, True, True], 4) == 2.0  # (1 + 1), then 2 left: a short last round
    assert fp8_agree.walk_tau([True] * 3 + [False] + [True] * 9, 2) == (3 + 1 + 3 + 3 + 3) / 5


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
        assert all(1 <= t <= int(k) + 1 for k, t in r["tau"].items())
    assert "| fp8wh/f16 |" in (tmp_path / "agree.md").read_text()
    for bad in (["--k", "0"], ["--variants", "fp8x"], ["--new", "0"]):
        with pytest.raises(SystemExit):
            fp8_agree.parse(["--model", "tiny-llama", "--weights", "random", *bad])
