"""``python -m attnlab.locate``'s handling of what the user gives it (docs/usage.md, "Exit codes"): a path that
is not a run folder, a bad option or override, a request out of range is one line on stderr and exit code 2;
a run with no divergence is exit 0 and "nothing to locate"; a bug still raises (exit 1, traceback)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from attnlab import locate as loc
from tests.cli.helpers import TINY, run_cli

OVERRIDES = [*TINY, "parity=off", "workload=synthetic", "workload.lengths=[12]"]
# two requests as that run writes them (12-token prompts, 8 output tokens); request 1 diverges at output 3
ROW = {"prompt_tokens": 12, "output_token_ids": [308, 148, 365, 439, 439, 439, 439, 434], "accept_lens": [1, 1, 1, 4],
       "first_divergence_vs_target_only": None}


def fake_run(folder: Path, divergence: int | None = 3, overrides=OVERRIDES, rows=None) -> Path:
    """A run folder as the CLI leaves it, without running: .hydra/overrides.yaml and requests.jsonl."""
    (folder / ".hydra").mkdir(parents=True)
    (folder / ".hydra" / "overrides.yaml").write_text(yaml.safe_dump(list(overrides)))
    rows = [dict(ROW), {**ROW, "first_divergence_vs_target_only": divergence}] if rows is None else rows
    (folder / "requests.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (folder / "status.json").write_text(json.dumps({"status": "complete"}))
    (folder / "parity.json").write_text("{}\n")  # parity=off: no level, the noise floor's included
    return folder


def call(argv: list[str], capsys) -> tuple[int, str, list[str]]:
    """main's exit code (argparse's SystemExit included), stdout, stderr lines."""
    try:
        code = loc.main([str(a) for a in argv])
    except SystemExit as e:
        code = e.code
    out, err = capsys.readouterr()
    return code, out, [ln for ln in err.splitlines() if ln.strip()]


def assert_user_error(code, err, *words):
    assert code == 2 and len(err) == 1, err
    assert err[0].startswith("attnlab.locate: error: ") and "Traceback" not in err[0], err
    for w in words:
        assert w in err[0], err[0]


@pytest.fixture
def run(tmp_path):
    return fake_run(tmp_path / "run")


def test_not_a_run_folder(tmp_path, capsys):
    a_file = tmp_path / "README.md"
    a_file.write_text("x")
    sweep = tmp_path / "sweep"
    for job in ("0", "1", "10"):
        fake_run(sweep / job)
    (sweep / "multirun.yaml").write_text("{}\n")
    failed = tmp_path / "failed"
    (failed / ".hydra").mkdir(parents=True)
    (failed / ".hydra" / "overrides.yaml").write_text(yaml.safe_dump(OVERRIDES))
    (failed / "status.json").write_text(json.dumps({"status": "failed", "error": "verify=triton needs cuda"}))
    empty = fake_run(tmp_path / "empty", rows=[])
    cases = [(tmp_path / "nonexistent", ("no such folder", "pass the folder of one run")),
             (a_file, ("not a folder",)),
             (sweep, ("is a sweep folder", "0, 1, 10", f"pass one job folder, e.g. {sweep / '0'}")),
             (tmp_path, ("holds 2 run folders (empty, failed): pass one of them",)),  # the sweep's are deeper
             (failed, ("no requests.jsonl", "status.json: failed: verify=triton needs cuda")),
             (empty, ("holds no request",)),
             (tmp_path / "sweep" / "multirun.yaml", ("not a folder",))]
    for path, words in cases:
        assert_user_error(*call([path], capsys)[::2], *words)


def test_bad_batch_and_request(run, capsys):
    for argv, words in [(["--batch", "-2"], ("--batch", "-2", ">= 1")),
                        (["--batch", "0"], ("--batch", "0: must be >= 1")),
                        (["--batch", "two"], ("'two' is not an integer",)),
                        (["--request", "-1"], ("--request", ">= 0")),
                        (["--request", "99"], ("--request 99: the run has 2 requests (0..1)",
                                               "requests that diverge (vs_target_only): 1")),
                        (["--request", "0"], ("request 0 has no divergence", "diverge (vs_target_only): 1"))]:
        assert_user_error(*call([run, *argv], capsys)[::2], *words)
    with pytest.raises(loc.LocateError, match=">= 1"):  # the API refuses it too
        loc.locate_run(run, [], None, "vs_target_only", 0, None)


def test_bad_overrides(run, capsys):
    assert_user_error(*call([run, "kv.pagesize=3"], capsys)[::2], "kv.pagesize: unknown key", "kv.page_size")
    assert_user_error(*call([run, "--bogus"], capsys)[::2], "unrecognized arguments: --bogus", "key=value")
    assert_user_error(*call([run, "foo"], capsys)[::2], "override 'foo'")
    assert_user_error(*call([run, "workload.num_prompts=1"], capsys)[::2], "prompts prepared now differ")
    # a backend option needs no + here either (cli.add_free_form): the backend itself names a bad one
    assert_user_error(*call([run, "verify.options.foo=1"], capsys)[::2], "verify.options.foo: unknown option")


def test_no_divergence_is_nothing_to_locate(tmp_path, capsys):
    code, out, err = call([fake_run(tmp_path / "same", divergence=None)], capsys)
    assert (code, err) == (0, []) and "nothing to locate" in out and "no request of 2 diverges" in out
    assert not (tmp_path / "same" / "locate.json").exists()
    # a run that compared nothing is not "no divergence": say how to get one
    rows = [{k: v for k, v in ROW.items() if not k.startswith("first_divergence")}] * 2
    code, _, err = call([fake_run(tmp_path / "off", rows=rows)], capsys)
    assert_user_error(code, err, "did not compare its tokens", "parity.tokens=true")
    code, _, err = call([tmp_path / "same", "--divergence", "noise_floor"], capsys)
    assert_user_error(code, err, "did not measure the noise floor", "parity.noise_floor=true")


def test_out_into_missing_folders_and_into_a_file(run, tmp_path, capsys):
    a_file = tmp_path / "a_file"
    a_file.write_text("x")
    assert_user_error(*call([run, "--out", a_file / "x.json"], capsys)[::2], "is a file, not a folder")
    out = tmp_path / "missing" / "dir" / "x.json"
    code, stdout, err = call([run, "--out", out], capsys)
    assert (code, err) == (0, []) and f"wrote {out}" in stdout
    res = json.loads(out.read_text())
    assert res["request"] == 1 and res["output_index"] == 3 and res["position"] == 12 + 3 - 1
    code, stdout, err = call([run, "--out", f"{tmp_path / 'folder'}/"], capsys)  # a folder: locate.json in it
    assert code == 0 and (tmp_path / "folder" / "locate.json").is_file()


def test_help_is_complete(capsys):
    code, out, _ = call(["--help"], capsys)
    assert code == 0
    text = " ".join(out.split())
    assert "name the first op whose bits differ." in text and "Exit codes" in text


def test_a_bug_still_raises(run, monkeypatch, capsys):
    def broken(*a, **k):
        raise RuntimeError("a bug")

    monkeypatch.setattr(loc, "locate_run", broken)
    with pytest.raises(RuntimeError, match="a bug"):
        loc.main([str(run)])
    monkeypatch.undo()
    monkeypatch.setenv("HYDRA_FULL_ERROR", "1")  # the user asked for the traceback of a user error
    with pytest.raises(loc.LocateError):
        loc.main([str(run / "nonexistent")])


def test_cli_one_line_no_traceback(tmp_path):
    proc = run_cli([str(tmp_path / "nonexistent")], tmp_path, module="attnlab.locate")
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1 and "Traceback" not in proc.stderr, proc.stderr


def test_a_run_keeps_the_fused_ops_it_was_composed_with(tmp_path):
    """engine.fused_ops's default changed (false -> auto, 2026-12-05): a run whose overrides do not set it is
    recomposed with its own composed value (.hydra/config.yaml), not today's default; an override of the run wins,
    and a folder without config.yaml pins nothing."""
    old = fake_run(tmp_path / "old")
    (old / ".hydra" / "config.yaml").write_text(yaml.safe_dump({"engine": {"fused_ops": False, "cuda_graph": False}}))
    saved, _ = loc.read_run(old)
    assert saved == ["engine.fused_ops=false", *OVERRIDES]
    own = fake_run(tmp_path / "own", overrides=[*OVERRIDES, "engine.fused_ops=auto"])
    (own / ".hydra" / "config.yaml").write_text(yaml.safe_dump({"engine": {"fused_ops": "auto"}}))
    assert loc.read_run(own)[0] == [*OVERRIDES, "engine.fused_ops=auto"]
    assert loc.read_run(fake_run(tmp_path / "bare"))[0] == OVERRIDES
