"""bench.launch_floor's command line on a machine without a GPU (its GPU rows run on the H200: experiments/)."""

from __future__ import annotations

import pytest
import torch

from attnlab.bench import launch_floor


def test_bad_input_and_no_gpu(capsys):
    with pytest.raises(SystemExit):
        launch_floor.main(["--models", "nope"])
    assert "unknown ['nope']" in capsys.readouterr().err
    for flag in ("--repeats", "--reps", "--iters"):
        with pytest.raises(SystemExit):
            launch_floor.main([flag, "0"])
    if not torch.cuda.is_available():
        assert launch_floor.main(["--models", "smollm2"]) == 2
        assert "attnlab.bench.launch_floor:" in capsys.readouterr().out


def test_floor_line_reads_the_fastest_stream():
    med = {f"{row} | {c}": us for c, *_ in launch_floor.SETTINGS
           for row, us in (("decode", 12.7), ("empty, decode grid", 0.8), ("empty x2, decode + merge grids", 1.5),
                           ("stream K / V, decode grid", 8.4), ("stream K / V + empty merge grid", 9.0),
                           ("stream K / V, 64 splits", 8.6), ("stream K / V, decode grid, contig", 6.0))}
    line = launch_floor.floor_line("llama8b", 4096, med, 32)  # contig reads other slots: not the plan's read
    assert "<= 9.40 us" in line and "best decode 12.70 us (32 splits)" in line
    assert "alone 1.50 us" in line
    # 2 x 4096 tokens x 8 kv heads x 128 x 2 bytes = 16.8 MB, read in 8.4 us = 2.0 TB/s
    assert "16.8 MB of K / V 8.40 us (stream K / V, decode grid | PDL off: 2.00 TB/s)" in line
    med.update({f"stream K / V, rows of every head, 256 programs | {c}": 7.0 for c, *_ in launch_floor.SETTINGS})
    med.update({f"stream K / V, decode grid, hnd | {c}": 5.0 for c, *_ in launch_floor.SETTINGS})
    line = launch_floor.floor_line("llama8b", 4096, med, 32)  # rows reads the plan's bytes: it counts; hnd a copy
    assert "7.00 us (stream K / V, rows of every head, 256 programs | PDL off: 2.40 TB/s)" in line
    for c, *_ in launch_floor.SETTINGS:  # a decode that merges inside its kernel has no second launch: one empty one
        del med[f"empty x2, decode + merge grids | {c}"]
    assert "its empty launches alone 0.80 us" in launch_floor.floor_line("llama8b", 4096, med, 32)


def test_stream_splits_bad_input(capsys):
    for bad in ("x", "0", "2000"):
        with pytest.raises(SystemExit):
            launch_floor.main(["--stream-splits", bad])
        assert "--stream-splits" in capsys.readouterr().err
    for bad in ("0", "300"):
        with pytest.raises(SystemExit):
            launch_floor.main(["--layers", bad])
        assert "--layers" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        launch_floor.main(["--stream-modes", "pages,tma"])
    assert "--stream-modes: unknown ['tma']" in capsys.readouterr().err
