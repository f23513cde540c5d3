"""attnlab.bench.profile's grouping of a step's kernels (the profiling itself needs a GPU)."""

import pytest

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
