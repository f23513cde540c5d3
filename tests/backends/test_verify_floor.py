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
    assert "No such file" in err and "no verify cell of triton" in err
