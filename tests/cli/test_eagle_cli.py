"""`python -m attnlab draft=eagle` end to end on CPU (tiny random target, an untrained head saved for it)."""

from __future__ import annotations

import torch

from attnlab.models import load_model
from attnlab.models.eagle import EagleConfig, EagleHead, weights_fingerprint
from attnlab.models.eagle_io import save_head
from tests.cli.helpers import TINY, read_json, run_cli, stderr_lines


def _head_for_tiny_llama(folder):
    target, mcfg = load_model("tiny-llama", dtype=torch.float32, init="random")  # the preset's seed-0 weights
    cfg = EagleConfig.for_target(mcfg, "tiny-llama", weights_fingerprint(target))
    torch.manual_seed(0)
    return save_head(EagleHead(cfg), folder)


def test_eagle_run_is_lossless(tmp_path):
    head = _head_for_tiny_llama(tmp_path / "head")
    run = tmp_path / "run"
    proc = run_cli([*TINY, "draft=eagle", f"draft.path={head}", "spec.num_draft_tokens=3", f"hydra.run.dir={run}"],
                   tmp_path, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    m = read_json(run / "metrics.json")
    assert m["parity_token_match"] == 1.0 and m["parity_token_match_ref"] == 1.0
    assert 1.0 <= m["accept_len_mean"] <= 4.0
    assert read_json(run / "status.json")["status"] == "complete"


def test_eagle_head_of_another_model_is_one_line(tmp_path):
    head = _head_for_tiny_llama(tmp_path / "head")
    cfg = read_json(head / "eagle3.json")
    cfg["target_fingerprint"] = "0000000000000000"
    (head / "eagle3.json").write_text(__import__("json").dumps(cfg))
    proc = run_cli([*TINY, "draft=eagle", f"draft.path={head}", f"hydra.run.dir={tmp_path / 'run'}"], tmp_path,
                   timeout=300)
    lines = stderr_lines(proc)
    assert proc.returncode == 2 and len(lines) == 1 and "fingerprint" in lines[0], proc.stderr[-2000:]


def test_eagle_without_a_head_for_the_model_is_one_line(tmp_path):
    proc = run_cli([*TINY, "draft=eagle", f"hydra.run.dir={tmp_path / 'run'}"], tmp_path, timeout=300)
    lines = stderr_lines(proc)
    assert proc.returncode == 2 and len(lines) == 1, proc.stderr[-2000:]
    assert "no trained EAGLE head" in lines[0] and "train_draft" in lines[0]
