# The H200 calls of the 2026-12-04h sitting, one part a call, back to back on one machine (README.md here):
#   FB=.gpu/fi bash experiments/h200-2026-12-04h/run.sh N      (carry [".gpu/fi"]; part 1 on a fresh machine)
#   1  install; FlashInfer JIT; GPU tests: verify_split_kv=auto (12-04g's owed call 2: both plans against the reference,
#      the engine's graph per split choice, graphs, kept plans, hybrid) and draft=eagle with fp8 weights (graphs, both
#      backends, fused or not, weight-only + e4m3 LM head and W8A8)
#   2  issue 16: bench.kernels before (split always) / after (auto), batch 1/16/64 x 512/1024/4096; bench.spec end to
#      end, SmolLM2 shapes, random weights, self-draft on triton, flashinfer verify split always / auto, batch 1 / 16
#   3  issue 17: an EAGLE drafter with bf16 / fp8w / fp8wh weights, random weights and an untrained head of the
#      target's shapes (--eagle-head random), gemm engine + PDL, batch 1, k 4: SmolLM2, Llama-3.2-1B, Llama-3.1-8B
# Each part's output: $OUT/runN.log (the console, tee'd) and resultsN.tgz (logs and bench tables; at most 8 files come
# back from a call). Each step has its own timeout inside the 10-minute limit of a call.
set -u -o pipefail
PART=${1:?part 1, 2 or 3}
. experiments/sitting.sh  # OUT, LOGS, step, install_fb, gpu_tests, fi_jit, the environment, the call's log, PY
pack() {  # every file of this call but its console log into one archive
  tar czf "/tmp/results$PART.tgz" -C "$OUT" --exclude="run$PART.log" . && find "$OUT" -type f ! -name "run$PART.log" -delete
  mv "/tmp/results$PART.tgz" "$OUT/"
}
FI="flashinfer,flashinfer/verify_split_kv=auto"
case $PART in
1)
  install_fb
  fi_jit compile1 150 "$FI"
  step "GPU tests: verify_split_kv=auto (both plans, a graph per split choice, graphs, kept plans, hybrid)"
  gpu_tests tests1 270 tests/backends/test_flashinfer_whole.py tests/backends/test_flashinfer_keep.py \
    tests/backends/test_hybrid.py tests/integration/test_gpu_engine.py \
    "tests/backends/test_flashinfer.py::test_gpu_cuda_graph_capture_replay" \
    "tests/backends/test_flashinfer.py::test_gpu_kernel_families" -m gpu -k "flashinfer or routing"
  step "GPU tests: draft=eagle with fp8 weights in graphs (triton and flashinfer, fused or not)"
  gpu_tests tests1e 120 tests/integration/test_gpu_engine.py -m gpu -k "fp8_eagle or eagle_graphs"
  pack
  ;;
2)
  step "issue 16: FlashInfer verify / decode before (split always) and after (auto), batch 1/16/64 x 512/1024/4096"
  timeout 150 $PY -m attnlab.bench.kernels --phases decode,verify --batches 1,16,64 --contexts 512,1024,4096 --ks 4 \
    --models smollm2,llama8b --backends $FI --baseline flashinfer --repeats 3 --out "$OUT/split2" > $LOGS/split2.log 2>&1
  echo "exit code $?"; grep -E "^\|" $LOGS/split2.log
  step "issue 16: end to end, SmolLM2 shapes (random weights), triton drafts, flashinfer verifies, batch 1 / 16"
  timeout 300 $PY -m attnlab.bench.spec --device cuda --skip-hf --weights random --drafters self --k 4 \
    --batch 1,16 --backends $FI --draft-backends triton --num-prompts 16 --new 64 --repeats 3 \
    --out "$OUT/spec2" > $LOGS/spec2.log 2>&1
  echo "exit code $?"; grep -E "^\|" $LOGS/spec2.log | head -40
  cp $LOGS/split2.log $LOGS/spec2.log "$OUT/" 2>/dev/null
  pack
  ;;
3)
  for model in smollm2-135m llama-3.2-1b llama-3.1-8b; do
    rounds=5; [ $model = llama-3.1-8b ] && rounds=3  # 8B: ~8 ms an iteration; 3 rounds keep the step under 170 s
    step "issue 17: EAGLE drafter bf16 / fp8w / fp8wh, $model shapes, random weights and head, batch 1, k 4"
    timeout 170 $PY -m attnlab.bench.spec --device cuda --skip-hf --model $model --weights random --eagle-head random \
      --drafters eagle --draft-weights bf16,fp8w,fp8wh --dtype bf16 --k 4 --batch 1 --backends triton --gemm triton \
      --pdl --ignore-eos --num-prompts 4 --new 96 --repeats $rounds --out "$OUT/eagle3-$model" > $LOGS/eagle3-$model.log 2>&1
    echo "exit code $?"; grep -E "^\||^- eagle" $LOGS/eagle3-$model.log
  done
  pack
  ;;
esac
