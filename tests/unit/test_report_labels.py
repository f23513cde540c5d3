"""Report plot labels name what a sweep varied (from each job's .hydra/overrides.yaml)."""

from attnlab.report import load_job, sweep_labels


def _job(root, name, overrides):
    d = root / name / ".hydra"
    d.mkdir(parents=True)
    (d / "overrides.yaml").write_text("".join(f"- {o}\n" for o in overrides))
    return load_job(root / name, root)


def test_labels_show_only_the_varied_overrides(tmp_path):
    jobs = [_job(tmp_path, str(i), ["draft=self", f"draft.layers={n}", f"verify={v}", "logger=jsonl"])
            for i, (n, v) in enumerate([(10, "torch"), (20, "torch"), (10, "triton")])]
    assert sweep_labels(jobs) == ["draft.layers=10, verify=torch", "draft.layers=20, verify=torch",
                                  "draft.layers=10, verify=triton"]


def test_labels_fall_back_to_the_job_name(tmp_path):
    jobs = [_job(tmp_path, "a", ["seed=1"]), load_job(tmp_path / "b", tmp_path)]  # b: no overrides file
    assert sweep_labels(jobs) == ["seed=1", "b"]
    assert sweep_labels([_job(tmp_path, "c", ["seed=1"])]) == ["c"]  # one job: nothing varies


def _sweep_job(root, name, overrides, metrics):
    import json

    from attnlab.metrics.outputs import write_json

    d = root / name
    (d / ".hydra").mkdir(parents=True)
    (d / ".hydra" / "overrides.yaml").write_text("".join(f"- {o}\n" for o in overrides))
    (d / ".hydra" / "config.yaml").write_text("draft: {kind: self, layers: 10}\nbackend: {name: triton}\n"
                                              "verify: {name: triton}\nspec: {num_draft_tokens: 4}\n")
    (d / "status.json").write_text(json.dumps({"status": "complete"}))
    write_json(d / "metrics.json", metrics)


def _metrics(tps, speedup):
    return {"output_tokens_per_s": tps, "output_tokens_per_s_min": tps - 5, "output_tokens_per_s_max": tps + 5,
            "speedup_vs_target_only": speedup, "speedup_vs_target_only_min": speedup - 0.1,
            "speedup_vs_target_only_max": speedup + 0.1, "bench_repeats": 3, "noisy": tps > 300,
            "iteration_ms": 12.5, "ttft_ms_p50": 30.0, "tpot_ms_p50": 4.25, "peak_mem_bytes": 3 * 2 ** 30,
            "parity_logits_max_abs_err": 0.0123, "accept_len_mean": 2.0, "accept_rate_pos1": 0.5,
            "num_draft_tokens": 4, "precision_target": "bf16", "precision_draft": "bf16", "page_size": 16}


def test_report_has_a_column_per_swept_override(tmp_path):
    """warmup=none,full x engine.fused_ops=false,true: four rows that today differ only in their numbers."""
    from attnlab.report import report

    combos = [("none", "false"), ("none", "true"), ("full", "false"), ("full", "true")]
    for i, (w, f) in enumerate(combos):
        _sweep_job(tmp_path, str(i), ["backend=triton", "verify=triton", f"warmup={w}", f"engine.fused_ops={f}"],
                   _metrics(100.0 * (i + 1), 1.0 + i / 10))
    lines = report(tmp_path, plots=False).splitlines()
    header = [c.strip() for c in lines[0].strip("|").split("|")]
    assert header[:3] == ["job", "engine.fused_ops", "warmup"]  # backend/verify did not vary: no column
    for col in ("ms/iter", "TTFT p50 ms", "TPOT p50 ms", "peak mem", "logits err", "tok/s min-max",
                "speedup min-max", "repeats"):
        assert col in header, col
    rows = [dict(zip(header, (c.strip() for c in ln.strip("|").split("|")))) for ln in lines[2:]]
    assert [(r["warmup"], r["engine.fused_ops"]) for r in rows] == [(w, f) for w, f in combos]
    assert rows[0]["tok/s"] == "100.0" and rows[0]["tok/s min-max"] == "95.0-105.0"
    assert rows[3]["speedup min-max"] == "1.20-1.40" and rows[3]["repeats"] == "3 noisy"
    assert (rows[0]["ms/iter"], rows[0]["peak mem"], rows[0]["logits err"]) == ("12.50", "3.00 GiB", "1.2e-02")


def test_bars_are_per_job_and_titles_fit(tmp_path):
    """One bar per job (two jobs of the same pair are not averaged), labelled by the varied override; every
    title and tick label lies inside the figure."""
    from attnlab.report import accept_figure, load_job, table_rows, throughput_figure

    for i, f in enumerate(("false", "true")):
        _sweep_job(tmp_path, str(i), ["verify=triton", f"engine.fused_ops={f}"], _metrics(100.0 + 50 * i, 1.1))
    jobs = [load_job(tmp_path / str(i), tmp_path) for i in range(2)]
    fig = throughput_figure(jobs, table_rows(jobs)[0])
    ax = fig.axes[0]
    assert [round(p.get_height()) for p in ax.patches] == [100, 150]
    assert [t.get_text() for t in ax.get_xticklabels()] == ["engine.fused_ops=false", "engine.fused_ops=true"]
    for f in (fig, accept_figure(jobs)):
        f.canvas.draw()
        box = f.bbox
        for a in f.axes:
            for text in [a.title, *a.get_xticklabels(), a.xaxis.label, a.yaxis.label]:
                if text.get_text():
                    e = text.get_window_extent()
                    assert e.x0 >= box.x0 - 1 and e.x1 <= box.x1 + 1 and e.y1 <= box.y1 + 1, text.get_text()


def test_key_table(tmp_path):
    """--keys prints chosen metrics.json keys per job (the cold vs warm first-request table)."""
    from attnlab.report import main

    for i, w in enumerate(("none", "full")):
        _sweep_job(tmp_path, str(i), [f"warmup={w}", "bench.cold=process"],
                   {"first_request_ms_cold": 1005.0 / (i + 1), "first_request_ms_warm": 544.0,
                    "cold_start": "fresh_process", "speedup_vs_target_only_repeats": [1.0, 1.25]})
    import contextlib
    import io

    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        keys = "cold_start,first_request_ms_cold,first_request_ms_warm,speedup_vs_target_only_repeats"
        assert main([str(tmp_path), "--keys", keys]) == 0
    lines = buf.getvalue().splitlines()
    assert lines[0] == ("| job | warmup | cold_start | first_request_ms_cold | first_request_ms_warm | "
                        "speedup_vs_target_only_repeats |")
    assert lines[2] == "| 0 | none | fresh_process | 1005 | 544 | 1, 1.25 |" and lines[3].startswith("| 1 | full |")
