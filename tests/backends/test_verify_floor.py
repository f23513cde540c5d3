"""attnlab.bench.verify_floor on CPU: the verify / decode table of a bench.kernels JSON, its floor counts, the rule's
record, the plot, and the errors of bad input."""

import json

import pytest

from attnlab.bench.verify_floor import main, markdown, parse_plans, rows_of

PLANS = {"fa2": "flashinfer", "rows": "flashinfer/verify_as_decode=true"}
RULE = ("by rule", "flashinfer/verify_as_decode=auto")


def cell(phase, backend, us, batch=1, context=512, q_len=None, kernel="", status="ok"):
    return {"phase": phase, "model": "smollm2", "batch": batch, "context": context,
            "q_len": q_len or (1 if phase == "decode" else 5), "backend": backend, "ms": us / 1000,
            "kernel": kernel, "status": status}


def cells():
    """Two shapes: at batch 1 the rows win (8 against 11 us over a decode of 8) and the rule took them; at batch 16
    fa2 wins (13 against 20 over 10) and the rule took the rows anyway (wrong)."""
    out = []
    for spec in (*PLANS.values(), RULE[1]):
        out += [cell("decode", spec, 8.0), cell("decode", spec, 10.0, batch=16)]
    out += [cell("verify", PLANS["fa2"], 11.0, kernel="fa2"),
            cell("verify", PLANS["rows"], 8.0, kernel="cuda-core:rows"),
            cell("verify", RULE[1], 8.1, kernel="cuda-core:rows"),
            cell("verify", PLANS["fa2"], 13.0, batch=16), cell("verify", PLANS["rows"], 20.0, batch=16),
            cell("verify", RULE[1], 20.0, batch=16, kernel="cuda-core:rows"),
            cell("verify", PLANS["fa2"], 99.0, batch=64, status="skipped")]
    return out


def test_ratios_best_plan_and_the_rules_record():
    rows = rows_of(cells(), PLANS, RULE)
    assert [(r.batch, r.context, r.q_len) for r in rows] == [(1, 512, 5), (16, 512, 5)]  # the skipped cell: none
    b1, b16 = rows
    assert b1.ratio == pytest.approx({"fa2": 11 / 8, "rows": 1.0, "by rule": 8.1 / 8})
    assert b1.rule_right is True and b1.rule_kernel == "cuda-core:rows"  # 8.1 within 3% of 8.0
    assert b16.rule_right is False  # 20 against fa2's 13
    text = markdown(rows, list(PLANS), RULE[0])
    assert "| 1 | 512 | 5 | 8.00 | 11.00 (1.38x) | 8.00 (1.00x) | 8.10 (1.01x) | rows | cuda-core:rows | yes |" in text
    assert "cells at or under 1.3x of their decode, of 2: fa2 1, rows 1, by rule 1" in text
    assert "by rule within 3% of the fastest other plan in 1 of 2 cells; not in: smollm2 b16 x 512 q5" in text


def test_a_cell_missing_a_plan_is_not_judged():
    rows = rows_of([c for c in cells() if not (c["backend"] == PLANS["rows"] and c["batch"] == 16)], PLANS, RULE)
    assert rows[1].rule_right is None and "rows" not in rows[1].ratio
    text = markdown(rows, list(PLANS), RULE[0])
    assert "| 13.00 (1.30x) | - | 20.00 (2.00x) | fa2 | cuda-core:rows | - |" in text


def test_the_command_line_reads_several_files_and_writes_the_table_and_a_plot(tmp_path, capsys):
    """Two bench.kernels JSONs (one run per model, say) are read as one."""
    every = cells()
    half = len(every) // 2
    for name, part in (("a", every[:half]), ("b", every[half:])):
        (tmp_path / f"{name}.json").write_text(json.dumps({"info": {}, "cells": part}))
    png = tmp_path / "k.png"
    assert main([str(tmp_path / "a.json"), str(tmp_path / "b.json"), "--plans",
                 "fa2=flashinfer,rows=flashinfer/verify_as_decode=true",
                 "--rule", "by rule=flashinfer/verify_as_decode=auto", "--plot", str(png)]) == 0
    assert "by rule within 3% of the fastest other plan in 1 of 2 cells" in capsys.readouterr().out
    assert png.stat().st_size > 1000 and png.read_bytes()[:4] == b"\x89PNG"


@pytest.mark.parametrize("plans,why", [("fa2", "write name=backend-spec"), ("a=x,a=y", "given twice"),
                                       (",", "no plans given")])
def test_bad_plans_are_refused(plans, why):
    with pytest.raises(ValueError, match=why):
        parse_plans(plans)


def test_bad_input_exits_2_with_one_line(tmp_path, capsys):
    assert main([str(tmp_path / "missing.json"), "--plans", "a=flashinfer"]) == 2
    path = tmp_path / "k.json"
    path.write_text(json.dumps({"cells": cells()}))
    assert main([str(path), "--plans", "a=triton"]) == 2
    err = capsys.readouterr().err
    assert "No such file" in err and "no cell of triton" in err


def _kernels_json(tmp_path):
    path = tmp_path / "k.json"
    path.write_text(json.dumps({"cells": cells()}))
    return str(path)


def _one_line_exit_2(capsys, argv, *needles):
    assert main(argv) == 2
    out, err = capsys.readouterr()
    assert out == "" and len(err.strip().splitlines()) == 1 and err.startswith("error: "), err
    for needle in needles:
        assert needle in err, (needle, err)
    return err


def test_a_plan_whose_cells_all_failed_keeps_the_others_table(tmp_path, capsys):
    """A GPU sitting's file where one plan's verify cells failed: the other plans' table, a note for it (exit 0);
    where every plan's failed, exit 2."""
    data = cells()
    for c in data:
        if c["backend"] == "flashinfer/verify_as_decode=auto" and c["phase"] == "verify":
            c.update(status="error", ms=None)
    path = tmp_path / "k.json"
    path.write_text(json.dumps({"cells": data}))
    argv = [str(path), "--plans", "fa2=flashinfer,rows=flashinfer/verify_as_decode=auto"]
    assert main(argv) == 0
    out, err = capsys.readouterr()
    assert "note: no measured verify cell of flashinfer/verify_as_decode=auto (plan rows)" in err, err
    assert "| smollm2 | 1 | 512 | 5 | 8.00 | 11.00 (1.38x) | - | fa2 |" in out, out
    _one_line_exit_2(capsys, [str(path), "--plans", "rows=flashinfer/verify_as_decode=auto"],
                     "no measured verify cell of flashinfer/verify_as_decode=auto (plan rows)")


def test_the_plot_makes_its_folder(tmp_path, capsys):
    png = tmp_path / "new" / "folder" / "k.png"
    assert main([_kernels_json(tmp_path), "--plans", "fa2=flashinfer", "--plot", str(png)]) == 0
    assert png.read_bytes()[:4] == b"\x89PNG"


@pytest.mark.parametrize("where,why", [("", "a folder; give a file name"), ("k.json/x.png", "is a file, not a folder"),
                                       ("x.notanimage", "an image's extension")])
def test_a_plot_that_cannot_be_written_is_refused_before_the_table(tmp_path, capsys, where, why):
    data = _kernels_json(tmp_path)
    _one_line_exit_2(capsys, [data, "--plans", "fa2=flashinfer", "--plot", str(tmp_path / where)], "--plot", why)


@pytest.mark.parametrize("argv,needles", [
    (["--plans", "fa2=flashinfer", "--rule", "b=triton"],
     ["no cell of triton (rule b)", "measured there: flashinfer, flashinfer/verify_as_decode=auto"]),
    (["--plans", "fa2=flashinfer,b=triton"], ["no cell of triton (plan b)"]),
    (["--plans", "fa2=flashinfer", "--rule", "fa2=flashinfer/verify_as_decode=auto"], ["names a plan of --plans"]),
    (["--plans", "fa2=flashinfer", "--floor", "-1"], ["--floor -1: a ratio > 0"]),
    (["--plans", "fa2=flashinfer", "--floor", "0"], ["--floor 0: a ratio > 0"]),
    (["--plans", "fa2=flashinfer", "--floor", "abc"], ["--floor abc: a ratio > 0"]),
    (["--plans", "fa2=flashinfer", "--spread", "0.97"], ["--spread 0.97: a ratio >= 1"]),
])
def test_unknown_specs_and_bad_ratios_exit_2_with_one_line(tmp_path, capsys, argv, needles):
    _one_line_exit_2(capsys, [_kernels_json(tmp_path), *argv], *needles)


@pytest.mark.parametrize("text,why", [("# a README\n", "not JSON"), ("[1, 2]", 'no "cells" list'),
                                      ('{"cells": [{"phase": "verify"}]}', "a cell without")])
def test_a_file_that_is_not_a_bench_kernels_json_is_named(tmp_path, capsys, text, why):
    path = tmp_path / "README.md"
    path.write_text(text)
    _one_line_exit_2(capsys, [str(path), "--plans", "fa2=flashinfer"], f"{path}: not a bench.kernels JSON", why)


def test_ratio_ticks_are_plain_numbers_and_the_floor_stands_alone():
    from attnlab.bench.verify_floor import ratio_ticks

    assert ratio_ticks(1.05, 2.85, 1.3) == [1.2, 1.3, 1.5, 2, 2.5]  # 12-04h's Llama-8B panel
    assert ratio_ticks(0.9, 5.5, 1.3) == [1, 1.3, 1.5, 2, 2.5, 3, 4, 5]  # 1.2 gives way to the floor
    assert ratio_ticks(0.02, 300, 1.3) == [0.1, 1.3, 10, 100]  # a decade each
    assert ratio_ticks(1.5, 3, 1.3) == [1.5, 1.75, 2, 2.5, 3]  # the floor off the axis: not a tick


def test_computed_scores_todays_rule_on_cells_measured_without_it(tmp_path, capsys):
    """--computed: at batch 1 x 512 (SmolLM2, q 5: 5 x 512 x 64 within the rows' bound) the rule takes the rows' 8 us,
    at batch 16 (past ROWS_MAX_BATCH) fa2's 13 us: right in both cells, where the measured rule (cells()) was wrong
    at batch 16; the column's kernel says which plan it took."""
    measured_without = [c for c in cells() if c["backend"] != RULE[1]]
    path = tmp_path / "k.json"
    path.write_text(json.dumps({"cells": measured_without}))
    argv = [str(path), "--plans", "fa2=flashinfer,rows=flashinfer/verify_as_decode=true"]
    assert main(argv + ["--computed", "rule now=fa2/rows"]) == 0
    out = capsys.readouterr().out
    assert "| 8.00 (1.00x) | rows | rows (cuda-core:rows) | yes |" in out
    assert "| 13.00 (1.30x) | fa2 | other | yes |" in out
    assert "rule now within 3% of the fastest other plan in 2 of 2 cells" in out
    for bad, needle in (("rule now=fa2", "write NAME=OFF/ON"), ("fa2=fa2/rows", "a NAME of its own"),
                        ("x=fa2/nope", "two plan names of --plans")):
        _one_line_exit_2(capsys, argv + ["--computed", bad], needle)
    _one_line_exit_2(capsys, argv + ["--computed", "x=fa2/rows", "--rule", "r=" + RULE[1]], "give one")


def test_cold_and_back_to_back_files_are_not_mixed(tmp_path):
    from attnlab.bench.verify_floor import read_cells

    warm, cold = cells(), cells()
    for c in cold:
        c["extra"] = {"cold": True}
    (tmp_path / "w.json").write_text(json.dumps({"cells": warm}))
    (tmp_path / "c.json").write_text(json.dumps({"cells": cold}))
    assert len(read_cells([str(tmp_path / "c.json")])) == len(cold)  # one kind: read
    cold_now = cells()  # since 2026-12-06c a --cold cell says so as its between context
    for c in cold_now:
        c["extra"] = {"between": "cold"}
    (tmp_path / "c2.json").write_text(json.dumps({"cells": cold_now}))
    assert len(read_cells([str(tmp_path / "c.json"), str(tmp_path / "c2.json")])) == 2 * len(cold)
    with pytest.raises(ValueError, match="back to back, cold: --cold"):
        read_cells([str(tmp_path / "w.json"), str(tmp_path / "c.json")])
    mlp = cells()
    for c in mlp:
        c["extra"] = {"between": "gemm"}
    (tmp_path / "g.json").write_text(json.dumps({"cells": mlp}))
    assert len(read_cells([str(tmp_path / "g.json")])) == len(mlp)
    with pytest.raises(ValueError, match="back to back, gemm"):
        read_cells([str(tmp_path / "w.json"), str(tmp_path / "g.json")])
