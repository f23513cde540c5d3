# Issue 16's Llama-8B batch-1 decode floor: a register cap on the decode's early-tile launches (decode.set_early_maxnreg,
# bench arm +regs<n>). At batch 1 x 4k the decode runs 256 programs of 8 warps and 128 registers, two a SM, which fill
# the register file; with PDL the next decode's programs cannot be resident, and so cannot load their early tile, until
# these leave (a reading: the preloads moved that cell 0%, experiments/decode-preload/). At 80 registers three fit a SM,
# with spills (regs.py). README.md says what it found.
#   1  carry [".gpu/fk", ".old"], ~6 min on a fresh machine (ordered for a call that may be cut):
#      - three floor rounds (fused-merge-auto/run.sh 8: c101f91, the floor's before, in the same call) of the default
#        (PDL on) against the cap at 80 (three programs a SM), 80 without the preload, 88 (two a SM: the spills alone),
#        72, and the merge launch (fused_merge=false) uncapped and at 80; 200 runs a replay, batch 1 / 16 x 4k, both
#        shapes (SmolLM2's one-tile launch takes the cap too: 4 warps, a control of what spills cost);
#      - the same merge-launch arms with the merge launch removed (nomerge.py, a diagnostic: the split decode alone),
#        against the fused default in the same process: what any faster merge could give;
#      - GPU tests: the capped launches bit for bit (test_gpu_decode_prefetch.py -k register_cap);
#      - bench.kernels decode at Llama-8B shapes, batch 1 / 2 / 4 / 8 / 16 / 32 x 128 / 512 / 4k: the default against
#        +regs80 and +regs88 (the other early-tile cells: the rule a default would need).
#      .old: mkdir -p .old && git archive c101f91 attnlab | tar -x -C .old   (untracked, git-excluded)
#   2  carry [".gpu/fk", ".old"], ~6 min on a fresh machine (after part 1: the merge, not the read, is what the split
#      decode alone saves): the fused merge's merger chosen by ticket at the start (merge.set_merge_ticket, +ticket1),
#      so that no program waits for its arrival's reply before it exits:
#      - three floor rounds of the default, +ticket1 and PDL off, c101f91 in the same call;
#      - nomerge.py at the floor cells again (the bound, in this call), with the default and +ticket1;
#      - GPU tests: the ticket raced and replayed (test_fused_merge.py), with a plan and with the current token's K / V
#        written late by the launch before (test_gpu_decode_prefetch.py); auto's batch-1 fused cases;
#      - bench.kernels decode, both shapes, batch 1 / 2 / 4 / 8 / 16 x 128 / 512 / 1k / 4k, the default and +ticket1
#        (every split early-tile cell).
#   Parts 1 and 2 need commit c6ff0e1's tree (the +regs and +ticket arms, removed after they lost: README).
#   3  carry [".gpu/fk"], ~4 min on a fresh machine: where the merge's 2.4 us go at Llama-8B's batch 1 x 4k (PDL on).
#      Four processes, twice in turn: bench.kernels (the default, fused; the merge launch), nomerge.py (the merge
#      launch removed), nomerge.py --arrive (the fused merge cut to its arrival: barrier, acq_rel add, the last one's
#      store of zeros), nomerge.py --arrive-relaxed (that arrival without its fence). Batch 1 / 16 x 4k, both shapes,
#      200 runs a replay.
#   4  carry [".gpu/fk"], ~1.5 min on a warm machine (after part 3, which ran it by hand in the same call): is the merge
#      proper bytes or the next decode's early tile? bf16 partials against fp32, PDL on and off, three rounds
#      (bf16pN); then the default, +preload0 and PDL off, each whole (plainN) and cut to its arrival (arriveN, the
#      same arms in both processes), two rounds.
#   5  carry [".gpu/fk"], ~1 min on a fresh machine: the merging program's own timestamps (stamps.py: cycles from
#      before its arrival to the add's reply and from the reply to its sums; globaltimer between launches), batch 1 x
#      4k, both shapes, PDL on and off, after a plain run of the same cells (the stamps' own cost).
#   6  carry [".gpu/fk"], ~1.5 min on a fresh machine: is the merge proper the merger's instruction issue? The lean merge
#      (lean.py: a compile-time split step, no bound masks; 429 instructions after the add against 581 in the sm_90a
#      SASS) against the default, three rounds of two processes (each the default and PDL off), batch 1 / 16 x 4k;
#      then the fused merge's GPU tests with the lean merge (lean.py --gpu-check). Needs commit d2fbb55's tree (lean.py
#      and merge_partials' SPLIT_STEP / ALL_SPLITS, removed after call 4: README).
#   7  carry [".gpu/fk"], ~3 min on a fresh machine: with PDL on, the merger's loads took 3x their time without (call
#      4's stamps): do the next decode's reads before its wait (the L2 prefetch of its first tile, and that tile's K
#      loaded) slow them? Batch 1 x 4k, both shapes: the default, +kvpf0 (no early reads: the wait first), +preload0
#      (the L2 prefetch only) and PDL off, timed in one process; the default and +kvpf0 stamped (stamps.py), each in
#      its own process; the default and PDL off timed and stamped with --between gemm (a layer's MLP on cuBLAS between
#      two decodes: no decode's reads behind the merger) and --between oproj (the output projection on attnlab's GEMM
#      as the engine's gemm path runs it, with PDL under +pdl: the engine's kernel after the decode); +preload0 and
#      PDL off stamped last; the stamps' table (stamps.py --read).
#   8  carry [".gpu/fk"], ~4 min on a fresh machine (after part 7, call 5: the merger is slow only behind the next
#      decode's early reads, and +preload0, 2,150 of its cycles fewer, moved the decode 0-0.15 us): the decode in the
#      engine's order and its fixed cost, the most wanted first (a call may be cut). Batch 1 x 4k, both shapes: the
#      default, +kvpf0 and PDL off after the output projection (--between oproj); the decode at batch 1 over Llama-8B's
#      4k to 32k (with triton/decode_tiles=64x4x3+pdl: 4k on the longer contexts' tile); the same arms after the MLP
#      (--between gemm); SmolLM2 at 4k / 16k / 32k; fit.py: time against bytes over the contexts past 4k (one tile,
#      their slope the bandwidth reached, their intercept the cost no context removes) and each 4k cell's distance
#      above that line; the default and PDL off stamped after the output projection; the between GEMMs' test on the
#      GPU. The between launches walk over copies of their weights (bench.between.weight_copies; between_copies and
#      the launch's own between_ms in each cell: part 7 had one copy, L2-hot timed alone).
#   9  carry [".gpu/fk"], ~4 min on a fresh machine (after part 8, call 6: at 8k-32k Llama-8B's batch-1 decode is a
#      fixed 7.0 us plus its bytes at the copy bandwidth; the 4k launch pays 4.6 us past its bytes): which launch takes
#      that fixed cost down at the long contexts? Batch 1 x 8k / 16k / 32k, PDL on: the default (64-token tiles, 4
#      warps, 3 stages, the merge launch) against the fused merge uncapped, 128-token tiles of 8 warps in 2 stages
#      (merge launch and fused), 32, 64 and 128 splits, the split loop's page ids a tile ahead (+ahead1: 3 and 4
#      stages; stages.py: only then does the loop copy ahead of the tile it computes); SmolLM2 at 16k / 32k the
#      default against fused and +ahead1; fit.py per arm. The page-ahead GPU tests run first.
# Output: $OUT/runPART.log (the console) and resultsPART.tgz (the tables as .md / .json, the test logs).
set -u -o pipefail
PART=${1:?part 1 to 9}
. experiments/sitting.sh  # OUT, LOGS, step, install_fb, gpu_tests, pack, the environment, the call's log, PY
case $PART in
1)
  L=triton/fused_merge=false
  floor_rounds \
    triton+pdl,triton+pdl+regs80,triton+pdl+regs80+preload0,triton+pdl+regs88,triton+pdl+regs72,$L+pdl,$L+pdl+regs80
  step "the split decode without its merge (nomerge.py: the merge launch removed; triton+pdl, fused, the anchor)"
  timeout 120 $PY experiments/decode-regcap/nomerge.py --phases decode --reps 200 --repeats 3 --quick \
    --backends triton+pdl,$L+pdl,$L+pdl+regs80 --out "$OUT/nomerge" > $LOGS/nomerge.log 2>&1
  echo "exit code $?"; grep -E "^decode|Error" $LOGS/nomerge.log
  step "GPU tests: the capped launches bit for bit"
  gpu_tests regcap 240 -m gpu tests/integration/test_gpu_decode_prefetch.py -k register_cap
  step "llama8b: triton+pdl, +regs80, +regs88, batch 1-32 x 128 / 512 / 4k"
  timeout 150 $PY -m attnlab.bench.kernels --phases decode --reps 200 --repeats 3 --models llama8b \
    --batches 1,2,4,8,16,32 --contexts 128,512,4096 --backends triton+pdl,triton+pdl+regs80,triton+pdl+regs88 \
    --out "$OUT/grid-llama8b" > $LOGS/grid-llama8b.log 2>&1
  echo "exit code $?"; grep -E "^decode|Error" $LOGS/grid-llama8b.log
  ;;
2)
  L=triton/fused_merge=false
  floor_rounds triton+pdl,triton+pdl+ticket1,triton
  step "the split decode without its merge (nomerge.py), the fused default and +ticket1 in the same process"
  timeout 120 $PY experiments/decode-regcap/nomerge.py --phases decode --reps 200 --repeats 3 --quick \
    --backends triton+pdl,triton+pdl+ticket1,$L+pdl --out "$OUT/nomerge" > $LOGS/nomerge.log 2>&1
  echo "exit code $?"; grep -E "^decode|Error" $LOGS/nomerge.log
  step "GPU tests: the merge ticket raced and replayed, a plan and the current K / V written late; auto's batch-1 cases"
  gpu_tests ticket 200 -m gpu tests/backends/test_fused_merge.py tests/integration/test_gpu_decode_prefetch.py \
    -k "ticket or batch1"
  for m in smollm2 llama8b; do
    step "$m: triton+pdl, +ticket1, batch 1-16 x 128 / 512 / 1k / 4k"
    timeout 100 $PY -m attnlab.bench.kernels --phases decode --reps 200 --repeats 3 --models $m \
      --batches 1,2,4,8,16 --contexts 128,512,1024,4096 --backends triton+pdl,triton+pdl+ticket1 \
      --out "$OUT/grid-$m" > $LOGS/grid-$m.log 2>&1
    echo "exit code $?"; grep -E "^decode|Error" $LOGS/grid-$m.log
  done
  ;;
3)
  FB=.gpu/fk install_fb
  L=triton/fused_merge=false
  Q="--phases decode --reps 200 --repeats 3 --quick"
  for r in $(seq "${ROUNDS:-2}"); do
    step "round $r: the default and the merge launch"
    timeout 150 $PY -m attnlab.bench.kernels $Q --backends triton+pdl,$L+pdl --out "$OUT/plain$r" > $LOGS/plain$r.log 2>&1
    echo "exit code $?"; grep -E "^decode|Error" $LOGS/plain$r.log
    step "round $r: the merge launch removed (nomerge.py)"
    timeout 120 $PY experiments/decode-regcap/nomerge.py $Q --backends triton+pdl,$L+pdl --out "$OUT/nomerge$r" \
      > $LOGS/nomerge$r.log 2>&1
    echo "exit code $?"; grep -E "^decode|Error" $LOGS/nomerge$r.log
    step "round $r: the fused merge cut to its arrival (nomerge.py --arrive)"
    timeout 120 $PY experiments/decode-regcap/nomerge.py --arrive $Q --backends triton+pdl --out "$OUT/arrive$r" \
      > $LOGS/arrive$r.log 2>&1
    echo "exit code $?"; grep -E "^decode|Error" $LOGS/arrive$r.log
    step "round $r: that arrival without its fence (nomerge.py --arrive-relaxed)"
    timeout 120 $PY experiments/decode-regcap/nomerge.py --arrive-relaxed $Q --backends triton+pdl \
      --out "$OUT/relaxed$r" > $LOGS/relaxed$r.log 2>&1
    echo "exit code $?"; grep -E "^decode|Error" $LOGS/relaxed$r.log
  done
  ;;
4)
  FB=.gpu/fk install_fb
  Q="--phases decode --reps 200 --repeats 3 --quick"
  for r in 1 2 3; do
    step "round $r: fp32 and bf16 partials, PDL on and off"
    timeout 60 $PY -m attnlab.bench.kernels $Q --backends \
      triton+pdl,triton/decode_partials=out+pdl,triton,triton/decode_partials=out --out "$OUT/bf16p$r" \
      > $LOGS/bf16p$r.log 2>&1
    echo "exit code $?"; grep -E "^decode|Error" $LOGS/bf16p$r.log
  done
  Q="$Q --models llama8b,smollm2 --batches 1 --backends triton+pdl,triton+pdl+preload0,triton"
  for r in 1 2; do
    step "round $r: the default, +preload0 and PDL off, whole and cut to their arrival"
    timeout 60 $PY -m attnlab.bench.kernels $Q --out "$OUT/plain$r" > $LOGS/plain$r.log 2>&1
    echo "exit code $?"; grep -E "^decode|Error" $LOGS/plain$r.log
    timeout 60 $PY experiments/decode-regcap/nomerge.py --arrive $Q --out "$OUT/arrive$r" > $LOGS/arrive$r.log 2>&1
    echo "exit code $?"; grep -E "^decode|Error" $LOGS/arrive$r.log
  done
  ;;
5)
  FB=.gpu/fk install_fb
  Q="--phases decode --reps 200 --repeats 3 --models llama8b,smollm2 --batches 1 --contexts 4096"
  step "plain: the default and PDL off"
  timeout 60 $PY -m attnlab.bench.kernels $Q --backends triton+pdl,triton --out "$OUT/plain" > $LOGS/plain.log 2>&1
  echo "exit code $?"; grep -E "^decode|Error" $LOGS/plain.log
  for arm in pdl nopdl; do
    step "stamped: $arm"
    timeout 90 $PY experiments/decode-regcap/stamps.py $Q --backends "triton$([ $arm = pdl ] && echo +pdl)" \
      --out "$OUT/stamps-$arm" > $LOGS/stamps-$arm.log 2>&1
    echo "exit code $?"; grep -E "^decode|^buffer|Error" $LOGS/stamps-$arm.log; cp $LOGS/stamps-$arm.log "$OUT/"
  done
  nvidia-smi --query-gpu=clocks.sm,clocks.max.sm --format=csv
  ;;
6)
  FB=.gpu/fk install_fb
  Q="--phases decode --reps 200 --repeats 3 --quick --backends triton+pdl,triton"
  for r in 1 2 3; do
    step "round $r: the default merge, then the lean one"
    timeout 60 $PY -m attnlab.bench.kernels $Q --out "$OUT/plain$r" > $LOGS/plain$r.log 2>&1
    echo "exit code $?"; grep -E "^decode|Error" $LOGS/plain$r.log
    timeout 60 $PY experiments/decode-regcap/lean.py $Q --out "$OUT/lean$r" > $LOGS/lean$r.log 2>&1
    echo "exit code $?"; grep -E "^decode|Error" $LOGS/lean$r.log
  done
  step "GPU tests of the fused merge with the lean merge (raced, replayed; its bits against merge_ordered)"
  timeout 240 $PY experiments/decode-regcap/lean.py --gpu-check > $LOGS/lean-tests.log 2>&1
  echo "exit code $?"; grep -E "passed|failed|FAILED|Error" $LOGS/lean-tests.log | tail -n 6
  cp $LOGS/lean-tests.log "$OUT/"
  ;;
7)
  FB=.gpu/fk install_fb
  Q="--phases decode --reps 200 --repeats 3 --models llama8b,smollm2 --batches 1 --contexts 4096"
  ARMS="triton+pdl triton+pdl+kvpf0 triton+pdl+preload0 triton"
  step "plain: $ARMS"
  timeout 60 $PY -m attnlab.bench.kernels $Q --backends "${ARMS// /,}" --out "$OUT/plain" > $LOGS/plain.log 2>&1
  echo "exit code $?"; grep -E "^decode|Error" $LOGS/plain.log
  stamped() {  # NAME ARM [bench.kernels arguments]: one stamped process
    local name=$1 arm=$2; shift 2
    step "stamped: $arm $*"
    timeout 90 $PY experiments/decode-regcap/stamps.py $Q --backends "$arm" "$@" --out "$OUT/$name" \
      > $LOGS/$name.log 2>&1
    echo "exit code $?"; grep -E "^decode|^buffer|Error" $LOGS/$name.log; cp $LOGS/$name.log "$OUT/"
  }
  # the default and +kvpf0 first, then the GEMM between, so that a call cut short keeps the comparisons that matter
  for arm in triton+pdl triton+pdl+kvpf0; do stamped "stamps-${arm//+/_}" "$arm"; done
  for b in gemm oproj; do
    step "plain, --between $b: the default and PDL off"
    timeout 120 $PY -m attnlab.bench.kernels $Q --backends triton+pdl,triton --between $b --out "$OUT/plain-$b" \
      > $LOGS/plain-$b.log 2>&1
    echo "exit code $?"; grep -E "^decode|Error" $LOGS/plain-$b.log
    for arm in triton+pdl triton; do stamped "stamps-$b-${arm//+/_}" "$arm" --between $b; done
  done
  for arm in triton+pdl+preload0 triton; do stamped "stamps-${arm//+/_}" "$arm"; done
  step "the stamps' table"
  $PY experiments/decode-regcap/stamps.py --read "$OUT"/stamps-*-stamps.json | tee "$OUT/stamps-table.md"
  nvidia-smi --query-gpu=clocks.sm,clocks.max.sm --format=csv
  ;;
8)
  FB=.gpu/fk install_fb
  Q="--phases decode --reps 200 --repeats 3 --batches 1"
  ARMS=triton+pdl,triton+pdl+kvpf0,triton
  # Ordered for a call that may be cut: the engine's order and Llama-8B's contexts first, the stamps last.
  between() {
    step "--between $1 (its weights walked): $ARMS"
    timeout 100 $PY -m attnlab.bench.kernels $Q --models llama8b,smollm2 --contexts 4096 --backends $ARMS \
      --between $1 --out "$OUT/between-$1" > $LOGS/between-$1.log 2>&1
    echo "exit code $?"; grep -E "^decode|Error" $LOGS/between-$1.log
  }
  contexts() {
    step "batch 1 over contexts: $1 at $2 (SmolLM2's 4k walks 24 MiB: the floor cell, partly L2): $ARMS${4:-}"
    timeout $3 $PY -m attnlab.bench.kernels $Q --models $1 --contexts $2 --backends $ARMS${4:-} \
      --out "$OUT/contexts-$1" > $LOGS/contexts-$1.log 2>&1
    echo "exit code $?"; grep -E "^decode|Error" $LOGS/contexts-$1.log
  }
  between oproj
  # 8k and up loop over 64-token tiles (4 warps, 3 stages) and merge in a second launch; 4k runs one 128-token tile of
  # 8 warps with the fused merge. The forced 64x4x3 arm runs 4k as the long contexts run: a point on their line.
  contexts llama8b 4096,8192,16384,32768 120 ,triton/decode_tiles=64x4x3+pdl
  between gemm
  contexts smollm2 4096,16384,32768 90
  step "time against bytes (fit.py): the 4k floor cells against the longer contexts' lines"
  $PY experiments/decode-regcap/fit.py "$OUT"/contexts-*.json --exclude smollm2:4096 --aside llama8b:4096 \
    --plot "$OUT/fit.png" | tee "$OUT/fit.md"
  $PY experiments/decode-regcap/fit.py "$OUT"/contexts-smollm2.json --aside smollm2:4096 | tee "$OUT/fit-smollm2-4k.md"
  nvidia-smi --query-gpu=clocks.sm,clocks.max.sm --format=csv
  for arm in triton+pdl triton; do
    name=stamps-oproj-${arm//+/_}
    step "stamped: $arm --between oproj"
    timeout 55 $PY experiments/decode-regcap/stamps.py $Q --models llama8b,smollm2 --contexts 4096 --backends $arm \
      --between oproj --out "$OUT/$name" > $LOGS/$name.log 2>&1
    echo "exit code $?"; grep -E "^decode|^buffer|Error" $LOGS/$name.log; cp $LOGS/$name.log "$OUT/"
  done
  step "the stamps' table"
  $PY experiments/decode-regcap/stamps.py --read "$OUT"/stamps-oproj-*-stamps.json | tee "$OUT/stamps-table.md"
  step "GPU test: the between GEMMs walk their weight copies"
  gpu_tests between 60 tests/backends/test_bench_kernels.py -k "between or weight_copies or cold_timer"
  ;;
9)
  FB=.gpu/fk install_fb
  T=triton
  # first: a fault in the never-run +ahead1 kernel would cost the timing process its CUDA context, not these tests
  step "GPU tests: the page ids a tile ahead, bit for bit (several stages, PDL off / on, merge launch and fused)"
  gpu_tests ahead 150 tests/integration/test_gpu_decode_prefetch.py -k page_ahead
  LONG=$T+pdl,$T/fused_merge=true+pdl,$T/decode_tiles=128x8x2+pdl,$T/decode_tiles=128x8x2/fused_merge=true+pdl
  # 64x4x4 compiles to 64x4x3's PTX, but with the page ids a tile ahead (+ahead1) 3 / 4 stages keep one / two tiles'
  # copies in flight beside the one computing (stages.py: K and V are two copy groups)
  LONG=$LONG,$T/num_splits=64+pdl,$T/num_splits=32+pdl,$T/num_splits=128+pdl,$T+pdl+ahead1
  LONG=$LONG,$T/decode_tiles=64x4x4+pdl+ahead1
  step "batch 1 over 8k-32k, PDL on: the long contexts' launch against fused, 128-token tiles, other splits / stages"
  timeout 240 $PY -m attnlab.bench.kernels --phases decode --reps 200 --repeats 3 --batches 1 --models llama8b \
    --contexts 8192,16384,32768 --backends $LONG \
    --out "$OUT/long-llama8b" > $LOGS/long-llama8b.log 2>&1
  echo "exit code $?"; grep -E "^decode|Error" $LOGS/long-llama8b.log
  # SmolLM2 from 16k: its 8k walk (8 layers of 6.3 MB) is about the L2, part 8's rule is twice it
  timeout 90 $PY -m attnlab.bench.kernels --phases decode --reps 200 --repeats 3 --batches 1 --models smollm2 \
    --contexts 16384,32768 --backends $T+pdl,$T/fused_merge=true+pdl,$T+pdl+ahead1 --out "$OUT/long-smollm2" \
    > $LOGS/long-smollm2.log 2>&1
  echo "exit code $?"; grep -E "^decode|Error" $LOGS/long-smollm2.log
  step "time against bytes per arm (fit.py)"
  $PY experiments/decode-regcap/fit.py "$OUT"/long-*.json --plot "$OUT/fit-long.png" | tee "$OUT/fit-long.md"
  nvidia-smi --query-gpu=clocks.sm,clocks.max.sm --format=csv
  ;;
*) echo "part 1 to 9"; exit 2 ;;
esac
pack
