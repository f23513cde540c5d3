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
