# Sourced by the H200 sittings' run.sh files, after PART is set: one GPU call's output folder ($OUT, which comes
# back; at most 8 files), its logs (/tmp/logs, which do not), the bundle installs' paths, a step timer, the log of the
# whole call ($OUT/run$PART.log, tee'd: it comes back even when the call times out), and the bench.spec command line.
set -u -o pipefail
OUT=${OUT:-/tmp/out}; LOGS=/tmp/logs; mkdir -p "$OUT" "$LOGS" /opt/site /opt/models /opt/data
T0=$(date +%s); step() { echo "=== [t+$(( $(date +%s) - T0 ))s] $*"; }
export PYTHONUNBUFFERED=1 PYTHONPATH=/opt/site:$PWD TOKENIZERS_PARALLELISM=false WANDB_MODE=disabled
exec > >(tee "$OUT/run$PART.log") 2>&1
PY=python3
DATA=/opt/data/sharegpt.jsonl.gz  # the 212 held-out ShareGPT first turns (never trained on), from .gpu/c
S="$PY -m attnlab.bench.spec --device cuda --skip-hf --fused-ops"
# install_fb: install .gpu/fb (core + flashinfer + fa3_fwd; FB=<folder> another bundle of the same kind, e.g. .gpu/fi
# without fa3_fwd) and print the GPU and the library versions (a call's first step on a fresh machine).
install_fb() {
  step "install ${FB:-.gpu/fb}"; bash ${FB:-.gpu/fb}/install.sh | tail -1
  nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader
  $PY -c "import torch, triton, flashinfer; print('torch', torch.__version__, 'triton', triton.__version__, \
'flashinfer', flashinfer.__version__)"
}
# floor_rounds ARMS: ROUNDS (3) floor rounds of bench.kernels arms ARMS against c101f91, the decode floor's "before"
# (fused-merge-auto/run.sh 8, which installs .gpu/fk: a no-op once a machine has it; needs .old/attnlab carried), one
# folder a round ($OUT/floorN), FLOOR_SECS (150) each; the decode rows on the console.
floor_rounds() {
  test -d .old/attnlab || { echo ".old/attnlab missing: carry it (git archive c101f91 attnlab | tar -x -C .old)"; exit 1; }
  local r
  for r in $(seq "${ROUNDS:-3}"); do
    ARMS=$1 FLOOR_SECS=${FLOOR_SECS:-150} OUT=$OUT/floor$r bash experiments/fused-merge-auto/run.sh 8 > /dev/null
    sleep 1; step "floor round $r"; grep -E "^decode|exit code" "$OUT/floor$r/run8.log"
  done
}
# pack: every file of this call in $OUT but its console log into one archive, resultsPART.tgz (at most 8 files come
# back from a call)
pack() {
  tar czf "/tmp/results$PART.tgz" -C "$OUT" --exclude="run$PART.log" . && find "$OUT" -type f ! -name "run$PART.log" -delete
  mv "/tmp/results$PART.tgz" "$OUT/"
}
# gpu_tests NAME SECONDS PYTEST-ARGS...: the GPU tests of one step under a timeout, their log as $OUT/NAME.log (it
# comes back), the summary lines on the console.
gpu_tests() {
  local name=$1 secs=$2; shift 2
  timeout "$secs" $PY -m pytest -q -p no:cacheprovider -ra --durations=6 "$@" > "$LOGS/$name.log" 2>&1
  echo "exit code $?"; grep -E "passed|failed|FAILED|Error|s call" "$LOGS/$name.log" | tail -n 14; cp "$LOGS/$name.log" "$OUT/"
}
# pdl NAME SECS MODELS WEIGHTS ARMS: bench.pdl on the gemm engine, batch 1, 128 new tokens, $ROUNDS rounds (4), its
# tables on the console and NAME.md / NAME.json in $OUT.
pdl() {
  local name=$1 secs=$2 models=$3 weights=$4 arms=$5
  timeout "$secs" $PY -m attnlab.bench.pdl --models "$models" --engines gemm --rounds "${ROUNDS:-4}" --new 128 \
    --weights "$weights" --gemm-splits "$arms" --out "$OUT/$name" > $LOGS/$name.log 2>&1
  echo "exit code $?"; grep -E "^\|" $LOGS/$name.log
}
# fi_jit NAME SECS BACKENDS: compile FlashInfer's decode and fa2 verify kernels (SmolLM2 and Llama-8B shapes) for these
# bench.kernels backend specs, untimed (JIT: 15-100 s a variant on a fresh machine); its log as $LOGS/NAME.log.
fi_jit() {
  local name=$1 secs=$2 backends=$3
  step "FlashInfer JIT: decode and fa2 verify, SmolLM2 and Llama-8B shapes"
  timeout "$secs" $PY -m attnlab.bench.kernels --compile-only --phases decode,verify --contexts 512 --ks 4 \
    --models smollm2,llama8b --backends "$backends" > $LOGS/$name.log 2>&1
  echo "exit code $?"; tail -n 1 $LOGS/$name.log
}
# rows_grid NAME SECS BACKENDS: bench.kernels FlashInfer decode / verify for these backend specs, batch 1/2/4/8/16 x
# context 128/256/512/1024/4096 x k 2/4/8, one process a model (SmolLM2, then Llama-8B shapes: a timeout loses one
# model's table, not both), SECS each; NAME-MODEL.json / .md in $OUT, the logs in $LOGS.
rows_grid() {
  local name=$1 secs=$2 backends=$3 m
  for m in smollm2 llama8b; do
    step "FlashInfer verify / decode, $m shapes: $backends"
    timeout "$secs" $PY -m attnlab.bench.kernels --phases decode,verify --batches 1,2,4,8,16 \
      --contexts 128,256,512,1024,4096 --ks 2,4,8 --models $m --backends "$backends" --baseline flashinfer \
      --repeats 3 --out "$OUT/$name-$m" > $LOGS/$name-$m.log 2>&1
    echo "exit code $?"
  done
}
# jit_prefill NAME SECS: FlashInfer's long-prompt prefill (prefill_backend=auto: FA3 on Hopper), SmolLM2 shapes, compiled
# untimed (2026-12-05c: its JIT took 2.5 minutes inside a timed bench.spec job); its log as $LOGS/NAME.log.
jit_prefill() {
  timeout "$2" $PY -m attnlab.bench.kernels --compile-only --phases prefill --contexts 512 --batches 1 \
    --models smollm2 --backends flashinfer > $LOGS/$1.log 2>&1
  echo "$1 exit code $?"; tail -n 1 $LOGS/$1.log
}
# jit_fp8 NAME SECS: FlashInfer's e4m3-KV modules at SmolLM2 shapes (the tensor-core decode, the fa2 verify / prefill)
# compiled untimed by one small job, flashinfer on both sides of a self-draft, random weights; its log $LOGS/NAME.log.
jit_fp8() {
  timeout "$2" $PY -m attnlab device=cuda precision=fp8-kv draft=self draft.layers=2 backend=flashinfer \
    verify=flashinfer model.init=random logger=none parity=off workload.num_prompts=1 workload.max_new_tokens=8 \
    bench.repeats=1 hydra.run.dir=/tmp/jit-fp8 > $LOGS/$1.log 2>&1
  echo "$1 exit code $?"; grep -E "tau|Error|error" $LOGS/$1.log | tail -n 2
}
# settle: no JIT compiler of a step cut by its timeout left running (timeout ends the Python process, not the ninja /
# nvcc / cicc children FlashInfer's JIT spawned: on 2026-12-05 they ran on under the next step's timed runs), then
# the host load.
settle() {
  pkill -f -x "ninja.*|.*nvcc .*|.*cicc .*|.*ptxas .*" 2>/dev/null; sleep 2
  echo "host load: $(cut -d' ' -f1-3 /proc/loadavg)"
}
# c101 NAME REPS: c101f91's triton decode (.old, issue 16's floor's before; carried) at batch 1 / 16 x 4k
# (bench.kernels --quick), its rows on the console, NAME.md / NAME.json in $OUT
c101() {
  (cd .old && PYTHONPATH=/opt/site:$PWD timeout 60 $PY -m attnlab.bench.kernels --phases decode --quick \
    --backends triton --reps "$2" --out "$OUT/$1" > $LOGS/$1.log 2>&1; echo "c101f91 exit code $?")
  grep -E "^decode" $LOGS/$1.log
}
