#!/usr/bin/env python3
"""Quantizes two of the exported PyTorch models (tests/data/onnx/{small_cnn,resnet_block}, written by
scripts/onnx_models.py) the way people ship int8 models: onnxruntime's static quantizer in its QDQ format
(u8 activations, i8 weights per output channel, each Conv's input, weight and output wrapped in
QuantizeLinear/DequantizeLinear pairs), calibrated on random batches. Writes
tests/data/onnx/<name>_int8/ in the ONNX backend-test layout, the expected outputs computed by
onnxruntime with its graph optimizations off, so each QuantizeLinear/DequantizeLinear runs as the ONNX
specification defines it (onnxruntime's optimizer fuses QDQ pairs into integer kernels, which round
differently).

Needs onnx and onnxruntime: `python3 -m pip install onnx onnxruntime`.
Run from the repository root: `python3 scripts/onnx_quantized.py`.
"""
import os
import sys

import numpy as np
import onnx
import onnxruntime as ort
from onnx import numpy_helper
from onnxruntime.quantization import CalibrationDataReader, QuantFormat, QuantType, quantize_static

ROOT = os.path.join("tests", "data", "onnx")


class Batches(CalibrationDataReader):
    def __init__(self, name, shape, count, seed):
        rng = np.random.default_rng(seed)
        self.batches = iter([{name: rng.standard_normal(shape).astype(np.float32)} for _ in range(count)])

    def get_next(self):
        return next(self.batches, None)


def quantize(name):
    src = os.path.join(ROOT, name, "model.onnx")
    dst_dir = os.path.join(ROOT, f"{name}_int8")
    os.makedirs(dst_dir, exist_ok=True)
    dst = os.path.join(dst_dir, "model.onnx")
    model = onnx.load(src)
    inp = model.graph.input[0]
    shape = [d.dim_value for d in inp.type.tensor_type.shape.dim]
    quantize_static(src, dst, Batches(inp.name, shape, 8, seed=1), quant_format=QuantFormat.QDQ,
                    activation_type=QuantType.QUInt8, weight_type=QuantType.QInt8, per_channel=True)
    onnx.checker.check_model(onnx.load(dst))
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    session = ort.InferenceSession(dst, options, providers=["CPUExecutionProvider"])
    # The exported model's own test input, so the float and int8 models see the same data.
    x = numpy_helper.to_array(onnx.load_tensor(os.path.join(ROOT, name, "test_data_set_0", "input_0.pb")))
    (y,) = session.run(None, {inp.name: x})
    s = os.path.join(dst_dir, "test_data_set_0")
    os.makedirs(s, exist_ok=True)
    open(os.path.join(s, "input_0.pb"), "wb").write(numpy_helper.from_array(x).SerializeToString())
    open(os.path.join(s, "output_0.pb"), "wb").write(numpy_helper.from_array(y).SerializeToString())
    ops = sorted({n.op_type for n in onnx.load(dst).graph.node})
    print(f"{name}_int8: {', '.join(ops)}", file=sys.stderr)


if __name__ == "__main__":
    for n in ["small_cnn", "resnet_block"]:
        quantize(n)
