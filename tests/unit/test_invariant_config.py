"""engine.invariant at config time (issue 18): a verify backend without an invariant mode, a tree, or a CPU run
is one line naming the field; a valid plan makes the target side invariant and fused, and nothing else."""

from __future__ import annotations

import dataclasses

import pytest
from hydra import compose, initialize_config_dir

from attnlab.backends.registry import get_backend_class
from attnlab.cli import CONF_DIR
from attnlab.config import validate
from attnlab.errors import ConfigError


def _validate(*overrides):
    with initialize_config_dir(str(CONF_DIR), version_base="1.3"):
        return validate(compose("config", overrides=["model=tiny-llama", "device=cpu", *overrides]))


@pytest.mark.parametrize("verify", ["flashinfer", "fa", "hybrid", "torch"])
def test_a_backend_without_the_capability_is_a_one_line_error(verify):
    with pytest.raises(ConfigError) as e:
        _validate("engine.invariant=true", f"verify={verify}")
    msg = str(e.value)
    assert msg.startswith(f"engine.invariant=true: verify={verify} cannot be invariant") and "\n" not in msg


def test_only_triton_declares_it():
    assert get_backend_class("triton").capabilities().invariant
    for name in ("torch", "flashinfer", "fa"):
        try:
            caps = get_backend_class(name).capabilities()
        except Exception as e:  # noqa: BLE001 - an optional GPU backend that cannot be imported here
            pytest.skip(f"{name} not importable here: {e}")
        assert not caps.invariant, name


@pytest.mark.parametrize("overrides,needle", [
    (["spec.topk=2", "spec.num_steps=2", "draft=self"], "engine.invariant=true: spec.topk=2"),  # ngram drafts no trees
    ([], "engine.invariant=true runs Triton kernels"),  # the capability holds; CPU does not
])
def test_trees_and_cpu_are_refused(overrides, needle):
    with pytest.raises(ConfigError, match=needle):
        _validate("engine.invariant=true", "verify=triton", *overrides)


def test_invariant_off_by_default_and_the_draft_backend_is_free():
    assert _validate().engine.invariant is False
    # the draft side's backend is not checked: a flashinfer drafter with a triton verifier gets the device error
    with pytest.raises(ConfigError, match="needs device=cuda"):
        _validate("engine.invariant=true", "verify=triton", "draft=self", "backend=flashinfer")


def test_side_specs_make_the_target_invariant_and_fused_only():
    from attnlab.prepare import prepare
    from attnlab.sides import reference_spec, side_spec

    plan = _validate("draft=self", "verify=triton", "backend=torch", "workload.num_prompts=1",
                     "workload.max_new_tokens=8")
    plan = dataclasses.replace(plan, engine=dataclasses.replace(plan.engine, invariant=True))
    work = prepare(plan)
    target = side_spec(plan, work, "target", "triton")
    draft = side_spec(plan, work, "draft", "torch")
    ref = reference_spec(plan, work)
    assert (target.invariant, target.fused_ops) == (True, True)
    assert (draft.invariant, draft.fused_ops) == (False, False)
    assert (ref.invariant, ref.fused_ops) == (False, False)


def test_build_side_refuses_a_backend_without_the_capability():
    from attnlab.engine.build import SideSpec, build_side
    from attnlab.plan import ModelSource

    spec = SideSpec(model=ModelSource("tiny-llama", None, "random", 0, {}), backend="torch", dtype="fp32",
                    kv_dtype="fp32", page_size=16, max_context=64, max_batch=1, device="cpu",
                    invariant=True)
    with pytest.raises(ConfigError, match="backend 'torch' cannot be invariant"):
        build_side(spec, progress=False)


def test_invariant_refuses_the_triton_gemm_route(monkeypatch):
    # validation only (nothing is built): pretend a GPU is visible so the device check passes on CPU
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    with pytest.raises(ConfigError) as e:
        _validate("device=cuda", "engine.invariant=true", "verify=triton", "engine.gemm=triton")
    assert "does not combine with engine.gemm=triton" in str(e.value) and "\n" not in str(e.value)
