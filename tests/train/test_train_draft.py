"""attnlab.train_draft on CPU: a head trained on a tiny target learns its greedy continuations, saves, loads,
drafts losslessly, resumes, and is refused by another target."""

from __future__ import annotations

import json

import pytest
import torch
from omegaconf import OmegaConf

from attnlab.errors import ModelLoadError
from attnlab.metrics.loggers import NoneLogger
from attnlab.models.byte_tokenizer import ByteTokenizer
from attnlab.models.eagle_io import load_head, read_head_config
from attnlab.spec.decoder import SpecParams, SpeculativeDecoder
from attnlab.spec.drafters import NoDrafter
from attnlab.spec.eagle import EagleDrafter
from attnlab.train_draft.loop import run
from attnlab.train_draft.schema import TrainConfig
from tests.spec.tiny import eagle_runner, runner, tiny_config, tiny_eagle, tiny_model
from tests.train.sample import write_sample

CFG = tiny_config(vocab=260, layers=2)  # >= 258 ids: the byte tokenizer's


def target_side(model):
    r = runner(model, CFG, 16, max_context=128, max_batch=32)
    r.tokenizer = ByteTokenizer(256, 257)
    return r


def train_config(sample, **train):
    cfg = OmegaConf.structured(TrainConfig)
    cfg.model.name = "tiny"
    t = cfg.train
    t.data.source = str(sample)
    t.data.num_train, t.data.num_eval = 96, 4
    t.data.regen_max_new_tokens, t.data.regen_batch_size, t.data.max_prompt_tokens = 24, 32, 64
    t.tokens_per_batch, t.epochs, t.eval_every, t.checkpoint_every = 768, 4, 0, 0
    t.ttt_steps, t.eval_k, t.lr, t.warmup_steps = 3, [2, 3], 3e-3, 5
    for k, v in train.items():
        OmegaConf.update(cfg, f"train.{k}", v)
    return cfg


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    d = tmp_path_factory.mktemp("train")
    sample = write_sample(d / "sharegpt.json", 120)
    model = tiny_model(CFG, seed=0)
    summary = run(train_config(sample), d, "cpu", "fp32", NoneLogger(), target=target_side(model))
    return model, d, summary


def test_training_learns_the_target(trained):
    _, _, s = trained
    before = s["eval_before"]
    assert s["eval/loss"] < 0.85 * before["eval/loss"]
    assert s["eval/top1_step0"] > 0.3 > 50 / CFG.vocab_size  # chance is 1/260
    assert s["eval/sim_tau_k2"] > 1.3 and before["eval/sim_tau_k2"] < 1.1
    for k in (2, 3):  # train.eval_k: the decoder's walk next to the all-starts mean
        assert 1 <= s[f"eval/walk_tau_k{k}"] <= k + 1 and 1 <= before[f"eval/walk_tau_k{k}"] <= k + 1
    assert s["data"]["source"]["truncated"] and s["data"]["source"]["conversations"] == 120


def test_every_nth_step_is_timed_by_phase(trained):
    """train.time_every (25): those steps' rows carry the synchronised phase times; the summary their medians."""
    _, d, s = trained
    rows = [json.loads(line) for line in (d / "train_log.jsonl").read_text().splitlines()]
    timed = [r["step"] for r in rows if "ms_backward" in r]
    assert timed and all(st % 25 == 0 for st in timed) and len(timed) == s["steps"] // 25
    phases = ("ms_batch", "ms_loss", "ms_backward", "ms_optimizer")
    assert set(s["phase_ms_median"]) == set(phases) and all(s["phase_ms_median"][k] > 0 for k in phases)


def test_trained_head_drafts_losslessly_and_better_than_untrained(trained):
    model, d, _ = trained
    head = load_head(d / "head", model, dtype=torch.float32, device="cpu")
    tok = ByteTokenizer(256, 257)  # prompts like the training ones (not seen in training: other seeds)
    ps = [tok.apply_chat_template([{"role": "user", "content": f"Tell me about {t}."}])
          for t in ("warm bread", "old maps", "blue boats", "the moon")]
    ref = SpeculativeDecoder(target_side(model), NoDrafter("cpu"), SpecParams(0)).generate(ps, 24)
    taus = []
    for h in (head, tiny_eagle(model, CFG, seed=9)):
        out = SpeculativeDecoder(target_side(model), EagleDrafter(eagle_runner(h)), SpecParams(3)).generate(ps, 24)
        assert [r.output_ids for r in out.requests] == [r.output_ids for r in ref.requests]
        taus.append(sum(t for r in out.requests for t in r.accept_lens) / sum(len(r.accept_lens) for r in out.requests))
    assert taus[0] > taus[1] + 0.2, taus


def test_walk_is_the_engines_greedy_decoding(trained):
    """Greedy EAGLE decoding, k = 3: each request's tokens per verify pass begin with walk_passes over the
    teacher-forced matches of its own output (the walk stops where fewer than k answer entries remain)."""
    from attnlab.train_draft.data import Example
    from attnlab.train_draft.ttt import walk_passes
    from tests.train.forced import forced_matches

    model, d, _ = trained
    head = load_head(d / "head", model, dtype=torch.float32, device="cpu")
    tok = ByteTokenizer(256, 257)
    ps = [tok.apply_chat_template([{"role": "user", "content": f"Tell me about {t}."}])
          for t in ("tall trees", "quiet songs", "red apples")]
    k = 3
    out = SpeculativeDecoder(target_side(model), EagleDrafter(eagle_runner(head)), SpecParams(k)).generate(ps, 40)
    f = forced_matches(model, head, [Example(p + r.output_ids, len(p)) for p, r in zip(ps, out.requests)], k)
    walks = walk_passes(f.matches, f.valid, k)
    assert any(t > 1 for w in walks for t in w)  # the trained head accepts drafts: the walk's phase matters
    for w, r in zip(walks, out.requests):
        assert len(r.output_ids) == 40 and r.accept_lens[:len(w)] == w
        assert sum(w) >= 40 - 1 - 2 * k  # walked up to the last k answer entries (the first token: prefill's)


def test_head_for_another_target_is_refused(trained):
    _, d, _ = trained
    other = tiny_model(CFG, seed=1)
    with pytest.raises(ModelLoadError, match="fingerprint"):
        load_head(d / "head", other, dtype=torch.float32, device="cpu")
    cfg = read_head_config(d / "head")
    assert cfg.target == "tiny" and cfg.meta["result"]["steps"] > 0


def test_resume_continues_from_the_checkpoint(tmp_path):
    sample = write_sample(tmp_path / "s.json", 60)
    model = tiny_model(CFG, seed=0)
    first = tmp_path / "a"
    first.mkdir()
    s1 = run(train_config(sample, max_steps=4, **{"data.num_train": 40}), first, "cpu", "fp32", NoneLogger(),
             target=target_side(model))
    second = tmp_path / "b"
    second.mkdir()
    s2 = run(train_config(sample, max_steps=7, resume=str(first), **{"data.num_train": 40}), second, "cpu",
             "fp32", NoneLogger(), target=target_side(model))
    assert s1["steps"] == 4 and s2["steps"] == 7
    assert s2["tokens"] > s1["tokens"]
    assert s2["data"] == s1["data"]  # the same sequences: read back from the first run's data.pt


def test_time_budget_fits_the_schedule_and_still_saves(tmp_path):
    sample = write_sample(tmp_path / "s.json", 60)
    cfg = train_config(sample, epochs=200, max_minutes=0.05, tokens_per_batch=256, **{"data.num_train": 40})
    s = run(cfg, tmp_path, "cpu", "fp32", NoneLogger(), target=target_side(tiny_model(CFG, seed=0)))
    assert s["stopped_by_time"] and 0 < s["steps"] < s["planned_steps"]
    assert (tmp_path / "head" / "eagle3.safetensors").is_file() and "eval/loss" in s


def test_cli_bad_input_is_one_line(tmp_path):
    from tests.cli.helpers import run_cli, stderr_lines

    proc = run_cli(["model=tiny-llama", "device=cpu", "logger=none", "train.eval_k=[9]", "train.ttt_steps=3",
                    f"hydra.run.dir={tmp_path / 'run'}"], tmp_path, module="attnlab.train_draft", timeout=120)
    lines = stderr_lines(proc)
    assert proc.returncode == 2 and len(lines) == 1, proc.stderr[-2000:]
    assert lines[0].startswith("attnlab.train_draft: error: train.eval_k=[9]") and "ttt_steps=3" in lines[0]


def test_cli_trains_a_head_for_a_preset(tmp_path):
    """The whole entry point on the tiny random preset: data from a ShareGPT-format file, a head saved."""
    from tests.cli.helpers import run_cli

    sample = write_sample(tmp_path / "s.json", 40)
    run = tmp_path / "run"
    proc = run_cli(["model=tiny-llama", "device=cpu", "logger=jsonl", f"train.data.source={sample}",
                    "train.data.num_train=8", "train.data.num_eval=2", "train.data.regen_max_new_tokens=8",
                    "train.data.max_prompt_tokens=64", "train.epochs=1", "train.ttt_steps=2", "train.eval_k=[2]",
                    "train.tokens_per_batch=512", f"hydra.run.dir={run}"], tmp_path, module="attnlab.train_draft",
                   timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert (run / "head" / "eagle3.json").is_file() and (run / "train_log.jsonl").is_file()
    assert json.loads((run / "status.json").read_text())["status"] == "complete"


def test_interrupt_saves_the_checkpoint_and_the_head(tmp_path, monkeypatch):
    """Ctrl-C (or SIGTERM, which attnlab raises as KeyboardInterrupt) mid-training keeps what was trained."""
    from attnlab.train_draft import loop

    real, calls = loop.ttt_loss, [0]

    def interrupted_at_step_3(*a, **k):
        calls[0] += 1
        if calls[0] == 3:
            raise KeyboardInterrupt
        return real(*a, **k)

    monkeypatch.setattr(loop, "ttt_loss", interrupted_at_step_3)
    sample = write_sample(tmp_path / "s.json", 40)
    cfg = train_config(sample, epochs=50, **{"data.num_train": 24})
    with pytest.raises(KeyboardInterrupt):
        run(cfg, tmp_path, "cpu", "fp32", NoneLogger(), target=target_side(tiny_model(CFG, seed=0)))
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["interrupted"] and summary["steps"] >= 1  # the evaluation before training runs it too
    assert (tmp_path / "checkpoint.pt").is_file() and (tmp_path / "head" / "eagle3.safetensors").is_file()


def test_reduced_draft_vocabulary_trains_on_the_frequent_answer_tokens(tmp_path):
    from attnlab.train_draft.data import Example, frequent_tokens

    assert frequent_tokens([Example([9, 9, 5, 5, 5, 7], 2)], 2, 12).tolist() == [5, 7]  # answer tokens only
    sample = write_sample(tmp_path / "s.json", 60)
    cfg = train_config(sample, draft_vocab_size=64, **{"data.num_train": 40})
    s = run(cfg, tmp_path, "cpu", "fp32", NoneLogger(), target=target_side(tiny_model(CFG, seed=0)))
    head = load_head(tmp_path / "head", tiny_model(CFG, seed=0), dtype=torch.float32, device="cpu")
    assert head.config.draft_vocab_size == 64 and head.d2t.numel() == 64
    assert s["eval/loss"] < s["eval_before"]["eval/loss"] and s["eval/top1_step0"] > 0.1


def _nan_loss_at(monkeypatch, bad):
    """Training losses (not evaluation's) at the calls in ``bad`` (1-based) become NaN, with NaN gradients."""
    from attnlab.train_draft import loop

    real, calls = loop.ttt_loss, [0]

    def poisoned(head, *a, **k):
        loss, st, m = real(head, *a, **k)
        if head.training:
            calls[0] += 1
            if bad(calls[0]):
                loss = loss * float("nan")
        return loss, st, m

    monkeypatch.setattr(loop, "ttt_loss", poisoned)


def test_a_nonfinite_step_is_skipped_and_counted(tmp_path, monkeypatch):
    _nan_loss_at(monkeypatch, lambda c: c in (2, 4))
    sample = write_sample(tmp_path / "s.json", 40)
    cfg = train_config(sample, epochs=3, **{"data.num_train": 24})
    s = run(cfg, tmp_path, "cpu", "fp32", NoneLogger(), target=target_side(tiny_model(CFG, seed=0)))
    assert s["skipped_nonfinite_steps"] == 2 and s["steps"] > 4
    rows = [json.loads(x) for x in (tmp_path / "train_log.jsonl").read_text().splitlines() if '"step"' in x]
    assert [r["step"] for r in rows if r.get("skipped")] == [2, 4]
    dump = torch.load(tmp_path / "nonfinite_step.pt", weights_only=False)  # the first one, to replay
    assert dump["step"] == 2 and dump["batch"] and "fc.weight" in dump["head"]
    head = load_head(tmp_path / "head", tiny_model(CFG, seed=0), dtype=torch.float32, device="cpu")
    assert all(torch.isfinite(p).all() for p in head.parameters())  # the NaN gradients never reached a weight
    assert s["eval/loss"] == s["eval/loss"] and s["eval/loss"] < s["eval_before"]["eval/loss"]


def test_nonfinite_steps_in_a_row_stop_the_run_and_save_nothing(tmp_path, monkeypatch):
    from attnlab.train_draft.loop import MAX_NONFINITE_IN_ROW, TrainingDiverged

    _nan_loss_at(monkeypatch, lambda c: c >= 3)
    sample = write_sample(tmp_path / "s.json", 40)
    cfg = train_config(sample, epochs=50, **{"data.num_train": 24})
    with pytest.raises(TrainingDiverged, match=f"{MAX_NONFINITE_IN_ROW + 1} steps in a row") as e:
        run(cfg, tmp_path, "cpu", "fp32", NoneLogger(), target=target_side(tiny_model(CFG, seed=0)))
    assert "\n" not in str(e.value)
    assert not (tmp_path / "head").exists() and not (tmp_path / "summary.json").exists()


def test_init_warm_starts_from_an_exported_head(trained, tmp_path):
    """train.init: the exported head (bf16 on disk) starts the run where the first one ended, on new data with a
    fresh schedule; a conflicting shape setting, or init with resume, is a one-line config error."""
    from attnlab.errors import ConfigError

    model, d, first = trained
    sample = write_sample(tmp_path / "s.json", 120)
    s = run(train_config(sample, init=str(d / "head"), max_steps=3), tmp_path, "cpu", "fp32", NoneLogger(),
            target=target_side(model))
    before = s["eval_before"]
    # the first run's final held-out loss (its fp32 weights; bf16 on disk: close, not equal), not a fresh head's
    assert abs(before["eval/loss"] - first["eval/loss"]) < 0.05 * first["eval/loss"]
    assert before["eval/loss"] < 0.9 * first["eval_before"]["eval/loss"]
    assert s["data"]["init"]["head"] == str(d / "head") and s["data"]["init"]["steps"] == first["steps"]
    assert s["steps"] == 3 and read_head_config(tmp_path / "head").meta["result"]["steps"] == 3
    layers = read_head_config(d / "head").capture_layers
    # the head's own settings, as a user may write them (layers in another order), are no conflict
    (tmp_path / "y").mkdir()
    ok = run(train_config(sample, init=str(d / "head"), max_steps=1, capture_layers=list(reversed(layers)),
                          draft_vocab_size=CFG.vocab_size),  # the whole vocabulary: none, as the head has
             tmp_path / "y", "cpu", "fp32", NoneLogger(), target=target_side(model))
    assert ok["steps"] == 1
    for bad, match in (({"capture_layers": [0]}, "capture_layers=\\[0\\] \\(the head has"),
                       ({"draft_vocab_size": 100}, "draft_vocab_size=100 \\(the head has None\\)"),
                       ({"resume": str(d)}, "choose one")):
        with pytest.raises(ConfigError, match=match):
            run(train_config(sample, init=str(d / "head"), max_steps=1, **bad), tmp_path / "x", "cpu", "fp32",
                NoneLogger(), target=target_side(model))
    assert list(layers) != [0]
