# flashinfer's verify_kv_chunk (issue 16's verify / decode floor, README.md here), on the GPU: its GPU tests, then
# bench.kernels FlashInfer decode / verify with the default against fa2 split plans searched from a 1 / 2 / 4-page
# floor, every cell in one process a model. One call, carry [".gpu/fi"], a fresh or a warm machine (about 5 minutes
# fresh, FlashInfer's JIT included):
#   FB=.gpu/fi bash experiments/kv-chunk/run.sh
# Output: $OUT/runkc.log (the console) and resultskc.tgz (logs, tables, the plot).
set -u -o pipefail
PART=kc
. experiments/sitting.sh  # OUT, LOGS, step, install_fb, gpu_tests, rows_grid, settle, pack, the environment, PY
F=flashinfer/verify_split_kv=true  # the split plan in every cell (the default's rule runs short KV whole)
B="flashinfer,$F,$F/verify_kv_chunk=1,$F/verify_kv_chunk=2,$F/verify_kv_chunk=4,flashinfer/verify_kv_chunk=2"
P="default=flashinfer,split=$F,c1=$F/verify_kv_chunk=1,c2=$F/verify_kv_chunk=2,c4=$F/verify_kv_chunk=4"
install_fb
step "GPU tests: fine chunks against the reference (graph-mode wrappers, kept plans)"
gpu_tests testskc 200 tests/backends/test_flashinfer_chunk.py -m gpu
settle
rows_grid kc 170 "$B"
$PY -m attnlab.bench.verify_floor "$OUT"/kc-*.json --plans "$P" --plot "$OUT/kc.png" \
  --rule "default+c2=flashinfer/verify_kv_chunk=2" > "$OUT/floor-kc.md"; tail -n 3 "$OUT/floor-kc.md"
cp $LOGS/kc-*.log "$OUT/" 2>/dev/null
pack
