# verify_as_decode=auto's refitted rule (q x the batch's kv tokens x head_dim <= 512K, batch <= 4, a request >= 256
# tokens; attnlab/backends/flashinfer.py), measured with it in place: the H100 cells of 2026-12-05 it was fitted on
# (experiments/h100-2026-12-05, rows1-*.json), the three plans in one process. One call, carry [".gpu/fi"], a fresh or
# a warm machine (about 5 minutes fresh, FlashInfer's JIT included):
#   FB=.gpu/fi bash experiments/rows-refit/run.sh
# 1  install; the rule's GPU tests (the rows against the reference, the engine's three verify graphs replayed)
# 2  bench.kernels FlashInfer decode / verify: the default, the rows always, the rows by rule; batch 1/2/4/8/16 x
#    128/256/512/1024/4096 x k 2/4/8, SmolLM2 and Llama-8B shapes; bench.verify_floor: the rule measured (--rule)
#    and computed from the other two plans' cells (--computed), floor and plot
# Output: $OUT/runrr.log (the console) and resultsrr.tgz (logs and tables).
set -u -o pipefail
PART=rr
. experiments/sitting.sh  # OUT, LOGS, step, install_fb, gpu_tests, rows_grid, pack, the environment, the call's log, PY
B="flashinfer,flashinfer/verify_as_decode=true,flashinfer/verify_as_decode=auto"
P="default=flashinfer,rows=flashinfer/verify_as_decode=true"
install_fb
step "GPU tests: the rows by rule (the reference, the engine's verify graphs per variant)"
gpu_tests testsrr 200 tests/backends/test_flashinfer_rows.py tests/integration/test_gpu_engine.py -m gpu \
  -k "rows or auto_rows"
rows_grid rr 110 "$B"
$PY -m attnlab.bench.verify_floor "$OUT"/rr-*.json --plans "$P" --plot "$OUT/rr.png" \
  --rule "by rule=flashinfer/verify_as_decode=auto" > "$OUT/floor-rr.md"; tail -n 2 "$OUT/floor-rr.md"
$PY -m attnlab.bench.verify_floor "$OUT"/rr-*.json --plans "$P" --computed "computed=default/rows" \
  > "$OUT/floor-rr-computed.md"; tail -n 2 "$OUT/floor-rr-computed.md"
cp $LOGS/rr-*.log "$OUT/" 2>/dev/null
pack
