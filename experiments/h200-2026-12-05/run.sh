# The H200 call of the 2026-12-05 sitting (README.md here): issue 16's verify_as_decode=auto, the decode rows by rule.
#   FB=.gpu/fi bash experiments/h200-2026-12-05/run.sh 1      (carry [".gpu/fi"]; a fresh machine or a warm one)
#   1  install (a no-op on a warm machine); GPU tests of verify_as_decode=auto (the engine's third graph, the rows on
#      the real FlashInfer, the rows' kept plans against fresh ones bit for bit) and of fused ops in graphs against
#      unfused eager on every backend (fa skips without fa3_fwd: carry .gpu/5 in a later call); bench.kernels
#      FlashInfer decode / verify with the default (verify_split_kv=auto), the rows always and the rows by rule,
#      batch 1/2/4/8/16 x 256/512/1024/2048/4096, k 2/4/8, SmolLM2 and Llama-8B shapes (attnlab.bench.verify_floor:
#      floor1.md, rows1.png); bench.spec end to end, SmolLM2 shapes, random weights, self-draft on triton, batch 1
#      and 4, the default flashinfer verify against verify_as_decode=auto
# Output: $OUT/run1.log (the console) and results1.tgz (logs and bench tables).
set -u -o pipefail
PART=${1:?part 1}
. experiments/sitting.sh  # OUT, LOGS, step, install_fb, gpu_tests, pack, the environment, the call's log, PY
B="flashinfer,flashinfer/verify_as_decode=true,flashinfer/verify_as_decode=auto"
case $PART in
1)
  install_fb
  step "GPU tests: verify_as_decode (true and auto: the rows against the reference, the engine's graphs per variant)"
  gpu_tests tests1 200 tests/backends/test_flashinfer_rows.py tests/integration/test_gpu_engine.py \
    tests/backends/test_flashinfer_whole.py tests/backends/test_flashinfer_keep.py -m gpu \
    -k "rows or split_choice or whole or kept_plans or fused_ops_in_graphs"
  step "issue 16: FlashInfer verify / decode: default (split by rule), rows always, rows by rule"
  timeout 240 $PY -m attnlab.bench.kernels --phases decode,verify --batches 1,2,4,8,16 \
    --contexts 256,512,1024,2048,4096 --ks 2,4,8 --models smollm2,llama8b --backends $B --baseline flashinfer \
    --repeats 3 --out "$OUT/rows1" > $LOGS/rows1.log 2>&1
  echo "exit code $?"; $PY -m attnlab.bench.verify_floor "$OUT/rows1.json" --plot "$OUT/rows1.png" \
    --plans "default=flashinfer,rows=flashinfer/verify_as_decode=true" \
    --rule "by rule=flashinfer/verify_as_decode=auto" > "$OUT/floor1.md"; tail -n 4 "$OUT/floor1.md"
  step "issue 16: end to end, SmolLM2 shapes, triton self-drafts, flashinfer verify: default vs rows by rule"
  for b in 1 4; do
    timeout 120 $PY -m attnlab.bench.spec --device cuda --skip-hf --weights random --drafters self --k 4 --batch $b \
      --backends "flashinfer,flashinfer/verify_as_decode=auto" --draft-backends triton --num-prompts 16 --new 64 \
      --repeats 3 --out "$OUT/spec1-b$b" > $LOGS/spec1-b$b.log 2>&1
    echo "exit code $?"; grep -E "^\|" $LOGS/spec1-b$b.log | head -20
  done
  cp $LOGS/rows1.log $LOGS/spec1-b*.log "$OUT/" 2>/dev/null
  pack
  ;;
esac
