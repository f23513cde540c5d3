"""experiments/fp8-kv-sweep/gpu_table.py: the README's table of a GPU sweep, read from the committed run folders."""

import importlib.util
import shutil
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "experiments" / "fp8-kv-sweep" / "results" / "h200-eagle"


def load():
    spec = importlib.util.spec_from_file_location("gpu_table", ROOT / "experiments" / "fp8-kv-sweep" / "gpu_table.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_the_table_of_the_h200_sweep(capsys):
    """12 rows, bf16 first; tau against the bf16 job of the same pair; the workload in the heading."""
    load().main([str(RESULTS / "fp8kv"), str(RESULTS / "fp8draft")])
    out = capsys.readouterr().out.splitlines()
    assert out[0] == "12 jobs; 6 prompts x 64 new tokens, batch 3, k 4, CUDA graphs off, warmup plan none"
    rows = [line for line in out if line.startswith(("| bf16", "| fp8"))]
    assert len(rows) == 12 and [r.split(" | ")[0] for r in rows] == ["| bf16"] * 4 + ["| fp8-kv"] * 4 + ["| fp8-draft"] * 4
    tt = next(r for r in rows if r.startswith("| fp8-kv | triton/triton |")).split(" | ")
    assert tt[2] == "2.053" and tt[4] == "+0.099" and tt[6] == "3: 3 near-tie, 0 unexplained"
    assert tt[7] == "0.401 / 5: 4 near-tie, 1 unexplained"  # against the reference: the row the README discusses
    assert [r.split(" | ")[1] for r in rows[:4]] == sorted(r.split(" | ")[1] for r in rows[:4])


def test_unfinished_jobs_are_left_out_and_named(tmp_path, capsys):
    """A job without parity.json, and one whose parity has no logits section, are named on stderr; the rest is
    tabulated; a precision without its bf16 job has no delta ("-")."""
    for n in ("4", "5", "6"):
        shutil.copytree(RESULTS / "fp8kv" / n, tmp_path / n)
    (tmp_path / "5" / "parity.json").unlink()
    parity = tmp_path / "6" / "parity.json"
    parity.write_text(parity.read_text().replace('"logits"', '"logits_off"'))
    load().main([str(tmp_path)])
    out, err = capsys.readouterr()
    assert f"left out: {tmp_path / '5'}: no parity.json (not finished?)" in err
    assert f"left out: {tmp_path / '6'}: parity.json has no logits" in err
    row = next(line for line in out.splitlines() if line.startswith("| fp8-kv"))
    assert row.split(" | ")[4] == "-" and out.startswith("1 jobs;")


def test_jobs_of_different_workloads_are_refused(tmp_path):
    for n in ("0", "1"):
        shutil.copytree(RESULTS / "fp8kv" / n, tmp_path / n)
    cfg = tmp_path / "1" / ".hydra" / "config.yaml"
    data = yaml.safe_load(cfg.read_text())
    data["workload"]["max_new_tokens"] = 128
    cfg.write_text(yaml.safe_dump(data))
    with pytest.raises(SystemExit, match="different workloads"):
        load().main([str(tmp_path)])


def test_an_empty_sweep_is_refused(tmp_path):
    with pytest.raises(SystemExit, match="no job folders"):
        load().main([str(tmp_path)])


def test_divergences_say_how_many_the_references_rounding_reaches():
    div = load()._divergences
    assert div({"divergences": 5, "near_tie": 4, "unexplained": 1}) == "5: 4 near-tie, 1 unexplained"  # before it
    assert div({"divergences": 5, "near_tie": 4, "unexplained": 1, "unexplained_within_rounding": 1}) == (
        "5: 4 near-tie, 1 unexplained (1 within the reference's rounding)")
    assert div({"divergences": 2, "near_tie": 2, "unexplained": 0, "unexplained_within_rounding": 0}) == (
        "2: 2 near-tie, 0 unexplained")
