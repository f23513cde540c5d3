# the inline device call after N2 (machine warm, model and flashinfer installed): the parity job, then the kernel grid
export PYTHONPATH=/opt/site:$PWD PYTHONUNBUFFERED=1 WANDB_MODE=disabled
timeout 150 python3 -m attnlab -m experiment=backend_pairs draft=eagle backend=triton verify=triton,flashinfer \
  engine.cuda_graph=true warmup=full bench.repeats=1 workload=sharegpt workload.path=/opt/data/sharegpt.jsonl.gz \
  workload.num_prompts=16 workload.batch_size=1 workload.max_new_tokens=128 logger=jsonl device=cuda \
  hydra.sweep.dir=/tmp/m/parity
python3 -m attnlab.report /tmp/m/parity --no-plots
timeout 200 python3 -m attnlab.bench.kernels --backends triton,flashinfer --batches 1,16,64 --contexts 512,4096,16384 \
  --repeats 3 --out $OUT/kernels_grid
