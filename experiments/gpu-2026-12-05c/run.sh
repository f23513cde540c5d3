# The GPU calls of the 2026-12-05c sitting (README.md here), back to back on one machine. The real SmolLM2's GGUF
# travels one 24.6 MB part a call (bundles.sh of h200-2026-12-04h: .gpu/m0 .. .gpu/m3), each beside other work, and
# the held-out ShareGPT prompts travel as a 142 KB export in .gpu/m3 (not the 27 MB .gpu/4 bundle), so the real model
# runs in the fourth call, not the sixth:
#   1  carry [".gpu/fi", ".gpu/m0"]:  bash .gpu/m0/install.sh; FB=.gpu/fi bash experiments/rows-refit/run.sh
#   2  carry [".gpu/m1"]:             FB=.gpu/m1 bash experiments/h100-2026-12-05b/run.sh
#   3  carry [".gpu/m2"]:             bash experiments/gpu-2026-12-05c/run.sh 3
#   4  carry [".gpu/m3"]:             bash experiments/gpu-2026-12-05c/run.sh 4
#   5  no carry, in the time left:    bash experiments/gpu-2026-12-05c/run.sh 5
# (FB=.gpu/mN: install_fb installs that call's GGUF part and prints the GPU and library versions.)
# .gpu/m3's export:  python -m attnlab.workloads.sharegpt --export .gpu/m3/heldout.jsonl.gz --train 0
#   (the 212 held-out first turns, every 50th conversation: never trained on by attnlab.train_draft)
# 3  install .gpu/m2; Triton's GPU cases (test_triton.py -m gpu)
# 4  install .gpu/m3 (joins the GGUF); issue 17: the real SmolLM2 and its shipped EAGLE head, bf16 / fp8w / fp8wh
#    drafts, k 4, batch 1, 16 held-out ShareGPT prompts, 128 new tokens, 5 repeats (h200-2026-12-04h part 8's run)
# 5  FlashInfer's parity grid against the torch reference (test_gpu_parity), never run whole; LIMIT seconds (400)
# Output: $OUT/runN.log (the console) and resultsN.tgz.
set -u -o pipefail
PART=${1:?part 3, 4 or 5}
. experiments/sitting.sh  # OUT, LOGS, step, install_fb, gpu_tests, pack, the environment, the call's log, PY
case $PART in
3)
  FB=.gpu/m2 install_fb
  step "GPU tests: Triton's GPU cases (test_triton.py -m gpu)"
  gpu_tests tests3t 200 tests/backends/test_triton.py -m gpu
  pack
  ;;
4)
  FB=.gpu/m3 install_fb
  test -s /opt/models/SmolLM2-135M-Instruct.Q4_1.gguf || { echo "the GGUF is not whole: parts 1-3 first"; exit 1; }
  step "issue 17: the real SmolLM2 and its shipped EAGLE head, bf16 / fp8w / fp8wh drafts, k 4, batch 1, 16 prompts"
  timeout 420 $PY -m attnlab.bench.spec --device cuda --skip-hf --weights real --prompts .gpu/m3/heldout.jsonl.gz \
    --num-prompts 16 --drafters eagle --draft-weights bf16,fp8w,fp8wh --dtype bf16 --k 4 --batch 1 --backends triton \
    --gemm triton --pdl --new 128 --repeats 5 --out "$OUT/eagle4" > $LOGS/eagle4.log 2>&1
  echo "exit code $?"; grep -E "^\||^- eagle" $LOGS/eagle4.log
  cp $LOGS/eagle4.log "$OUT/" 2>/dev/null
  pack
  ;;
5)
  step "GPU tests: FlashInfer's parity grid (test_gpu_parity, every dtype / head dim / page size / mode)"
  gpu_tests tests5f "${LIMIT:-400}" tests/backends/test_flashinfer.py -m gpu -k test_gpu_parity
  pack
  ;;
esac
