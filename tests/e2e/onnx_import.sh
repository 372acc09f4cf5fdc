#!/usr/bin/env bash
# ONNX import (tandem import): torchvision's resnet18, mobilenet_v2, mobilenet_v3_small and
# shufflenet_v2_x0_5 (random weights and batch-norm statistics; V3's squeeze-excitation;
# ShuffleNet's channel split and shuffle as general reshape and transpose), squeezenet1_1 (its
# pools' ceil_mode, which adds no window at 32 pixels), a small torchvision
# VisionTransformer (nn.MultiheadAttention's packed in-projection, the class token), a tabular
# torch.nn model (Linear, LayerNorm, GELU and its tanh form, Dropout; at opsets 14 and 17), a
# text classifier of nn.TransformerEncoderLayers (a bool key_padding_mask, True = padding; mean
# over the tokens) and a BERT-style text
# classifier under Hugging Face's module names (tests/interop/hf_encoder.py: attention with a
# padding mask; again with token_type_ids an input) and a LayoutLM-style one (hf_encoder.py: boxes through the x, y, height and width
# tables), exported from PyTorch in training mode, imported and
# evaluated on every CPU backend: tandem's logits equal torch's within 1e-4. The spec's nodes and
# the weights carry PyTorch's module names and the state dict's keys; --cut names a module. The
# imported resnet18 trains split at that cut over mutual TLS (tandem-cloud and tandem-edge, both
# --init-from the import's weights, K = 4, 3 SGD steps, the edge's sample order replayed in
# torch); tandem export's file loads strictly into torchvision's resnet18 and equals torch's own
# 3 steps within 1e-4; so does the BERT-style classifier (without dropout, with a token-type
# table), split after its first encoder layer. The ViT trains 3 steps split at its first encoder layer in one process
# (tandem train --init-from, --export): strict load, torch's own steps within 1e-4; so does a
# model of general reshapes, transposes and reductions (onnx_check.py's Views), split after
# its channel shuffle, one of arithmetic and matmuls no pattern takes (Arith), one of
# comparisons, torch.where, masked_fill with -inf and expand (Gates), and the text
# classifier, its padding mask crossing the cut (marks_padding: read as 1 - mask), again
# reading left to right (nn.Transformer's causal mask, an attn_mask: attention's causal), a GPT
# as nanoGPT writes it (q, k, v split, a tril buffer masked_fill'ed: causal attention), and a
# LayoutLM-style classifier (words, boxes, a token-type table). A model of
# three ops tandem cannot take is refused naming all three; a truncated file and a bad cut are
# refused with the exact errors.
# Usage: onnx_import.sh BUILD_DIR SOURCE_DIR [BACKENDS]
set -euo pipefail
build=$1 src=$2 backends=${3:-"reference portable xnnpack onednn"}
tandem_bin=$build/tools/tandem cloud_bin=$build/cloud/tandem-cloud edge_bin=$build/edge/tandem-edge
work=$(mktemp -d)
cleanup() { [[ -n ${cloud_pid:-} ]] && kill "$cloud_pid" 2>/dev/null; wait 2>/dev/null; rm -rf "$work"; }
trap cleanup EXIT
fail() { echo "FAIL: $*"; [[ -f $work/cloud.log ]] && { echo "--- cloud log"; tail -20 "$work/cloud.log"; }; exit 1; }
source "$src/tests/lib/skip.sh"
/usr/bin/python3 -c 'import torch, torchvision' 2>/dev/null ||
  skip_or_fail "/usr/bin/python3 has no torch or torchvision (install python3-torch python3-torchvision; scripts/setup.sh does)"
check=$src/tests/interop/onnx_check.py

# torch's exports run side by side (the test runs alone: both cores are its); each status is checked.
models="resnet18 mobilenet_v2 mobilenet_v3_small shufflenet_v2_x0_5 squeezenet1_1 views arith gates pools convnext vit tabular14 tabular17 bert bert2 encoder causal gpt layoutlm"
pids=()
for model in $models; do
  mkdir -p "$work/$model"
  /usr/bin/python3 "$check" export "$model" "$work/$model" 48 > "$work/$model/export.out" 2>&1 &
  pids+=($!)
done
/usr/bin/python3 "$check" refused "$work" > "$work/refused.out" 2>&1 &
pids+=($!)
# Opsets 13 to 17 (14 above): four models again at 13, 15, 16 and 17 (LayerNormalization).
opsets="vit:13 encoder:15 layoutlm:16 bert:17"
for at in $opsets; do
  mkdir -p "$work/${at/:/-}"
  /usr/bin/python3 "$check" export "${at%:*}" "$work/${at/:/-}" 8 "${at#*:}" > "$work/${at/:/-}/export.out" 2>&1 &
  pids+=($!)
done
mkdir -p "$work/bert0"  # the BERT-style classifier without dropout, to train as torch does
/usr/bin/python3 "$check" export bert0 "$work/bert0" 48 > "$work/bert0/export.out" 2>&1 &
pids+=($!)
for pid in "${pids[@]}"; do
  wait "$pid" || fail "torch could not export: $(tail -3 "$work"/*/export.out "$work/refused.out")"
done
for model in $models; do
  dir=$work/$model
  case $model in mobilenet_v2) cut=features.7 ;; mobilenet_v3_small) cut=features.4 ;; tabular*) cut=2 ;; shufflenet*) cut=stage3 ;; squeezenet*) cut=features.6 ;; views) cut=reshape_1 ;; arith) cut=div ;; gates) cut=where ;; pools) cut=pool_1 ;; convnext) cut=features.1 ;;
    bert|bert2) cut=bert.encoder.layer.0 ;; vit) cut=encoder.layers.encoder_layer_0 ;; encoder|causal) cut=encoder.layers.0 ;; gpt) cut=add_1 ;;
    layoutlm) cut=layoutlm.encoder.layer.0 ;; *) cut=layer3 ;; esac
  tol=1e-4
  [[ $model == mobilenet_v3_small || $model == shufflenet_v2_x0_5 || $model == pools ]] && tol=1e-5  # logits of 0.1 to 0.5
  "$tandem_bin" import "$dir/model.onnx" --out "$dir/imported" --cut "$cut" > "$dir/import.out" 2>&1 ||
    fail "$model: tandem import: $(cat "$dir/import.out")"
  cat "$dir/import.out"
  pids=()
  for backend in $backends; do
    "$tandem_bin" evaluate --model "$dir/imported/model.json" --weights "$dir/imported/weights.safetensors" \
      --data "$dir/data" --backend "$backend" --logits "$dir/$backend.f32" > /dev/null 2> "$dir/$backend.err" &
    pids+=($!)
  done
  set -- $backends
  for pid in "${pids[@]}"; do
    wait "$pid" || fail "$model on $1: tandem evaluate: $(cat "$dir/$1.err")"
    shift
  done
  for backend in $backends; do
    echo -n "$model on $backend: "
    /usr/bin/python3 "$check" compare "$dir/torch.f32" "$dir/$backend.f32" "$tol" || fail "$model on $backend: logits differ from torch's"
  done
done

for at in $opsets; do
  dir=$work/${at/:/-}
  "$tandem_bin" import "$dir/model.onnx" --out "$dir/imported" > "$dir/import.out" 2>&1 || fail "$at: tandem import: $(cat "$dir/import.out")"
  "$tandem_bin" evaluate --model "$dir/imported/model.json" --weights "$dir/imported/weights.safetensors" --data "$dir/data" \
    --backend reference --logits "$dir/reference.f32" > /dev/null 2> "$dir/reference.err" || fail "$at: tandem evaluate: $(cat "$dir/reference.err")"
  echo -n "${at%:*} at opset ${at#*:}: "
  /usr/bin/python3 "$check" compare "$dir/torch.f32" "$dir/reference.f32" 1e-4 || fail "$at: logits differ from torch's"
done
grep -q 'op: "layer_norm"' "$work/bert-17/imported/model.json" && ! grep -q "fused bert.embeddings.LayerNorm: ReduceMean" "$work/bert-17/import.out" ||
  fail "bert at opset 17: its LayerNormalization"

# A tabular model's decomposed LayerNorm and GELUs (opset 14) came back as tandem's ops.
for f in "1: ReduceMean, Sub, Pow, ReduceMean, Add, Sqrt, Div, Mul, Add -> layer_norm" "2: Div, Erf, Add, Mul, Mul -> gelu" \
         "5: Mul, Mul, Mul, Add, Mul, Tanh, Add, Mul, Mul -> gelu_tanh"; do
  grep -qF "fused $f" "$work/tabular14/import.out" || fail "tabular14: not fused: $f"
done
grep -q 'name: "1", op: "layer_norm"' "$work/tabular17/imported/model.json" || fail "tabular17: LayerNormalization"
grep -q "fused 1:" "$work/tabular17/import.out" && fail "tabular17's LayerNormalization was taken for the decomposed pattern"

# General reshapes, transposes and reductions train as torch does: the Views model 3 steps
# split after its channel shuffle (slices, the shuffle, an image as tokens, tokens and
# features swapped; means and sums over its axes, one keeping its axis).
# trains_like_torch MODEL: 3 SGD steps of 16 samples at K = 4 (tandem train --init-from the
# import, split at its cut, --export), torch's own 3 steps, the two state dicts within 1e-4.
trains_like_torch() {
  local d=$work/$1
  "$tandem_bin" train --model "$d/imported/model.json" --data "$d/data" --init-from "$d/imported/weights.safetensors" \
    --limit 16 --batch 16 --microbatches 4 --epochs 3 --optimizer sgd --lr 0.05 --momentum 0 --test-limit 8 \
    --export "$d/trained.safetensors" > "$d/train.out" 2>&1 || fail "tandem train on the $1 model: $(tail -3 "$d/train.out")"
  /usr/bin/python3 "$check" train "$1" "$d" 3 16 4 0.05 1 || fail "torch could not train the $1 model"
  /usr/bin/python3 "$check" weights "$1" "$d/trained.safetensors" "$d" 1e-4 || fail "tandem's 3 steps of the $1 model differ from torch's"
}
vw=$work/views
trains_like_torch views
grep -qF '{ name: "transpose_1", op: "transpose", inputs: ["tanh"], transpose: { perm: [1, 0] } }' "$vw/imported/model.json" ||
  fail "views: tokens and features swapped: $(grep -F transpose "$vw/imported/model.json")"
grep -qF '{ name: "reducesum", op: "reduce", inputs: ["reshape_1"], reduce: { mode: "sum", axes: [0, 1] } }' "$vw/imported/model.json" &&
  grep -qF '{ name: "reducesum_1.keepdims", op: "reshape", inputs: ["reducesum_1"], reshape: { shape: [64, 1] } }' "$vw/imported/model.json" ||
  fail "views: the image's sum over rows and columns, a token's sum kept: $(grep -F reduce "$vw/imported/model.json")"

# Arithmetic no pattern takes trains as torch does: the Arith model 3 steps split after its
# image's broadcast division (gates broadcast over channels and tokens, scalars either side,
# attention written by hand as matmul, softmax, matmul; the last token and an image's row
# gathered as slices; maxima and minima over an image's rows and columns and the tokens; a
# trained layer scale, kept under its state-dict name).
ar=$work/arith
trains_like_torch arith
for op in '{ name: "mul", op: "binary", inputs: ["relu", "sigmoid"], binary: { mode: "mul" } }' \
          '{ name: "div", op: "binary", inputs: ["mul", "add"], binary: { mode: "div" } }' \
          '{ name: "matmul", op: "matmul", inputs: ["q", "transpose"] }' \
          '{ name: "softmax", op: "softmax", inputs: ["div_1"] }' \
          '{ name: "sub", op: "binary", inputs: ["mul_1"], binary: { mode: "sub", scalar: 1, scalar_first: true } }' \
          '{ name: "reciprocal", op: "binary", inputs: ["add_1"], binary: { mode: "div", scalar: 1, scalar_first: true } }' \
          '{ name: "gather_1", op: "slice", inputs: ["add_2"], slice: { axis: 0, start: 63, end: 64 } }' \
          '{ name: "gather_2", op: "slice", inputs: ["div"], slice: { axis: 0, start: 2, end: 3 } }' \
          '{ name: "reducemax", op: "reduce", inputs: ["div"], reduce: { mode: "max", axes: [0, 1] } }' \
          '{ name: "reducemin", op: "reduce", inputs: ["add_2"], reduce: { mode: "min", axes: [0] } }' \
          '{ name: "neg", op: "binary", inputs: ["div"], binary: { mode: "sub", scalar: 0, scalar_first: true } }' \
          '{ name: "mul_4", op: "binary", inputs: ["mul_3"], binary: { mode: "mul", operand: [8] }, torch_names: [{ field: "operand", name: "gamma" }] }'; do
  grep -qF "$op" "$ar/imported/model.json" || fail "arith: not imported as $op: $(grep -E 'binary|matmul|softmax' "$ar/imported/model.json")"
done

# Pads as torch writes them: nn.AvgPool2d as Pad (zeros) and AveragePool, its padding as a Pad
# too, F.pad's pads (computed by a chain of Shape, ConstantOfShape, Concat, Reshape, a backwards
# Slice, Transpose) before a convolution, torch.cat of one tensor: windows with their padding;
# 3 steps split after the second pool as torch does.
pl=$work/pools/imported/model.json
grep -qF '{ name: "pool_1", op: "avg_pool2d", inputs: ["pool"], pool: { kernel: [3], stride: [1], padding: [1] } }' "$pl" &&
  grep -qF '{ name: "conv_1", op: "conv2d", inputs: ["pool_1"], conv2d: { out_channels: 8, kernel: [3], stride: [1], padding: [1]' "$pl" &&
  grep -qF '{ name: "flatten", op: "flatten", inputs: ["conv_1"] }' "$pl" || fail "pools: the pads: $(grep -E 'pool|conv' "$pl")"
trains_like_torch pools

# Comparisons, selections and repeats no pattern takes: the Gates model's torch.where (x > 0), a
# linear of the tokens' mean repeated over them (unsqueeze, expand), scores masked_fill'ed with
# -inf, logic on comparisons (|, ~, .float()); 3 steps split after the first where as torch does.
gt=$work/gates/imported/model.json
grep -qF '{ name: "where", op: "where", inputs: ["greater", "conv", "mul"] }' "$gt" &&
  grep -qF '{ name: "expand", op: "expand", inputs: ["unsqueeze"], expand: { shape: [64, 8] } }' "$gt" &&
  grep -qF '{ name: "where_2", op: "where", inputs: ["less", "div"], where: { a: -inf } }' "$gt" &&
  grep -qF '{ name: "not", op: "binary", inputs: ["less_1"], binary: { mode: "equal", scalar: 0 } }' "$gt" ||
  fail "gates: where, expand and the comparisons: $(grep -E 'where|expand|binary' "$gt")"
trains_like_torch gates

# ConvNeXt: its LayerNorm2d and blocks permute the image to [N, H, W, C] (tandem's own order: no
# transpose at all), normalize and apply linears over C (views [H W, C] around each linear), and
# scale by a trained [C, 1, 1] (held [1, 1, C], written back as torch's); 3 steps split after
# the first stage as torch does.
cx=$work/convnext/imported/model.json
grep -qF '{ name: "features.1.0.mul", op: "binary", inputs: ["features.1.0.block.5.reshape_1"], binary: { mode: "mul", operand: [1, 1, 8], image_operand: true }, torch_names: [{ field: "operand", name: "features.1.0.layer_scale" }] }' "$cx" &&
  ! grep -q 'op: "transpose"' "$cx" || fail "convnext: the layer scale, or a transpose: $(grep -E 'binary|transpose' "$cx")"
trains_like_torch convnext

# ShuffleNet's channel shuffle (view [N, 2, C/2, H, W], transpose 1 and 2, view [N, C, H, W])
# is two views and one transpose of tandem's [H, W, C]; its x.chunk(2, dim=1) two channel slices.
s=$work/shufflenet_v2_x0_5/imported/model.json
grep -qF '{ name: "stage2.0.reshape", op: "reshape", inputs: ["stage2.0.concat"], reshape: { shape: [4, 4, 2, 24] } }' "$s" &&
  grep -qF '{ name: "stage2.0.transpose", op: "transpose", inputs: ["stage2.0.reshape"], transpose: { perm: [0, 1, 3, 2] } }' "$s" &&
  grep -qF '{ name: "stage2.0.reshape_1", op: "reshape", inputs: ["stage2.0.transpose"], reshape: { shape: [4, 4, 48] } }' "$s" &&
  grep -qF '{ name: "stage2.1.slice_1", op: "slice", inputs: ["stage2.0.reshape_1"], slice: { axis: 2, start: 24, end: 48 } }' "$s" ||
  fail "shufflenet: the channel shuffle and split: $(grep -F stage2.0.re "$s")"
(( $(grep -c 'op: "transpose"' "$s") == 16 )) || fail "shufflenet: not one transpose a shuffle (16 shuffles)"

# The BERT-style encoder: attention with its padding mask, the embeddings and the pooler's
# first token came back as tandem's ops, under Hugging Face's module names.
b=$work/bert/imported
grep -qF "fused bert.encoder.layer.1.attention.self: Reshape, Transpose, MatMul, Div, Add (mask), Softmax, MatMul, Transpose, Reshape -> attention" \
  "$work/bert/import.out" || fail "bert: attention not fused"
grep -qF 'name: "bert.encoder.layer.0.attention.self", op: "attention", inputs: ["bert.encoder.layer.0.attention.self.query", "bert.encoder.layer.0.attention.self.key", "bert.encoder.layer.0.attention.self.value", "attention_mask"], attention: { heads: 4 }' \
  "$b/model.json" || fail "bert: layer 0's attention"
grep -qF '{ name: "attention_mask", shape: [16], mask: true }' "$b/model.json" || fail "bert: the mask input"
grep -qF 'name: "bert.embeddings.position_embeddings", op: "position_embedding"' "$b/model.json" || fail "bert: position embeddings"
grep -qF 'name: "bert.pooler.gather", op: "token_pool"' "$b/model.json" || fail "bert: the pooler's first token"
# Two segments: token_type_ids an input, its table an embedding of it added to the words.
b2=$work/bert2/imported
grep -qF '{ name: "token_type_ids", shape: [16], dtype: "int32" }' "$b2/model.json" &&
  grep -qF '{ name: "bert.embeddings.token_type_embeddings", op: "embedding", inputs: ["token_type_ids"], embedding: { count: 2, features: 32 } }' \
    "$b2/model.json" || fail "bert2: the token types: $(grep -F token_type "$b2/model.json")"
grep -q 'cut: "bert.encoder.layer.0.output.LayerNorm"' "$b/model.json" || fail "bert: --cut bert.encoder.layer.0"

# Names: PyTorch's modules, so the weights file holds the state dict's keys.
r18=$work/resnet18/imported
grep -q 'name: "layer1.0.conv1", op: "conv2d"' "$r18/model.json" || fail "no node named after module layer1.0.conv1"
grep -q 'name: "layer1.0.bn1", op: "batch_norm", inputs: \["layer1.0.conv1"\]' "$r18/model.json" || fail "batch norm layer1.0.bn1"
grep -q 'cut: "layer3.1.relu_1"' "$r18/model.json" || fail "--cut layer3 did not resolve to layer3's last node"
for model in resnet18 mobilenet_v3_small convnext bert bert2 vit encoder layoutlm; do
  /usr/bin/python3 - "$work/$model/torch.pt" "$work/$model/imported/weights.safetensors" <<'PY' || fail "$model: the weights' names are not the state dict's"
import json, struct, sys, torch
keys = {k for k in torch.load(sys.argv[1]) if not k.endswith("num_batches_tracked")}
blob = open(sys.argv[2], "rb").read()
names = {k for k in json.loads(blob[8:8 + struct.unpack("<Q", blob[:8])[0]]) if k != "__metadata__"}
sys.exit(0 if names == keys else print("only torch:", sorted(keys - names)[:5], "only tandem:", sorted(names - keys)[:5]) or 1)
PY
done

# A cut named by module wherever cuts are given: tandem train --cut layer2.
"$tandem_bin" train --model "$r18/model.json" --data "$work/resnet18/data" --cut layer2 --limit 16 --batch 16 \
  --microbatches 2 --test-limit 16 > "$work/train.out" 2>&1 || fail "tandem train --cut layer2: $(tail -3 "$work/train.out")"
grep -q "layer2.1.relu_1" "$work/train.out" || fail "tandem train --cut layer2 did not cut after layer2.1.relu_1: $(head -3 "$work/train.out")"

# Split training over TLS from the imported weights: 3 steps of 32 samples, K = 4, plain SGD.
# A small learning rate: batch norm over micro-batches of 8 (1x1 maps in layer4) makes larger
# steps chaotic (at 0.05 torch's own float32 and float64 runs differ by 1e-2 after 3 steps; at
# 0.001 by 2e-7).
source "$src/tests/e2e/lib.sh"
# split_trains_over_tls MODEL DIR LR: DIR/imported split-trained by tandem-cloud and tandem-edge
# over mutual TLS from the import's weights (3 steps of 32 samples, K = 4, plain SGD at LR,
# client clinic-MODEL), tandem export's file against torch's own 3 steps within 1e-4.
split_trains_over_tls() {
  local name=$1 dir=$2 lr=$3
  model=$dir/imported/model.json
  start_cloud_as cloud --init-from "$dir/imported/weights.safetensors" --optimizer sgd --lr "$lr" --momentum 0
  "$cloud_bin" pki issue --state-dir "$work/state" --client "clinic-$name" --out "$work/id-$name" > /dev/null
  "$edge_bin" train --cloud "wss://localhost:$port" --identity "$work/id-$name" --model "$model" --data "$dir/data" \
    --init-from "$dir/imported/weights.safetensors" --limit 32 --batch 32 --microbatches 4 --epochs 3 --test-limit 8 \
    --optimizer sgd --lr "$lr" --momentum 0 --seed 1 --checkpoint-dir "$work/ckpt-$name" --checkpoint-every 3 \
    > "$work/edge-$name.out" 2>&1 || fail "tandem-edge on the imported $name: $(tail -3 "$work/edge-$name.out")"
  stop_cloud
  cloud_pid=
  "$tandem_bin" export --model "$model" --edge-ckpt "$work/ckpt-$name/edge-000000000003.tdmc" --identity "$work/id-$name" \
    --cloud-ckpt "$work/state/checkpoints/clinic-$name/cloud-000000000003.tdmc" --out "$dir/trained.safetensors" \
    > "$dir/export.out" 2>&1 || fail "tandem export of the $name: $(cat "$dir/export.out")"
  /usr/bin/python3 "$check" train "$name" "$dir" 3 32 4 "$lr" 1 || fail "torch could not train the $name"
  /usr/bin/python3 "$check" weights "$name" "$dir/trained.safetensors" "$dir" 1e-4 ||
    fail "tandem's 3 split steps of the $name over TLS differ from torch's"
}
split_trains_over_tls resnet18 "$work/resnet18" 0.001

# The BERT-style classifier the same way, split after its first encoder layer (the padding
# mask crosses the cut with the activations): 3 steps of 32 texts, K = 4, lr 0.05. This one
# has Hugging Face's token-type table, token_type_ids left to its buffer of zeros: its row 0
# at every token is the position_embedding's own token-type table (types: 2), trained and
# exported under its state-dict name, so the strict load and the comparison take it too.
b0=$work/bert0
"$tandem_bin" import "$b0/model.onnx" --out "$b0/imported" --cut bert.encoder.layer.0 > "$b0/import.out" 2>&1 ||
  fail "bert0: tandem import: $(cat "$b0/import.out")"
grep -qF "fused bert.embeddings.position_embeddings: Gather(token type 0) + Add, Gather(rows 0..T-1) + Add -> position_embedding" "$b0/import.out" &&
  grep -qF 'embedding: { count: 16, types: 2 }, torch_names: [{ field: "token_type_embeddings", name: "bert.embeddings.token_type_embeddings.weight" }]' \
    "$b0/imported/model.json" || fail "bert0: the token-type table: $(grep -F position_embedding "$b0/imported/model.json")"
split_trains_over_tls bert0 "$b0" 0.05

# MobileNetV3's squeeze-excitation: a 1x1 convolution of the pooled image, its gate
# (hardsigmoid) and the image times the gate (mul).
grep -qF 'name: "features.1.block.1.fc1", op: "conv2d", inputs: ["features.1.block.1.avgpool"]' "$work/mobilenet_v3_small/imported/model.json" ||
  fail "mobilenet_v3_small: the squeeze-excitation's fc1"
grep -qF 'name: "features.1.block.1.mul", op: "mul", inputs: ["features.1.block.0.2", "features.1.block.1.scale_activation"]' \
  "$work/mobilenet_v3_small/imported/model.json" || fail "mobilenet_v3_small: the squeeze-excitation's product"

# The ViT: its patches, class token and positions and nn.MultiheadAttention (time-major, the
# in-projection packed and sliced, heads merged with the batch) came back as tandem's ops; the
# state dict's own names (class_token, encoder.pos_embedding, in_proj_weight) kept.
v=$work/vit/imported
for f in "/Transpose: Reshape [N, C, H W], Transpose -> tokens" "encoder.class_token: Expand, Concat, Add -> class_token" \
         "encoder.layers.encoder_layer_1.self_attention: Reshape, Transpose, MatMul, Div, Softmax, MatMul, Transpose, Reshape -> attention"; do
  grep -qF "fused $f" "$work/vit/import.out" || fail "vit: not fused: $f"
done
grep -qF 'name: "encoder.class_token", op: "class_token", inputs: ["tokens"], torch_names: [{ field: "cls_token", name: "class_token" }, { field: "position_embeddings", name: "encoder.pos_embedding" }]' \
  "$v/model.json" || fail "vit: the class token"
grep -qF 'name: "encoder.layers.encoder_layer_0.self_attention", op: "attention", inputs: ["encoder.layers.encoder_layer_0.self_attention.slice", "encoder.layers.encoder_layer_0.self_attention.slice_1", "encoder.layers.encoder_layer_0.self_attention.slice_2"], attention: { heads: 2 }' \
  "$v/model.json" || fail "vit: layer 0's attention"
trains_like_torch vit
grep -q "layers.encoder_layer_0.add_1" "$work/vit/train.out" || fail "vit: not cut at encoder.layers.encoder_layer_0: $(head -3 "$work/vit/train.out")"

# nn.MultiheadAttention's key_padding_mask: a bool input (True = padding, saved as BOOL) whose
# Reshape, Expand over the heads, Reshape, Cast and Where(mask, -inf, zeros) came back as
# attention's mask; the spec says its 1s mark padding. It trains 3 steps split after the first
# layer, the mask crossing the cut to the second layer's attention.
en=$work/encoder
grep -qF '{ name: "pad", shape: [12], mask: true, marks_padding: true }' "$en/imported/model.json" ||
  fail "encoder: the padding mask input: $(grep -F '"pad"' "$en/imported/model.json" | head -1)"
grep -qF "input pad [12]: a key padding mask, 1 marks padding (torch's key_padding_mask; read as 1 - mask)" "$en/import.out" ||
  fail "encoder: the import does not say the mask marks padding"
grep -qF 'name: "encoder.layers.1.self_attn", op: "attention", inputs: ["encoder.layers.1.self_attn.slice", "encoder.layers.1.self_attn.slice_1", "encoder.layers.1.self_attn.slice_2", "pad"], attention: { heads: 2 }' \
  "$en/imported/model.json" || fail "encoder: layer 1's attention does not read the mask"
trains_like_torch encoder
grep -q "layers.0.norm2" "$en/train.out" || fail "encoder: not cut at encoder.layers.0: $(head -3 "$en/train.out")"

# Read left to right: nn.Transformer's causal mask (a Trilu of -inf, the attn_mask) filled where
# the key padding mask holds is attention's causal flag with its mask; 3 steps as torch's.
ca=$work/causal
grep -qF 'name: "encoder.layers.0.self_attn", op: "attention", inputs: ["encoder.layers.0.self_attn.slice", "encoder.layers.0.self_attn.slice_1", "encoder.layers.0.self_attn.slice_2", "pad"], attention: { heads: 2, causal: true }' \
  "$ca/imported/model.json" || fail "causal: layer 0's attention is not causal with its mask: $(grep -F attention "$ca/imported/model.json")"
trains_like_torch causal

# A GPT as nanoGPT writes it: c_attn's split into slices, the scale from the keys' shape folded,
# the tril buffer sliced and compared with 0 read as attention's causal flag, positions from
# torch.arange; 3 steps split after the attention's residual as torch does (the buffer, which
# tandem reads as a constant, given back to torch's state dict).
gp=$work/gpt/imported/model.json
grep -qF '{ name: "matmul_1", op: "attention", inputs: ["split", "split_1", "split_2"], attention: { heads: 2, causal: true } }' "$gp" &&
  grep -qF '{ name: "wpe", op: "position_embedding", inputs: ["wte"], embedding: { count: 12 } }' "$gp" ||
  fail "gpt: causal attention over the split, the positions: $(grep -E 'attention|position' "$gp")"
trains_like_torch gpt

# LayoutLM as Hugging Face writes its embeddings: the words, the positions, each box's x0, y0,
# x1, y1 through the x and y tables (shared by the two corners), its height and width through
# the h and w tables, and the token-type table's row 0 last. The six box lookups are one
# layout_embedding (its tables under their state-dict names), the type row the position
# table's own; it trains 3 steps split after its first layer as torch does.
lm=$work/layoutlm
for f in "layoutlm.embeddings: Gather(bbox[:, :, k]) x 4, Sub x 2, Gather x 6, Add x 6 -> layout_embedding" \
         "layoutlm.embeddings.position_embeddings: Gather(token type 0) + Add -> position_embedding's token-type table"; do
  grep -qF "fused $f" "$lm/import.out" || fail "layoutlm: not fused: $f"
done
grep -qF '{ name: "bbox", shape: [16, 4], dtype: "int32" }' "$lm/imported/model.json" &&
  grep -qF '{ name: "layoutlm.embeddings", op: "layout_embedding", inputs: ["layoutlm.embeddings.position_embeddings", "bbox"], embedding: { count: 24 } }' \
    "$lm/imported/model.json" || fail "layoutlm: the boxes: $(grep -F -e bbox -e layout_embedding "$lm/imported/model.json")"
trains_like_torch layoutlm
grep -q "layoutlm.encoder.layer.0.output.LayerNorm" "$lm/train.out" || fail "layoutlm: not cut at layoutlm.encoder.layer.0: $(head -3 "$lm/train.out")"

# Refused: every node tandem cannot take, at once, with its op and module.
"$tandem_bin" import "$work/model.onnx" --out "$work/refused" > "$work/refused-import.out" 2>&1 && fail "the model was imported"
cat "$work/refused-import.out"
grep -q "^tandem: \[import\] $work/model.onnx: 3 problems (ops: LeakyRelu, MaxPool, Slice); tandem imports none of the model:" \
  "$work/refused-import.out" || fail "refused: $(head -2 "$work/refused-import.out")"
for p in "node '/pool/MaxPool' (MaxPool, module pool): ceil_mode=1 adds a window over its height of 32 (16 windows rather than 15); tandem's windows floor the output size, so it takes ceil_mode only where rounding up adds none" \
         "node '/branch/branch.1/LeakyRelu' (LeakyRelu, module branch.1): tandem has no such op" \
         "node '/Slice' (Slice): it slices with step 2; tandem's slice takes every element (step 1)"; do
  grep -qF "$p" "$work/refused-import.out" || fail "refused: not listed: $p"
done
[[ ! -e $work/refused ]] || fail "a refused import wrote $work/refused"

# A truncated file; a cut that names nothing.
head -c 5000 "$work/resnet18/model.onnx" > "$work/cut.onnx"
"$tandem_bin" import "$work/cut.onnx" --out "$work/x" > "$work/trunc.out" 2>&1 && fail "a truncated file was imported"
grep -q "^tandem: \[onnx\] $work/cut.onnx: not a readable ONNX model (a length runs past the end)" "$work/trunc.out" ||
  fail "truncated: $(cat "$work/trunc.out")"
"$tandem_bin" import "$work/resnet18/model.onnx" --out "$work/x" --cut layer9 > "$work/cut.out" 2>&1 && fail "--cut layer9 was taken"
grep -qF "tandem: [import] $work/resnet18/model.onnx: --cut 'layer9' names no module or node (top-level modules: avgpool, bn1, conv1, fc, layer1, layer2, layer3, layer4, maxpool, relu)" \
  "$work/cut.out" || fail "bad cut: $(cat "$work/cut.out")"
echo "PASS"
