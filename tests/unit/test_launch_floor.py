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

