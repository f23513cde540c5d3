"""Record the output of every op of a forward pass, per token row: what the divergence locator compares.

Nothing here touches a normal run: the recorder installs forward hooks on one Decoder (and, for the fused
path, wraps ``attnlab.kernels.fused.add_rmsnorm``) only inside its ``with`` block, and attention is seen
through ``RecordingContext``, an AttnContext the locator builds for its own passes. Outside the block the
per-layer path is exactly as before: no hook, no flag, no branch.

Ops, in dataflow order (``OPS``); per layer ``i``:
  input_norm -> qkv -> [q_norm, k_norm] -> q_rope, k_rope -> attention -> o_proj -> attn_residual (the
  residual stream after attention) -> post_norm -> gate_up -> act (SiLU(gate) * up) -> down -> layer_out
  (the residual stream after the layer); before the layers ``embed``, after them ``final_norm`` and
  ``logits`` (the LM head's output in the model dtype, before the fp32 cast).
Each is stored as [num_tokens, -1] in its own dtype, on the CPU, so bits can be compared.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from attnlab.backends.context import AttnContext

LAYER_OPS = ("input_norm", "qkv", "q_norm", "k_norm", "q_rope", "k_rope", "attention", "o_proj",
             "attn_residual", "post_norm", "gate_up", "act", "down", "layer_out")


def op_order(num_layers: int) -> list[tuple[str, int | None]]:
    """Every (op, layer) in dataflow order; layer None for the ops outside the layers."""
    return [("embed", None), *((op, i) for i in range(num_layers) for op in LAYER_OPS), ("final_norm", None),
            ("logits", None)]


@dataclass
class Recording:
    """(op, layer) -> [num_tokens, width] tensor of one pass; ``positions`` [num_tokens] of its rows."""

    ops: dict[tuple[str, int | None], torch.Tensor] = field(default_factory=dict)
    positions: list[int] = field(default_factory=list)

    def put(self, op: str, layer: int | None, x: torch.Tensor) -> None:
        self.ops[(op, layer)] = x.detach().reshape(x.shape[0], -1).to("cpu", copy=True)


@dataclass
class RecordingContext(AttnContext):
    """An AttnContext that also records attention's inputs (RoPE applied) and output."""

    recording: Recording | None = None

    def attend(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
               stored: bool = False) -> torch.Tensor:
        out = super().attend(layer, q, k, v, stored=stored)
        if self.recording is not None:
            self.recording.put("q_rope", layer, q)
            self.recording.put("k_rope", layer, k)
            self.recording.put("attention", layer, out)
        return out


class Recorder:
    """``with Recorder(model) as rec: rec.recording = Recording(); model(...)`` records one pass.

    model: an attnlab Decoder (the target). Hooks come off when the block exits."""

    def __init__(self, model, fused_ops: bool = False):
        from attnlab.models.decoder import Decoder

        if not isinstance(model, Decoder):
            raise TypeError(f"the locator records a Decoder, not {type(model).__name__}")
        self.model = model
        self.recording: Recording | None = None
        self._handles: list = []
        self.fused_ops = fused_ops  # the side runs attnlab.kernels.fused (engine.fused_ops)
        self._fused_calls = 0
        self._real_add_rmsnorm = None

    def _put(self, op, layer, x):
        if self.recording is not None:
            self.recording.put(op, layer, x)

    def _hook(self, op, layer, what="out"):
        def hook(module, args, out):
            self._put(op, layer, args[0] if what == "in" else out)
        return hook

    def __enter__(self):  # -> this Recorder
        m, hook = self.model, self._hook
        mods = [(m.embed_tokens, "embed", None, "out"), (m.norm, "final_norm", None, "out"),
                (m.lm_head, "logits", None, "out")]
        for i, layer in enumerate(m.layers):
            a, mlp = layer.self_attn, layer.mlp
            mods += [(layer.input_layernorm, "input_norm", i, "out"), (a.qkv_proj, "qkv", i, "out"),
                     (a.o_proj, "o_proj", i, "out"), (layer.post_attention_layernorm, "attn_residual", i, "in"),
                     (layer.post_attention_layernorm, "post_norm", i, "out"), (mlp.gate_up_proj, "gate_up", i, "out"),
                     (mlp.down_proj, "act", i, "in"), (mlp.down_proj, "down", i, "out"), (layer, "layer_out", i, "out")]
            if a.q_norm is not None:
                mods += [(a.q_norm, "q_norm", i, "out"), (a.k_norm, "k_norm", i, "out")]
        self._handles = [mod.register_forward_hook(hook(op, i, what)) for mod, op, i, what in mods]
        if self.fused_ops:  # the fused path calls its norms as kernels, not modules: wrap them (with the residual)
            from attnlab.kernels import fused

            self._fused_calls, self._real_add_rmsnorm = 0, fused.add_rmsnorm
            fused.add_rmsnorm = self._add_rmsnorm
        return self

    def _add_rmsnorm(self, x, residual, weight, eps):
        out, res = self._real_add_rmsnorm(x, residual, weight, eps)
        c, n = self._fused_calls, len(self.model.layers)
        self._fused_calls += 1
        if c == 2 * n:  # the final norm; its residual is the last layer's output stream
            self._put("final_norm", None, out)
            self._put("layer_out", n - 1, res)
        elif c % 2 == 0:  # layer c // 2's input norm; the residual is the previous layer's output stream
            self._put("input_norm", c // 2, out)
            if c:
                self._put("layer_out", c // 2 - 1, res)
        else:
            self._put("post_norm", c // 2, out)
            self._put("attn_residual", c // 2, res)
        return out, res

    def start(self, recording: Recording) -> None:
        """Record the next forward pass into ``recording``."""
        self.recording = recording
        self._fused_calls = 0

    def __exit__(self, *exc) -> None:
        for h in self._handles:
            h.remove()
        self._handles = []
        if self._real_add_rmsnorm is not None:
            from attnlab.kernels import fused

            fused.add_rmsnorm, self._real_add_rmsnorm = self._real_add_rmsnorm, None
        self.recording = None
