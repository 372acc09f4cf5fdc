#!/usr/bin/env bash
# Back-shard training throughput: tandem's cloud work alone (bench_back_shard: a spec's shard
# after its cut, random activations, K=4 micro-batches a step, SGD with momentum) against
# PyTorch eager training the same layers on the same device (bench/pytorch_back_shard.py),
# the two alternating, ROUNDS runs each; prints the medians and their ratio. Issue 17's bars
# on a GPU: at least 1.5x for the Fashion-MNIST back, 1.0x for ResNet18's and spam-bert's.
# DEVICE=cuda (the default; tandem on --backend cuda) needs a GPU and PyTorch that sees it;
# DEVICE=cpu compares onednn with PyTorch on one CPU thread. On cuda PyTorch runs twice: in full
# f32 as tandem (the ratio), and with its default TF32 convolutions (for the record).
# QUICK=1 runs a quarter of the steps (a device check's time).
# usage: [DEVICE=cuda|cpu] [ROUNDS=3] [BATCH=64] [QUICK=1] [PYTHON=python3 with torch] bash bench/gpu/back_shard.sh
set -euo pipefail
cd "$(dirname "$0")/../.."
device=${DEVICE:-cuda} rounds=${ROUNDS:-3} batch=${BATCH:-64}
python=${PYTHON:-/usr/bin/python3}  # with PyTorch: Debian's here, the image's own on the GPU machine
bin=build/release/bench/bench_back_shard
[[ -x $bin ]] || bash scripts/setup.sh release > /dev/null
export OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1  # one thread a side on the CPU
if [[ $device == cuda ]]; then
  backend=cuda
  # Only a missing GPU skips; a failure of the cuda backend itself fails the bench.
  gpu=$(build/release/tools/tandem gpu) || { echo "SKIP: $gpu (DEVICE=cpu compares on the CPU)"; exit 77; }
  echo "GPU: $gpu"
  "$python" -c 'import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)' ||
    { echo "SKIP: PyTorch sees no CUDA device here"; exit 77; }
else
  backend=onednn
fi

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
median() { sort -n | awk '{ v[NR] = $1 } END { print v[int((NR + 1) / 2)] }'; }
field() { grep -o "\"$1\": *[0-9.]*" | grep -o '[0-9.]*$'; }

# model spec, its cut, steps a run on the GPU and on the CPU
while read -r name spec cut gpu_steps cpu_steps; do
  steps=$([[ $device == cuda ]] && echo "$gpu_steps" || echo "$cpu_steps")
  [[ ${QUICK:-0} == 1 ]] && steps=$(((steps + 3) / 4))
  : > "$work/tandem" && : > "$work/torch" && : > "$work/torch_tf32"
  for _ in $(seq 1 "$rounds"); do
    "$bin" "$spec" --cut "$cut" --backend "$backend" --batch "$batch" --steps "$steps" --warmup 3 |
      field samples_per_s >> "$work/tandem"
    TORCH_CUDNN_TF32=0 "$python" bench/pytorch_back_shard.py "$spec" "$cut" "$device" "$batch" 4 "$steps" 3 |
      field samples_per_s >> "$work/torch"
    [[ $device == cuda ]] && TORCH_CUDNN_TF32=1 "$python" bench/pytorch_back_shard.py "$spec" "$cut" "$device" "$batch" \
      4 "$steps" 3 | field samples_per_s >> "$work/torch_tf32"
  done
  t=$(median < "$work/tandem") p=$(median < "$work/torch") p32=$(median < "$work/torch_tf32")
  awk -v n="$name" -v b="$backend" -v d="$device" -v t="$t" -v p="$p" -v r="$rounds" -v p32="${p32:-0}" 'BEGIN {
    printf "%-14s tandem (%s) %10.1f samples/s, PyTorch (%s) %10.1f: %.2fx (medians of %d)", n, b, t, d, p, t / p, r
    if (p32 > 0) printf "; PyTorch with TF32 convolutions %.1f: %.2fx", p32, t / p32
    printf "\n" }'
done << 'MODELS'
fashion-mnist samples/fashion-mnist/model.json pool2 2000 200
resnet18 samples/models/resnet18-32.json relu17 200 4
spam-bert samples/spam-bert/model.json bert.encoder.layer.1.output.LayerNorm 200 3
MODELS
