# The H200 calls of the 2026-12-04g sitting (issue 16: FlashInfer verify without split-KV where the split does not pay,
# one CUDA graph per split choice), one part a call, in the order they ran:
#   FB=.gpu/fi bash experiments/h200-2026-12-04g/run.sh N      (carry [".gpu/fi"] on a fresh machine)
# Each part's output: $OUT/runN.log (the console, tee'd) and resultsN.tgz (the logs and bench tables; at most 8 files
# come back from a call).
set -u -o pipefail
PART=${1:?part 1}
. experiments/sitting.sh  # OUT, LOGS, step, install_fb, gpu_tests, pdl, fi_jit, the environment, the call's log, PY
pack() {  # every file of this call but its console log into one archive
  tar czf "/tmp/results$PART.tgz" -C "$OUT" --exclude="run$PART.log" . && find "$OUT" -type f ! -name "run$PART.log" -delete
  mv "/tmp/results$PART.tgz" "$OUT/"
}
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
2)  # a fresh machine: verify_split_kv=auto (a graph per split choice), its GPU tests, before / after. Not run in the
    # 12-04g sitting (the machine stopped answering at its start and no other was lent): the next session's first call
  install_fb
  FI="flashinfer,flashinfer/verify_split_kv=auto"
  fi_jit compile2 150 "$FI"
  step "GPU tests: both plans against the reference, the engine's graph per split choice, graphs, kept plans, hybrid"
  gpu_tests tests2 280 tests/backends/test_flashinfer_whole.py tests/backends/test_flashinfer_keep.py \
    tests/backends/test_hybrid.py tests/integration/test_gpu_engine.py \
    "tests/backends/test_flashinfer.py::test_gpu_cuda_graph_capture_replay" \
    "tests/backends/test_flashinfer.py::test_gpu_kernel_families" -m gpu -k "flashinfer or routing"
  step "issue 16: FlashInfer verify / decode before (split always) and after (auto), batch 1/16/64 x 512/1024/4096"
  timeout 150 $PY -m attnlab.bench.kernels --phases decode,verify --batches 1,16,64 --contexts 512,1024,4096 --ks 4 \
    --models smollm2,llama8b --backends $FI --baseline flashinfer --repeats 3 \
    --out "$OUT/split2" > $LOGS/split2.log 2>&1
  echo "exit code $?"; grep -E "^\|" $LOGS/split2.log
  cp $LOGS/split2.log "$OUT/" 2>/dev/null
  pack
  ;;
3)  # right after part 2, on its warm machine (flashinfer installed and compiled): the end-to-end before / after
  FI="flashinfer,flashinfer/verify_split_kv=auto"
  step "issue 16: end to end, SmolLM2 shapes (random weights), triton drafts, flashinfer verifies, batch 1 / 16"
  timeout 300 $PY -m attnlab.bench.spec --device cuda --skip-hf --weights random --drafters self --k 4 \
    --batch 1,16 --backends $FI --draft-backends triton --num-prompts 16 --new 64 --repeats 3 \
    --out "$OUT/spec3" > $LOGS/spec3.log 2>&1
  echo "exit code $?"; grep -E "^\|" $LOGS/spec3.log | head -40
  cp $LOGS/spec3.log "$OUT/" 2>/dev/null
  pack
  ;;
esac
