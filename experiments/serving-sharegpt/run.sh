#!/usr/bin/env bash
# Issue 19's serving numbers on one H200 (README.md here): SmolLM2-135M on held-out ShareGPT prompts, served by
# the continuous-batching engine, in one device call (FlashInfer's JIT modules already warm).
#   bash experiments/serving-sharegpt/run.sh [bench]  preferred: one process (python -m attnlab.bench.serving), each
#                                                     side built and graphed once for every setting, four pairs
#   bash experiments/serving-sharegpt/run.sh all      the previous path: a Hydra job per (pair, drafter, load)
#   bash experiments/serving-sharegpt/run.sh closed   only its closed loop (~3 min)  | poisson: only its sweep (~2 min)
# Every multirun has its own timeout; together they stay under the 10-minute limit of one device call.
# Needs the bundles of experiments/h200-2026-12-01 (its .gpu/a+b: the GGUF, hydra, ShareGPT export; .gpu/c+6:
# flashinfer and its sm_90a kernels) installed, or DATA pointing at a `python -m attnlab.workloads.sharegpt
# --export` file. Output in $OUT: run.log; bench: serving.md, serving.json, serving_latency.png; the Hydra path:
# report.md + its PNGs, runs.tgz (every job folder).
# Request counts are cut to fit the time box (README: "what was cut"); raise N_* for a full run.
set -u -o pipefail
PART=${1:-bench}
OUT=${OUT:-/tmp/out}; RUNS=/tmp/serving-runs; mkdir -p "$OUT" "$RUNS"
T0=$(date +%s); step() { echo "=== [t+$(( $(date +%s) - T0 ))s] $*"; }
export PYTHONUNBUFFERED=1 PYTHONPATH=/opt/site:$PWD TOKENIZERS_PARALLELISM=false WANDB_MODE=disabled
exec > >(tee "$OUT/run.log") 2>&1
PY=python3
DATA=${DATA:-/opt/data/sharegpt.jsonl.gz}
GRAPHS=${GRAPHS:-false}  # engine.cuda_graph: eager by default (capture for 128-request buckets costs each job time)
# Common to every job: one timed repeat (+ its target-only baseline), no parity pass, a JIT warmup, ShareGPT's
# recorded answer lengths capped at 128 tokens, at most 128 running requests, a KV pool sized for all of them.
COMMON=(device=cuda model=smollm2-135m workload=sharegpt workload.path=$DATA workload.split=heldout
        workload.output_len=recorded workload.max_new_tokens=128 workload.max_prompt_len=1024
        workload.batch_size=128 warmup=jit bench.repeats=1 parity=off logger=jsonl engine.cuda_graph=$GRAPHS)
attn() {  # attn <name> <timeout s> <overrides...>: one multirun into $RUNS/<name>
  local name=$1 t=$2; shift 2
  timeout "$t" $PY -m attnlab -m "${COMMON[@]}" "$@" hydra.sweep.dir=$RUNS/$name > "$RUNS/$name.log" 2>&1
  echo "--- $name: rc=$? (124: its timeout), $(grep -l '"complete"' $RUNS/$name/*/status.json 2>/dev/null | wc -l) jobs complete"
  grep -E "serving \(|error" "$RUNS/$name.log" | tail -n 8
}

nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
$PY -c "import torch, triton, flashinfer; print('torch', torch.__version__, 'triton', triton.__version__, \
'flashinfer', flashinfer.__version__)"
[ -f "$DATA" ] || { echo "no ShareGPT export at $DATA (set DATA=...)"; exit 2; }

# Preferred: one process. Each verify backend's target is built once (CUDA graphs for q_len 1 and 5, buckets up to
# 128) and serves the target-only rows of every setting; each eagle draft backend is built once on it and serves
# every setting; one untimed warm run per (pair, drafter). Request counts: README "One process".
if [ "$PART" = bench ]; then
  step "bench.serving: eagle x 4 pairs and none x 2 verify backends, closed 1,8,32,100 and poisson 8,32,128"
  timeout 590 $PY -m attnlab.bench.serving --device cuda --model smollm2-135m --backends triton,flashinfer \
    --draft-backends triton,flashinfer --drafters eagle,none --k 4 --prompts "$DATA" --output-len recorded \
    --max-new 128 --closed 1,8,32,100 --poisson ${RATES:-8,32,128} --max-running 128 --out "$OUT/serving"
  echo "--- bench.serving: rc=$? (124: its timeout)"
  step "done"
  exit 0
fi

# Closed loop: C requests in the system, a new one as soon as one finishes; the first C are the warmup (their
# admission is the ramp-up), the rest are measured. eagle runs attention on both sides: all four pairs; ngram and
# none run none on the draft side (the backend is ignored there): the two verify backends.
declare -A N_CLOSED=([1]=6 [8]=24 [32]=64 [100]=160) T_EAGLE=([1]=40 [8]=40 [32]=45 [100]=60) \
  T_OTHER=([1]=30 [8]=30 [32]=35 [100]=45)
if [ "$PART" != poisson ]; then
  for C in 1 8 32 100; do
    N=${N_CLOSED[$C]}
    L=(workload.arrival=closed workload.concurrency=$C workload.num_prompts=$N workload.warmup_requests=$C)
    step "closed loop c=$C ($N requests, the first $C as warmup): eagle x 4 backend pairs"
    attn closed-c$C-eagle ${T_EAGLE[$C]} "${L[@]}" draft=eagle backend=triton,flashinfer verify=triton,flashinfer
    step "closed loop c=$C: ngram and none x 2 verify backends"
    attn closed-c$C-ngram-none ${T_OTHER[$C]} "${L[@]}" draft=ngram,none backend=triton verify=triton,flashinfer
  done
fi

# Poisson: open-loop arrivals at a fixed rate (seeded, the same schedule for every job), 8 warmup requests.
# 48 requests: at 8 req/s the arrivals alone span 6 s per timed run (spec and its target-only baseline).
RATES=${RATES:-8,32,128}
if [ "$PART" != closed ]; then
  step "poisson rates $RATES req/s (48 requests, 8 warmup): eagle / none x triton-triton and flashinfer-flashinfer"
  P=(workload.arrival=poisson workload.rate=$RATES workload.num_prompts=48 workload.warmup_requests=8)
  attn poisson-tt 90 "${P[@]}" draft=eagle,none backend=triton verify=triton
  attn poisson-ff 90 "${P[@]}" draft=eagle,none backend=flashinfer verify=flashinfer
fi

step "report: tables, latency_throughput.png, kv_timeline.png"
$PY -m attnlab.report $RUNS --out "$OUT" > /dev/null && sed -n '/## Serving/,$p' "$OUT/report.md" | head -n 70
$PY -m attnlab.report $RUNS --out /tmp/keys --keys arrival,request_rate,concurrency,output_tokens_per_s,\
ttft_ms_p50,ttft_ms_p99,tpot_ms_p50,itl_ms_p50,itl_ms_p99,kv_pages_used_max,kv_pages_used_max_draft,\
preemptions,speedup_vs_target_only,target_only_itl_ms_p50 > "$OUT/keys.md"
tar czf "$OUT/runs.tgz" -C /tmp serving-runs 2>/dev/null
step "done"
