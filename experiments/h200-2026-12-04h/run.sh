# The H200 calls of the 2026-12-04h sitting, one part a call, back to back on one machine (README.md here):
#   FB=.gpu/fi bash experiments/h200-2026-12-04h/run.sh N      (carry [".gpu/fi"]; part 1 on a fresh machine)
#   (2026-12-05: reordered so that the first call, if it is the only one, decides issue 16's default and floor)
#   1  install; GPU tests: verify_split_kv=auto (12-04g's owed call 2: both plans against the reference, the engine's
#      graph per split choice, graphs, kept plans, hybrid) and verify_as_decode (the rows against the reference);
#      issue 16: bench.kernels split always / auto / decode rows, batch 1/16/64 x 512/1024/4096 (bench.verify_floor)
#   2  GPU tests of draft=eagle with fp8 weights (graphs, both backends, fused or not, weight-only + e4m3 LM head and
#      W8A8); the batch-1 Triton decode at 4k under 11 decode_tiles launches (the floor: 4.60 / 9.40 us); bench.spec end
#      to end, SmolLM2 shapes, random weights, self-draft on triton, the three flashinfer verifies, batch 1
#   3  issue 17: an EAGLE drafter with bf16 / fp8w / fp8wh weights, random weights and an untrained head of the
#      target's shapes (--eagle-head random), gemm engine + PDL, batch 1, k 4: SmolLM2, Llama-3.2-1B, Llama-3.1-8B;
#      then SmolLM2 on the fused cuBLAS path (the head's draft phase before its gemm path, EagleHead._forward_gemm)
#   4-8 (optional, if >= 450 s of device time are left after 3; the same machine): the real SmolLM2 (Q4_1 GGUF in bf16)
#      with its shipped EAGLE head, bf16 / fp8w / fp8wh drafts: tau and speed on 16 held-out ShareGPT prompts. The GGUF's
#      four 24.6 MB parts and the ShareGPT bundle travel one a call beside the 18.5 MB tree (64 MiB a call):
#      `bash experiments/h200-2026-12-04h/bundles.sh` makes .gpu/m0 .. .gpu/m3 here, then carry .gpu/m0 (part 4),
#      .gpu/m1 (5), .gpu/m2 (6), .gpu/m3 (7: joins the GGUF), .gpu/4 (8: ShareGPT, then the run)
# Each part's output: $OUT/runN.log (the console, tee'd) and resultsN.tgz (logs and bench tables; at most 8 files come
# back from a call). Each step has its own timeout inside the 10-minute limit of a call.
set -u -o pipefail
PART=${1:?part 1-8}
. experiments/sitting.sh  # OUT, LOGS, step, install_fb, gpu_tests, fi_jit, pack, the environment, the call's log, PY
FI="flashinfer,flashinfer/verify_split_kv=auto"
ROWS="$FI,flashinfer/verify_as_decode=true"  # + the verify as decode rows (flashinfer_rows, 2026-12-05)
case $PART in
1)
  install_fb
  step "GPU tests: verify_split_kv=auto (both plans, a graph per split choice, graphs, kept plans, hybrid) and the verify as decode rows (their FlashInfer JIT inside)"
  gpu_tests tests1 240 tests/backends/test_flashinfer_whole.py tests/backends/test_flashinfer_keep.py \
    tests/backends/test_hybrid.py tests/integration/test_gpu_engine.py tests/backends/test_flashinfer_rows.py \
    "tests/backends/test_flashinfer.py::test_gpu_cuda_graph_capture_replay" \
    "tests/backends/test_flashinfer.py::test_gpu_kernel_families" -m gpu -k "(flashinfer or routing) and not fp8_eagle"
  step "issue 16: FlashInfer verify / decode: split always, auto, as decode rows; batch 1/16/64 x 512/1024/4096"
  timeout 240 $PY -m attnlab.bench.kernels --phases decode,verify --batches 1,16,64 --contexts 512,1024,4096 --ks 4 \
    --models smollm2,llama8b --backends $ROWS --baseline flashinfer --repeats 3 --out "$OUT/split2" > $LOGS/split2.log 2>&1
  echo "exit code $?"; grep -E "^\|" $LOGS/split2.log
  cp $LOGS/split2.log "$OUT/" 2>/dev/null
  pack
  ;;
2)
  step "GPU tests: draft=eagle with fp8 weights in graphs (triton and flashinfer; unfused, fused ops, the gemm path)"
  install_fb  # a fresh machine (the next session opens with this call: 280 s for the tests, JIT inside); no-op warm
  gpu_tests tests2e 280 tests/integration/test_gpu_engine.py -m gpu -k "fp8_eagle or eagle_graphs or fused_eagle_head or head_on_the_gemm"
  step "issue 16: the batch-1 Triton decode floor, a sweep of the decode launch (decode_tiles: BLOCK_N x warps x stages)"
  T=triton; for t in 16x2x4 32x2x4 32x4x3 64x2x4 64x4x3 64x4x4 64x8x3 128x4x3 128x8x2 128x8x3 256x8x2; do
    T="$T,triton/decode_tiles=$t"; done
  timeout 120 $PY -m attnlab.bench.kernels --phases decode --batches 1 --contexts 4096 --models smollm2,llama8b \
    --backends "$T" --baseline triton --repeats 3 --out "$OUT/dtiles2" > $LOGS/dtiles2.log 2>&1
  echo "exit code $?"; grep -E "^\|" $LOGS/dtiles2.log
  [ "${SPEC:-1}" = 1 ] || { cp $LOGS/dtiles2.log "$OUT/" 2>/dev/null; pack; exit 0; }  # SPEC=0: tests and sweep only
  step "issue 16: end to end, SmolLM2 shapes (random weights), triton drafts, flashinfer verifies, batch 1"
  timeout 150 $PY -m attnlab.bench.spec --device cuda --skip-hf --weights random --drafters self --k 4 \
    --batch 1 --backends $ROWS --draft-backends triton --num-prompts 16 --new 64 --repeats 3 \
    --out "$OUT/spec2" > $LOGS/spec2.log 2>&1
  echo "exit code $?"; grep -E "^\|" $LOGS/spec2.log | head -40
  cp $LOGS/spec2.log $LOGS/dtiles2.log "$OUT/" 2>/dev/null
  pack
  ;;
3)
  for model in smollm2-135m llama-3.2-1b llama-3.1-8b; do
    rounds=5; secs=120; [ $model = llama-3.1-8b ] && rounds=3 secs=150  # 8B: ~8 ms an iteration
    step "issue 17: EAGLE drafter bf16 / fp8w / fp8wh, $model shapes, random weights and head, batch 1, k 4"
    timeout $secs $PY -m attnlab.bench.spec --device cuda --skip-hf --model $model --weights random --eagle-head random \
      --drafters eagle --draft-weights bf16,fp8w,fp8wh --dtype bf16 --k 4 --batch 1 --backends triton --gemm triton \
      --pdl --ignore-eos --num-prompts 4 --new 96 --repeats $rounds --out "$OUT/eagle3-$model" > $LOGS/eagle3-$model.log 2>&1
    echo "exit code $?"; grep -E "^\||^- eagle" $LOGS/eagle3-$model.log
  done
  [ "${FUSED:-0}" = 1 ] || { pack; exit 0; }  # the device time of 2026-12-05 did not reach to the step below
  step "issue 17: the same SmolLM2 rows on the fused cuBLAS path (--fused-ops): the EAGLE head's draft phase before its gemm path"
  timeout 100 $PY -m attnlab.bench.spec --device cuda --skip-hf --model smollm2-135m --weights random --eagle-head random \
    --drafters eagle --draft-weights bf16,fp8w --dtype bf16 --k 4 --batch 1 --backends triton --fused-ops --pdl \
    --ignore-eos --num-prompts 4 --new 96 --repeats 5 --out "$OUT/eagle3-fused" > $LOGS/eagle3-fused.log 2>&1
  echo "exit code $?"; grep -E "^\||^- eagle" $LOGS/eagle3-fused.log
  pack
  ;;
[4-7])
  step "install .gpu/m$((PART - 4)) (a part of the SmolLM2 GGUF)"; bash .gpu/m$((PART - 4))/install.sh | tail -1
  ;;
8)
  step "install .gpu/4 (ShareGPT)"; bash .gpu/4/install.sh | tail -1
  step "issue 17: the real SmolLM2 and its shipped EAGLE head, bf16 / fp8w / fp8wh drafts, k 4, batch 1, 16 prompts"
  timeout 420 $PY -m attnlab.bench.spec --device cuda --skip-hf --weights real --prompts sharegpt --num-prompts 16 \
    --drafters eagle --draft-weights bf16,fp8w,fp8wh --dtype bf16 --k 4 --batch 1 --backends triton --gemm triton \
    --pdl --new 128 --repeats 5 --out "$OUT/eagle8" > $LOGS/eagle8.log 2>&1
  echo "exit code $?"; grep -E "^\||^- eagle" $LOGS/eagle8.log
  cp $LOGS/eagle8.log "$OUT/" 2>/dev/null
  pack
  ;;
esac
