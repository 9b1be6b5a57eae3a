"""Reference outputs for the browser test: onnxruntime (CPU) on magika for each sample text.

Usage: reference.py SAMPLES.json MODEL_DIR > reference.json
magika's preprocessing is written here again (from magika 1.0's description: first and last KiB
of the first/last 4 KiB block, whitespace stripped at the outer ends, padded with 256), so a
mistake in the page's JS preprocessing shows up as a mismatch too.
"""
import json
import sys

import numpy as np
import onnxruntime as ort

WS = b" \t\n\r\x0b\x0c"


def features(data: bytes) -> np.ndarray:
    block = min(len(data), 4096)
    head = data[:block].lstrip(WS)[:1024]
    tail = data[len(data) - block:].rstrip(WS)[-1024:] if block else b""
    beg = list(head) + [256] * (1024 - len(head))
    end = [256] * (1024 - len(tail)) + list(tail)
    return np.array([beg + end], dtype=np.int32)


def main() -> None:
    samples = json.load(open(sys.argv[1]))
    session = ort.InferenceSession(f"{sys.argv[2]}/model.onnx", providers=["CPUExecutionProvider"])
    out = {}
    for s in samples:
        x = features(s["text"].encode("utf-8"))
        (probs,) = session.run(["target_label"], {"bytes": x})
        out[s["name"]] = {"tokens": x[0].tolist(), "probs": probs[0].astype(float).tolist()}
    json.dump(out, sys.stdout)


main()
