"""Failure behaviour, as a user meets it (python -m attnlab in a subprocess): bad input ends with exit code 2 and
exactly one line on stderr naming the field and the allowed values, no traceback; degenerate values that can
run are said on the log and recorded in metrics.json."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.cli.helpers import TINY, read_json, run_cli, stderr_lines

CASES = {
    "unknown backend": (["backend=foo"], ["backend=foo", "torch", "triton", "flashinfer", "fa"]),
    "unknown model": (["model=nope"], ["model=nope", "tiny-llama", "smollm2-135m"]),
    "invalid page size": (["kv.page_size=0"], ["kv.page_size=0", ">= 1"]),
    "GPU backend on CPU": (["verify=flashinfer"], ["verify=flashinfer", "device 'cpu'", "cuda"]),
    "missing dataset file": (["workload=hf", "workload.path=/nonexistent/prompts.jsonl"],
                             ["workload.path", "/nonexistent/prompts.jsonl", "no such file"]),
    # Hydra's own message suggests the `+` that would make the typo silently accepted: ours suggests the key
    "typo in a key": (["kv.pagesize=4"], ["kv.pagesize: unknown key", "did you mean kv.page_size?"]),
    "wrong type": (["spec.num_draft_tokens=four"], ["spec.num_draft_tokens", "four"]),
    "k <= 0 with a drafter": (["spec.num_draft_tokens=0"], ["spec.num_draft_tokens=0", ">= 1", "draft=none"]),
    "unknown dtype": (["precision.target=fp64"], ["precision.target='fp64'", "bf16"]),
    "context past a sliding window": (["+model.overrides.sliding_window=8"], ["sliding_window=8", "context"]),
    # issue 15
    "+ key under backend options": (["+verify.options.splits=4"], ["verify.options.splits", "unknown key"]),
    "unknown model override": (["+model.overrides.num_layer=1"],
                               ["model.overrides.num_layer", "did you mean model.overrides.num_layers?"]),
    "zero layers": (["+model.overrides.num_layers=0"], ["model.overrides.num_layers=0", "integer >= 1"]),
    "k past max_new_tokens": (["spec.num_draft_tokens=1000"],
                              ["spec.num_draft_tokens=1000", "< workload.max_new_tokens=8"]),
    "pretrained init on a random-only preset": (["model.init=pretrained"],
                                                ["model=tiny-llama has no pretrained weights", "model.init=random"]),
    "fa on CPU": (["verify=fa"], ["verify=fa runs on CUDA GPUs only", "device 'cpu'", "verify=torch"]),
    "draft.layers=0": (["draft=self", "draft.layers=0"], ["draft.layers=0", "must be >= 1"]),
    "KV pool larger than memory": (["kv.num_pages=100000000"],
                                   ["kv.num_pages=100000000", "TiB", "free on cpu", "lower kv.num_pages"]),
    "context past the model's": (["workload=synthetic", "workload.lengths=[4000]"],
                                 ["position 4013", "2048", "max_position_embeddings",
                                  "kv.allow_past_model_context=true"]),
}
NOT_IN = {  # what a message must not say
    "fa on CPU": ["pip install"],  # the device is the problem, not a missing package
    "draft.layers=0": ["num_layers"],  # no unfilled "1..num_layers"
}


def _assert_one_line_exit_2(proc, needles, not_in=()):
    lines = stderr_lines(proc)
    assert proc.returncode == 2, (proc.returncode, proc.stderr[-2000:])
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith("attnlab: error: ")
    assert "Traceback" not in proc.stderr + proc.stdout
    for needle in needles:
        assert needle in lines[0], (needle, lines[0])
    for needle in not_in:
        assert needle not in lines[0], (needle, lines[0])
    return lines[0]


def _run(tmp_path, *overrides, env=None, timeout=120):
    return run_cli([*TINY, *overrides, f"hydra.run.dir={tmp_path / 'run'}"], tmp_path, timeout=timeout, env=env)


def _status(tmp_path):
    path = tmp_path / "run" / "status.json"
    return read_json(path)["status"] if path.exists() else None


@pytest.mark.parametrize("case", list(CASES))
def test_bad_input_exits_2_with_one_line(case, tmp_path):
    overrides, needles = CASES[case]
    _assert_one_line_exit_2(_run(tmp_path, *overrides), needles, NOT_IN.get(case, ()))
    assert _status(tmp_path) in (None, "failed")  # errors inside the job: the folder records them


# ---------------------------------------------------------------------------------------------------------
# bad files


def _hf_folder(path: Path, weights: bytes | None) -> Path:
    """A tiny Llama-shaped HF folder with a working tokenizer and the given model.safetensors bytes."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    path.mkdir()
    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2, **{chr(97 + i): 3 + i for i in range(26)}, " ": 29}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Split("", "isolated")
    tok.save(str(path / "tokenizer.json"))
    (path / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "PreTrainedTokenizerFast", "bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>"}))
    (path / "config.json").write_text(json.dumps({
        "architectures": ["LlamaForCausalLM"], "vocab_size": 512, "hidden_size": 128, "intermediate_size": 256,
        "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "bos_token_id": 1,
        "eos_token_id": 2, "max_position_embeddings": 2048}))
    if weights is not None:
        (path / "model.safetensors").write_bytes(weights)
    return path


def _jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def _garbage_safetensors(tmp):  # the first 8 bytes (the header length) read as 2**64 - 1: "header too large"
    folder = _hf_folder(tmp / "ckpt", bytes([0xFF]) * 64)
    return [f"model.path={folder}", "model.init=pretrained"]


def _path_with_random_init(tmp):  # model=tiny-llama defaults to init=random: the path would be ignored
    return [f"model.path={_hf_folder(tmp / 'ckpt', None)}"]


def _truncated_gguf(tmp):  # a GGUF header that stops after its counts
    path = tmp / "cut.gguf"
    path.write_bytes(b"GGUF" + (3).to_bytes(4, "little") + (1).to_bytes(8, "little") + (9).to_bytes(8, "little"))
    return [f"model.path={path}", "model.init=pretrained"]


def _empty_gguf(tmp):
    (tmp / "empty.gguf").write_bytes(b"")
    return [f"model.path={tmp / 'empty.gguf'}", "model.init=pretrained"]


def _chat_without_role(tmp):
    data = _jsonl(tmp / "chats.jsonl", [{"messages": [{"content": "hello"}]}])
    return ["workload=hf", f"workload.path={data}", "workload.field=messages"]


def _column_of_numbers(tmp):
    data = _jsonl(tmp / "nums.jsonl", [{"n": 1}, {"n": 2}])
    return ["workload=hf", f"workload.path={data}", "workload.field=n"]


FILE_CASES = {
    "garbage model.safetensors": (_garbage_safetensors, ["model.safetensors", "SafetensorError", "corrupt"]),
    "a path with init=random": (_path_with_random_init, ["model.path=", "model.init=random would not read",
                                                         "model.init=pretrained"]),
    "truncated GGUF": (_truncated_gguf, ["cut.gguf", "truncated or corrupt"]),
    "0-byte GGUF": (_empty_gguf, ["empty.gguf", "the file is empty (0 bytes)"]),
    "chat message without role": (_chat_without_role, ["row 0 message 0", "'role'", "'content'"]),
    "column of numbers": (_column_of_numbers, ["workload.field='n'", "row 0 holds int", "not text"]),
}


@pytest.mark.parametrize("case", list(FILE_CASES))
def test_bad_file_exits_2_with_one_line(case, tmp_path):
    make, needles = FILE_CASES[case]
    line = _assert_one_line_exit_2(_run(tmp_path, *make(tmp_path)), needles)
    assert "StopIteration" not in line
    assert _status(tmp_path) in (None, "failed")
    assert not (tmp_path / "run" / "metrics.json").exists()


def test_empty_prompt_list(tmp_path):
    data = _jsonl(tmp_path / "prompts.jsonl", [{"question": ""}, {"question": "   "}])
    proc = _run(tmp_path, "workload=hf", f"workload.path={data}", "workload.field=question")
    _assert_one_line_exit_2(proc, ["workload.path", "no non-empty prompts", "question"])


def test_wandb_online_without_api_key(tmp_path):
    env = {"HOME": str(tmp_path), "WANDB_API_KEY": None, "WANDB_MODE": None, "NETRC": str(tmp_path / "netrc"),
           "WANDB_CONFIG_DIR": str(tmp_path / "wandb-config")}
    proc = _run(tmp_path, "logger=wandb", "logger.mode=online", env=env)
    _assert_one_line_exit_2(proc, ["logger.mode=online", "wandb", "logger.mode=offline"])
    assert _status(tmp_path) == "failed"


def test_chat_template_failure_is_a_config_error():
    """A chat template that raises (jinja's TemplateError, e.g. roles that do not alternate) names the prompt."""
    from jinja2.exceptions import TemplateError

    from attnlab.errors import ConfigError
    from attnlab.workloads import Prompt, tokenize_prompts

    class Tok:
        chat_template = "{{ raise_exception('roles must alternate') }}"

        def apply_chat_template(self, *a, **k):
            raise TemplateError("roles must alternate")

    with pytest.raises(ConfigError, match="prompt 'p0'.*chat template failed.*roles must alternate"):
        tokenize_prompts([Prompt("p0", "chat", None, messages=[{"role": "user", "content": "hi"}])], Tok(), True)


# ---------------------------------------------------------------------------------------------------------
# typos with +, degenerate values that run


def test_plus_key_typo_is_refused_with_a_suggestion(tmp_path):
    """`+kv.pagesize=4` used to run at page 16: the key is refused, nothing runs."""
    proc = _run(tmp_path, "+kv.pagesize=4")
    _assert_one_line_exit_2(proc, ["kv.pagesize: unknown key", "did you mean kv.page_size?"])
    assert not (tmp_path / "run" / "metrics.json").exists()


def test_degenerate_values_that_run_are_said_and_recorded(tmp_path):
    """Empty dataset rows, a page larger than the max context and (opted in) a run past the model's trained
    positions: the run completes, the log says each, metrics.json records each."""
    data = _jsonl(tmp_path / "prompts.jsonl", [{"q": "hello there"}, {"q": ""}, {"q": None}, {"q": "a b c"}])
    proc = _run(tmp_path, "workload=hf", f"workload.path={data}", "workload.field=q", "workload.num_prompts=4",
                "kv.page_size=100000000", "+model.overrides.max_position_embeddings=16",
                "kv.allow_past_model_context=true", "parity=off")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert stderr_lines(proc) == [] and "Traceback" not in proc.stdout
    for said in ("skipped 2 empty row(s) in column 'q'", "2 prompts, fewer than workload.num_prompts=4",
                 "kv.page_size=100000000 is larger than the max context", "past max_position_embeddings 16"):
        assert said in proc.stdout, said
    m = read_json(tmp_path / "run" / "metrics.json")
    assert m["num_requests"] == 2 and m["num_prompts_requested"] == 4
    assert m["page_size_requested"] == 100000000 and m["page_size"] == m["max_context"] < 100
    assert m["past_model_context"] is True and m["model_max_position_embeddings"] == 16
