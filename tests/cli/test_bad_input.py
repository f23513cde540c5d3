"""Bad input ends with exit code 2 and exactly one line on stderr, naming the field and the allowed values,
before any model is loaded."""

from __future__ import annotations

import pytest

from tests.cli.helpers import TINY, read_json, run_cli, stderr_lines

CASES = {
    "unknown backend": (["backend=foo"], ["backend=foo", "torch", "triton", "flashinfer", "fa"]),
    "unknown model": (["model=nope"], ["model=nope", "tiny-llama", "smollm2-135m"]),
    "invalid page size": (["kv.page_size=0"], ["kv.page_size=0", ">= 1"]),
    "GPU backend on CPU": (["verify=flashinfer"], ["verify=flashinfer", "device 'cpu'", "cuda"]),
    "missing dataset file": (["workload=hf", "workload.path=/nonexistent/prompts.jsonl"],
                             ["workload.path", "/nonexistent/prompts.jsonl", "no such file"]),
    "typo in a key": (["kv.pagesize=4"], ["kv.pagesize", "not in"]),
    "wrong type": (["spec.num_draft_tokens=four"], ["spec.num_draft_tokens", "four"]),
    "k <= 0 with a drafter": (["spec.num_draft_tokens=0"], ["spec.num_draft_tokens=0", ">= 1", "draft=none"]),
    "unknown dtype": (["precision.target=fp64"], ["precision.target='fp64'", "bf16"]),
    "context past a sliding window": (["+model.overrides.sliding_window=8"], ["sliding_window=8", "context"]),
}


def _assert_one_line_exit_2(proc, needles):
    lines = stderr_lines(proc)
    assert proc.returncode == 2, (proc.returncode, proc.stderr[-2000:])
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith("attnlab: error: ")
    assert "Traceback" not in proc.stderr
    for needle in needles:
        assert needle in lines[0], (needle, lines[0])


@pytest.mark.parametrize("case", list(CASES))
def test_bad_input_exits_2_with_one_line(case, tmp_path):
    overrides, needles = CASES[case]
    proc = run_cli([*TINY, *overrides, f"hydra.run.dir={tmp_path / 'run'}"], tmp_path, timeout=120)
    _assert_one_line_exit_2(proc, needles)
    status = tmp_path / "run" / "status.json"
    if status.exists():  # validation errors happen inside the job: the folder records them
        assert read_json(status)["status"] == "failed"


def test_empty_prompt_list(tmp_path):
    data = tmp_path / "prompts.jsonl"
    data.write_text('{"question": ""}\n{"question": "   "}\n')
    proc = run_cli([*TINY, "workload=hf", f"workload.path={data}", "workload.field=question",
                    f"hydra.run.dir={tmp_path / 'run'}"], tmp_path, timeout=120)
    _assert_one_line_exit_2(proc, ["workload.path", "no non-empty prompts", "question"])
