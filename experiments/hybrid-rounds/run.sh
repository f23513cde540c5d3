# The hybrid's end-to-end verdict (issue 16; docs/backends.md, "Measured"), timed in rounds: with --same-rounds
# bench.spec times every verify backend on the same mixed 200 / 4,000-token prompts in each round and reports each
# row's tok/s against triton's same row as the median of per-round ratios, so drift between a sweep's jobs
# (2026-12-05c: triton's batch-8 median moved 1.19x between processes) or between groups cannot decide it. (Its first
# run, 2026-12-06, had no --same-rounds: each verify backend's rows were a group of their own, timed one group after
# the other in one process; README.md.) Random weights, ngram k 4, graphs, batch 1 and 8, 16 prompts (PROMPTS=32: 2026-12-05c's
# count) x 128 tokens, 5 rounds. One call, carry [".gpu/fk"], a fresh or a warm machine (plus the FA3 prefill's JIT,
# minutes, on a machine that has not built it):
#   FB=.gpu/fk bash experiments/hybrid-rounds/run.sh
# (on the machine xqa-verify/run.sh 3 left warm, with the libraries and that JIT: carry [".gpu/g1"], FB=.gpu/g1, the
# fp8 sweep's second GGUF part riding along: fp8-kv-sweep/run.sh)
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
jit_prefill jitp 300
settle
step "bench.spec: triton, flashinfer, the hybrid; mixed 200 / 4,000-token prompts; batch 1 and 8; 5 rounds"
timeout ${SPEC_SECS:-300} $PY -m attnlab.bench.spec --device cuda --skip-hf --weights random --drafters ngram --k 4 --batch 1,8 \
  --backends "triton,flashinfer,$H" --prompt-lengths 200,4000 --num-prompts ${PROMPTS:-16} --new 128 --repeats 5 --same-rounds \
  --out "$OUT/hr" > $LOGS/hr.log 2>&1
echo "exit code $?"; grep -E "^\||^- |against the first" $LOGS/hr.log
cp $LOGS/hr.log "$OUT/" 2>/dev/null
pack
