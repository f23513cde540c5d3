"""Failure behaviour, as a user meets it (python -m attnlab in a subprocess): bad input ends with exit code 2 and
exactly one line on stderr naming the field and the allowed values, no traceback; degenerate values that can
run are said on the log and recorded in metrics.json; SIGINT / SIGTERM end a run as `interrupted` with the
requests finished so far; a sweep with failed jobs exits 3; a run folder is never mixed with an older run."""

from __future__ import annotations

import json
import signal
from pathlib import Path

import pytest

from attnlab.models.eagle_io import HEADS_DIR
from tests.cli.helpers import TINY, interrupt_cli, read_json, run_cli, stderr_lines

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
    "+ key under backend options": (["+verify.options.splits=4"], ["verify.options.splits", "unknown option",
                                                                   "'torch'"]),
    "unknown model override": (["+model.overrides.num_layer=1"],
                               ["model.overrides.num_layer", "did you mean model.overrides.num_layers?"]),
    "zero layers": (["+model.overrides.num_layers=0"], ["model.overrides.num_layers=0", "integer >= 1"]),
    "k past max_new_tokens": (["spec.num_draft_tokens=1000"],
                              ["spec.num_draft_tokens=1000", "< workload.max_new_tokens=8"]),
    "pretrained init on a random-only preset": (["model.init=pretrained"],
                                                ["model=tiny-llama has no pretrained weights", "model.init=random"]),
    "fa on CPU": (["verify=fa"], ["verify=fa runs on CUDA GPUs only", "device 'cpu'", "verify=torch"]),
    "draft.layers=0": (["draft=self", "draft.layers=0"], ["draft.layers=0", "must be >= 1"]),
    "KV pool too small for a batch": (["kv.num_pages=1"], ["kv.num_pages=1", "cannot hold batch 0 of",
                                                             "raise kv.num_pages"]),
    "parity reference on the wrong device": (["parity.reference=flashinfer"],
                                             ["parity.reference=flashinfer", "device 'cpu'"]),
    "parity.max_prompts=0": (["parity.max_prompts=0"], ["parity.max_prompts=0", ">= 1"]),
    "EAGLE head folder missing": (["draft=eagle", "draft.path=/nonexistent/head"],
                                  ["draft.path='/nonexistent/head'", "eagle3.json"]),
    "EAGLE head of another model": (["draft=eagle", f"draft.path={HEADS_DIR / 'smollm2-135m'}"],
                                    ["trained for 'smollm2-135m'", "this target has"]),
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
    needles = ["logger.mode=online: no W&B API key", "api.wandb.ai", "WANDB_API_KEY", "logger.mode=offline"]
    # the dry run refuses it too (it passed before: only wandb.init refused it, once the run had started)
    _assert_one_line_exit_2(_run(tmp_path, "dry_run=true", "logger=wandb", "logger.mode=online", env=env), needles)
    assert not (tmp_path / "run").exists()
    proc = _run(tmp_path, "logger=wandb", "logger.mode=online", env=env)
    _assert_one_line_exit_2(proc, needles)
    assert _status(tmp_path) == "failed" and "wandb" not in {p.name for p in (tmp_path / "run").iterdir()}


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
# typos with +, re-used folders, degenerate values that run


def test_plus_key_typo_is_refused_with_a_suggestion(tmp_path):
    """`+kv.pagesize=4` used to run at page 16: the key is refused, nothing runs."""
    proc = _run(tmp_path, "+kv.pagesize=4")
    _assert_one_line_exit_2(proc, ["kv.pagesize: unknown key", "did you mean kv.page_size?"])
    assert not (tmp_path / "run" / "metrics.json").exists()


def test_run_folder_in_use_is_refused_untouched(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    (run / "status.json").write_text('{"status": "complete"}')
    (run / "metrics.json").write_text('{"output_tokens_per_s": 1.0}')
    _assert_one_line_exit_2(_run(tmp_path), ["hydra.run.dir=", "not empty", "status 'complete'", "deletes nothing"])
    assert sorted(p.name for p in run.iterdir()) == ["metrics.json", "status.json"]  # no .hydra/, no log
    assert read_json(run / "metrics.json") == {"output_tokens_per_s": 1.0}


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


# ---------------------------------------------------------------------------------------------------------
# interrupts

LONG = ["workload=synthetic", "workload.lengths=[16]", "workload.num_prompts=40", "workload.batch_size=1",
        "workload.max_new_tokens=32", "parity=off"]


@pytest.mark.parametrize("sig,code", [(signal.SIGTERM, 143), (signal.SIGINT, 130)], ids=["SIGTERM", "SIGINT"])
def test_interrupt_keeps_finished_requests(sig, code, tmp_path):
    """SIGTERM (timeout, Slurm, docker stop) and Ctrl-C after the first batch: status interrupted, the finished
    requests in requests.jsonl, partial metrics, one line, exit 128 + signal."""
    run = tmp_path / "run"
    rc, out, err, seen = interrupt_cli([*TINY, *LONG, f"hydra.run.dir={run}"], tmp_path, sig,
                                       after="1 of 40 requests finished")
    assert seen, out[-2000:] + err[-2000:]
    assert rc == code, err[-3000:]
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert len(lines) == 1 and "Traceback" not in err, err[-3000:]
    name = "SIGTERM" if sig == signal.SIGTERM else "SIGINT"
    assert lines[0].startswith(f"attnlab: interrupted by {name}: ") and "of 40 requests finished" in lines[0]
    status = read_json(run / "status.json")
    assert status["status"] == "interrupted" and name in status["error"]
    rows = [json.loads(ln) for ln in (run / "requests.jsonl").read_text().splitlines()]
    assert 1 <= len(rows) < 40 and status["requests_completed"] == len(rows)
    assert all(r["output_tokens"] == 32 for r in rows)  # finished requests only, each whole
    m = read_json(run / "metrics.json")
    assert m["partial"] is True and m["interrupted_by"] == name and m["num_requests"] == len(rows)
    assert m["requests_planned"] == 40 and m["output_tokens_per_s"] > 0


def test_interrupted_sweep_prints_its_summary(tmp_path):
    sweep = tmp_path / "sweep"
    rc, out, err, seen = interrupt_cli(["-m", *TINY, *LONG, "workload.num_prompts=2,40,2",
                                        f"hydra.sweep.dir={sweep}"], tmp_path, signal.SIGINT,
                                       after="1 of 40 requests finished")
    assert seen and rc == 130, err[-3000:]
    assert "attnlab sweep: interrupted by SIGINT after 2 of 3 jobs: 1 complete, 0 failed, 1 interrupted, " \
           "1 not started" in out, out[-2000:]
    assert len([ln for ln in err.splitlines() if ln.strip()]) == 1 and "Traceback" not in err
    assert read_json(sweep / "0" / "status.json")["status"] == "complete"
    assert read_json(sweep / "1" / "status.json")["status"] == "interrupted"
    assert not (sweep / "2").exists()


# ---------------------------------------------------------------------------------------------------------
# sweeps, dry-run, help, benchmarks


def test_sweep_with_a_failed_job_exits_3(tmp_path):
    """One job passes, one fails: exit 3 (not 0), the passing job's files intact, the report lists both."""
    from attnlab.report import report

    sweep = tmp_path / "sweep"
    proc = run_cli(["-m", *TINY, "parity=off", "verify=torch,flashinfer", f"hydra.sweep.dir={sweep}"], tmp_path)
    assert proc.returncode == 3, proc.stderr[-3000:]
    lines = stderr_lines(proc)
    assert lines == [("attnlab: sweep: 1 of 2 jobs failed (each job's status.json says why; the summary line is "
                      "above)")], proc.stderr[-3000:]
    assert "attnlab sweep: 2 jobs, 1 complete, 1 failed (1: verify=flashinfer" in proc.stdout
    assert read_json(sweep / "0" / "status.json")["status"] == "complete"
    assert len((sweep / "0" / "requests.jsonl").read_text().splitlines()) == 2
    assert read_json(sweep / "0" / "metrics.json")["output_tokens_per_s"] > 0
    assert read_json(sweep / "1" / "status.json")["status"] == "failed"
    table = [ln for ln in report(sweep, plots=False).splitlines() if ln.startswith("| ")]
    assert len(table) == 1 + 2 and "complete" in table[1] and "failed: verify=flashinfer" in table[2]


def test_dry_run_prints_the_resolved_plan(tmp_path):
    proc = _run(tmp_path, "dry_run=true", "draft=self", "draft.layers=1", "kv.page_size=100000",
                "engine.fused_ops=auto")  # auto: off on CPU
    assert proc.returncode == 0 and stderr_lines(proc) == [], proc.stderr[-3000:]
    out = proc.stdout
    assert "attnlab dry run: valid" in out
    for needle in ("device       cpu", "verify       torch: weights fp32, KV fp32", "backend      torch",
                   "layers [0]", "(clamped from 100000)", "kv pools     target ", "draft ", "free on cpu",
                   "cuda graphs  off", "layers       fused ops off, gemm cublas, pdl off",
                   "parity       kernel, logits, tokens"):
        assert needle in out, (needle, out)
    assert not (tmp_path / "run").exists()  # nothing written


def test_free_form_keys_are_set_as_the_docs_write_them(tmp_path):
    """verify.options.<key> / model.overrides.<key> without Hydra's +: the key reaches the backend's / model's own
    check (an unknown option is still refused by name), and a sweep over one plans a job per value."""
    proc = _run(tmp_path, "dry_run=true", "model.overrides.num_layers=1")
    assert proc.returncode == 0 and "1 layers" in proc.stdout, proc.stderr[-2000:]
    _assert_one_line_exit_2(_run(tmp_path, "dry_run=true", "verify=hybrid", "verify.options.short=torch",
                                 "verify.options.threshold=-5"), ["verify.options.threshold=-5: must be an int"])
    _assert_one_line_exit_2(_run(tmp_path, "dry_run=true", "verify.options.splits=4"),
                            ["verify.options.splits: unknown option for backend 'torch'"])
    proc = run_cli(["-m", *TINY, "dry_run=true", "model.overrides.num_layers=1,2"], tmp_path)
    assert proc.returncode == 0 and "2 jobs, 2 valid" in proc.stdout, proc.stderr[-2000:]


PAGES = ["model=tiny-llama", "device=cpu", "logger=none", "parity=off", "workload=synthetic", "workload.batch_size=2",
         "workload.max_new_tokens=24", "kv.page_size=1", "dry_run=true"]


@pytest.mark.parametrize("overrides,verdict", [
    # two 16-token prompts, 24 new tokens, k = 4: a request peaks at 16 + 23 + 4 = 43 tokens (86 pages of 1)
    (["workload.lengths=[16,16]", "workload.num_prompts=2", "kv.num_pages=86"], None),
    (["workload.lengths=[16,16]", "workload.num_prompts=2", "kv.num_pages=85"],
     "the target pool cannot hold batch 0 of the workload (2 request(s) run to their budgets: 86 pages of 1)"),
    # a tree's frontier writes (S - 1) * K = 12 draft slots: 16 + 23 + 12 = 51 a request (the 60-token prompt of
    # batch 1 makes max context 89: the cap does not hold them back)
    (["workload.lengths=[16,16,60]", "workload.num_prompts=3", "kv.num_pages=90", "draft=self", "draft.layers=1",
      "spec.topk=4", "spec.num_steps=4"],
     "the draft pool cannot hold batch 0 of the workload (2 request(s) run to their budgets: 102 pages of 1)"),
    # the warmup runs batch_size copies of each length: 2 x (60 + 7 + 4)
    (["workload.lengths=[16,16,60]", "workload.num_prompts=3", "kv.num_pages=90", "warmup=jit",
      "warmup.lengths=[60]"], "the warmup's 60-token batch (2 request(s) run to their budgets: 142 pages of 1)"),
])
def test_a_fixed_pool_is_checked_against_each_batch(tmp_path, overrides, verdict):
    """kv.num_pages against every batch's peak KV (preflight.request_peak), in the dry run: what fits runs, what does
    not is refused naming the pool and the batch, never an out-of-pages error after the weights are read."""
    proc = run_cli([*PAGES, *overrides], tmp_path)
    if verdict is None:
        assert proc.returncode == 0 and "valid" in proc.stdout, proc.stderr[-2000:]
    else:
        _assert_one_line_exit_2(proc, [verdict, "raise kv.num_pages"])


def test_kernel_only_parity_builds_no_reference(tmp_path):
    """parity.reference is checked where a pass builds it (tokens, logits, acceptance), not for kernel parity."""
    proc = _run(tmp_path, "dry_run=true", "parity.reference=flashinfer", "parity.tokens=false", "parity.logits=false",
                "parity.acceptance=false")
    assert proc.returncode == 0 and "valid" in proc.stdout, proc.stderr[-2000:]


def test_dry_run_of_a_sweep_names_the_invalid_job(tmp_path):
    proc = run_cli(["-m", *TINY, "dry_run=true", "verify=torch,flashinfer"], tmp_path)
    line = _assert_one_line_exit_2(proc, ["job 1 (verify=flashinfer)", "device 'cpu'"])
    assert "job 0" not in line and "attnlab dry run - job 0 (verify=torch): valid" in proc.stdout
    assert "attnlab dry run: 2 jobs, 1 valid, 1 invalid" in proc.stdout
    assert not (tmp_path / "outputs").exists()


def test_dry_run_of_an_experiments_grid_plans_the_jobs_hydra_launches(tmp_path):
    """An experiment's own grid (hydra.sweeper.params, conf/experiment/fp8_kv.yaml: 3 precisions x 2 x 2 backends)
    is planned as Hydra's sweeper launches it, with a command-line value replacing the grid's for its key. Before
    2026-12-06 the dry run expanded the command line only: one job for `-m experiment=fp8_kv`, where Hydra ran 12."""
    proc = run_cli(["-m", "experiment=fp8_kv", "device=cpu", "logger=none", "dry_run=true"], tmp_path)
    assert "attnlab dry run: 12 jobs, " in proc.stdout, proc.stdout[-2000:]  # which are valid: this machine's
    for job in ("job 0 (precision=bf16 backend=triton verify=triton)",
                "job 11 (precision=fp8-draft backend=flashinfer verify=flashinfer)"):
        assert job in proc.stdout + proc.stderr, proc.stderr[-2000:]
    proc = run_cli(["-m", "experiment=fp8_kv", "device=cpu", "logger=none", "dry_run=true", "precision=bf16,fp8-kv",
                    "backend=torch", "verify=torch"], tmp_path)
    assert proc.returncode == 0 and "attnlab dry run: 2 jobs, 2 valid, 0 invalid" in proc.stdout, proc.stderr[-2000:]
    assert "job 1 (precision=fp8-kv): valid" in proc.stdout
    from attnlab.compose import sweep_jobs
    from attnlab.sweep import count_jobs  # what an interrupted sweep's summary counts as planned

    grid = ["precision=bf16,fp8-kv,fp8-draft", "backend=triton,flashinfer", "verify=triton,flashinfer"]
    assert count_jobs(["experiment=fp8_kv"], grid) == 12 and count_jobs(["backend=triton"], grid) == 6
    from attnlab import sweep
    from attnlab.compose import compose

    saved = sweep.STATE.planned, sweep.STATE.sweep_dir
    try:  # the callback that counts a starting sweep's jobs reads the grid from Hydra's config
        sweep.SweepSummary().on_multirun_start(compose(["experiment=fp8_kv", "backend=triton"], with_hydra=True))
        assert sweep.STATE.planned == 6
    finally:
        sweep.STATE.planned, sweep.STATE.sweep_dir = saved
    # a swept experiment brings no grid: Hydra reads the grid from the fixed overrides' config
    assert sweep_jobs(["experiment=smoke,fp8_kv", "logger=none"]) == [["experiment=smoke", "logger=none"],
                                                                      ["experiment=fp8_kv", "logger=none"]]


@pytest.mark.parametrize("arg", ["hydra.sweeper.params={seed:'1,2'}", "+hydra.sweeper.params.seed='1,2'"])
def test_a_grid_on_the_command_line_is_refused_in_one_line(tmp_path, arg):
    """Hydra cannot merge hydra.sweeper.params from the command line (an OmegaConf traceback): one line that says
    where a grid goes, before anything is composed or written."""
    _assert_one_line_exit_2(run_cli(["-m", *TINY, arg], tmp_path),
                            ["hydra.sweeper.params", "cannot be set on the command line", "experiment config"])
    assert not (tmp_path / "outputs").exists()


def test_help_describes_attnlab(tmp_path):
    proc = run_cli(["--help"], tmp_path, timeout=60)
    assert proc.returncode == 0 and proc.stderr == ""
    for needle in ("speculative decoding", "Examples:", "dry_run=true", "docs/usage.md", "python -m attnlab.report",
                   "verify: fa, flashinfer, hybrid, torch, triton", "Exit codes"):
        assert needle in proc.stdout, needle
    assert "Powered by Hydra" not in proc.stdout


def test_bench_spec_skips_an_unsupported_cell(tmp_path):
    proc = run_cli(["--device", "cpu", "--model", "tiny-llama", "--backends", "torch,flashinfer", "--drafters",
                    "ngram", "--dtype", "fp32", "--num-prompts", "1", "--new", "4", "--k", "2", "--skip-hf"],
                   tmp_path, module="attnlab.bench.spec")
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = [ln for ln in stderr_lines(proc) if not ln.startswith("[bench.spec ")]  # its progress lines aside
    assert len(lines) == 1 and lines[0].startswith("skipped verify=flashinfer does not support"), proc.stderr
    assert "verify torch: round 1 of" in proc.stderr
    assert "Traceback" not in proc.stderr
    assert "| attnlab | 1 | ngram | 2 | chain | - / torch |" in proc.stdout and "Skipped (cannot run here)" in proc.stdout
