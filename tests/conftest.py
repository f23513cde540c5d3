"""Session fixtures shared across test files: the real SmolLM2-135M (GGUF) loaded once, ours and HF's."""

from __future__ import annotations

import os

# pytest -n 2 on 2 cores: one compute thread per worker (inherited by the CLI subprocesses the tests start).
# With torch's default of one OpenMP thread per core, two workers spin-wait against each other: on CI a
# default run that takes 1 min alone took over 6 min beside another worker.
if os.environ.get("PYTEST_XDIST_WORKER"):
    for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ[_var] = "1"

import pytest
import torch

if os.environ.get("PYTEST_XDIST_WORKER"):
    torch.set_num_threads(1)

# Triton interpreter on CPU-only machines: TRITON_INTERPRET must be set before any @triton.jit function is
# defined, i.e. before attnlab.kernels is first imported; conftest runs before every test module.
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

from attnlab.errors import ModelLoadError

SMOLLM2 = "smollm2-135m"


@pytest.fixture(autouse=True)
def _pdl_off_after_each_test():
    """engine.pdl, engine.gemm_split and engine.gemm_prefetch are process-wide switches (attnlab.kernels.pdl, attnlab.kernels.gemm): no
    test leaves them changed for the next one."""
    yield
    import sys

    mod = sys.modules.get("attnlab.kernels.pdl")
    if mod is not None:
        mod.set_enabled(False)
    mod = sys.modules.get("attnlab.kernels.gemm")
    if mod is not None:
        mod.set_split_mode(mod.DEFAULT_SPLIT_MODE)
        mod.set_prefetch(mod.DEFAULT_PREFETCH)
        mod.set_fp8_mode(mod.DEFAULT_FP8_MODE)  # sides.set_process_wide sets it from a run's plan


def _smollm2_path():
    from attnlab.models.presets import get_preset

    try:
        return get_preset(SMOLLM2).gguf_path()
    except ModelLoadError as e:
        pytest.skip(str(e))


@pytest.fixture(scope="session")
def smollm2():
    """(Decoder, ModelConfig, tokenizer) of SmolLM2-135M-Instruct Q4_1, fp32 on CPU."""
    from attnlab.models import load_model, load_tokenizer

    _smollm2_path()
    model, cfg = load_model(SMOLLM2, dtype=torch.float32, device="cpu")
    return model, cfg, load_tokenizer(SMOLLM2)


@pytest.fixture(scope="session")
def smollm2_hf():
    """transformers' LlamaForCausalLM from the same GGUF, fp32, eval.

    Built as from_pretrained(dir, gguf_file=...) does, minus its hard dependency on accelerate: transformers'
    own GGUF converter (load_gguf_checkpoint, with its Q/K reverse permute) supplies the state dict.
    """
    from transformers import AutoConfig, AutoModelForCausalLM
    from transformers.modeling_gguf_pytorch_utils import load_gguf_checkpoint

    path = _smollm2_path()
    config = AutoConfig.from_pretrained(str(path.parent), gguf_file=path.name)
    config._attn_implementation = "eager"
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    tensors = load_gguf_checkpoint(str(path), return_tensors=True, model_to_load=model)["tensors"]
    missing, unexpected = model.load_state_dict(tensors, strict=False)
    assert not unexpected and set(missing) <= {"lm_head.weight"}, (missing, unexpected)
    model.tie_weights()
    return model.eval()
