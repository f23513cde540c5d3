# Issue 16's item 2 (docs/precision.md, "The H200 sweep"): conf/experiment/fp8_kv.yaml on the real SmolLM2, the
# flashinfer rows beside triton's: precision bf16 / fp8-kv / fp8-draft x draft backend x verify backend (12 jobs, bf16
# first: it is what the fp8 rows' parity is read against), parity (tokens, logits, acceptance) and speed. The drafter is
# the shipped EAGLE-3 head since 2026-12-05f (the self-draft's tau was 1.02-1.03; results/: that run, 8 of 12 jobs in
# 470 s on an H100, so the 12 take two calls now: bf16 and fp8-kv, then fp8-draft).
# The GGUF travels in four parts (bundles.sh: .gpu/g0..g3, after ../shared/gpu/prepare.sh) on one machine, back to
# back; calls 1 and 2 carry little, so other work of the sitting rides beside them:
#   1  carry [".gpu/fk", ".gpu/g0"]:  bash experiments/fp8-kv-sweep/run.sh 1   (or xqa-verify/run.sh 3, which installs
#                                     both and compiles this sweep's e4m3-KV FlashInfer modules untimed: jit_fp8)
#   2  carry [".gpu/g1"]:             bash experiments/fp8-kv-sweep/run.sh 2   (or FB=.gpu/g1 hybrid-rounds/run.sh)
#      carry [".gpu/g2"]:             FB=.gpu/g2 bash experiments/fp8-kv-sweep/run.sh 2
#   3  carry [".gpu/g3"]:             bash experiments/fp8-kv-sweep/run.sh 3   (joins the GGUF; bf16 and fp8-kv: 8 jobs)
#   4  no carry:                      bash experiments/fp8-kv-sweep/run.sh 4   (fp8-draft: 4 jobs; the reports)
#   5  carry [".gpu/g3"] after 1, 2:  bash experiments/fp8-kv-sweep/run.sh 5   (job 4 alone, fp8-kv triton / triton,
#                                     with parity.rounding: is its gap-0.5 divergence within the reference's rounding?)
# (.gpu/fk: the core libraries and flashinfer of .gpu/1 without its GGUF part, datasets, dill and multiprocess.)
# Output: $OUT/runN.log (the console) and resultsN.tgz (the report, fp8kv.md, and the run folders without weights).
set -u -o pipefail
PART=${1:?part 1, 2, 3, 4 or 5}
. experiments/sitting.sh  # OUT, LOGS, step, install_fb, jit_fp8, pack, the environment, the call's log, PY
# sweep NAME PRECISIONS SECS: experiment=fp8_kv at these precisions x backend x verify, in /tmp/sweep/NAME; SWEEP_ARGS:
# more overrides (SWEEP_ARGS=backend=triton: the triton-drafted half, for a sitting short of device time)
sweep() {
  step "fp8_kv sweep on the real SmolLM2, precision $2 x backend x verify (triton, flashinfer)"
  timeout "$3" $PY -m attnlab -m experiment=fp8_kv device=cuda logger=jsonl precision="$2" \
    hydra.sweep.dir=/tmp/sweep/$1 ${SWEEP_ARGS:-} > $LOGS/sweep-$1.log 2>&1
  echo "exit code $?"; grep -E "HYDRA\] +#|tau|ERROR|attnlab sweep" $LOGS/sweep-$1.log | cut -c1-220
  cp $LOGS/sweep-$1.log "$OUT/"
}
# reports SWEEP...: attnlab.report of each sweep folder (its .md in $OUT and on the console), and the run folders without
# weights in one archive
reports() {
  local d; for d in "$@"; do $PY -m attnlab.report /tmp/sweep/$d > "$OUT/$d.md" 2>&1; cat "$OUT/$d.md"; done
  tar czf "$OUT/fp8kv-runs.tgz" --exclude="*.pt" -C /tmp/sweep "$@" 2>/dev/null
}
case $PART in
1) FB=.gpu/fk install_fb; bash .gpu/g0/install.sh | tail -1; step "e4m3-KV JIT"; jit_fp8 jitfp8 240 ;;
2) FB=${FB:-.gpu/g1} install_fb ;;
3)
  FB=.gpu/g3 install_fb
  test -s /opt/models/SmolLM2-135M-Instruct.Q4_1.gguf || { echo "the GGUF is not whole: run.sh 1, then run.sh 2 with g1 and with g2 first"; exit 1; }
  sweep fp8kv bf16,fp8-kv "${SWEEP_SECS:-540}"
  reports fp8kv  # here too: a sitting short of device time may stop after this call
  ;;
4)
  sweep fp8draft fp8-draft "${SWEEP_SECS:-300}"
  reports fp8kv fp8draft
  ;;
5)
  FB=.gpu/g3 install_fb
  test -s /opt/models/SmolLM2-135M-Instruct.Q4_1.gguf || { echo "the GGUF is not whole: run.sh 1, then run.sh 2 with g1 and with g2 first"; exit 1; }
  step "job 4 of the sweep alone (precision fp8-kv, backend triton, verify triton), parity.rounding on"
  timeout "${SWEEP_SECS:-300}" $PY -m attnlab experiment=fp8_kv device=cuda logger=jsonl precision=fp8-kv \
    backend=triton verify=triton hydra.run.dir=/tmp/sweep/job4/0 > $LOGS/job4.log 2>&1
  echo "exit code $?"; grep -E "tau|WARNING|ERROR|rounding" $LOGS/job4.log | cut -c1-400
  cp $LOGS/job4.log "$OUT/"
  reports job4
  ;;
esac
pack
