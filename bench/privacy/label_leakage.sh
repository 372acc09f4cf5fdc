#!/usr/bin/env bash
# Label leakage, what the cloud can learn of the labels (issue 18, attack b): the Fashion-MNIST
# sample trained with the real edge and cloud sessions in one process (bench_label_leakage),
# with an ordinary cut (the labels travel in each Forward), U-shaped at pool2,relu3 (they stay
# home, but the gradient sent up is computed from them), and U-shaped with each SIGMA of noise
# on that gradient (--grad-clip C --grad-noise SIGMA). Each row: the test accuracy it reached,
# the norm and direction attacks' AUC on classes 0 and 1 (Li et al. 2021; chance 0.5, issue
# 18's bar 0.55) and the ten-class attack's accuracy (chance 10%).
# Usage: bash bench/privacy/label_leakage.sh [EPOCHS] [C] [SIGMA...]  (default 2 epochs, C 0.1,
#        sigmas 0.5 1)
set -euo pipefail
cd "$(dirname "$0")/../.."
epochs=${1:-2} clip=${2:-0.1}
shift $(( $# < 2 ? $# : 2 ))
sigmas=("$@")
((${#sigmas[@]})) || sigmas=(0.5 1)
bin=build/release
[[ -x $bin/bench/bench_label_leakage ]] || { bash scripts/setup.sh release > /dev/null; cmake --build $bin --target bench_label_leakage > /dev/null; }
list=$(IFS=,; echo "${sigmas[*]}")
"$bin/bench/bench_label_leakage" --model samples/fashion-mnist/model.json --epochs "$epochs" --grad-clip "$clip" \
  --sigmas "$list" | grep -v '^{'
