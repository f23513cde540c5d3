# Issue 16's item 2 (docs/precision.md, "The H200 sweep"): conf/experiment/fp8_kv.yaml on the real SmolLM2, the
# flashinfer rows beside triton's: precision bf16 / fp8-draft / fp8-kv x draft backend x verify backend, parity
# (tokens, logits, acceptance) and speed. Never run on a GPU. Back to back on one machine (bundles: ../shared/gpu/
# prepare.sh, then .gpu/fk, the core libraries and flashinfer of .gpu/1 without its GGUF part, datasets, dill and
# multiprocess (experiments/xqa-verify/run.sh), and h200-2026-12-04h/bundles.sh's .gpu/m0..m3):
#   1  carry [".gpu/fk"]:  bash experiments/fp8-kv-sweep/run.sh 1
#   2  carry [".gpu/m0"]:  bash experiments/fp8-kv-sweep/run.sh 2
#   3  carry [".gpu/m1"]:  bash experiments/fp8-kv-sweep/run.sh 3
#   4  carry [".gpu/m2"]:  bash experiments/fp8-kv-sweep/run.sh 4
#   5  carry [".gpu/m3"]:  bash experiments/fp8-kv-sweep/run.sh 5   (joins the GGUF; draft backend triton)
#   6  no carry:           bash experiments/fp8-kv-sweep/run.sh 6   (draft backend flashinfer; the report)
# The tree (22.6 MB on 2026-12-05d) with .gpu/fk (20.1 MB) and a GGUF part (24.6 MB) passes the 64 MiB a call carries,
# so the core libraries and the four parts ride in five calls. Calls 1-4 carry little: put other work of the sitting
# beside them (h100-2026-12-05c/run.sh did).
# Output: $OUT/runN.log (the console) and resultsN.tgz (the sweep's report and run folders' metrics / parity).
set -u -o pipefail
PART=${1:?part 1-6}
. experiments/sitting.sh  # OUT, LOGS, step, install_fb, pack, the environment, the call's log, PY
# sweep DRAFT_BACKEND SECS: the fp8_kv grid for one draft backend (6 jobs), its report in $OUT
sweep() {
  step "fp8_kv sweep on the real SmolLM2: backend=$1, verify triton and flashinfer, bf16 / fp8-draft / fp8-kv"
  timeout "$2" $PY -m attnlab -m experiment=fp8_kv device=cuda logger=jsonl backend="$1" \
    hydra.sweep.dir=/tmp/sweep/fp8kv > $LOGS/sweep-$1.log 2>&1
  echo "exit code $?"; tail -n 2 $LOGS/sweep-$1.log; cp $LOGS/sweep-$1.log "$OUT/"
}
case $PART in
1) FB=.gpu/fk install_fb ;;
[234]) FB=.gpu/m$((PART - 2)) install_fb ;;
5)
  FB=.gpu/m3 install_fb
  test -s /opt/models/SmolLM2-135M-Instruct.Q4_1.gguf || { echo "the GGUF is not whole: parts 2-4 first"; exit 1; }
  sweep triton 540
  ;;
6)
  sweep flashinfer 480
  $PY -m attnlab.report /tmp/sweep/fp8kv > "$OUT/fp8kv.md" 2>&1; cat "$OUT/fp8kv.md"
  tar czf "$OUT/fp8kv-runs.tgz" --exclude="*.pt" -C /tmp/sweep fp8kv 2>/dev/null
  pack
  ;;
esac
