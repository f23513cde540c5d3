"""FP8 (e4m3) weights for the drafter: FP8Linear and quantize_linears.

W8A8 with row-wise scales, as vLLM's and torchao's "fp8 dynamic, per-row" recipes:
- weights: ``w8 = fp8(W / sw)``, one fp32 scale per output row, ``sw = amax(|W[n, :]|) / 448``;
- activations: quantized per token (row) at run time the same way, ``sa = amax(|x[m, :]|) / 448``;
- matmul: ``torch._scaled_mm(a8, w8.t(), scale_a=sa [M, 1], scale_b=sw [1, N], out_dtype=bf16, bias=b)``
  (cuBLASLt / CUTLASS row-wise fp8 GEMM: needs sm_89+, and K, N multiples of 16).
``emulate=True`` dequantizes both operands to fp32 and runs a plain matmul: the same numbers up to fp32
summation order, on any device (the CPU unit tests use it). Error bounds: docs/precision.md and
tests/unit/test_fp8.py.

Weight-only at small M (``small_m="weight_only"``, precision=fp8w-draft): a pass of <= 16 rows skips the
activation quantization (about 8 small launches per linear, which made W8A8 slower than bf16 on a small
drafter) and runs ``attnlab.kernels.gemm``, which loads the e4m3 weights (half of bf16's bytes), converts
them inside the GEMM (``precision.fp8_mma``: by default to f16, the activations too, for an f16 MMA; bf16: exactly to
the activation dtype; docs/precision.md) and applies the row scales to the fp32 sums; larger passes (prefill) stay
W8A8.

Only the decoder layers' projections are quantized (qkv_proj, o_proj, gate_up_proj, down_proj) by default; the
embeddings, norms and lm_head stay in the model dtype (bf16), as in the usual fp8 checkpoints. ``lm_head=True``
(precision.fp8_lm_head) quantizes the LM head too: a drafter's head is a quarter of a 1B model's bytes a step and only
sets what it proposes; a head tied to the embeddings gets its own e4m3 copy (the embeddings stay bf16).
"""

from __future__ import annotations

import copy

import torch
from torch import nn

from attnlab.kvcache.quant import fp8_max

WEIGHT_FP8 = torch.float8_e4m3fn
LINEAR_NAMES = ("self_attn.qkv_proj", "self_attn.o_proj", "mlp.gate_up_proj", "mlp.down_proj")
# each projection's role in attnlab.kernels.gemm (ROLES: it picks the K loop and split policy of its small-M passes)
LINEAR_ROLES = dict(zip(LINEAR_NAMES, ("qkv", "o", "gate_up", "down")))
SMALL_M = ("w8a8", "weight_only")  # FP8Linear.small_m (precision.fp8_gemm)
# in the __dict__ of a module whose projections quantize_linears / EagleHead.quantize_fp8 made W8A8 (``mark_w8a8``):
# attnlab's small-M GEMM runs e4m3 weights weight-only, so such a layer or head keeps the fused cuBLAS path
# (``is_w8a8``)
W8A8_MARK = "fp8_w8a8"
_MIN_SCALE = 1e-12  # a zero row gets this scale (its fp8 values are 0 anyway), never a division by zero


def quantize_rows(x: torch.Tensor, dtype: torch.dtype = WEIGHT_FP8) -> tuple[torch.Tensor, torch.Tensor]:
    """x: [rows, cols] -> (fp8 [rows, cols], fp32 scale [rows, 1]) with x ~= fp8 * scale per row."""
    xf = x.float()
    scale = (xf.abs().amax(dim=-1, keepdim=True) / fp8_max(dtype)).clamp_min(_MIN_SCALE)
    m = fp8_max(dtype)
    return (xf / scale).clamp(-m, m).to(dtype), scale


class FP8Linear(nn.Module):
    """``y = x @ W.T + b`` with fp8 weights (per-output-row scales) and per-token fp8 activations.

    weight:       [out, in] float8_e4m3fn
    weight_scale: [out] fp32
    bias:         [out] in the output dtype, or None
    forward: x [..., in] bf16 (fp16 / fp32 with emulate) -> [..., out] in x's dtype.
    small_m: w8a8 (every M) | weight_only (<= 16 rows: attnlab.kernels.gemm, e4m3 weights dequantized inside,
    x unquantized; more rows: W8A8).
    Dtype casts of the module (``model.to(bf16)``) do not apply to it (its buffers only follow device moves).
    """

    def __init__(self, weight: torch.Tensor, weight_scale: torch.Tensor, bias: torch.Tensor | None,
                 emulate: bool = False, small_m: str = "w8a8", role: str | None = None):
        super().__init__()
        self.role = role  # attnlab.kernels.gemm's role of its small-M passes (the LM head's: "lm_head")
        if small_m not in SMALL_M:
            raise ValueError(f"small_m={small_m!r}: choose from {', '.join(SMALL_M)}")
        self.small_m = small_m
        self.out_features, self.in_features = weight.shape
        self.register_buffer("weight", weight)
        self.register_buffer("weight_scale", weight_scale.float().reshape(-1))
        self.register_buffer("bias", bias)
        self.emulate = emulate

    @classmethod
    def from_linear(cls, linear: nn.Linear, dtype: torch.dtype = WEIGHT_FP8, emulate: bool = False,
                    small_m: str = "w8a8", role: str | None = None) -> FP8Linear:
        bias = linear.bias.detach().clone() if linear.bias is not None else None
        return cls.from_weight(linear.weight, bias, dtype, emulate=emulate, small_m=small_m, role=role)

    @classmethod
    def from_weight(cls, weight: torch.Tensor, bias: torch.Tensor | None = None, dtype: torch.dtype = WEIGHT_FP8,
                    emulate: bool = False, small_m: str = "w8a8", role: str | None = None) -> FP8Linear:
        """An FP8Linear of a weight [out, in] that is no nn.Linear's (an EAGLE head's LM-head rows)."""
        if dtype != WEIGHT_FP8:
            raise ValueError(f"FP8Linear weights are float8_e4m3fn only (got {dtype}); e5m2 is a KV format")
        w8, sw = quantize_rows(weight.detach(), dtype)
        return cls(w8, sw, bias, emulate=emulate, small_m=small_m, role=role)

    def dequantized_weight(self) -> torch.Tensor:
        """[out, in] fp32: what the fp8 matmul effectively multiplies by."""
        return self.weight.float() * self.weight_scale[:, None]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        lead = x.shape[:-1]
        x2 = x.reshape(-1, self.in_features)
        if self.small_m == "weight_only" and x2.shape[0] <= 16:  # attnlab.kernels.gemm.MAX_M
            from attnlab.kernels import gemm

            bias = self.bias.to(x.dtype) if self.bias is not None else None
            return gemm.linear(x2, self.weight, bias, w_scale=self.weight_scale, role=self.role).reshape(
                *lead, self.out_features)
        a8, sa = quantize_rows(x2, self.weight.dtype)  # [M, K] fp8, [M, 1] fp32
        if self.emulate:
            y = (a8.float() * sa) @ self.dequantized_weight().t()
            if self.bias is not None:
                y = y + self.bias.float()
            y = y.to(x.dtype)
        else:
            bias = self.bias.to(x.dtype) if self.bias is not None else None
            y = torch._scaled_mm(a8, self.weight.t(), scale_a=sa, scale_b=self.weight_scale.view(1, -1),
                                 bias=bias, out_dtype=x.dtype)
        return y.reshape(*lead, self.out_features)

    def _apply(self, fn, recurse=True):
        # follow device moves, keep dtypes: a cast would destroy the fp8 weights and round the scales
        for name, buf in self._buffers.items():
            if buf is not None:
                self._buffers[name] = buf.to(fn(buf[:0] if buf.dim() else buf).device)
        return self

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features}, out_features={self.out_features}, "
                f"bias={self.bias is not None}, emulate={self.emulate}, small_m={self.small_m}")


def scaled_mm_ok(in_features: int, out_features: int) -> bool:
    """torch._scaled_mm's shape rule on CUDA: K and N multiples of 16 (other projections stay bf16)."""
    return in_features % 16 == 0 and out_features % 16 == 0


def quantize_linears(model: nn.Module, dtype: torch.dtype = WEIGHT_FP8, *, layers: list[int] | None = None,
                     emulate: bool = False, inplace: bool = False, small_m: str = "w8a8",
                     lm_head: bool = False) -> nn.Module:
    """A Decoder whose layer projections (LINEAR_NAMES) are FP8Linear; embeddings / norms untouched, and the lm_head
    too unless ``lm_head`` (then an FP8Linear of its weight: a tied head's own copy, the embeddings unchanged).

    ``inplace=False`` returns a copy that *shares* every other tensor with ``model`` (only the module
    objects are new, so the copy costs the fp8 weights alone) and leaves ``model`` as it was; ``layers``
    limits the swap to those layer indices (a self-drafter's subset). Projections whose shape
    torch._scaled_mm cannot take (not multiples of 16) stay as they are unless ``emulate``. ``small_m``: see
    FP8Linear.
    """
    if not inplace:
        memo = {id(t): t for t in list(model.parameters()) + list(model.buffers())}
        model = copy.deepcopy(model, memo)
    keep = set(range(len(model.layers))) if layers is None else set(layers)
    for i, layer in enumerate(model.layers):
        if i not in keep:
            continue
        for path in LINEAR_NAMES:
            parent_name, attr = path.split(".")
            parent = getattr(layer, parent_name)
            lin = getattr(parent, attr)
            if isinstance(lin, nn.Linear) and (emulate or scaled_mm_ok(lin.in_features, lin.out_features)):
                setattr(parent, attr, FP8Linear.from_linear(lin, dtype, emulate=emulate, small_m=small_m,
                                                            role=LINEAR_ROLES[path]))
                mark_w8a8(layer, small_m)
    if lm_head:
        head = getattr(model, "lm_head", None)
        if not isinstance(head, nn.Linear) or not (emulate or scaled_mm_ok(head.in_features, head.out_features)):
            raise ValueError(f"lm_head=True: the model's lm_head ({type(head).__name__}) is not an nn.Linear that "
                             f"row-wise fp8 takes (K, N multiples of 16)")
        model.lm_head = FP8Linear.from_linear(head, dtype, emulate=emulate, small_m=small_m, role="lm_head")
    return model


def mark_w8a8(module: nn.Module, small_m: str) -> None:
    """Record that ``module``'s projections are FP8Linear of ``small_m`` (W8A8 or weight-only): ``is_w8a8``."""
    module.__dict__[W8A8_MARK] = small_m == "w8a8"


def is_w8a8(module: nn.Module) -> bool:
    """Whether ``module``'s projections are W8A8 e4m3 (``mark_w8a8``): one dict lookup, for the per-pass path."""
    return bool(module.__dict__.get(W8A8_MARK))


def has_fp8_linears(model: nn.Module) -> bool:
    return any(isinstance(m, FP8Linear) for m in model.modules())


def fp8_matmul_problem(device: str) -> str | None:
    """None if row-wise fp8 matmul runs on ``device``, else a one-line reason (for config validation).

    CPU is refused on purpose (fp8 weights are a GPU speed study; FP8Linear(emulate=True) is for tests).
    On CUDA: sm_89+ and a real row-wise torch._scaled_mm call on a 16x16 problem.
    """
    if device != "cuda":
        return f"fp8 weights need a CUDA GPU with sm_89+ (device is {device})"
    if not hasattr(torch, "_scaled_mm"):
        return f"this torch ({torch.__version__}) has no torch._scaled_mm"
    if not torch.cuda.is_available():
        return "no CUDA device is visible"
    cap = torch.cuda.get_device_capability()
    if cap < (8, 9):
        return f"fp8 matmul needs sm_89+ (this GPU is sm_{cap[0]}{cap[1]})"
    try:
        lin = nn.Linear(16, 16, bias=False, dtype=torch.bfloat16, device="cuda")
        FP8Linear.from_linear(lin)(torch.randn(4, 16, dtype=torch.bfloat16, device="cuda"))
    except Exception as e:  # noqa: BLE001 - any failure of the probe is the reason
        return f"row-wise torch._scaled_mm fails here ({type(e).__name__}: {str(e).splitlines()[0][:120]})"
    return None
