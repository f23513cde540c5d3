# The H200 call of the 2026-12-05 sitting (README.md here): issue 16's verify_as_decode=auto, the decode rows by rule.
#   FB=.gpu/fi bash experiments/h200-2026-12-05/run.sh 1      (carry [".gpu/fi"]; a fresh machine or a warm one)
#   bash experiments/h200-2026-12-05/run.sh 2                 (carry [".gpu/5"]; optional, on part 1's machine)
#   bash experiments/h200-2026-12-05/run.sh 3                 (no carry; optional, on the same machine)
#   1  install (a no-op on a warm machine); GPU tests of verify_as_decode=auto (the engine's third graph, the rows on
#      the real FlashInfer, the rows' kept plans against fresh ones bit for bit) and of fused ops in graphs against
#      unfused eager on every backend (fa skips without fa3_fwd: carry .gpu/5 in a later call); bench.kernels
#      FlashInfer decode / verify with the default (verify_split_kv=auto), the rows always and the rows by rule,
#      batch 1/2/4/8/16 x 128/256/512/1024/4096, k 2/4/8, SmolLM2 and Llama-8B shapes (attnlab.bench.verify_floor:
#      floor1.md, rows1.png); bench.spec end to end, SmolLM2 shapes, random weights, self-draft on triton, batch 1,
#      the default flashinfer verify against verify_as_decode=auto
#   2  fa3_fwd installed; fa's GPU tests (parity, graph replay) and its case of the fused-ops graph test; part 1's
#      bench.spec at batch 4
#   3  the GPU grids never run whole: FlashInfer's parity grid (test_gpu_parity), Triton's GPU cases
#   4  issue 16's full kernel grid with today's defaults (2026-12-03b ran it before verify_split_kv=auto and the
#      contiguous prefill): every backend and phase, batch 1/16/64 x 512/4k/16k, k 4; after parts 1 and 2 on one
#      machine (FlashInfer and fa3_fwd installed), no carry
# Output: $OUT/runN.log (the console) and resultsN.tgz (logs and bench tables).
set -u -o pipefail
PART=${1:?part 1, 2, 3 or 4}
. experiments/sitting.sh  # OUT, LOGS, step, install_fb, gpu_tests, pack, the environment, the call's log, PY
B="flashinfer,flashinfer/verify_as_decode=true,flashinfer/verify_as_decode=auto"
# spec_rows BATCH SECS: bench.spec, SmolLM2 shapes, random weights, triton self-drafts (k 4), the default flashinfer
# verify against verify_as_decode=auto; its table on the console
spec_rows() {
  timeout "$2" $PY -m attnlab.bench.spec --device cuda --skip-hf --weights random --drafters self --k 4 --batch "$1" \
    --backends "flashinfer,flashinfer/verify_as_decode=auto" --draft-backends triton --num-prompts 16 --new 64 \
    --repeats 3 --out "$OUT/spec$PART-b$1" > $LOGS/spec$PART-b$1.log 2>&1
  echo "exit code $?"; grep -E "^\|" $LOGS/spec$PART-b$1.log | head -20; cp $LOGS/spec$PART-b$1.log "$OUT/"
}
case $PART in
1)
  install_fb
  step "GPU tests: verify_as_decode (true and auto: the rows against the reference, the engine's graphs per variant)"
  gpu_tests tests1 220 tests/backends/test_flashinfer_rows.py tests/integration/test_gpu_engine.py \
    tests/backends/test_flashinfer_whole.py tests/backends/test_flashinfer_keep.py -m gpu \
    -k "rows or split_choice or whole or kept_plans or fused_ops_in_graphs"
  rows_grid rows1 100 "$B"  # default (split by rule), rows always, rows by rule
  $PY -m attnlab.bench.verify_floor "$OUT"/rows1-*.json --plot "$OUT/rows1.png" \
    --plans "default=flashinfer,rows=flashinfer/verify_as_decode=true" \
    --rule "by rule=flashinfer/verify_as_decode=auto" > "$OUT/floor1.md"; tail -n 4 "$OUT/floor1.md"
  step "issue 16: end to end, SmolLM2 shapes, triton self-drafts, flashinfer verify: default vs rows by rule, batch 1"
  spec_rows 1 100
  cp $LOGS/rows1-*.log "$OUT/" 2>/dev/null
  pack
  ;;
2)
  # optional, the same machine, carry [".gpu/5"] (fa3_fwd): fa's case of the fused-ops graph test, and batch 4 end
  # to end
  step "install .gpu/5 (fa3_fwd)"; bash .gpu/5/install.sh | tail -1
  step "GPU tests: fa's own (parity, CUDA-graph replay: never run since 2026-11-29) and its fused-ops graph case"
  gpu_tests tests2 300 tests/backends/test_flash_attn.py tests/integration/test_gpu_engine.py -m gpu \
    -k "test_flash_attn or fused_ops_in_graphs"
  step "issue 16: end to end, as part 1's, batch 4"
  spec_rows 4 110
  pack
  ;;
3)
  # optional, the same machine, no carry: the GPU grids never run whole (docs/backends.md, "Which builds ran"):
  # FlashInfer's parity grid against the torch reference (JIT: about 3 minutes), Triton's GPU cases
  step "GPU tests: FlashInfer's parity grid (test_gpu_parity, every dtype / head dim / page size / mode)"
  gpu_tests tests3f 400 tests/backends/test_flashinfer.py -m gpu -k test_gpu_parity
  step "GPU tests: Triton's GPU cases (test_triton.py -m gpu)"
  gpu_tests tests3t 170 tests/backends/test_triton.py -m gpu
  pack
  ;;
4)
  step "issue 16: bench.kernels, full grid with today's defaults (the rows by rule beside the default flashinfer)"
  timeout 330 $PY -m attnlab.bench.kernels --ks 4 --backends \
    triton,flashinfer,flashinfer/verify_as_decode=auto,fa,hybrid/short=flashinfer/long=triton/threshold=1024 \
    --out "$OUT/grid4" > $LOGS/grid4.log 2>&1; echo "exit code $?"; tail -n 60 $LOGS/grid4.log
  cp $LOGS/grid4.log "$OUT/" 2>/dev/null
  pack
  ;;
esac
