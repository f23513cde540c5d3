# source me (from tools/flashinfer_aot): a private flashinfer 0.7.2.post1 + tvm-ffi 0.1.15.post2 under $FI_BUILD
# (site/, deps/, stubs/, curand/ as README.md says) and the project's CPU-torch venv
: "${FI_BUILD:=$HOME/fi-build}"; export FI_BUILD
export PYTHONPATH=${FI_BUILD}/site:${FI_BUILD}/deps
export FLASHINFER_CUDA_ARCH_LIST=9.0          # -> (9, "0a"): -gencode=arch=compute_90a,code=sm_90a
export FLASHINFER_WORKSPACE_BASE=${FI_BUILD}/ws
export CUDA_HOME=/usr/local/cuda
export FLASHINFER_EXTRA_LDFLAGS="-L${FI_BUILD}/stubs"   # libcuda.so stub (SONAME libcuda.so.1)
export MAX_JOBS=1 FLASHINFER_NVCC_THREADS=1
PY=${PY:-$(git rev-parse --show-toplevel)/.venv/bin/python}
export FLASHINFER_EXTRA_CUDAFLAGS="-isystem ${FI_BUILD}/curand/nvidia/cu13/include"  # curand_kernel.h (cutlass util headers; CUDA 13.0 curand 10.4.0.35)
