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


def _launched_kernels():
    """(module, jit function def, its launch calls) for every @triton.jit function launched as ``f[grid](...)``."""
    import ast
    import pathlib

    import attnlab.kernels

    out = []
    for path in sorted(pathlib.Path(attnlab.kernels.__file__).parent.glob("*.py")):
        tree = ast.parse(path.read_text())
        jit = {f.name: f for f in ast.walk(tree) if isinstance(f, ast.FunctionDef)
               and any("jit" in ast.unparse(d) for d in f.decorator_list)}
        launches: dict[str, list] = {}
        for node in ast.walk(tree):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Subscript) \
                    and isinstance(node.func.value, ast.Name) and node.func.value.id in jit:
                launches.setdefault(node.func.value.id, []).append(node)
        out += [(path.name, jit[name], calls) for name, calls in launches.items()]
    return out


PRE_WAIT_CALLS = {"tl.program_id", "tl.arange", "tl.minimum", "_columns", "_prefetch_weights"}
# kernels that read their plan before the wait (no launch directly before an attention kernel writes one:
# attnlab.kernels.decode's docstring): the tensors they may load there, and their helpers (the KV prefetch; the
# early first tile's page ids, which aim its K / V loads, kept only if re-read equal)
PRE_WAIT_PLAN_READS = {"_decode_kernel": ({"QO_INDPTR", "KV_LENS", "KV_INDPTR", "K", "V"},
                                          {"tl.load", "tl.cdiv", "_prefetch_kv", "tile_slots"})}
# K / V before the wait (the decode's preloaded early tile): only under this mask, which leaves out the current
# token's row, the one the launch before may be storing (decode's docstring; the GPU race test stores it late)
PRE_WAIT_KV_MASK = "settled"


def test_every_launched_kernel_waits_first_and_takes_launch_args():
    """Statically, on any machine: a kernel that touches memory before the wait could read its predecessor's
    output early under PDL (only index arithmetic and the GEMM's weight prefetch may precede it); one launched
    without launch_args would never take PDL."""
    import ast

    kernels = _launched_kernels()
    assert len(kernels) >= 11, [k[1].name for k in kernels]
    for module, fn, calls in kernels:
        args = fn.args
        assert args.args[-1].arg == "USE_PDL" and ast.unparse(args.defaults[-1]) == "False", (module, fn.name)
        body = [st for st in fn.body if not (isinstance(st, ast.Expr) and isinstance(st.value, ast.Constant))]
        texts = [ast.unparse(st) for st in body]
        assert "pdl_start(USE_PDL)" in texts, (module, fn.name)
        reads, helpers = PRE_WAIT_PLAN_READS.get(fn.name, (set(), set()))
        for st in body[:texts.index("pdl_start(USE_PDL)")]:  # before the wait: index arithmetic, the weights'
            # L2 prefetch (engine.gemm_prefetch: no kernel writes weights), an attention kernel's plan reads and KV
            # prefetch; nothing else that reads or writes memory
            inner = [c for c in ast.walk(st) if isinstance(c, ast.Call)]
            called = {ast.unparse(c.func) for c in inner}
            assert called <= PRE_WAIT_CALLS | helpers, (module, fn.name, ast.unparse(st), called - PRE_WAIT_CALLS)
            for c in inner:
                if ast.unparse(c.func) == "tl.load":  # only the plan's tensors, and K / V but the current row
                    base = next(n.id for n in ast.walk(c.args[0]) if isinstance(n, ast.Name))
                    assert base in reads, (module, fn.name, ast.unparse(c))
                    if base in ("K", "V"):
                        mask = next((ast.unparse(k.value) for k in c.keywords if k.arg == "mask"), None)
                        assert mask == PRE_WAIT_KV_MASK, (module, fn.name, ast.unparse(c))
        if fn.name in PRE_WAIT_PLAN_READS:  # that mask stops before position kv_len - 1
            masks = [ast.unparse(a.value) for a in ast.walk(fn) if isinstance(a, ast.Assign)
                     and ast.unparse(a.targets[0]) == PRE_WAIT_KV_MASK]
            assert len(masks) == 1 and "< kv_len_e - 1" in masks[0], (module, fn.name, masks)
        for call in calls:
            spread = [k for k in call.keywords if k.arg is None]
            assert any(ast.unparse(k.value).startswith("launch_args(") for k in spread), (module, fn.name)


def test_the_decode_prefetch_helpers_only_read_page_ids_and_prefetch():
    """The helpers the decode calls before its wait (``_prefetch_kv``, and ``tile_slots`` inside it and for the early
    first tile) load nothing but the page ids (KV_INDICES) and store nothing: the rest of their memory traffic is
    prefetch_l2 (a hint)."""
    import ast
    import inspect

    from attnlab.kernels import decode, paged

    for fn, loads in ((decode._prefetch_kv, {"KV_INDICES"}), (paged.tile_slots, {"KV_INDICES"})):
        tree = ast.parse(inspect.getsource(fn.fn))
        for c in (n for n in ast.walk(tree) if isinstance(n, ast.Call)):
            name = ast.unparse(c.func)
            assert name not in ("tl.store", "tl.atomic_add", "tl.atomic_cas", "tl.atomic_xchg"), (fn.fn.__name__, name)
            if name == "tl.load":
                base = next(n.id for n in ast.walk(c.args[0]) if isinstance(n, ast.Name))
                assert base in loads, (fn.fn.__name__, ast.unparse(c))
            elif name not in ("tl.arange", "tl.static_range", "tile_slots", "prefetch_l2", "range") \
                    and not name.endswith(").to"):  # a cast of a call's result (the load, checked on its own)
                raise AssertionError((fn.fn.__name__, name))


def _cfg(**engine):
    from omegaconf import OmegaConf

    base = {"fused_ops": False, "gemm": "cublas", "invariant": False, "pdl": True}
    return OmegaConf.create({"engine": {**base, **engine}})


def test_config_refuses_pdl_where_no_attnlab_kernel_runs():
    from omegaconf import OmegaConf

    from attnlab.config import _check_pdl_has_kernels

    fi, fa = OmegaConf.create({"name": "flashinfer"}), OmegaConf.create({"name": "fa"})
    with pytest.raises(ConfigError, match=r"engine.pdl=true: no attnlab Triton kernel runs here \(attention "
                                          r"flashinfer/fa"):
        _check_pdl_has_kernels(_cfg(), [fi, fa], False)
    for cfg, sides, fused in ((_cfg(), [fi], True), (_cfg(gemm="triton"), [fi], False),
                              (_cfg(), [OmegaConf.create({"name": "triton"})], False),
                              (_cfg(), [OmegaConf.create({"name": "hybrid", "options": {"short": "flashinfer",
                                                                                        "long": "triton"}})], False)):
        _check_pdl_has_kernels(cfg, sides, fused)  # each runs attnlab kernels: accepted


def test_using_restores_the_previous_setting():
    with pytest.raises(ConfigError), pdl.using(True, "cpu"):
        pass
    assert not pdl.enabled()
    with pdl.using(False):
        assert not pdl.enabled()
    assert not pdl.enabled()
