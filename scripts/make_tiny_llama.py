#!/usr/bin/env python3
"""Build a tiny Llama-style decoder (random seeded weights) as two ONNX models.

Sits between onnx.helper (the only builder used: no torch) and the model
benchmarks/tests, which read models/tiny_llama_prefill and models/tiny_llama_decode.

Architecture: vocab 512, d_model 128, 2 layers, 4 heads of 32, SiLU MLP of 256,
RMSNorm (Pow/ReduceMean/Add/Sqrt/Div/Mul), rotary embeddings (Cos/Sin of
position * inv_freq, rotate_half by Slice/Neg/Concat), causal mask (Trilu +
Where), Softmax attention (MatMul/Transpose/Reshape), Gather embedding. Opset 17,
IR 8, static shapes.

- prefill: input_ids i64 [1,S] -> logits [1,S,512], present_key_L / present_value_L
  [1,4,S,32] for L in 0,1 (S = 128 in the saved model).
- decode: input_ids i64 [1,1], position_ids i64 [1,1], past_key_L / past_value_L
  [1,4,P,32] (P = 128) -> logits [1,1,512], present_key_L / present_value_L [1,4,P+1,32].

Usage: make_tiny_llama.py [OUT_DIR]  (default models/): writes both models and
checks with onnxruntime that a decode step after a 128-token prefill gives the
same logits and K/V as a 129-token prefill (which proves the KV cache wiring).
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

VOCAB, D, LAYERS, HEADS, HEAD_DIM, FFN = 512, 128, 2, 4, 32, 256
PREFILL_LEN = 128
SEED = 20261122
EPS = 1e-5
ROPE_THETA = 10000.0


def make_weights(seed: int = SEED) -> dict[str, np.ndarray]:
    """Random weights scaled so activations and logits stay O(1)."""
    rng = np.random.default_rng(seed)

    def lin(n_in: int, n_out: int) -> np.ndarray:
        return (rng.standard_normal((n_in, n_out)) / np.sqrt(n_in)).astype(np.float32)

    def norm() -> np.ndarray:
        return (1.0 + 0.1 * rng.standard_normal(D)).astype(np.float32)

    w = {"embed": rng.standard_normal((VOCAB, D)).astype(np.float32)}
    for l in range(LAYERS):
        w[f"l{l}.attn_norm"] = norm()
        for name in ("wq", "wk", "wv", "wo"):
            w[f"l{l}.{name}"] = lin(D, D)
        w[f"l{l}.mlp_norm"] = norm()
        w[f"l{l}.w_gate"] = lin(D, FFN)
        w[f"l{l}.w_up"] = lin(D, FFN)
        w[f"l{l}.w_down"] = lin(FFN, D)
    w["final_norm"] = norm()
    w["lm_head"] = lin(D, VOCAB)
    return w


class Builder:
    """Accumulates nodes and initializers with unique value names."""

    def __init__(self) -> None:
        self.nodes: list[onnx.NodeProto] = []
        self.inits: list[onnx.TensorProto] = []
        self.count = 0

    def const(self, name: str, value: np.ndarray) -> str:
        self.inits.append(numpy_helper.from_array(value, name))
        return name

    def op(self, op_type: str, inputs: list[str], out: str | None = None, **attrs) -> str:
        self.count += 1
        out = out or f"{op_type.lower()}_{self.count}"
        self.nodes.append(helper.make_node(op_type, inputs, [out], name=f"n{self.count}_{op_type}", **attrs))
        return out


def rms_norm(b: Builder, x: str, weight: str) -> str:
    sq = b.op("Pow", [x, "two"])
    mean = b.op("ReduceMean", [sq], axes=[-1], keepdims=1)
    rms = b.op("Sqrt", [b.op("Add", [mean, "eps"])])
    return b.op("Mul", [b.op("Div", [x, rms]), weight])


def rotate_half(b: Builder, x: str) -> str:
    x1 = b.op("Slice", [x, "half_start0", "half_end0", "axis_last"])
    x2 = b.op("Slice", [x, "half_start1", "half_end1", "axis_last"])
    return b.op("Concat", [b.op("Neg", [x2]), x1], axis=-1)


def heads(b: Builder, x: str, seq: int) -> str:
    """[1,S,D] -> [1,H,S,hd]."""
    shape = b.const(f"shape_heads_{b.count}", np.array([1, seq, HEADS, HEAD_DIM], np.int64))
    return b.op("Transpose", [b.op("Reshape", [x, shape])], perm=[0, 2, 1, 3])


def build(seq: int, past: int | None, w: dict[str, np.ndarray], name: str) -> onnx.ModelProto:
    """Decoder over `seq` new tokens; with `past` cached positions when past is not None."""
    b = Builder()
    for k, v in w.items():
        b.const(k, v)
    b.const("two", np.array(2.0, np.float32))
    b.const("eps", np.array(EPS, np.float32))
    b.const("scale", np.array(1.0 / np.sqrt(HEAD_DIM), np.float32))
    b.const("half_start0", np.array([0], np.int64))
    b.const("half_end0", np.array([HEAD_DIM // 2], np.int64))
    b.const("half_start1", np.array([HEAD_DIM // 2], np.int64))
    b.const("half_end1", np.array([HEAD_DIM], np.int64))
    b.const("axis_last", np.array([-1], np.int64))
    b.const("axis1", np.array([1], np.int64))
    inv_freq = 1.0 / ROPE_THETA ** (np.arange(0, HEAD_DIM, 2, dtype=np.float32) / HEAD_DIM)
    b.const("inv_freq", inv_freq.astype(np.float32))

    inputs = [helper.make_tensor_value_info("input_ids", TensorProto.INT64, [1, seq])]
    if past is None:
        positions = b.const("positions", np.arange(seq, dtype=np.int64).reshape(1, seq))
    else:
        positions = "position_ids"
        inputs.append(helper.make_tensor_value_info("position_ids", TensorProto.INT64, [1, seq]))
    outputs = [helper.make_tensor_value_info("logits", TensorProto.FLOAT, [1, seq, VOCAB])]

    # rotary tables: angles [1,S,16] -> concat -> [1,S,32] -> cos/sin [1,1,S,32]
    pos_f = b.op("Unsqueeze", [b.op("Cast", [positions], to=TensorProto.FLOAT), "axis_last"])
    angles = b.op("Mul", [pos_f, "inv_freq"])
    angles = b.op("Concat", [angles, angles], axis=-1)
    cos = b.op("Unsqueeze", [b.op("Cos", [angles]), "axis1"], out="rope_cos")
    sin = b.op("Unsqueeze", [b.op("Sin", [angles]), "axis1"], out="rope_sin")

    if past is None:
        b.const("neg_big", np.array(-1e9, np.float32))
        ones = b.const("causal_ones", np.ones((seq, seq), np.float32))
        lower = b.op("Trilu", [ones], upper=0)
        mask = b.op("Cast", [lower], out="causal_mask", to=TensorProto.BOOL)

    x = b.op("Gather", ["embed", "input_ids"], axis=0)
    total = seq if past is None else past + seq
    for l in range(LAYERS):
        h = rms_norm(b, x, f"l{l}.attn_norm")
        q = heads(b, b.op("MatMul", [h, f"l{l}.wq"]), seq)
        k = heads(b, b.op("MatMul", [h, f"l{l}.wk"]), seq)
        v = heads(b, b.op("MatMul", [h, f"l{l}.wv"]), seq)
        q = b.op("Add", [b.op("Mul", [q, cos]), b.op("Mul", [rotate_half(b, q), sin])])
        k = b.op("Add", [b.op("Mul", [k, cos]), b.op("Mul", [rotate_half(b, k), sin])])
        pk, pv = f"present_key_{l}", f"present_value_{l}"
        if past is None:
            k = b.op("Identity", [k], out=pk)
            v = b.op("Identity", [v], out=pv)
        else:
            for n in (f"past_key_{l}", f"past_value_{l}"):
                inputs.append(helper.make_tensor_value_info(n, TensorProto.FLOAT, [1, HEADS, past, HEAD_DIM]))
            k = b.op("Concat", [f"past_key_{l}", k], out=pk, axis=2)
            v = b.op("Concat", [f"past_value_{l}", v], out=pv, axis=2)
        for n in (pk, pv):
            outputs.append(helper.make_tensor_value_info(n, TensorProto.FLOAT, [1, HEADS, total, HEAD_DIM]))
        scores = b.op("MatMul", [q, b.op("Transpose", [k], perm=[0, 1, 3, 2])])
        scores = b.op("Mul", [scores, "scale"])
        if past is None:
            scores = b.op("Where", [mask, scores, "neg_big"])
        attn = b.op("Softmax", [scores], axis=-1)
        ctx = b.op("Transpose", [b.op("MatMul", [attn, v])], perm=[0, 2, 1, 3])
        ctx = b.op("Reshape", [ctx, b.const(f"shape_merge_{l}", np.array([1, seq, D], np.int64))])
        x = b.op("Add", [x, b.op("MatMul", [ctx, f"l{l}.wo"])])
        h = rms_norm(b, x, f"l{l}.mlp_norm")
        gate = b.op("MatMul", [h, f"l{l}.w_gate"])
        silu = b.op("Mul", [gate, b.op("Sigmoid", [gate])])
        up = b.op("MatMul", [h, f"l{l}.w_up"])
        x = b.op("Add", [x, b.op("MatMul", [b.op("Mul", [silu, up]), f"l{l}.w_down"])])
    h = rms_norm(b, x, "final_norm")
    b.op("MatMul", [h, "lm_head"], out="logits")

    graph = helper.make_graph(b.nodes, name, inputs, outputs, b.inits)
    model = helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", 17)], producer_name="tandem make_tiny_llama"
    )
    model.ir_version = 8
    onnx.checker.check_model(model, full_check=True)
    return model


def prefill_model(w: dict[str, np.ndarray], seq: int = PREFILL_LEN) -> onnx.ModelProto:
    return build(seq, None, w, f"tiny_llama_prefill_{seq}")


def decode_model(w: dict[str, np.ndarray], past: int = PREFILL_LEN) -> onnx.ModelProto:
    return build(1, past, w, f"tiny_llama_decode_{past}")


def prompt_ids(n: int = PREFILL_LEN + 1, seed: int = SEED) -> np.ndarray:
    """Deterministic token ids in [0, VOCAB), shape [1, n]."""
    return np.random.default_rng(seed + 1).integers(0, VOCAB, (1, n), dtype=np.int64)


def example_inputs(prefill_path: Path) -> tuple[dict, dict]:
    """Inputs for both saved models: the decode step continues the prefill's prompt."""
    import onnxruntime as ort

    ids = prompt_ids()
    prefill_in = {"input_ids": ids[:, :PREFILL_LEN]}
    sess = ort.InferenceSession(str(prefill_path), providers=["CPUExecutionProvider"])
    names = [o.name for o in sess.get_outputs()]
    outs = dict(zip(names, sess.run(None, prefill_in)))
    decode_in = {"input_ids": ids[:, PREFILL_LEN:], "position_ids": np.array([[PREFILL_LEN]], np.int64)}
    for l in range(LAYERS):
        decode_in[f"past_key_{l}"] = outs[f"present_key_{l}"]
        decode_in[f"past_value_{l}"] = outs[f"present_value_{l}"]
    return prefill_in, decode_in


def check_kv_cache(w: dict[str, np.ndarray], prefill_path: Path, decode_path: Path) -> float:
    """Decode after a 128-token prefill must equal a 129-token prefill's last position."""
    import onnxruntime as ort

    long = ort.InferenceSession(prefill_model(w, PREFILL_LEN + 1).SerializeToString(),
                                providers=["CPUExecutionProvider"])
    ids = prompt_ids()
    want = dict(zip([o.name for o in long.get_outputs()], long.run(None, {"input_ids": ids})))
    _, decode_in = example_inputs(prefill_path)
    dec = ort.InferenceSession(str(decode_path), providers=["CPUExecutionProvider"])
    got = dict(zip([o.name for o in dec.get_outputs()], dec.run(None, decode_in)))
    err = float(np.abs(got["logits"][:, 0] - want["logits"][:, -1]).max())
    for l in range(LAYERS):
        for n in (f"present_key_{l}", f"present_value_{l}"):
            err = max(err, float(np.abs(got[n] - want[n]).max()))
    scale = float(np.abs(want["logits"]).max())
    if not err <= 1e-4 * max(1.0, scale):
        raise SystemExit(f"tiny_llama: KV-cache check FAILED, max abs diff {err:.3g} (logit scale {scale:.3g})")
    if int(got["logits"].argmax()) != int(want["logits"][0, -1].argmax()):
        raise SystemExit("tiny_llama: KV-cache check FAILED, argmax differs")
    return err


def write(out_dir: Path, log=print) -> tuple[Path, Path]:
    """Write both models under out_dir and run the KV-cache check."""
    w = make_weights()
    prefill_path = out_dir / "tiny_llama_prefill" / "model.onnx"
    decode_path = out_dir / "tiny_llama_decode" / "model.onnx"
    for path, model in ((prefill_path, prefill_model(w)), (decode_path, decode_model(w))):
        path.parent.mkdir(parents=True, exist_ok=True)
        onnx.save(model, str(path))
    err = check_kv_cache(w, prefill_path, decode_path)
    log(f"tiny_llama: prefill + decode written, KV-cache check ok (max abs diff {err:.2e})")
    return prefill_path, decode_path


if __name__ == "__main__":
    write(Path(sys.argv[1] if len(sys.argv) > 1 else Path(__file__).resolve().parent.parent / "models"))
