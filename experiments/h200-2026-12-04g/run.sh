# The H200 calls of the 2026-12-04g sitting (issue 16: FlashInfer verify without split-KV where the split does not pay,
# one CUDA graph per split choice), one part a call, in the order they ran:
#   FB=.gpu/fi bash experiments/h200-2026-12-04g/run.sh N      (carry [".gpu/fi"] on a fresh machine)
# Each part's output: $OUT/runN.log (the console, tee'd) and resultsN.tgz (the logs and bench tables; at most 8 files
# come back from a call).
set -u -o pipefail
PART=${1:?part 1}  # parts 2-3 (not run: no machine) moved to ../h200-2026-12-04h/run.sh 1-2
. experiments/sitting.sh  # OUT, LOGS, step, install_fb, gpu_tests, pdl, fi_jit, the environment, the call's log, PY
case $PART in
1)  # a fresh machine: where FlashInfer's split-KV pays in a graph-mode fa2 verify, and where one launch is faster
  install_fb
  FI="flashinfer,flashinfer/verify_split_kv=false"
  fi_jit compile1 260 "$FI"  # (as run: the same command, inline)
  step "issue 16: FlashInfer verify split-KV on / off vs its decode: batch 1-64 x context 512-2048, 50 runs a replay"
  timeout 300 $PY -m attnlab.bench.kernels --phases decode,verify --batches 1,4,16,64 --contexts 512,1024,2048 \
    --ks 4 --models smollm2,llama8b --backends $FI --baseline flashinfer --repeats 3 --out "$OUT/split1" \
    > $LOGS/split1.log 2>&1
  echo "exit code $?"; grep -E "^\|" $LOGS/split1.log
  ;;
esac
