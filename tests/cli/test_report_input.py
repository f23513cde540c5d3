"""``python -m attnlab.report`` over inputs that are not a plain sweep: a train_draft folder beside the runs
(outputs/ holds both), an unknown ``--keys`` key, serving jobs (their table on stdout too). Fabricated folders,
no model: each test takes well under a second."""

from __future__ import annotations

import json

import pytest
from omegaconf import OmegaConf

from attnlab.report import main, report
from tests.unit.test_report_labels import _metrics, _sweep_job


@pytest.fixture(scope="module")
def train_config() -> str:
    """conf/train_draft.yaml as ``python -m attnlab.train_draft`` saves it in .hydra/config.yaml
    (``precision: auto`` is a plain string there, not a group)."""
    from hydra import compose, initialize_config_dir

    from attnlab.compose import CONF_DIR
    from attnlab.train_draft import schema  # noqa: F401  registers the schema

    with initialize_config_dir(str(CONF_DIR), version_base="1.3"):
        cfg = compose("train_draft", overrides=["model=tiny-llama", "device=cpu", "logger=jsonl"])
    text = OmegaConf.to_yaml(cfg)
    assert "precision: auto" in text and "train:" in text
    return text


def _train_draft_folder(d, config: str):
    """What attnlab.train_draft writes (attnlab/train_draft/cli.py, loop.py), less the tensors."""
    (d / ".hydra").mkdir(parents=True)
    (d / ".hydra" / "config.yaml").write_text(config)
    (d / ".hydra" / "overrides.yaml").write_text("- model=tiny-llama\n- device=cpu\n- logger=jsonl\n")
    (d / "status.json").write_text(json.dumps({"status": "complete", "error": None, "duration_s": 5.1}))
    (d / "env.json").write_text(json.dumps({"torch": "x"}))
    (d / "summary.json").write_text(json.dumps({"head": str(d / "head"), "steps": 4, "eval/sim_tau@2": 1.1}))
    (d / "head").mkdir()
    (d / "head" / "eagle3.json").write_text("{}")


def _run(root, name, **metrics):
    _sweep_job(root, name, ["verify=triton"], {**_metrics(100.0, 1.2), **metrics})


def test_outputs_with_runs_and_train_draft_folders(tmp_path, capsys, train_config):
    """outputs/ holds runs/ and train/: the run gets its row, the train_draft folder is named in a note
    (stderr, report.md), never a crash."""
    _run(tmp_path / "runs", "a")
    _train_draft_folder(tmp_path / "train" / "t1", train_config)
    assert main([str(tmp_path), "--no-plots"]) == 0
    out, err = capsys.readouterr()
    table = [ln for ln in out.splitlines() if ln.startswith("| ")]
    assert len(table) == 2 and table[1].startswith("| runs/a |") and "train" not in out
    note = ("attnlab.report: note: skipped 1 train_draft folder (python -m attnlab.train_draft output; its results "
            "are in summary.json): train/t1")
    assert err.splitlines() == [note]
    assert "skipped 1 train_draft folder" in (tmp_path / "report.md").read_text()


def test_only_train_draft_folders_is_a_user_error(tmp_path, capsys, train_config):
    for name in ("t1", "t2"):
        _train_draft_folder(tmp_path / name, train_config)
    assert main([str(tmp_path), "--no-plots"]) == 2
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and err[0].startswith("attnlab.report: error: no attnlab speculative-decoding run folders")
    assert "skipped 2 train_draft folders" in err[0] and "t1, t2" in err[0]
    assert main([str(tmp_path / "t1")]) == 2  # the train_draft folder itself
    assert "train_draft" in capsys.readouterr().err


def test_odd_configs_never_crash(tmp_path, train_config):
    """A config that is not an attnlab run (no draft/verify/spec/workload) is skipped; a run whose groups are
    plain strings, or whose metrics.json / status.json is not an object, still gets a row."""
    _run(tmp_path, "a")
    other = tmp_path / "other"
    (other / ".hydra").mkdir(parents=True)
    (other / ".hydra" / "config.yaml").write_text("foo: 1\nprecision: auto\n")
    (other / "status.json").write_text(json.dumps({"status": "complete"}))
    odd = tmp_path / "odd"
    (odd / ".hydra").mkdir(parents=True)
    (odd / ".hydra" / "config.yaml").write_text("draft: ngram\nverify: torch\nprecision: auto\nkv: 16\n")
    (odd / "status.json").write_text("[1, 2]")
    (odd / "metrics.json").write_text(json.dumps({"precision_kv_target": None, "output_tokens_per_s": 1.0}))
    notes: list[str] = []
    rows = [ln for ln in report(tmp_path, plots=False, notes=notes).splitlines()[2:]]
    assert [r.split("|")[1].strip() for r in rows] == ["a", "odd"]
    assert "| -/? | ? | ? | ? | ? | no |" in rows[1] and rows[1].endswith("| ? |")
    assert notes == ["skipped 1 folder (not an attnlab run: its .hydra/config.yaml has no draft/verify/spec/workload): "
                     + "other"]


def test_unknown_key_is_refused_with_close_keys(tmp_path, capsys):
    _run(tmp_path, "0", cold_start="inline")
    _run(tmp_path, "1")
    assert main([str(tmp_path), "--keys", "cold_start,nonexistent_key"]) == 2
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and err[0].startswith("attnlab.report: error: unknown --keys key nonexistent_key")
    assert main([str(tmp_path), "--keys", "ttft_ms_p5,output_tokens_per_sec"]) == 2
    err = capsys.readouterr().err
    assert "ttft_ms_p50" in err and "did you mean output_tokens_per_s," in err and "Traceback" not in err


def test_key_some_jobs_have_and_config_keys(tmp_path, capsys):
    """A key one job has: "-" for the others; a dotted config key reads .hydra/config.yaml."""
    _run(tmp_path, "0", cold_start="inline")
    _run(tmp_path, "1")
    assert main([str(tmp_path), "--keys", "cold_start,spec.num_draft_tokens"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0] == "| job | cold_start | spec.num_draft_tokens |"
    assert out[2:] == ["| 0 | inline | 4 |", "| 1 | - | 4 |"]


def test_serving_table_is_printed(tmp_path, capsys):
    """Serving jobs: stdout has the main table, then the serving heading and table, as report.md does."""
    for i, rate in enumerate((2.0, 8.0)):
        _run(tmp_path, str(i), arrival="poisson", request_rate=rate, requests_per_s=rate, itl_ms_p50=5.0 + i,
             kv_pages_used_max=40 + i, preemptions=0)
    assert main([str(tmp_path), "--no-plots"]) == 0
    out = capsys.readouterr().out
    main_table, serving = out.split("\n\n## Serving (continuous batching)\n\n")
    assert len(main_table.splitlines()) == 4 and "tau" in main_table.splitlines()[0]
    lines = serving.strip().splitlines()
    assert len(lines) == 4 and "req/s" in lines[0] and "ITL p50 ms" in lines[0]
    assert "2 req/s" in lines[2] and "| 41 |" in lines[3]
    assert serving.strip() in (tmp_path / "report.md").read_text()
    _run(tmp_path / "batch", "0")  # no serving job: no serving section
    assert "Serving" not in report(tmp_path / "batch", plots=False)
