#!/usr/bin/env python3
"""Generate the NaN / Inf test data of runtime/tests/numerics.rs from onnxruntime.

Sits between onnxruntime (the reference) and the Rust test: for each case it builds a
single-op ONNX model with onnx.helper, feeds it inputs holding NaN, +Inf, -Inf and -0.0 at
known positions, runs onnxruntime (CPU provider, graph optimisations off) and writes

    OUT/<case>/model.onnx
    OUT/<case>/test_data_set_0/input_K.pb, output_K.pb
    OUT/index.json   [{"name", "family", "op", "rtol", "atol", "bit_exact", "skip", "expected"}]

`bit_exact`: outputs must equal the expected bits (data movement: NaN payloads, -0.0).
`skip`: flat indices of output 0 whose value ONNX leaves undefined (float -> int casts of
NaN/Inf); the test checks every other element. `expected`: "onnxruntime", or the rule used
instead where tandem decides a semantic (documented in README.md, "Numerics").

Usage: gen_numerics.py [OUT_DIR] [--force]   (default OUT_DIR: conformance-data/numerics)
Skips all work when OUT/.stamp matches this script and the onnx/onnxruntime versions.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import shutil
import sys
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

REPO = Path(__file__).resolve().parent.parent
NAN, INF = float("nan"), float("inf")
F = np.float32


def stamp_value() -> str:
    digest = hashlib.sha256(Path(__file__).read_bytes()).hexdigest()[:16]
    return f"onnx={onnx.__version__} onnxruntime={ort.__version__} script={digest}\n"


def f32(rows) -> np.ndarray:
    return np.array(rows, dtype=F)


def bits(values) -> np.ndarray:
    """f32 tensor from raw bit patterns (NaN payloads, signalling NaN, denormals)."""
    return np.array(values, dtype=np.uint32).view(F)


# Elementwise input: every row mixes specials with values that overflow exp/tanh/sigmoid
# approximations (|x| in 10..100), huge values and ordinary ones. 6 rows of 8.
SPECIAL = f32(
    [
        [NAN, INF, -INF, -0.0, 0.0, 1.5, -2.0, 0.5],
        [88.0, -88.0, 100.0, -100.0, 1e30, -1e30, 20.0, -20.0],
        [10.0, -10.0, 9.0, -9.0, 15.0, -15.0, 50.0, -50.0],
        [-INF, NAN, 3.0, -0.25, 1e-30, -1e-30, 700.0, -700.0],
        [0.0, -0.0, INF, NAN, -3.5, 2.25, -1.0, 1.0],
        [5.0, -5.0, 30.0, -30.0, -INF, INF, NAN, 0.75],
    ]
)

# Pairs for binary ops: a row of A against the same row of B covers the IEEE special cases.
PAIR_A = f32(
    [
        [NAN, 1.0, NAN, INF, INF, -INF, 0.0, 0.0],
        [INF, -INF, 1.0, -1.0, 0.0, -0.0, 1e30, -1e30],
        [2.0, -2.0, 0.5, -1.0, 1.0, -8.0, INF, -INF],
        [-0.0, 0.0, -0.0, 3.0, NAN, INF, -INF, 2.0],
        [0.0, -0.0, 1.0, -1.0, 4.0, -4.0, NAN, 1.5],
    ]
)
PAIR_B = f32(
    [
        [1.0, NAN, NAN, INF, -INF, -INF, INF, 0.0],
        [2.0, 3.0, 0.0, 0.0, 0.0, 0.0, 1e30, 1e30],
        [INF, INF, INF, INF, NAN, 1.0 / 3.0, -1.0, 2.0],
        [-1.0, -1.0, -2.0, -INF, 0.0, -2.0, 3.0, -INF],
        [-0.0, 0.0, -0.0, INF, 0.5, 0.5, 0.0, NAN],
    ]
)

CASES: list[dict] = []

# Where onnxruntime ignores NaN (ReduceMax/ReduceMin, MaxPool, GlobalMaxPool keep the largest
# non-NaN value) tandem propagates it, like its own Max/Min, numpy and PyTorch: the expected
# output is then numpy's (np.max / np.min propagate NaN). See README.md, "Numerics".
NAN_PROPAGATES = "numpy: NaN propagates (onnxruntime skips NaN in this op)"


def np_reduce(fn, axis, keepdims):
    return (NAN_PROPAGATES, lambda feeds, outs: [fn(feeds["x"], axis=axis, keepdims=keepdims)])


def linear_taps(n_in: int, n_out: int, ct: str) -> list:
    """(index, weight) taps of each output coordinate of a 2x linear resize, edge-clamped,
    zero weights left out (the ONNX formula, written here independently of the kernels)."""
    taps = []
    for o in range(n_out):
        x = (o + 0.5) / 2 - 0.5 if ct == "half_pixel" else o * (n_in - 1) / (n_out - 1)
        f = int(np.floor(x))
        r = x - f
        taps.append([(min(max(i, 0), n_in - 1), w) for i, w in ((f, 1 - r), (f + 1, r))
                     if w != 0])
    return taps


def np_resize_linear(x: np.ndarray, ct: str) -> np.ndarray:
    n, c, h, w = x.shape
    th, tw = linear_taps(h, 2 * h, ct), linear_taps(w, 2 * w, ct)
    y = np.zeros((n, c, 2 * h, 2 * w), dtype=np.float64)
    for i, ti in enumerate(th):
        for j, tj in enumerate(tw):
            y[:, :, i, j] = sum(wi * wj * x[:, :, a, b].astype(np.float64)
                                for a, wi in ti for b, wj in tj)
    return y.astype(F)


ZERO_WEIGHT = ("numpy: a zero-weight tap is left out, so 0 * NaN / 0 * Inf never reaches an "
               "output (onnxruntime multiplies it in)")


def np_maxpool(kernel, stride, pad):
    def fix(feeds, outs):
        x = np.pad(feeds["x"], [(0, 0), (0, 0), (pad, pad), (pad, pad)],
                   constant_values=-np.inf)
        w = np.lib.stride_tricks.sliding_window_view(x, (kernel, kernel), axis=(2, 3))
        return [np.max(w, axis=(4, 5))[:, :, ::stride, ::stride].astype(F)]
    return (NAN_PROPAGATES, fix)


def case(name, family, op, inputs, attrs=None, consts=None, opset=17, out_types=None,
         rtol=1e-3, atol=1e-5, bit_exact=False, skip=None, expected=None, n_out=1):
    """Register one single-node case. inputs: [(name, array)] fed at run time; consts:
    [(name, array)] initializers (attribute-like inputs); node inputs: inputs then consts
    (Resize: x, roi, scales). expected: None (onnxruntime) or (rule, fn(feeds, outs))."""
    CASES.append(dict(name=name, family=family, op=op, inputs=inputs, attrs=attrs or {},
                      consts=consts or [], opset=opset, out_types=out_types, rtol=rtol,
                      atol=atol, bit_exact=bit_exact, skip=skip or [], expected=expected,
                      n_out=n_out))


def unary_cases():
    x = [("x", SPECIAL)]
    for op, opset, attrs in [
        ("Relu", 14, {}), ("Sigmoid", 13, {}), ("Tanh", 13, {}), ("Exp", 13, {}),
        ("Log", 13, {}), ("Sqrt", 13, {}), ("Abs", 13, {}), ("Neg", 13, {}),
        ("LeakyRelu", 16, {"alpha": 0.1}), ("Erf", 13, {}), ("Gelu", 20, {}),
        ("Softplus", 1, {}), ("Softsign", 1, {}), ("Elu", 6, {"alpha": 1.0}),
        ("Selu", 6, {}), ("HardSigmoid", 6, {}), ("HardSwish", 14, {}),
        ("Reciprocal", 13, {}), ("Floor", 13, {}), ("Ceil", 13, {}), ("Round", 11, {}),
        ("Sign", 13, {}), ("Sin", 7, {}), ("Cos", 7, {}),
    ]:
        # sin/cos of 1e30 are argument-reduction dependent: the case keeps to |x| <= 100
        inp = x if op not in ("Sin", "Cos") else [("x", np.where(np.abs(SPECIAL) > 100, F(7.0), SPECIAL))]
        # Neg and Abs only touch the sign bit: -0.0 and NaN payloads compared bit for bit
        case(f"unary_{op.lower()}", "unary", op, inp, attrs, opset=opset,
             bit_exact=op in ("Neg", "Abs"))
    case("unary_gelu_tanh", "unary", "Gelu", x, {"approximate": "tanh"}, opset=20)
    case("unary_clip", "unary", "Clip", x, consts=[("lo", f32(-1.0)), ("hi", f32(1.0))], opset=13)
    case("unary_clip_inf_bounds", "unary", "Clip", x,
         consts=[("lo", f32(-INF)), ("hi", f32(INF))], opset=13)
    case("unary_isnan", "unary", "IsNaN", x, opset=13)
    case("unary_isinf", "unary", "IsInf", x, opset=10)


def binary_cases():
    ab = [("a", PAIR_A), ("b", PAIR_B)]
    for op in ["Add", "Sub", "Mul", "Div", "Pow", "Max", "Min", "Mean", "Sum"]:
        case(f"binary_{op.lower()}", "binary", op, ab, opset=13)
    # broadcast: one row of specials against every row
    case("binary_add_broadcast", "binary", "Add", [("a", SPECIAL), ("b", PAIR_B[0])], opset=14)
    case("binary_mul_broadcast", "binary", "Mul", [("a", SPECIAL), ("b", PAIR_B[1])], opset=14)
    c = np.roll(PAIR_B, 3, axis=1)
    for op in ["Max", "Min", "Mean", "Sum"]:
        case(f"variadic_{op.lower()}3", "binary", op, ab + [("c", c)], opset=13)
    # subnormal results, compared bit for bit: does a GPU flush them to zero?
    tiny = f32([[1e-20, 1e-38, 1e-40, 1.4e-45, -1e-40, 1e-39, 3e-39, -1.4e-45],
                [2.0, 0.5, 1e-45, -1e-41, 1e-38, 1e-37, -1e-38, 1.0]])
    scale = f32([[1e-20, 0.5, 2.0, 1.0, 1.0, 0.25, -1.0, 3.0],
                 [1e-39, 1e-39, 1.0, 1.0, 0.01, 0.01, 1e-3, 1e-40]])
    case("binary_mul_subnormal", "binary", "Mul", [("a", tiny), ("b", scale)], opset=14,
         bit_exact=True)
    case("binary_add_subnormal", "binary", "Add", [("a", tiny), ("b", -np.roll(tiny, 1))],
         opset=14, bit_exact=True)
    case("binary_prelu", "binary", "PRelu", [("x", SPECIAL), ("slope", SPECIAL[4])], opset=16)
    case("binary_mod_fmod", "binary", "Mod", ab, {"fmod": 1}, opset=13)


def compare_cases():
    ab = [("a", PAIR_A), ("b", PAIR_B)]
    for op in ["Equal", "Less", "Greater", "LessOrEqual", "GreaterOrEqual"]:
        case(f"compare_{op.lower()}", "compare", op, ab, opset=16)
    cond = (np.arange(PAIR_A.size).reshape(PAIR_A.shape) % 3 != 0)
    # Where copies the chosen element's bits; onnxruntime turns -0.0 into +0.0 there.
    case("where", "compare", "Where", [("c", cond), ("a", PAIR_A), ("b", PAIR_B)], opset=16,
         bit_exact=True, expected=("numpy: np.where keeps -0.0 (onnxruntime gives +0.0)",
                                   lambda f, o: [np.where(f["c"], f["a"], f["b"])]))
    case("cast_to_bool", "cast", "Cast", [("x", SPECIAL)], {"to": TensorProto.BOOL}, opset=13)
    undefined = [int(i) for i in np.flatnonzero(~np.isfinite(SPECIAL) | (np.abs(SPECIAL) > 1e9))]
    for to, nm in [(TensorProto.INT32, "int32"), (TensorProto.INT64, "int64")]:
        case(f"cast_to_{nm}", "cast", "Cast", [("x", SPECIAL)], {"to": to}, opset=13,
             skip=undefined)


def linalg_cases():
    rng = np.random.default_rng(1)
    a = rng.uniform(-1, 1, (6, 5)).astype(F)
    a[1, 2] = NAN
    a[2, 0] = INF
    a[3, 1], a[3, 3] = INF, -INF
    a[4, 4] = -INF
    b = rng.uniform(0.25, 1, (5, 4)).astype(F)
    b[0, 3] = 0.0  # row 2 (Inf) times a zero: NaN in that column
    b[4, 1] = -b[4, 1]
    case("matmul", "linalg", "MatMul", [("a", a), ("b", b)], opset=13)
    bt = np.ascontiguousarray(b.T)
    cvec = f32([0.0, NAN, 1.0, -INF])
    case("gemm_transb_bias", "linalg", "Gemm", [("a", a), ("b", bt), ("c", cvec)],
         {"transB": 1, "alpha": 1.0, "beta": 1.0}, opset=13)
    # sizes past the CPU GEMM's and the GPU tiles' edges (partial tiles, packed panels)
    al = rng.uniform(-1, 1, (70, 65)).astype(F)
    bl = rng.uniform(-1, 1, (65, 33)).astype(F)
    al[3, 7], al[40, 64], al[69, 0], al[10, 10], al[10, 20] = NAN, INF, -INF, INF, -INF
    bl[0, 32], bl[64, 5] = 0.0, NAN
    case("matmul_large", "linalg", "MatMul", [("a", al), ("b", bl)], opset=13, atol=1e-4)
    case("gemm_beta0_nan_c", "linalg", "Gemm", [("a", a), ("b", bt), ("c", cvec)],
         {"transB": 1, "alpha": 1.0, "beta": 0.0}, opset=13)
    x = rng.uniform(-1, 1, (1, 2, 7, 7)).astype(F)
    x[0, 0, 1, 1] = NAN
    x[0, 1, 5, 5] = INF
    x[0, 0, 3, 0] = -INF
    w = rng.uniform(0.1, 1, (3, 2, 3, 3)).astype(F)
    w[1] = -w[1]
    w[2, 0, 1, 1] = 0.0  # Inf/NaN under a zero weight is still NaN
    bias = f32([0.5, -0.5, 0.0])
    case("conv", "linalg", "Conv", [("x", x), ("w", w), ("bias", bias)],
         {"kernel_shape": [3, 3], "pads": [1, 1, 1, 1]}, opset=11)
    xl = rng.uniform(-1, 1, (1, 8, 20, 20)).astype(F)
    xl[0, 3, 5, 5], xl[0, 0, 19, 19], xl[0, 7, 0, 10] = NAN, INF, -INF
    wl = rng.uniform(-0.5, 0.5, (16, 8, 3, 3)).astype(F)
    case("conv_large", "linalg", "Conv", [("x", xl), ("w", wl)],
         {"kernel_shape": [3, 3], "pads": [1, 1, 1, 1]}, opset=11, atol=1e-4)
    case("conv_strided", "linalg", "Conv", [("x", x), ("w", w)],
         {"kernel_shape": [3, 3], "strides": [2, 2]}, opset=11)
    wt = rng.uniform(0.1, 1, (2, 3, 3, 3)).astype(F)
    wt[1] = -wt[1]
    case("conv_transpose", "linalg", "ConvTranspose", [("x", x), ("w", wt)],
         {"kernel_shape": [3, 3], "strides": [2, 2]}, opset=11)


def softmax_cases():
    x = f32(
        [
            [1.0, 2.0, NAN, 0.0, -1.0, 3.0],
            [1.0, INF, 2.0, 0.0, -1.0, 3.0],
            [1.0, -INF, 2.0, 0.0, -1.0, 3.0],
            [-INF, -INF, -INF, -INF, -INF, -INF],
            [INF, INF, 0.0, 1.0, 2.0, 3.0],
            [88.0, 100.0, -100.0, 1e30, -1e30, 0.0],
            [0.5, -0.5, 1.0, -1.0, 2.0, -2.0],
        ]
    )
    for op in ["Softmax", "LogSoftmax"]:
        case(f"{op.lower()}_last", "softmax", op, [("x", x)], {"axis": -1}, opset=13)
        case(f"{op.lower()}_axis0", "softmax", op, [("x", np.ascontiguousarray(x.T))],
             {"axis": 0}, opset=13)


def norm_cases():
    x = f32(
        [
            [1.0, 2.0, NAN, 0.0, -1.0, 3.0, 0.5, 0.25],
            [1.0, INF, 2.0, 0.0, -1.0, 3.0, 0.5, 0.25],
            [1.0, -INF, 2.0, 0.0, -1.0, 3.0, 0.5, 0.25],
            [-0.0, -0.0, -0.0, -0.0, 0.0, 0.0, 0.0, 0.0],
            [1e30, -1e30, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0],
            [0.5, -0.5, 1.0, -1.0, 2.0, -2.0, 4.0, -4.0],
        ]
    )
    scale = np.linspace(0.5, 1.5, 8).astype(F)
    bias = np.linspace(-1, 1, 8).astype(F)
    case("layer_norm", "norm", "LayerNormalization", [("x", x), ("scale", scale), ("bias", bias)],
         {"axis": -1, "epsilon": 1e-5}, opset=17, rtol=1e-3, atol=1e-4)
    xc = SPECIAL.reshape(2, 3, 2, 4).copy()
    xc[1, 2] = f32([[0.5, 1.0, 1.5, 2.0], [2.5, 3.0, 3.5, 4.0]])  # one finite channel
    sc, bc = f32([1.0, -2.0, 0.5]), f32([0.0, 1.0, -1.0])
    mean, var = f32([0.5, -1.0, 2.0]), f32([1.0, 4.0, 0.25])
    case("batch_norm", "norm", "BatchNormalization", [("x", xc), ("s", sc), ("b", bc), ("m", mean), ("v", var)],
         {"epsilon": 1e-5}, opset=15)
    case("instance_norm", "norm", "InstanceNormalization", [("x", xc), ("s", sc), ("b", bc)],
         {"epsilon": 1e-5}, opset=6, atol=1e-4)


def reduce_cases():
    x = f32(
        [
            [1.0, NAN, 2.0, 3.0, -1.0],
            [1.0, INF, 2.0, 3.0, -1.0],
            [1.0, -INF, 2.0, 3.0, -1.0],
            [INF, -INF, 2.0, 3.0, -1.0],
            [-0.0, -0.0, -0.0, -0.0, -0.0],
            [0.0, INF, 2.0, 3.0, -1.0],
            [-INF, -INF, -INF, -INF, -INF],
            [NAN, INF, -INF, 0.0, 1.0],
            [0.5, -0.5, 1.0, -1.0, 2.0],
        ]
    )
    axes = [("axes", np.array([1], dtype=np.int64))]
    axes0 = [("axes", np.array([0], dtype=np.int64))]
    for op in ["ReduceSum", "ReduceMean", "ReduceMax", "ReduceMin", "ReduceProd", "ReduceL1",
               "ReduceL2", "ReduceSumSquare", "ReduceLogSumExp", "ReduceLogSum"]:
        fn = {"ReduceMax": np.max, "ReduceMin": np.min}.get(op)
        case(f"{op.lower()}_last", "reduce", op, [("x", x)], {"keepdims": 1}, consts=axes,
             opset=18, expected=fn and np_reduce(fn, 1, True))
        case(f"{op.lower()}_axis0", "reduce", op, [("x", np.ascontiguousarray(x.T))],
             {"keepdims": 0}, consts=axes0, opset=18, expected=fn and np_reduce(fn, 0, False))
    # ArgMax/ArgMin: the first NaN is the extreme (numpy), as NaN wins in ReduceMax/Min;
    # onnxruntime skips NaN unless it comes first.
    for op, fn in [("ArgMax", np.argmax), ("ArgMin", np.argmin)]:
        case(f"{op.lower()}_nan", "reduce", op, [("x", x)], {"axis": 1, "keepdims": 1},
             opset=13, expected=("numpy: the index of the first NaN (onnxruntime skips NaN "
                                 "after the first element)",
                                 lambda f, o, fn=fn: [fn(f["x"], axis=1, keepdims=True)]))
    # ArgMax/ArgMin of Inf (NaN's index is implementation-defined; no NaN here)
    xi = np.where(np.isnan(x), F(0.0), x)
    for op in ["ArgMax", "ArgMin"]:
        case(f"{op.lower()}_inf", "reduce", op, [("x", xi)], {"axis": 1, "keepdims": 1},
             opset=13)


def pool_cases():
    x = np.arange(2 * 36, dtype=F).reshape(1, 2, 6, 6) / 10 - 3
    x[0, 0, 0, 0] = NAN
    x[0, 0, 2, 3] = INF
    x[0, 0, 5, 5] = -INF
    x[0, 1, 1, 4] = NAN
    x[0, 1, 4, 1] = -INF
    x[0, 1, 3, 3] = INF
    x[0, 1, 3, 2] = -INF
    case("maxpool_2x2", "pool", "MaxPool", [("x", x)], {"kernel_shape": [2, 2], "strides": [2, 2]},
         opset=12, expected=np_maxpool(2, 2, 0))
    case("maxpool_3x3_pad", "pool", "MaxPool", [("x", x)],
         {"kernel_shape": [3, 3], "pads": [1, 1, 1, 1]}, opset=12, expected=np_maxpool(3, 1, 1))
    xn = -np.abs(x)  # all negative: a pad read as 0 would win; -Inf windows stay -Inf
    xn[0, 0, 0:2, 0:2] = -INF
    case("maxpool_negative_pad", "pool", "MaxPool", [("x", xn)],
         {"kernel_shape": [3, 3], "pads": [1, 1, 1, 1], "strides": [2, 2]}, opset=12,
         expected=np_maxpool(3, 2, 1))
    case("avgpool_3x3_pad", "pool", "AveragePool", [("x", x)],
         {"kernel_shape": [3, 3], "pads": [1, 1, 1, 1]}, opset=19)
    case("avgpool_3x3_pad_count", "pool", "AveragePool", [("x", x)],
         {"kernel_shape": [3, 3], "pads": [1, 1, 1, 1], "count_include_pad": 1}, opset=19)
    case("global_avgpool", "pool", "GlobalAveragePool", [("x", x)], opset=1)
    case("global_maxpool", "pool", "GlobalMaxPool", [("x", x)], opset=1,
         expected=np_reduce(np.max, (2, 3), True))
    xg = np.where(np.isnan(x), F(1.0), x)
    case("global_maxpool_inf", "pool", "GlobalMaxPool", [("x", xg)], opset=1)


def resize_cases():
    x = np.arange(2 * 16, dtype=F).reshape(1, 2, 4, 4) / 4
    x[0, 0, 1, 1] = NAN
    x[0, 0, 3, 0] = INF
    x[0, 1, 2, 2] = -INF
    x[0, 1, 0, 3] = -0.0
    scales = [("roi", np.zeros(0, dtype=F)), ("scales", f32([1, 1, 2, 2]))]
    case("resize_nearest", "resize", "Resize", [("x", x)], {"mode": "nearest"}, consts=scales,
         opset=13, bit_exact=True)
    for ct in ["half_pixel", "align_corners"]:
        # the reference agrees with onnxruntime wherever no special value is involved
        finite = np.nan_to_num(x, nan=1.0, posinf=2.0, neginf=-2.0)
        m = build(dict(name="check", op="Resize", inputs=[("x", finite)], consts=scales,
                       attrs={"mode": "linear", "coordinate_transformation_mode": ct},
                       opset=13, n_out=1))
        ort_y = run_ort(m, {"x": finite})[0]
        assert np.allclose(ort_y, np_resize_linear(finite, ct), atol=1e-5), ct
        case(f"resize_linear_{ct}", "resize", "Resize", [("x", x)],
             {"mode": "linear", "coordinate_transformation_mode": ct}, consts=scales, opset=13,
             expected=(ZERO_WEIGHT, lambda f, o, ct=ct: [np_resize_linear(f["x"], ct)]))


def movement_cases():
    payload = bits(
        [
            [0x7FC00000, 0xFFC00000, 0x7FC00123, 0x7F800001, 0x7F800000, 0xFF800000],
            [0x80000000, 0x00000000, 0x00000001, 0x80400000, 0x3F800000, 0xBF800000],
            [0x7FFFFFFF, 0xFFFFFFFF, 0x00800000, 0x7F7FFFFF, 0xFF7FFFFF, 0x807FFFFF],
            [0xFFC00001, 0x7FC0BEEF, 0x3E800000, 0x80000001, 0x40490FDB, 0xC0000000],
        ]
    )
    p = [("x", payload)]
    case("gather_rows", "movement", "Gather", p, {"axis": 0},
         consts=[("idx", np.array([3, 0, 2, 1, 0], dtype=np.int64))], opset=13, bit_exact=True)
    case("gather_cols", "movement", "Gather", p, {"axis": 1},
         consts=[("idx", np.array([5, 0, 3, 2], dtype=np.int64))], opset=13, bit_exact=True)
    case("transpose", "movement", "Transpose", p, {"perm": [1, 0]}, opset=13, bit_exact=True)
    case("concat", "movement", "Concat", [("x", payload), ("y", payload[::-1].copy())],
         {"axis": 1}, opset=13, bit_exact=True)
    case("slice", "movement", "Slice", p, consts=[
        ("starts", np.array([1, 1], dtype=np.int64)), ("ends", np.array([4, 6], dtype=np.int64)),
        ("axes", np.array([0, 1], dtype=np.int64)), ("steps", np.array([1, 2], dtype=np.int64))],
        opset=13, bit_exact=True)
    case("expand", "movement", "Expand", [("x", payload[1:2].copy())],
         consts=[("shape", np.array([3, 6], dtype=np.int64))], opset=13, bit_exact=True)
    case("identity_pad", "movement", "Pad", p,
         consts=[("pads", np.array([1, 0, 0, 1], dtype=np.int64))], opset=13, bit_exact=True)


def onnx_type(arr: np.ndarray) -> int:
    return helper.np_dtype_to_tensor_dtype(arr.dtype)


def build(c: dict) -> onnx.ModelProto:
    ins = [helper.make_tensor_value_info(n, onnx_type(a), a.shape) for n, a in c["inputs"]]
    inits = [numpy_helper.from_array(a, n) for n, a in c["consts"]]
    names = [n for n, _ in c["inputs"]] + [n for n, _ in c["consts"]]
    if c["op"] == "Resize":  # Resize(X, roi, scales)
        names = ["x", "roi", "scales"]
    outs = [f"y{k}" for k in range(c["n_out"])]
    node = helper.make_node(c["op"], names, outs, **c["attrs"])
    graph = helper.make_graph(
        [node], c["name"], ins,
        [helper.make_empty_tensor_value_info(o) for o in outs],
        initializer=inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", max(c["opset"], 13))])
    model.ir_version = 8
    return model


def run_ort(model: onnx.ModelProto, feeds: dict) -> list[np.ndarray]:
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    so.intra_op_num_threads = 1
    so.log_severity_level = 3
    s = ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])
    return s.run(None, feeds)


def write(out: Path, c: dict, model: onnx.ModelProto, outputs: list[np.ndarray]) -> None:
    d = out / c["name"]
    data = d / "test_data_set_0"
    data.mkdir(parents=True)
    # declare the output types ORT produced, so the model is complete
    for vi, y in zip(model.graph.output, outputs):
        vi.CopyFrom(helper.make_tensor_value_info(vi.name, onnx_type(y), y.shape))
    onnx.checker.check_model(model)
    (d / "model.onnx").write_bytes(model.SerializeToString())
    for k, (n, a) in enumerate(c["inputs"]):
        (data / f"input_{k}.pb").write_bytes(numpy_helper.from_array(a, n).SerializeToString())
    for k, y in enumerate(outputs):
        (data / f"output_{k}.pb").write_bytes(
            numpy_helper.from_array(y, f"y{k}").SerializeToString())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out", nargs="?", default=str(REPO / "conformance-data" / "numerics"))
    ap.add_argument("--force", action="store_true", help="regenerate even if up to date")
    args = ap.parse_args()
    out = Path(args.out).resolve()
    stamp = out / ".stamp"
    if not args.force and stamp.is_file() and stamp.read_text() == stamp_value():
        n = len(json.loads((out / "index.json").read_text()))
        print(f"numerics: up to date ({n} cases in {out})")
        return
    for f in (unary_cases, binary_cases, compare_cases, linalg_cases, softmax_cases,
              norm_cases, reduce_cases, pool_cases, resize_cases, movement_cases):
        f()
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    index = []
    for c in CASES:
        model = build(c)
        feeds = {n: a for n, a in c["inputs"]}
        outputs = [np.asarray(y) for y in run_ort(model, feeds)]
        expected = "onnxruntime"
        if c["expected"] is not None:
            rule, fix = c["expected"]
            outputs, expected = fix(feeds, outputs), rule
        write(out, c, model, outputs)
        index.append({"name": c["name"], "family": c["family"], "op": c["op"],
                      "rtol": c["rtol"], "atol": c["atol"], "bit_exact": c["bit_exact"],
                      "skip": c["skip"], "expected": expected})
    (out / "index.json").write_text("[\n" + ",\n".join(json.dumps(e) for e in index) + "\n]\n")
    stamp.write_text(stamp_value())
    fams = sorted({c["family"] for c in CASES})
    print(f"numerics: {len(CASES)} cases ({', '.join(fams)}) in {out}")


if __name__ == "__main__":
    sys.exit(main())
