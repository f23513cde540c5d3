"""attnlab.bench.profile's grouping of a step's kernels (the profiling itself needs a GPU)."""

import pytest
import torch

from attnlab.bench.profile import kernel_table, role_of


@pytest.mark.parametrize("name,role", [
    ("_gemm_kernel", "attnlab GEMM"), ("_reduce_kernel", "attnlab GEMM"),
    ("_decode_kernel", "attention"), ("_merge_kernel", "split merge"),
    ("_add_rmsnorm_kernel", "RMSNorm (+ residual)"), ("_rope_qk_kernel", "RoPE"), ("_silu_mul_kernel", "SiLU-mul"),
    ("_store_kv_kernel", "KV store"),
    ("nvjet_tst_64x8_64x16_4x1_v_bz_TNT", "cuBLAS GEMM"), ("sm90_xmma_gemm_bf16bf16_bf16f32", "cuBLAS GEMM"),
    ("void at::native::reduce_kernel<512, 1, at::native::ReduceOp<float, ArgMaxOps>>", "argmax / reductions"),
    ("void at::native::vectorized_elementwise_kernel<4, CUDAFunctor_add<float>>", "torch elementwise"),
    ("void at::native::index_elementwise_kernel<128, 4>", "gather / embedding / copies"),
    ("void flashinfer::BatchPrefillWithPagedKVCacheKernel<KernelTraits<...>>", "attention"),
    ("void flashinfer::BatchDecodeWithPagedKVCacheKernel<Params>", "attention"),
    ("void flashinfer::PrefillWithKVCacheKernel<CollectiveMainloop>", "attention"),
    ("kernel_mha_impl", "attention"), ("kernel_mha", "attention"),
    ("void flashinfer::MergeStatesLargeNumIndexSetsKernel<bf16>", "split merge"),
    ("void flashinfer::PersistentVariableLengthMergeStatesKernel<bf16>", "split merge"),
    ("void flashinfer::MergeStateKernel<bf16>", "split merge"),
    ("void flash_fwd_splitkv_combine_kernel<Kernel_traits>", "split merge"),
    ("void flash::FlashAttnFwdCombine<Shape>", "split merge"), ("void flash::flash_fwd_kernel<Traits>", "attention"),
    ("mystery", "other"),
])
def test_roles(name, role):
    assert role_of(name) == role


def test_kernel_table_per_step_and_shares():
    rows = kernel_table([("_gemm_kernel", 40, 400.0), ("_reduce_kernel", 20, 100.0), ("_decode_kernel", 20, 300.0),
                         ("mystery", 2, 200.0)], steps=2)
    assert [r["role"] for r in rows] == ["attnlab GEMM", "attention", "other"]
    g = rows[0]
    assert g["launches_per_step"] == 30 and g["us_per_step"] == 250 and g["share"] == pytest.approx(0.5)
    assert g["us_per_launch"] == pytest.approx(500 / 60) and g["kernels"] == ["_gemm_kernel", "_reduce_kernel"]
    assert sum(r["share"] for r in rows) == pytest.approx(1.0)
    assert [(k["name"], k["launches_per_step"], k["us_per_step"]) for k in g["by_kernel"]] == [
        ("_gemm_kernel", 20, 200), ("_reduce_kernel", 10, 50)]
    from attnlab.bench.profile import table_lines

    lines = table_lines(rows)  # a role, then its kernels where it has several
    assert lines[0].startswith("| attnlab GEMM | 30.0 | 250.0 | 50% |")
    assert "_reduce_kernel | 10.0 | 50.0 | | 5.00 |" in lines[2] and lines[3].startswith("| attention |")
    with pytest.raises(ValueError, match="steps"):
        kernel_table([], steps=0)


def _fake_gpu(monkeypatch, fail_model=None):
    """bench.profile's main on CPU: its GPU parts replaced by fakes that log what ran, in order; a wall time taken
    after any profile comes out 1.15x slower (what CUPTI left attached did to the host on an H100, 2026-12-06)."""
    import types

    from attnlab.bench import e2e, kernels, profile
    from attnlab.kernels import pdl

    log, state = [], {"profiled": False}

    def side(model, backend, batch, graphs, max_context, fused=False, weights="bf16"):
        if model == fail_model:
            raise RuntimeError("no such side")
        log.append(("side", model, fused))
        return types.SimpleNamespace(model=model)

    def wall(dec, prompts, steps):
        log.append(("wall", dec))
        return 1.15 if state["profiled"] else 1.0  # ms a step

    def prof(dec, prompts, steps):
        log.append(("profile", dec))
        state["profiled"] = True
        return [("_gemm_kernel", 2 * steps, 600.0 * steps), ("_decode_kernel", steps, 200.0 * steps)]

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *a: "fake GPU")
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: None)
    monkeypatch.setattr(kernels, "copy_bandwidth_gb_s", lambda *a, **k: 1000.0)
    monkeypatch.setattr(kernels, "versions", lambda: {"torch": "x"})
    monkeypatch.setattr(e2e, "side", side)
    monkeypatch.setattr(e2e, "set_host_path", lambda rs, host: log.append(("capture", rs.model)))
    monkeypatch.setattr(e2e, "step_weight_bytes", lambda model: 10 ** 6)
    monkeypatch.setattr(profile, "_decoder", lambda rs, batch: ((rs.model, pdl.enabled()), "prompts"))
    monkeypatch.setattr(profile, "_wall_ms", wall)
    monkeypatch.setattr(profile, "_profile_side", prof)
    monkeypatch.setattr(pdl, "unsupported", lambda *a: None)
    monkeypatch.setattr(pdl, "set_enabled", lambda on, device=None: pdl.__dict__.__setitem__("_enabled", on))
    return log


def test_every_wall_time_before_the_first_profile(monkeypatch, tmp_path):
    import json

    from attnlab.bench.profile import main

    log = _fake_gpu(monkeypatch)
    rc = main(["--models", "m1,m2", "--engines", "fused", "--pdl", "off,on", "--steps", "4",
               "--out", str(tmp_path / "p")])
    assert rc == 0
    kinds = [e[0] for e in log if e[0] in ("wall", "profile")]
    first = kinds.index("profile")
    assert kinds[:first] == ["wall"] * 4  # the four configurations timed, then profiled (each re-timed after)
    assert kinds[first:] == ["profile", "wall"] * 4
    assert sum(e[0] == "side" for e in log) == 8  # a side per configuration in each pass (none re-captured after another)
    # each configuration under its own PDL setting, in both passes
    assert [e[1] for e in log if e[0] == "wall"][:4] == [("m1", False), ("m1", True), ("m2", False), ("m2", True)]
    res = json.loads((tmp_path / "p.json").read_text())
    runs = res["runs"]
    assert [(r["model"], r["pdl"]) for r in runs] == [("m1", "off"), ("m1", "on"), ("m2", "off"), ("m2", "on")]
    assert all(r["wall_ms_per_step"] == 1.0 for r in runs)  # none timed after a profile
    assert all(r["wall_ms_per_step_after_profiles"] == 1.15 for r in runs)
    assert runs[0]["kernel_us_per_step"] == 800.0 and runs[0]["launches_per_step"] == 3
    assert runs[0]["idle_share"] == pytest.approx(0.2)  # against the wall before any profile
    md = (tmp_path / "p.md").read_text()
    assert md.count("step 1000 us wall (1150 after profiles), 800 us in 3 kernels -> idle 20%") == 4


def test_a_failing_configuration_keeps_the_others(monkeypatch, tmp_path):
    import json

    from attnlab.bench.profile import main

    _fake_gpu(monkeypatch, fail_model="bad")
    rc = main(["--models", "bad,m2", "--engines", "fused", "--pdl", "off", "--steps", "4",
               "--out", str(tmp_path / "p")])
    assert rc == 1
    runs = json.loads((tmp_path / "p.json").read_text())["runs"]
    assert runs[0]["model"] == "bad" and "no such side" in runs[0]["error"]
    assert runs[1]["model"] == "m2" and runs[1]["wall_ms_per_step"] == 1.0


@pytest.mark.parametrize("args", [["--pdl", "off,off"], ["--engines", "fused,fused"], ["--models", "m1,m1"]])
def test_a_configuration_listed_twice_is_refused(args, capsys):
    from attnlab.bench.profile import main

    with pytest.raises(SystemExit) as e:
        main(args)
    assert e.value.code == 2 and "twice" in capsys.readouterr().err


def test_a_configuration_whose_wall_failed_is_not_profiled(monkeypatch, tmp_path):
    import json

    from attnlab.bench import profile
    from attnlab.bench.profile import main

    log = _fake_gpu(monkeypatch)
    real = profile._wall_ms

    def wall(dec, prompts, steps):
        if dec == ("m1", True):
            raise RuntimeError("capture failed")
        return real(dec, prompts, steps)
    monkeypatch.setattr(profile, "_wall_ms", wall)
    assert main(["--models", "m1", "--engines", "fused", "--pdl", "off,on", "--out", str(tmp_path / "p")]) == 1
    assert [e[1] for e in log if e[0] == "profile"] == [("m1", False)]  # PDL on failed in the first pass: skipped
    runs = json.loads((tmp_path / "p.json").read_text())["runs"]
    assert runs[0]["wall_ms_per_step"] == 1.0 and "capture failed" in runs[1]["error"]
