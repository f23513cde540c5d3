# Issue 16's batch-1 decode floor (<= 4.60 / 9.40 us at 4k, SmolLM2 / Llama-8B shapes; best 4.82 / 11.80 on the H200,
# 2026-12-03d): how fast can this GPU read the decode's K / V bytes at all? bench.launch_floor's stream rows
# (attnlab.bench.kv_stream: the decode's programs, split bounds, page gathers and tile, loads and a sum, no softmax) at
# the decode's split count and at 8 / 16 / 64 / 128, beside the decode and the empty launches, in one process. If no
# split grid reads the bytes fast enough for the floor, no kernel of this design meets it.
#   1  carry [".gpu/fk"] (or any bundle that installs torch-side libs; none needed beyond the machine's torch and
#      triton), ~120 s warm: the kv_stream GPU test, then bench.launch_floor --stream-splits 8,16,64,128
#   2  carry [".gpu/fk", ".old"], ~150 s warm: the floor's before and after on one card. The floor is "1.5x faster than
#      2026-12-01", whose figures (6.9 / 14.1 us) were taken on an H200 by c101f91's bench.kernels --quick (5 runs a
#      replay); only H100s come now. .old is that commit's attnlab (made here, untracked and git-excluded:
#      mkdir -p .old && git archive c101f91 attnlab | tar -x -C .old). Two rounds of: c101f91's bench.kernels and
#      today's (triton, triton+pdl), batch 1 and 16 x 4k decode, at 5 runs a replay (the floor's method) and at 200.
#      Then part 1's stream rows again with 64 layers walked (SmolLM2's 8 fit the L2).
#   3  carry [".gpu/fk"], ~100 s warm: does the read's speed owe to its per-token page gathers? The GPU tests of
#      kv_stream's three load modes and the fused merge's PDL race case (experiments/README lead 0), then
#      bench.launch_floor --stream-modes pages,contig: the decode grid's read as one TMA box per page, and as if the
#      pages were consecutive (a bound, other slots), beside the gathers; SmolLM2 walked from DRAM (64 layers) and
#      Llama-8B (8 layers, 134 MB). Then bench.kernels --between gemm at one cell (its launch now shared, 12390ea).
#   4  carry [".gpu/fk"], ~90 s warm (2026-12-06f): does the decode's one-head-a-program walk cost the read? On
#      2026-12-06f (decode-early/run.sh 6) kv_stream's rows mode (every kv head of a token in one program) read
#      Llama-8B's 16.8 MB in 7.32 us with 512 programs, against 8.51-8.67 for the decode grid's gathers. The kv_stream
#      GPU tests (rows, hnd), then bench.launch_floor --stream-modes rows,hnd: the decode's own grid and gathers over a
#      head-major copy of the pool (FlashInfer's HND: a page's tokens of one head contiguous), beside the slot-major
#      gathers and rows, both shapes (SmolLM2 64 layers, Llama-8B 8).
# FB=<bundle> installs another bundle first (a sitting's GGUF part riding along: FB=.gpu/g1).
# Output: $OUT/run1.log (the console) and results1.tgz (lf.md / lf.json, the test log).
set -u -o pipefail
PART=${1:?part 1 to 4}
. experiments/sitting.sh  # OUT, LOGS, step, install_fb, gpu_tests, pack, the environment, the call's log, PY
case $PART in
1)
  install_fb
  step "kv_stream on the GPU: the read-only pass reads exactly the plan's bytes"
  gpu_tests kvs 120 tests/unit/test_kv_stream.py tests/unit/test_launch_floor.py
  step "bench.launch_floor with the stream rows: SmolLM2 and Llama-8B shapes, batch 1 x 4k"
  timeout 300 $PY -m attnlab.bench.launch_floor --models smollm2,llama8b --contexts 4096 --stream-splits 8,16,64,128 \
    --out "$OUT/lf" > $LOGS/lf.log 2>&1
  echo "exit code $?"; grep -E "^\||Error" $LOGS/lf.log; cp $LOGS/lf.log "$OUT/"
  ;;
2)
  FB=.gpu/fk install_fb
  test -d .old/attnlab || { echo ".old/attnlab missing: carry .old (see the header)"; exit 1; }
  for r in 1 2; do
    for reps in 5 200; do
      step "round $r, $reps runs a replay: c101f91 (2026-12-01's code and bench)"
      (cd .old && PYTHONPATH=/opt/site:$PWD timeout 150 $PY -m attnlab.bench.kernels --backends triton --phases decode \
        --quick --reps $reps --out "$OUT/old-r$r-$reps" > $LOGS/old-r$r-$reps.log 2>&1; echo "exit code $?")
      grep -E "^decode" $LOGS/old-r$r-$reps.log
      step "round $r, $reps runs a replay: today's triton, triton+pdl"
      timeout 150 $PY -m attnlab.bench.kernels --backends triton,triton+pdl --phases decode --quick --reps $reps \
        --repeats 3 --out "$OUT/new-r$r-$reps" > $LOGS/new-r$r-$reps.log 2>&1
      echo "exit code $?"; grep -E "^decode" $LOGS/new-r$r-$reps.log
    done
  done
  step "bench.launch_floor, 64 layers walked (SmolLM2: 200 MB, 4x the H100's L2; part 1's 8 were 25 MB)"
  timeout 200 $PY -m attnlab.bench.launch_floor --models smollm2,llama8b --contexts 4096 --stream-splits 8,16,64 \
    --layers 64 --out "$OUT/lf64" > $LOGS/lf64.log 2>&1
  echo "exit code $?"; grep -E "^\||Error|skipped" $LOGS/lf64.log
  ;;
3)
  FB=.gpu/fk install_fb
  step "GPU tests: kv_stream's load modes (TMA boxes), the fused merge's PDL race (four launches a graph)"
  gpu_tests kvs3 240 tests/unit/test_kv_stream.py tests/unit/test_launch_floor.py tests/backends/test_fused_merge.py \
    -k "stream or floor or pdl"
  for m in llama8b smollm2; do
    layers=8; [ $m = smollm2 ] && layers=64
    step "bench.launch_floor, $m, $layers layers: the decode grid's read as gathers, page boxes and contiguous"
    timeout 200 $PY -m attnlab.bench.launch_floor --models $m --contexts 4096 --stream-modes pages,contig \
      --stream-splits 16,64 --layers $layers --out "$OUT/lfm-$m" > $LOGS/lfm-$m.log 2>&1
    echo "exit code $?"; grep -E "^\||Error|skipped" $LOGS/lfm-$m.log
  done
  step "bench.kernels --between gemm (its launch built once per shape since 12390ea): batch 1 x 4k, both shapes"
  timeout 120 $PY -m attnlab.bench.kernels --phases decode --backends triton+pdl,triton/fused_merge=true+pdl \
    --batches 1 --contexts 4096 --models smollm2,llama8b --reps 200 --repeats 3 --between gemm \
    --out "$OUT/between" > $LOGS/between.log 2>&1
  echo "exit code $?"; grep -E "^decode|Error" $LOGS/between.log
  ;;
4)
  FB=.gpu/fk install_fb
  step "GPU tests: kv_stream's load modes (rows, hnd among them) read exactly the plan's bytes"
  gpu_tests kvs4 180 tests/unit/test_kv_stream.py tests/unit/test_launch_floor.py
  for m in llama8b smollm2; do
    layers=8; splits=64; [ $m = smollm2 ] && layers=64 && splits=16
    step "bench.launch_floor, $m, $layers layers: gathers over slot-major and head-major pages, rows of every head"
    timeout 200 $PY -m attnlab.bench.launch_floor --models $m --contexts 4096 --stream-modes rows,hnd \
      --stream-splits $splits --layers $layers --out "$OUT/lfh-$m" > $LOGS/lfh-$m.log 2>&1
    echo "exit code $?"; grep -E "^\||Error|skipped" $LOGS/lfh-$m.log
  done
  ;;
esac
pack
