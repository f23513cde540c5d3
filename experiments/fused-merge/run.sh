# Issue 16's batch-1 decode floor: the split merge inside the decode (fused_merge), its last program's loads sized to
# the GQA group instead of the tile's 16 padded rows. On 2026-12-03 the fused merge was 1.10-1.15x slower than the
# merge launch at batch 1; its unrolled loads held 16 x head_dim x splits values a thread could not keep in flight.
#   1  carry [".gpu/fk", ".old", ".oldf"], ~6 min warm:
#      - GPU tests: the fused merge racing (Llama-8B heads at batch 16, SmolLM2's at batch 1 with a padding request,
#        with PDL), the decode's prefetch tests;
#      - bench.kernels decode, merge launch against fused, batch 1 / 4 / 16 x 512 / 4k / 16k, both shapes, 200 runs
#        a replay, PDL on (the engine's setting);
#      - the same two arms from 14d6bb7 (.oldf: the fused merge before this change), batch 1 / 16 x 4k;
#      - the floor's before and after: c101f91's bench.kernels (.old) and today's arms, --quick, 5 and 200 runs;
#      - after one layer's MLP (--between gemm): merge launch against fused, batch 1 / 16 x 4k;
#      - on an H200 only: decode-read part 1's stream rows (owed since 2026-12-06c).
#      .old:  mkdir -p .old && git archive c101f91 attnlab | tar -x -C .old
#      .oldf: mkdir -p .oldf && git archive 14d6bb7 attnlab ':(exclude)attnlab/heads' | tar -x -C .oldf
#      (both untracked; add /.oldf/ to .git/info/exclude as /.old/ is)
#   2  carry [".gpu/fk"], ~6 min warm: the decode's launch (decode_tiles: BLOCK_N x warps x stages; 1 stage: no
#      pipelining, which a split of one tile does not use), merge launch and fused, PDL on, 200 runs a replay, at
#      batch 1 x 4k and 16k, one process a shape (its 7-8 launches x 2 arms interleaved)
#   3  carry [".gpu/fk", ".old"], ~6 min warm: part 2's leads (the fused merge; 128-token tiles in 1 stage) over
#      batch 1 / 4 / 16 x 512 / 4k / 16k against the default, then after one layer's MLP, then c101f91's decode
#   4  carry [".gpu/fk"], ~5 min warm: end to end (bench.spec, SmolLM2-135M on random weights, the gemm engine with
#      PDL, CUDA graphs), triton against triton/fused_merge=true in the same rounds: prompts of 3,960 tokens (the
#      plan's 32 splits, one tile each, as the 4k kernel cell) and of 380 (4 splits), batch 1 and 4, 128 new tokens
#   5  carry [".gpu/fk"], ~5 min: end to end at Llama-8B's attention shape (Llama-3.1-8B on random weights, cuBLAS
#      GEMMs, fused ops, PDL, CUDA graphs), triton against triton/fused_merge=true/decode_tiles=128x4x1 (part 3's
#      0.80x kernel cell) in the same rounds, 4 prompts of 3,960 tokens, batch 1
#   6  carry [".gpu/fk"], ~4 min: the same arms' decode kernels inside the engine's graphs (bench.spec --kernel-profile,
#      PDL off so that a kernel's CUPTI time holds no wait for the one before), SmolLM2-135M (attnlab's GEMMs) and
#      Llama-3.1-8B (cuBLAS), random weights, 2 prompts of 3,960 tokens, batch 1
# Output: $OUT/runPART.log (the console) and resultsPART.tgz (the tables as .md / .json, the test log).
set -u -o pipefail
PART=${1:?part 1 to 6}
. experiments/sitting.sh  # OUT, LOGS, step, install_fb, gpu_tests, pack, the environment, the call's log, PY
ARMS=triton+pdl,triton/fused_merge=true+pdl
K="$PY -m attnlab.bench.kernels --phases decode"
case $PART in
1)
  FB=.gpu/fk install_fb
  for d in .old .oldf; do test -d $d/attnlab || { echo "$d/attnlab missing: carry it (see the header)"; exit 1; }; done
  step "GPU tests: the fused merge racing (eager, graphs, PDL), the decode's prefetch"
  gpu_tests fm 240 tests/backends/test_fused_merge.py tests/integration/test_gpu_decode_prefetch.py
  step "merge launch against fused: batch 1 / 4 / 16 x 512 / 4k / 16k, SmolLM2 and Llama-8B shapes, 200 runs a replay"
  timeout 240 $K --backends $ARMS --batches 1,4,16 --contexts 512,4096,16384 --models smollm2,llama8b --reps 200 \
    --repeats 3 --out "$OUT/fm" > $LOGS/fm.log 2>&1
  echo "exit code $?"; grep -E "^decode|Error" $LOGS/fm.log
  step "14d6bb7's fused merge (rows padded to BLOCK_M), the same arms, batch 1 / 16 x 4k"
  (cd .oldf && PYTHONPATH=/opt/site:$PWD timeout 90 $K --backends $ARMS --batches 1,16 --contexts 4096 \
    --models smollm2,llama8b --reps 200 --repeats 3 --out "$OUT/fm-old" > $LOGS/fm-old.log 2>&1; echo "exit code $?")
  grep -E "^decode|Error" $LOGS/fm-old.log
  for reps in 5 200; do
    step "the floor, $reps runs a replay: c101f91, then today's arms"
    (cd .old && PYTHONPATH=/opt/site:$PWD timeout 90 $K --backends triton --quick --reps $reps \
      --out "$OUT/old-$reps" > $LOGS/old-$reps.log 2>&1; echo "exit code $?")
    grep -E "^decode" $LOGS/old-$reps.log
    timeout 90 $K --backends $ARMS --quick --reps $reps --repeats 3 --out "$OUT/new-$reps" > $LOGS/new-$reps.log 2>&1
    echo "exit code $?"; grep -E "^decode" $LOGS/new-$reps.log
  done
  step "after one layer's MLP (--between gemm): merge launch against fused, batch 1 / 16 x 4k"
  timeout 90 $K --backends $ARMS --batches 1,16 --contexts 4096 --models smollm2,llama8b --reps 200 --repeats 3 \
    --between gemm --out "$OUT/fm-gemm" > $LOGS/fm-gemm.log 2>&1
  echo "exit code $?"; grep -E "^decode|Error" $LOGS/fm-gemm.log
  gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader)
  if [[ $gpu == *H200* ]]; then
    step "an H200: decode-read part 1's stream rows"
    timeout 120 $PY -m attnlab.bench.launch_floor --models smollm2,llama8b --contexts 4096 --stream-splits 8,16,64 \
      --out "$OUT/lf-h200" > $LOGS/lf-h200.log 2>&1
    echo "exit code $?"; grep -E "^\||Error|skipped" $LOGS/lf-h200.log
  fi
  ;;
2)
  FB=.gpu/fk install_fb
  for m in smollm2 llama8b; do
    if [ $m = smollm2 ]; then tiles="128x4x3 128x4x1 128x4x2 64x2x4 64x2x1 64x4x2 128x8x3 256x4x2"
    else tiles="64x4x3 64x4x1 64x8x3 128x4x3 128x4x1 256x8x2 128x8x2"; fi
    specs=""
    for t in $tiles; do specs="$specs,triton/decode_tiles=$t+pdl,triton/fused_merge=true/decode_tiles=$t+pdl"; done
    step "the decode's tile, warps and stages, merge launch and fused, $m shapes, batch 1 x 4k and 16k"
    timeout 240 $K --backends "${specs#,}" --batches 1 --contexts 4096,16384 --models $m --reps 200 --repeats 3 \
      --out "$OUT/tiles-$m" > $LOGS/tiles-$m.log 2>&1
    echo "exit code $?"; grep -E "^decode|Error" $LOGS/tiles-$m.log
  done
  ;;
3)
  FB=.gpu/fk install_fb
  test -d .old/attnlab || { echo ".old/attnlab missing: carry it (see the header)"; exit 1; }
  T=decode_tiles=128x4x1
  A3=triton+pdl,triton/fused_merge=true+pdl,triton/$T+pdl,triton/fused_merge=true/$T+pdl
  for m in smollm2 llama8b; do
    step "part 2's leads over the grid, $m shapes: batch 1 / 4 / 16 x 512 / 4k / 16k, 200 runs a replay"
    timeout 200 $K --backends $A3 --batches 1,4,16 --contexts 512,4096,16384 --models $m --reps 200 --repeats 3 \
      --out "$OUT/grid-$m" > $LOGS/grid-$m.log 2>&1
    echo "exit code $?"; grep -E "^decode|Error" $LOGS/grid-$m.log
  done
  step "the same arms after one layer's MLP (--between gemm), batch 1 x 4k"
  timeout 60 $K --backends $A3 --batches 1 --contexts 4096 --models smollm2,llama8b --reps 200 --repeats 3 \
    --between gemm --out "$OUT/grid-gemm" > $LOGS/grid-gemm.log 2>&1
  echo "exit code $?"; grep -E "^decode|Error" $LOGS/grid-gemm.log
  step "c101f91 on this machine, 200 runs a replay (the floor's before)"
  (cd .old && PYTHONPATH=/opt/site:$PWD timeout 60 $K --backends triton --quick --reps 200 \
    --out "$OUT/old-200" > $LOGS/old-200.log 2>&1; echo "exit code $?")
  grep -E "^decode" $LOGS/old-200.log
  ;;
4)
  FB=.gpu/fk install_fb
  for len in 3960 380; do
    step "end to end, SmolLM2-135M (random weights), prompts of $len tokens: merge launch against fused, same rounds"
    timeout 200 $S --gemm triton --pdl --weights random --backends triton,triton/fused_merge=true --drafters ngram \
      --k 4 --batch 1,4 --prompt-lengths $len --new 128 --repeats 5 --same-rounds --ignore-eos \
      --out "$OUT/e2e-$len" > $LOGS/e2e-$len.log 2>&1
    echo "exit code $?"; grep -vE "^\s*$|it/s|%\|" $LOGS/e2e-$len.log | tail -n 25
  done
  ;;
5)
  FB=.gpu/fk install_fb
  step "end to end, Llama-3.1-8B (random weights), prompts of 3960 tokens: merge launch against fused + 128x4x1"
  timeout 400 $S --model llama-3.1-8b --pdl --weights random \
    --backends triton,triton/fused_merge=true/decode_tiles=128x4x1 --drafters ngram --k 4 --batch 1 \
    --prompt-lengths 3960 --num-prompts 4 --new 128 --repeats 5 --same-rounds --ignore-eos \
    --out "$OUT/e2e8b-3960" > $LOGS/e2e8b-3960.log 2>&1
  echo "exit code $?"; grep -vE "^\s*$|it/s|%\|" $LOGS/e2e8b-3960.log | tail -n 16
  ;;
6)
  FB=.gpu/fk install_fb
  for m in smollm2-135m llama-3.1-8b; do
    g=$([ $m = smollm2-135m ] && echo triton || echo cublas)
    step "in the engine's graphs, PDL off (CUPTI's kernel times then hold no wait): $m, gemm $g, kernel profile"
    timeout 250 $S --model $m --gemm $g --weights random --drafters ngram --k 4 --batch 1 --prompt-lengths 3960 \
      --backends triton,triton/fused_merge=true,triton/fused_merge=true/decode_tiles=128x4x1 --num-prompts 2 \
      --new 128 --repeats 2 --same-rounds --ignore-eos --kernel-profile 6 --out "$OUT/kp-$m" > $LOGS/kp-$m.log 2>&1
    echo "exit code $?"; grep -E "^\| (attention|split merge|role)|iterations \(|^### |Error" $LOGS/kp-$m.log
    cp $LOGS/kp-$m.log "$OUT/"
  done
  ;;
*) echo "part 1 to 6"; exit 2 ;;
esac
pack
