# The hybrid's end-to-end verdict (issue 16; docs/backends.md, "Measured"), timed in rounds: bench.spec times every
# verify backend on the same mixed 200 / 4,000-token prompts in each round and reports each row's speedup as the median
# of per-round ratios, so drift between a sweep's jobs (2026-12-05c: triton's batch-8 median moved 1.19x between
# processes) cannot decide it. Random weights, ngram k 4, graphs, batch 1 and 8, 32 prompts x 128 tokens, 5 rounds.
# One call, carry [".gpu/fi"], a fresh or a warm machine (about 4 minutes fresh, plus the FA3 prefill's JIT):
#   FB=.gpu/fi bash experiments/hybrid-rounds/run.sh
# Output: $OUT/runhr.log (the console) and resultshr.tgz.
set -u -o pipefail
PART=hr
. experiments/sitting.sh  # OUT, LOGS, step, install_fb, fi_jit, settle, pack, the environment, PY
H=hybrid/short=flashinfer/long=triton/threshold=1024
install_fb
fi_jit jit 200 "flashinfer,$H"  # FlashInfer's decode / fa2 verify kernels untimed first
# and its FA3 prefill (the 4,000-token prompts' family): on 2026-12-05d its JIT ("can take several minutes") ran inside
# bench.spec's 300 s and the step timed out before a round was timed
step "FlashInfer JIT: the long prompts' prefill (auto: FA3 on Hopper), SmolLM2 shapes"
timeout 300 $PY -m attnlab.bench.kernels --compile-only --phases prefill --contexts 512 --batches 1 --models smollm2 \
  --backends flashinfer > $LOGS/jitp.log 2>&1
echo "exit code $?"; tail -n 1 $LOGS/jitp.log
settle
step "bench.spec: triton, flashinfer, the hybrid; mixed 200 / 4,000-token prompts; batch 1 and 8; 5 rounds"
timeout 300 $PY -m attnlab.bench.spec --device cuda --skip-hf --weights random --drafters ngram --k 4 --batch 1,8 \
  --backends "triton,flashinfer,$H" --prompt-lengths 200,4000 --num-prompts 32 --new 128 --repeats 5 \
  --out "$OUT/hr" > $LOGS/hr.log 2>&1
echo "exit code $?"; grep -E "^\|" $LOGS/hr.log
cp $LOGS/hr.log "$OUT/" 2>/dev/null
pack
