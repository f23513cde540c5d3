"""Config schema (compose-time errors), every group option composes, cross-field validation, one-line errors."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from attnlab.cli import CONF_DIR, one_line
from attnlab.config import resolve_precision, self_draft_layers, validate
from attnlab.errors import ConfigError

GROUPS = ("draft", "backend", "verify", "precision", "kv", "warmup", "spec", "workload", "logger", "parity",
          "bench", "experiment")


def _compose(*overrides: str):
    with initialize_config_dir(str(CONF_DIR), version_base="1.3"):
        return compose("config", overrides=list(overrides))


def test_default_config():
    cfg = _compose()
    assert cfg.model.name == "smollm2-135m" and cfg.draft.kind == "ngram"
    assert (cfg.backend.name, cfg.verify.name) == ("torch", "torch")
    assert cfg.workload.kind == "builtin" and cfg.logger.kind == "wandb" and cfg.logger.mode == "offline"
    assert cfg.parity.enabled and cfg.device == "auto" and cfg.engine.cuda_graph is False


def test_backend_and_verify_parse_as_documented():
    cfg = _compose("backend=flashinfer", "verify=triton")
    assert (cfg.backend.name, cfg.verify.name) == ("flashinfer", "triton")


@pytest.mark.parametrize("group,option", [(g, p.stem) for g in GROUPS for p in sorted((CONF_DIR / g).glob("*.yaml"))])
def test_every_group_option_composes(group, option):
    overrides = [f"{group}={option}"]
    cfg = _compose(*overrides)
    OmegaConf.to_container(cfg, resolve=True)
    if group in ("backend", "verify"):
        assert cfg[group].name == option


def test_draft_preset_reuses_the_model_preset():
    cfg = _compose("draft=tiny-llama")
    model = OmegaConf.load(CONF_DIR / "model" / "tiny-llama.yaml")
    assert cfg.draft.kind == "model" and cfg.draft.name == model.name and cfg.draft.init == model.init


@pytest.mark.parametrize("override,needle", [
    ("kv.page_size=abc", "kv.page_size"),
    ("kv.pagesize=4", "kv.pagesize"),
    ("spec.temperature=hot", "spec.temperature"),
    ("workload.batch_size=[1]", "workload.batch_size"),
])
def test_typo_or_wrong_type_fails_at_compose(override, needle):
    with pytest.raises(Exception) as e:
        _compose(override)
    msg = one_line(e.value)
    assert "\n" not in msg and needle in msg


def test_unknown_group_option_is_one_line():
    with pytest.raises(Exception) as e:
        _compose("verify=flashattn")
    assert one_line(e.value) == "verify=flashattn: unknown option (choose from: fa, flashinfer, hybrid, torch, triton)"


def _validate(*overrides):
    return validate(_compose("model=tiny-llama", "device=cpu", *overrides))


def test_validate_resolves_auto():
    r = _validate()
    assert r.device == "cpu" and r.k == 4 and r.bench.repeats == 1  # null repeats: 1 on CPU (3 on GPU)
    p = r.precision
    assert (p.target, p.draft, p.kv_target, p.kv_draft) == ("fp32", "fp32", "fp32", "fp32")
    assert _validate("draft=none").k == 0
    assert r.engine.decode_steps_per_sync == 1
    assert _validate("draft=none", "engine.decode_steps_per_sync=4").engine.decode_steps_per_sync == 4


def test_fused_ops_auto_is_on_where_the_device_is_cuda():
    """engine.fused_ops=auto, the default since 2026-12-05: off on CPU, where the main job runs as is, on where the
    run's device is cuda."""
    from attnlab.config import EngineSchema, resolve_fused_ops

    assert EngineSchema().fused_ops == "auto" and _validate().engine.fused_ops is False
    assert _validate("engine.fused_ops=auto").engine.fused_ops is False
    assert _validate("engine.fused_ops=false").engine.fused_ops is False
    assert resolve_fused_ops("auto", "cuda") is True and resolve_fused_ops(True, "cuda") is True
    assert resolve_fused_ops(False, "cuda") is False and resolve_fused_ops("auto", "cpu") is False


def test_the_run_plan_is_frozen_and_typed():
    """validate returns the config as frozen dataclasses (attnlab/plan.py), not a string-keyed dict."""
    import dataclasses

    from attnlab.plan import BenchPlan, DraftPlan, ModelSource, Precision, RunPlan, plan_dict

    plan = _validate("draft=self", "draft.layers=[1,0]", "bench.repeats=4", "+model.overrides.num_layers=2")
    assert isinstance(plan, RunPlan) and dataclasses.is_dataclass(plan)
    assert isinstance(plan.model, ModelSource) and isinstance(plan.draft, DraftPlan)
    assert isinstance(plan.precision, Precision) and isinstance(plan.bench, BenchPlan)
    assert plan.draft.layers == (0, 1) and plan.bench.repeats == 4 and plan.workload.categories == ()
    assert plan.model.overrides["num_layers"] == 2
    for obj, name, value in ((plan, "device", "cuda"), (plan.spec, "k", 8), (plan.bench, "repeats", 1),
                             (plan.precision, "target", "bf16")):
        with pytest.raises(dataclasses.FrozenInstanceError):
            setattr(obj, name, value)
    with pytest.raises(TypeError):
        plan.model.overrides["num_layers"] = 3  # a read-only mapping: the plan cannot change through it
    d = plan_dict(plan)
    assert d["draft"]["layers"] == [0, 1] and d["model"]["overrides"] == {"num_layers": 2}
    with pytest.raises(TypeError):
        plan["k"]  # no string keys: not subscriptable


@pytest.mark.parametrize("overrides,needle", [
    (["kv.page_size=0"], "kv.page_size=0"),
    (["kv.num_pages=0"], "kv.num_pages=0"),
    (["spec.num_draft_tokens=0"], "spec.num_draft_tokens=0"),
    (["spec.num_draft_tokens=-1", "draft=self"], "spec.num_draft_tokens=-1"),
    (["spec.top_p=0"], "spec.top_p"),
    (["spec.temperature=-1"], "spec.temperature"),
    (["precision.target=fp8_e4m3"], "precision.target"),
    (["precision.kv_target=int4"], "precision.kv_target='int4'"),
    (["verify=flashinfer"], "verify=flashinfer"),
    (["draft=self", "backend=fa"], "backend=fa"),
    (["verify.name=nope"], "verify.name='nope'"),
    (["device=tpu"], "device='tpu'"),
    (["workload=hf"], "workload.path is required"),
    (["workload=hf", "workload.path=missing.jsonl"], "no such file"),
    (["workload.num_prompts=0"], "workload.num_prompts=0"),
    (["model.path=/nope/model.gguf"], "model.path"),
    (["model.name=nope"], "unknown model preset"),
    (["draft=self", "draft.layers=[]"], "draft.layers"),
    (["engine.cuda_graph=true"], "engine.cuda_graph"),
    (["engine.fused_ops=true"], "engine.fused_ops=true runs Triton kernels and needs device=cuda"),
    (["engine.fused_ops=yes"], "engine.fused_ops='yes': choose true, false or auto"),
    (["engine.fused_ops=1"], "engine.fused_ops=1: choose true, false or auto"),
    (["engine.fused_ops=[auto]"], "engine.fused_ops="),
    (["engine.pdl=true"], "engine.pdl=true"),
    (["engine.gemm=triton"], "engine.gemm=triton"),
    (["engine.gemm=triton_attn"], "engine.gemm=triton_attn runs attnlab's Triton GEMM and needs device=cuda"),
    (["engine.gemm=cutlass"], "engine.gemm='cutlass'"),
    (["engine.gemm_split=lean"], "engine.gemm_split='lean'"),
    (["engine.gemm_split=lean/ticket"], "engine.gemm_split=lean/ticket splits attnlab's Triton GEMM"),
    (["engine.gemm_split=fill/ticket"], "engine.gemm_split=fill/ticket splits attnlab's Triton GEMM"),  # the default
    (["engine.gemm_prefetch=4"], "engine.gemm_prefetch=4 prefetches attnlab's Triton GEMM weights"),
    (["engine.gemm_prefetch=17"], "engine.gemm_prefetch=17: an integer"),
    (["engine.gemm_prefetch=-1"], "engine.gemm_prefetch=-1: an integer"),
    (["precision.fp8_gemm=weight_only"], "precision.fp8_gemm=weight_only"),  # bf16 draft weights
    (["precision.fp8_gemm=w4a16"], "precision.fp8_gemm='w4a16'"),
    (["precision.fp8_lm_head=true"], "precision.fp8_lm_head=true: applies to fp8 draft weights only"),
    (["precision.fp8_mma=f16"], "precision.fp8_mma=f16: the MMA of weight-only fp8 GEMMs"),
    (["precision.fp8_mma=fp8"], "precision.fp8_mma='fp8': unknown value"),
    (["precision=fp8w-draft"], "precision.draft='fp8_e4m3'"),  # CPU: no fp8 matmul
    (["engine.decode_steps_per_sync=0"], "engine.decode_steps_per_sync=0"),
    (["engine.decode_steps_per_sync=4", "spec.temperature=0.7"], "engine.decode_steps_per_sync=4"),
    (["logger.mode=sometimes"], "logger.mode"),
    (["bench.repeats=0"], "bench.repeats=0"),
    (["bench.noisy_ratio=0.5"], "bench.noisy_ratio=0.5"),
    (["bench.cold=lukewarm"], "bench.cold='lukewarm'"),
    (["workload.arrival=trickle"], "workload.arrival"),
    (["workload.arrival=poisson"], "workload.rate=None"),
    (["workload.arrival=poisson", "workload.rate=0"], "workload.rate=0"),
    (["workload.arrival=closed"], "workload.concurrency=None"),
    (["workload.arrival=all_at_once", "workload.rate=4"], "only arrival=poisson"),
    (["workload.arrival=poisson", "workload.rate=4", "workload.concurrency=2"], "only arrival=closed"),
    (["workload.arrival=closed", "workload.concurrency=2", "workload.warmup_requests=6"], "warmup_requests=6"),
    (["workload.warmup_requests=1"], "for the serving arrivals only"),
    (["workload.arrival=all_at_once", "workload.slo_ttft_ms=-1"], "workload.slo_ttft_ms=-1"),
    (["workload.arrival=all_at_once", "engine.kv_policy=lru"], "engine.kv_policy"),
    (["workload.split=test"], "workload.split=test: workload=builtin has no splits"),
    (["workload=synthetic", "workload.split=heldout"], "workload.split=heldout: workload=synthetic has no splits"),
])
def test_validation_errors_name_the_field(overrides, needle):
    with pytest.raises(ConfigError) as e:
        _validate(*overrides)
    assert needle in str(e.value) and "\n" not in str(e.value)


def test_split_is_read_only_where_a_workload_has_splits():
    """workload.split on a workload without splits is refused (above); its schema default is not a request."""
    assert _validate("workload.split=train").workload.kind == "builtin"
    assert _validate("workload=humaneval").workload.split == "train"


def test_warmup_lengths_without_warmup_generations_warn(caplog):
    """warmup.lengths under a plan that runs no warmup generations (none, graphs) is one warning line, not an error
    (experiment=hybrid_routing sets lengths for the plans that read them); the default value says nothing."""
    with caplog.at_level(logging.WARNING, logger="attnlab"):
        _validate("warmup.lengths=[64,128]")
    assert [r.getMessage() for r in caplog.records] == [
        "warmup.lengths=[64, 128] is ignored: warmup=none runs no warmup generations (warmup=jit or full runs them)"]
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="attnlab"):
        _validate("warmup.lengths=[16]")
        _validate("warmup=jit", "warmup.lengths=[64]")
    assert not caplog.records


def test_wandb_online_needs_an_api_key(tmp_path, monkeypatch):
    """logger.mode=online with no W&B API key is refused by validate (so by the dry run too), not by wandb.init once
    the run has started; offline and the jsonl logger need none."""
    for var in ("WANDB_API_KEY", "WANDB_IDENTITY_TOKEN_FILE", "WANDB_BASE_URL"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("NETRC", str(tmp_path / "netrc"))
    monkeypatch.setenv("WANDB_CONFIG_DIR", str(tmp_path / "wandb"))
    with pytest.raises(ConfigError, match=r"^logger.mode=online: no W&B API key .* has no entry for api.wandb.ai\); "
                                          r"set WANDB_API_KEY .* or use logger.mode=offline"):
        _validate("logger.mode=online")
    assert _validate("logger.mode=offline").logger.mode == "offline"
    assert _validate("logger=jsonl", "logger.mode=online").logger.kind == "jsonl"
    monkeypatch.setenv("WANDB_API_KEY", "k" * 40)
    assert _validate("logger.mode=online").logger.mode == "online"


def test_ngram_drafter_ignores_the_draft_backend():
    # the draft side runs no attention with ngram: a GPU-only draft backend is fine on CPU
    assert _validate("backend=flashinfer").k == 4


def test_precision_auto_on_gpu_is_bf16():
    p = resolve_precision(OmegaConf.create({"target": "auto", "draft": "auto", "kv_target": "auto",
                                            "kv_draft": "fp8_e4m3"}), "cuda")
    assert p == {"target": "bf16", "draft": "bf16", "kv_target": "bf16", "kv_draft": "fp8_e4m3"}


def test_self_draft_layers():
    assert self_draft_layers(None, 30) is None
    assert self_draft_layers(3, 30) == [0, 1, 2]
    assert self_draft_layers([5, 1], 30) == [1, 5]
    for bad in (0, 31, [30], [1, 1], True):
        with pytest.raises(ConfigError):
            self_draft_layers(bad, 30)


def test_every_yaml_is_documented():
    """Each group option starts with a comment saying what it is (the docs rely on it)."""
    for path in Path(CONF_DIR).glob("*/*.yaml"):
        if path.parent.name != "model":
            assert path.read_text().lstrip().startswith("#"), path


def test_serving_arrivals_reach_the_plan():
    plan = _validate("workload.arrival=poisson", "workload.rate=2.5", "workload.warmup_requests=1",
                     "engine.kv_policy=preempt")
    w = plan.workload
    assert w.serving and (w.arrival, w.rate, w.warmup_requests) == ("poisson", 2.5, 1)
    assert plan.engine.kv_policy == "preempt"
    assert not _validate().workload.serving  # arrival=batch: the fixed batches of the speculative loop alone


def test_fp8_mma_sets_the_gemms_fp8_mode():
    """precision.fp8_mma reaches the plan and, through sides.set_process_wide, the GEMM's process-wide fp8 mode (f16:
    gemm's half; bf16: its exact mode), for weight-only fp8 draft weights only (a CPU plan edited: fp8 weights need a
    GPU to validate); every plan sets it, so a run after another in one process (a sweep) starts from its own. auto
    (the default) resolves to f16 for weight-only fp8 GEMMs, else bf16."""
    from dataclasses import replace

    from attnlab.kernels import gemm
    from attnlab.sides import set_process_wide

    plan = _validate()
    assert plan.precision.fp8_mma == "bf16"
    fp8 = replace(plan, precision=replace(plan.precision, draft="fp8_e4m3", fp8_gemm="weight_only", fp8_mma="f16"))
    before = gemm.fp8_mode()
    try:
        set_process_wide(fp8)
        assert gemm.fp8_mode() == "half"
        set_process_wide(replace(fp8, precision=replace(fp8.precision, fp8_mma="bf16")))
        assert gemm.fp8_mode() == gemm.EXACT_FP8_MODE == "wide"
        gemm.set_fp8_mode("half")
        set_process_wide(plan)  # a bf16 draft's plan after it: the exact mode again
        assert gemm.fp8_mode() == gemm.EXACT_FP8_MODE
        assert gemm.DEFAULT_FP8_MODE == "half"  # the kernel's own default (bench arms): what auto picks
    finally:
        gemm.set_fp8_mode(before)
    auto = [replace(plan.precision, draft="fp8_e4m3", fp8_gemm=g, fp8_mma="auto").fp8_mma for g in ("weight_only", "w8a8")]
    assert auto == ["f16", "bf16"]
    assert [replace(plan.precision, fp8_gemm="weight_only", fp8_mma=m).fp8_mma for m in ("bf16", "f16")] == ["bf16", "f16"]


# what a CPU cannot run: the experiments that need a GPU are planned here up to these checks, and no further
_NEEDS_A_GPU = ("does not support device 'cpu'", "need a CUDA GPU")


@pytest.mark.parametrize("experiment", sorted(p.stem for p in (CONF_DIR / "experiment").glob("*.yaml")))
def test_every_experiment_plans_every_job_of_its_sweep(experiment, capsys):
    """Each conf/experiment/*.yaml as a sweep (``-m experiment=NAME``, its own grid included) passes the dry run on
    this CPU but for the checks only a GPU passes. Until 2026-12-06 long_context asked for 16k prompts of
    SmolLM2-135M, which holds 8,192 positions: refused at validation on every machine."""
    from attnlab.dryrun import main

    code = main([f"experiment={experiment}", "logger=none"], multirun=True)
    out, err = capsys.readouterr()
    errors = [line for line in err.splitlines() if line.startswith("attnlab: error")]
    assert [e for e in errors if not any(n in e for n in _NEEDS_A_GPU)] == [], err
    assert code == (2 if errors else 0) and "attnlab dry run: " in out
