"""bench.gemm: the layer shapes it times, and its CPU smoke (--interpret) end to end."""

from __future__ import annotations

from attnlab.bench import gemm as bench


def test_layer_shapes_of_the_presets():
    assert bench.shapes("llama8b") == [("qkv", 6144, 4096), ("o", 4096, 4096), ("gate_up", 28672, 4096),
                                       ("down", 4096, 14336), ("lm_head", 128256, 4096)]
    assert {g: (n, k) for g, n, k in bench.shapes("smollm2")}["qkv"] == (960, 576)


def test_interpret_smoke(capsys, tmp_path):
    out = tmp_path / "gemm.json"
    assert bench.main(["--interpret", "--gemms", "o,down", "--ms", "1,3", "--out", str(out)]) == 0
    text = capsys.readouterr().out
    assert "| tiny | down | 128 x 256 | 3 |" in text and "inv attnlab" in text
    import json

    rows = json.loads(out.read_text())["rows"]
    assert len(rows) == 4 and all(r["inv_attnlab"] and r["max_err_attnlab"] < 0.1 for r in rows)


def test_interpret_split_modes(capsys, tmp_path):
    """--split-modes: one column per further mode, each mode's rows invariance-checked; bad modes refused."""
    out = tmp_path / "gemm.json"
    assert bench.main(["--interpret", "--gemms", "down", "--ms", "2", "--split-modes", "fill/pass,lean/ticket",
                       "--out", str(out)]) == 0
    text = capsys.readouterr().out
    assert "attnlab fill/pass us" in text and "lean/ticket us (ratio)" in text
    import json

    (row,) = json.loads(out.read_text())["rows"]
    assert set(row["split_us"]) == {"lean/ticket"} and row["split_us"]["lean/ticket"]["us"] > 0
    assert bench.main(["--interpret", "--split-modes", "fill"]) == 2
