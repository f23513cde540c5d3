"""engine.pdl's switch (attnlab.kernels.pdl) and config checks, on any machine."""

from __future__ import annotations

import pytest
import torch

from attnlab.errors import ConfigError
from attnlab.kernels import pdl


def test_off_by_default_and_no_launch_args():
    assert not pdl.enabled()
    assert pdl.launch_args(torch.zeros(1)) == {}


def test_refused_where_it_cannot_run():
    with pytest.raises(ConfigError, match=r"engine.pdl=true: .*CUDA feature \(device=cpu\)"):
        pdl.set_enabled(True, "cpu")
    assert not pdl.enabled()
    if not torch.cuda.is_available():
        assert pdl.unsupported() in ("no CUDA device", "TRITON_INTERPRET=1 runs no GPU kernels")
        with pytest.raises(ConfigError, match="engine.pdl=true"):
            pdl.set_enabled(True)
    pdl.set_enabled(False, "cpu")  # off is always allowed
    assert not pdl.enabled()


def test_forced_for_compile_is_scoped():
    with pdl.forced_for_compile():
        assert pdl.launch_args(torch.zeros(1)) == {"USE_PDL": True, "launch_pdl": True}
    assert pdl.launch_args(torch.zeros(1)) == {}
    assert not pdl.enabled()


def test_interpreted_kernels_take_the_default_variant():
    """The kernels' USE_PDL constexpr defaults to False: a launch without launch_args (every CPU launch) runs the
    variant that existed before PDL (here: the fused RMSNorm under the interpreter, against torch)."""
    from attnlab.kernels.heuristics import interpreter_on

    if not interpreter_on():
        pytest.skip("runs the Triton interpreter (CPU CI)")
    from attnlab.kernels import fused

    x, w = torch.randn(3, 64), torch.rand(64) + 0.5
    out = fused.add_rmsnorm(x, None, w, 1e-5)
    out = out[0] if isinstance(out, tuple) else out
    ref = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-5) * w
    torch.testing.assert_close(out, ref, atol=1e-5, rtol=1e-5)
