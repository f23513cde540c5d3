"""Programmatic dependent launch (PDL) for attnlab's Triton kernels: ``engine.pdl`` (Hopper and later, CUDA).

A decode step of a small model is hundreds of short kernels back to back (SmolLM2-135M at batch 1: about 7 a
layer, 30 layers, ~1.2 ms a step on an H200), so the gap between two kernels (the next grid's launch and CTA
set-up, after the previous grid has drained) is a real share of the step. With PDL a kernel is launched with
``launch_pdl=True`` (cudaLaunchAttributeProgrammaticStreamSerialization): the GPU may start it while the kernel
before it in the stream still runs. Each of attnlab's kernels then starts with

    griddepcontrol.wait              (tl.extra.cuda.gdc_wait: returns once the previous grid has completed and
                                      its memory is visible; nothing global is read or written before it, but
                                      the weights' and the decode's plan and early K / V reads, which no previous
                                      grid writes: attnlab.kernels.gemm / decode)
    griddepcontrol.launch_dependents (tl.extra.cuda.gdc_launch_dependents: the next PDL kernel may launch now)

so what overlaps is launch latency, set-up and reads of what the previous grid does not write: outputs are
bit-identical with PDL on and off (GPU test), and the math of every kernel is unchanged. A kernel that is not
PDL-launched (cuBLAS, a torch op) waits for its predecessor as always; a PDL kernel after it gains nothing from the
edge but loses nothing. CUDA graphs keep the programmatic edges of a captured stream (CUDA >= 12.3).

The switch is process-wide, like ``torch.backends.cuda.matmul.allow_tf32``: the job sets it from
``engine.pdl`` before building its sides; graphs record the kernels as they were launched at capture. Off by
default, until the H200 A/B (``python -m attnlab.bench.pdl``) says it pays.
"""

from __future__ import annotations

import contextlib
import functools

import torch
import triton
import triton.language as tl

from attnlab.errors import ConfigError
from attnlab.kernels.heuristics import interpreter_on

_enabled = False
_compile_only = False  # attnlab.kernels.aot: CPU tensors, kernels compiled for a GPU target, nothing launched


def set_enabled(on: bool, device: torch.device | str | None = None) -> None:
    """Turn PDL on or off for every attnlab Triton launch that follows. On needs a CUDA device of compute
    capability >= 9.0 (``device``: the one the sides run on; default the current one) and compiled kernels
    (not TRITON_INTERPRET=1): otherwise a ConfigError says why."""
    global _enabled
    if on:
        why = unsupported(device)
        if why:
            raise ConfigError(f"engine.pdl=true: {why} (use engine.pdl=false)")
    _enabled = bool(on)


def enabled() -> bool:
    return _enabled


@contextlib.contextmanager
def using(on: bool, device: torch.device | str | None = None):
    """``set_enabled(on, device)`` inside, the previous setting restored after (benches, tests)."""
    before = _enabled
    set_enabled(on, device)
    try:
        yield
    finally:
        globals()["_enabled"] = before


def unsupported(device: torch.device | str | None = None) -> str | None:
    """Why PDL cannot run here, or None."""
    dev = torch.device(device) if device is not None else None
    if dev is not None and dev.type != "cuda":
        return f"programmatic dependent launch is a CUDA feature (device={dev.type})"
    if interpreter_on():
        return "TRITON_INTERPRET=1 runs no GPU kernels"
    if not torch.cuda.is_available():
        return "no CUDA device"
    if torch.version.hip:
        return "ROCm: griddepcontrol is an NVIDIA (sm_90+) instruction"
    major, minor = _capability(dev.index if dev is not None and dev.index is not None else torch.cuda.current_device())
    if major < 9:
        return f"needs compute capability >= 9.0 (Hopper); this GPU is {major}.{minor}"
    return None


@functools.cache
def _capability(index: int) -> tuple[int, int]:
    return torch.cuda.get_device_capability(index)


def launch_args(t: torch.Tensor) -> dict:
    """Extra launch arguments of an attnlab kernel whose data live on ``t``'s device: ``USE_PDL`` (the kernel's
    constexpr: wait, then let dependents launch) and ``launch_pdl``, when PDL is on; nothing otherwise (the
    kernels' default USE_PDL=False, the same compiled variant as before PDL existed)."""
    if _enabled and (t.is_cuda or _compile_only):
        return {"USE_PDL": True, "launch_pdl": True}
    return {}


@contextlib.contextmanager
def forced_for_compile():
    """Inside (attnlab.kernels.aot only, whose launches compile and never run): every launch takes the PDL
    variant, though its tensors are on the CPU, so the CPU CI checks that ``griddepcontrol`` lowers for sm_90."""
    global _enabled, _compile_only
    before = _enabled, _compile_only
    _enabled = _compile_only = True
    try:
        yield
    finally:
        _enabled, _compile_only = before


@triton.jit
def pdl_start(USE_PDL: tl.constexpr):
    """The first statement of every attnlab kernel (module doc): with PDL, wait for the previous grid, then let
    the next one launch. Without it, nothing (not even traced)."""
    if USE_PDL:
        tl.extra.cuda.gdc_wait()
        tl.extra.cuda.gdc_launch_dependents()


L2_LINE = 128  # bytes per prefetch.global.L2


@triton.jit
def prefetch_l2(ptrs):
    """``prefetch.global.L2`` of the line at each pointer: a hint, no result, no fault semantics to rely on (the
    callers point masked lanes at a valid address). The one memory access a kernel may issue before its wait on data
    the previous grid may be writing: L2 is the GPU's point of coherence, so a line prefetched early is the line that
    grid's stores update, and the loads after the wait read its final bits (no early load fills L1 with a line that
    grid writes: the decode's preloaded tile, its only early loads of K / V, leaves out the rows it may write, and
    those rows are whole lines: attnlab.kernels.decode)."""
    tl.inline_asm_elementwise("prefetch.global.L2 [$1];", "=r,l", [ptrs], dtype=tl.int32, is_pure=False, pack=1)
