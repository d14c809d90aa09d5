#!/usr/bin/env python3
"""Exports the PyTorch models kiln's ONNX tests run (tests/data/onnx/<name>/), in the ONNX backend-test
layout: model.onnx plus test_data_set_N/{input,output}_K.pb computed by PyTorch on the CPU.

  - small_cnn: conv + batch norm + ReLU + max pool, a strided conv, global average pool, linear;
  - resnet_block: a torchvision-style BasicBlock with a strided 1x1 downsample on the skip path;
  - encoder_layer: nn.TransformerEncoderLayer (batch first), exported with a dynamic batch: two data sets
    of different batch sizes run from one kiln compile;
  - digits: a small CNN trained on scikit-learn's 8x8 handwritten digits (the onnx_classify example's
    model), with one test image per class in examples/data/digits/.

Needs torch, onnx, onnxscript and scikit-learn: `python3 -m pip install torch onnx onnxscript scikit-learn`.
Run from the repository root: `python3 scripts/onnx_models.py`.
"""
import os
import sys

import numpy as np
import onnx
import torch
import torch.nn as nn
from onnx import numpy_helper

OUT = os.path.join("tests", "data", "onnx")
OPSET = 18


def save(name, model, inputs_per_set, dynamic_batch=False):
    model.eval()
    d = os.path.join(OUT, name)
    os.makedirs(d, exist_ok=True)
    first = inputs_per_set[0]
    names = [f"input_{i}" for i in range(len(first))]
    kwargs = {}
    if dynamic_batch:
        batch = torch.export.Dim("batch", min=1, max=1024)
        kwargs["dynamic_shapes"] = tuple({0: batch} for _ in names)
    program = torch.onnx.export(model, tuple(first), input_names=names, output_names=["output_0"],
                                opset_version=OPSET, dynamo=True, external_data=False, **kwargs)
    program.save(os.path.join(d, "model.onnx"))
    onnx.checker.check_model(onnx.load(os.path.join(d, "model.onnx")))
    for k, inputs in enumerate(inputs_per_set):
        s = os.path.join(d, f"test_data_set_{k}")
        os.makedirs(s, exist_ok=True)
        with torch.no_grad():
            out = model(*inputs)
        for i, t in enumerate(inputs):
            open(os.path.join(s, f"input_{i}.pb"), "wb").write(numpy_helper.from_array(t.numpy()).SerializeToString())
        outs = out if isinstance(out, tuple) else (out,)
        for i, t in enumerate(outs):
            open(os.path.join(s, f"output_{i}.pb"), "wb").write(numpy_helper.from_array(t.numpy()).SerializeToString())
    ops = sorted({n.op_type for n in onnx.load(os.path.join(d, "model.onnx")).graph.node})
    print(f"{name}: {', '.join(ops)}", file=sys.stderr)


def randomize_bn(m):
    for mod in m.modules():
        if isinstance(mod, nn.BatchNorm2d):
            mod.running_mean.uniform_(-0.5, 0.5)
            mod.running_var.uniform_(0.5, 1.5)
            mod.weight.data.uniform_(0.5, 1.5)
            mod.bias.data.uniform_(-0.5, 0.5)
    return m


class BasicBlock(nn.Module):
    def __init__(self, cin, cout, stride):
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.down = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))

    def forward(self, x):
        y = torch.relu(self.bn1(self.conv1(x)))
        y = self.bn2(self.conv2(y))
        return torch.relu(y + self.down(x))


def digits_cnn():
    return nn.Sequential(
        nn.Conv2d(1, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(16, 32, 3, padding=1), nn.BatchNorm2d(32), nn.ReLU(), nn.AdaptiveAvgPool2d(1),
        nn.Flatten(), nn.Linear(32, 10))


def train_digits():
    from sklearn.datasets import load_digits
    data = load_digits()
    x = torch.tensor(data.images, dtype=torch.float32).unsqueeze(1) / 16.0
    y = torch.tensor(data.target)
    torch.manual_seed(0)
    perm = torch.randperm(len(x))
    train, test = perm[:1500], perm[1500:]
    m = digits_cnn()
    opt = torch.optim.Adam(m.parameters(), lr=3e-3)
    for epoch in range(40):
        m.train()
        for i in range(0, len(train), 64):
            idx = train[i:i + 64]
            loss = nn.functional.cross_entropy(m(x[idx]), y[idx])
            opt.zero_grad()
            loss.backward()
            opt.step()
    m.eval()
    with torch.no_grad():
        acc = (m(x[test]).argmax(1) == y[test]).float().mean().item()
    print(f"digits: held-out accuracy {acc:.3f} on {len(test)} images", file=sys.stderr)
    # One held-out image per class, as 8-bit greyscale PGM files the example reads.
    img_dir = os.path.join("examples", "data", "digits")
    os.makedirs(img_dir, exist_ok=True)
    for c in range(10):
        k = next(int(i) for i in test if int(y[i]) == c)
        pix = (data.images[k] * 255.0 / 16.0).round().astype(np.uint8)
        with open(os.path.join(img_dir, f"digit_{c}.pgm"), "wb") as f:
            f.write(b"P5\n8 8\n255\n" + pix.tobytes())
    return m, x[test[:4]]


def main():
    torch.manual_seed(1234)
    g = torch.Generator().manual_seed(7)
    rand = lambda *s: torch.randn(*s, generator=g)

    cnn = randomize_bn(nn.Sequential(
        nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(8, 16, 3, stride=2, padding=1), nn.BatchNorm2d(16), nn.ReLU(),
        nn.AvgPool2d(2, ceil_mode=False), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(16, 10)))
    save("small_cnn", cnn, [[rand(2, 3, 16, 16)]])

    save("resnet_block", randomize_bn(BasicBlock(8, 16, 2)), [[rand(2, 8, 12, 12)]])

    enc = nn.TransformerEncoderLayer(d_model=32, nhead=4, dim_feedforward=64, dropout=0.0, batch_first=True)
    save("encoder_layer", enc, [[rand(2, 10, 32)], [rand(3, 10, 32)]], dynamic_batch=True)

    digits, sample = train_digits()
    save("digits", digits, [[sample]], dynamic_batch=True)


if __name__ == "__main__":
    main()
