"""The divergence locator (issue 18): names the first op and layer whose bits differ between a
decode-shaped and a verify-shaped pass (or two backends), on tiny models with a known first difference."""

from __future__ import annotations

import json

import pytest
import torch

from attnlab.backends.torch_ref import TorchBackend, reference_attention
from attnlab.locate import (
    LocateError,
    NothingToLocate,
    Passes,
    format_result,
    locate,
    pick_request,
    verify_row,
)
from attnlab.probe import LAYER_OPS, Recorder
from tests.spec.tiny import runner, tiny_config, tiny_model


class RowwiseTorch(TorchBackend):
    """The fp32 reference computed one query row at a time over exactly its visible keys: every row's
    arithmetic has one shape whatever q_len or batch, so decode and verify agree to the bit (CPU)."""

    name = "rowwise"

    def run(self, q, layer):
        pool = self.pool
        flat = pool.layer(layer).view(2, -1, pool.num_kv_heads, pool.head_dim)
        out = torch.zeros(q.shape, dtype=torch.float32)
        for plan in self.active_plan:
            for b in range(plan.rows.shape[0]):
                for j in range(plan.rows.shape[1]):
                    row = int(plan.rows[b, j])
                    if row < 0:
                        continue
                    seen = plan.slots[b][plan.mask[b, j]]
                    out[row] = reference_attention(q[row:row + 1], flat[0][seen], flat[1][seen],
                                                   torch.ones(1, len(seen), dtype=torch.bool), self.scale)[0]
        return out.to(q.dtype)


def _runner(dtype, backend="torch", seed=0):
    cfg = tiny_config(layers=3)
    model = tiny_model(cfg, seed).to(dtype)
    r = runner(model, cfg, backend="torch" if backend == "rowwise" else backend, max_context=128)
    if backend == "rowwise":
        pool = r.pool
        r.backend = RowwiseTorch(pool, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim, cfg.head_dim ** -0.5, dtype)
    return r, cfg


SEQ = [(7 * i + 3) % 96 for i in range(40)]


def test_rowwise_passes_agree_to_the_bit_and_a_verify_only_change_is_named(monkeypatch):
    r, _ = _runner(torch.bfloat16, "rowwise")
    start, row, k = 20, 2, 4
    decode = Passes(r, (1,) * (row + 1), label="decode")
    verify = Passes(r, (k + 1,), label="verify")
    same = locate(decode, verify, SEQ, start, start + row)
    assert same["first"] is None, format_result(same)  # the premise: nothing differs by pass shape here
    assert "bitwise identical: every op at every compared position" in format_result(same)
    assert all(e["equal"] for e in same["at_position"]) and len(same["positions"]) == row + 1
    # perturb one op on q_len > 1 passes only: layer 1's down projection
    down = r.model.layers[1].mlp.down_proj
    real = down.forward
    monkeypatch.setattr(down, "forward", lambda x: real(x) + (1e-2 if x.shape[0] > 1 else 0.0))
    res = locate(decode, verify, SEQ, start, start + row)
    f = res["first"]
    assert (f["op"], f["layer"], f["position"]) == ("down", 1, start), format_result(res)
    at = {(e["op"], e["layer"]): e["equal"] for e in res["at_position"]}
    assert all(at[(op, 0)] for op in LAYER_OPS if (op, 0) in at)  # layer 0 untouched
    assert not at[("down", 1)] and not at[("layer_out", 1)] and not at[("logits", None)]
    assert at[("act", 1)]  # the op's input is still the same: the difference starts in the op itself
    assert "first difference: layer 1 down at position 20" in format_result(res)


def test_torch_vs_triton_attention_is_the_first_difference():
    """Same weights, same decode shape, two attention backends (Triton under the interpreter on CPU):
    everything before layer 0's attention is the same torch code, attention is the first op to differ."""
    a, cfg = _runner(torch.float32, "torch")
    b = runner(a.model, cfg, backend="triton", max_context=128)
    res = locate(Passes(a, (1,), 2, label="torch"), Passes(b, (1,), 2, label="triton"), SEQ, 30, 30)
    f = res["first"]
    assert (f["op"], f["layer"], f["position"]) == ("attention", 0, 30), format_result(res)
    at = {(e["op"], e["layer"]): e["equal"] for e in res["at_position"]}
    assert at[("q_rope", 0)] and at[("k_rope", 0)] and not at[("o_proj", 0)]
    assert f["max_abs_diff"] < 1e-4  # fp32 rounding, not a wrong kernel


def test_recorder_leaves_no_hooks_and_records_every_op():
    r, cfg = _runner(torch.float32)
    model = r.model
    with Recorder(model) as rec:
        from attnlab.locate import record_passes

        recs = record_passes(Passes(r, (1, 3)), SEQ, 5)
    assert [x.positions for x in recs] == [[5], [6, 7, 8]]
    names = {op for op, _ in recs[1].ops}
    assert names == set(LAYER_OPS) - {"q_norm", "k_norm"} | {"embed", "final_norm", "logits"}
    assert recs[1].ops[("logits", None)].shape == (3, cfg.vocab_size)
    assert rec.recording is None
    hooks = [m for m in model.modules() if m._forward_hooks or m._forward_pre_hooks]
    assert hooks == []
    assert r.allocator.num_used == 0  # the locator's requests were released


def test_verify_row_from_accept_lengths():
    # output 0 from prefill; pass 0 emits 3 (outputs 1..3), pass 1 emits 1 (output 4), pass 2 emits 5
    assert [verify_row([3, 1, 5], d) for d in (1, 2, 3, 4, 5, 9)] == [0, 1, 2, 0, 0, 4]
    with pytest.raises(ValueError):
        verify_row([3, 1], 5)


def test_pick_request():
    rows = [{"first_divergence_vs_target_only": None}, {"first_divergence_vs_target_only": 4,
                                                         "divergence_noise_floor": {"index": 2}}]
    assert pick_request(rows, "vs_target_only", None)[::2] == (1, 4)
    assert pick_request(rows, "noise_floor", None)[::2] == (1, 2)
    with pytest.raises(LocateError, match="no divergence.*requests that diverge .vs_target_only.: 1"):
        pick_request(rows, "vs_target_only", 0)
    with pytest.raises(LocateError, match="the run has 2 requests"):
        pick_request(rows, "vs_target_only", 2)
    with pytest.raises(NothingToLocate, match="no request of 1 diverges"):
        pick_request(rows[:1], "vs_target_only", None)


@pytest.mark.slow
def test_cli_on_a_run_folder(tmp_path):
    """A tiny run, a divergence written into its requests.jsonl, the locator run on it (its plumbing: the
    position, the verify row, locate.json)."""
    from attnlab.locate import main
    from tests.cli.helpers import TINY, run_cli

    out = tmp_path / "run"
    proc = run_cli([*TINY, "parity=off", "workload=synthetic", "workload.lengths=[12]", f"hydra.run.dir={out}"],
                   tmp_path)
    assert proc.returncode == 0, proc.stderr[-2000:]
    rows = [json.loads(x) for x in (out / "requests.jsonl").read_text().splitlines()]
    rows[1]["first_divergence_vs_target_only"] = 3
    (out / "requests.jsonl").write_text("".join(json.dumps(x) + "\n" for x in rows))
    assert main([str(out), "device=cpu"]) == 0
    res = json.loads((out / "locate.json").read_text())
    assert res["request"] == 1 and res["output_index"] == 3 and res["position"] == 12 + 3 - 1
    assert res["verify_row"] == verify_row(rows[1]["accept_lens"], 3)
    assert res["positions"][0] == res["position"] - res["verify_row"] and res["at_position"]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_an_invariant_side_is_bitwise_identical_decode_vs_verify(dtype):
    """engine.invariant's target side on CPU (the interpreter): the invariant triton kernel with a split of 16
    tokens (two splits at these positions), the fused one-row-per-program ops, the GEMMs through
    invariant_linear (on CPU one GEMV per row: through BLAS at M = 15 the locator names qkv instead). Decode at
    q_len 1 and one q_len 5 verify pass, at batch 1 and batch 3: no op differs."""
    from attnlab.backends.triton import TritonBackend

    cfg = tiny_config(layers=1)  # one layer: every op kind once, small enough for the interpreter
    model = tiny_model(cfg, 0).to(dtype)
    r = runner(model, cfg, backend="triton", max_context=128, fused_ops=True)
    r.backend = TritonBackend(r.pool, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim, cfg.head_dim ** -0.5, dtype,
                              invariant=True, split_tokens=16)
    r.invariant = True
    start, k = 27, 4
    res = locate(Passes(r, (1,) * (k + 1), label="decode"), Passes(r, (k + 1,), batch=3, label="verify"), SEQ,
                 start, start + k)
    assert res["first"] is None, format_result(res)
    assert r.backend.active_plan.params.kind == "invariant"
