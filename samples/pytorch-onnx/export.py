#!/usr/bin/python3
"""A model written in PyTorch, exported to ONNX for `tandem import`: torchvision's ResNet18 for
Fashion-MNIST's 28x28 grey images (a 3x3 stem on one channel, no max pool, 10 classes), with
the random weights torchvision starts from (nothing is downloaded). Put your own model here:
what matters is the export call, in training mode so batch norm and the parameter names stay.

usage: export.py OUT.onnx
"""
import sys
import warnings

import torch
import torchvision

torch.manual_seed(0)
model = torchvision.models.resnet18(num_classes=10)
model.conv1 = torch.nn.Conv2d(1, 64, kernel_size=3, stride=1, padding=1, bias=False)
model.maxpool = torch.nn.Identity()

with warnings.catch_warnings():
    warnings.simplefilter("ignore")  # torch 1.13 warns about batch norm's counters in training mode
    torch.onnx.export(model, torch.randn(2, 1, 28, 28), sys.argv[1],
                      training=torch.onnx.TrainingMode.TRAINING, do_constant_folding=False,
                      opset_version=14, input_names=["image"], output_names=["logits"],
                      dynamic_axes={"image": {0: "batch"}})
print(f"wrote {sys.argv[1]}: torchvision resnet18 for 28x28x1 images, 10 classes")
