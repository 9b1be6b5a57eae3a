#!/usr/bin/env python3
"""Generate the ONNX backend conformance test data from the installed onnx wheel.

Sits between the `onnx` Python wheel (which, since 1.19, ships the node test
*generators* but no longer the generated `backend/test/data/node` files) and the
Rust conformance harness, which reads the standard ONNX test layout:

    OUT/node/<test_name>/model.onnx
    OUT/node/<test_name>/test_data_set_0/input_K.pb, output_K.pb
    OUT/simple/<test_name>/...             (small multi-node model tests)
    OUT/pytorch-converted/<test_name>/...  (copied as shipped in the wheel)
    OUT/pytorch-operator/<test_name>/...   (copied as shipped in the wheel)
    OUT/index.json                         (one entry per test, see below)

index.json: [{"name", "kind", "ops": [op types], "opset": default-domain opset,
"dtypes": [elem types of graph inputs/outputs], "tensor_only": bool (false when
an input/output is a sequence/map/optional), "rtol", "atol"}].

Usage: gen_conformance.py [OUT_DIR] [--force]   (default OUT_DIR: conformance-data/)
Skips all work when OUT/.stamp matches this script and the onnx version.
Deterministic: numpy's global RNG is seeded before the generators run.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import sys
import time
import warnings
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto

REPO = Path(__file__).resolve().parent.parent
GENERATED_KINDS = ("node", "simple")
COPIED_KINDS = ("pytorch-converted", "pytorch-operator")


def stamp_value() -> str:
    digest = hashlib.sha256(Path(__file__).read_bytes()).hexdigest()[:16]
    return f"onnx={onnx.__version__} numpy={np.__version__} script={digest}\n"


def collect_cases() -> list:
    """Node + simple model cases (the 'real' kind only points at downloads)."""
    import onnx.backend.test.case.model as model_cases
    import onnx.backend.test.case.node as node_cases

    np.random.seed(0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        node = node_cases.collect_testcases()
        model = [c for c in model_cases.collect_testcases() if c.kind != "real"]
    return list(node) + model


def generate(tmp: Path) -> list:
    """Write every case into tmp/<kind>/<name> with onnx's own writer."""
    from onnx.backend.test import cmd_tools

    cases = collect_cases()
    # cmd_tools.generate_data() iterates model_test.collect_testcases(); point it at ours.
    original = cmd_tools.model_test.collect_testcases
    cmd_tools.model_test.collect_testcases = lambda: cases
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            cmd_tools.generate_data(argparse.Namespace(output=str(tmp)))
    finally:
        cmd_tools.model_test.collect_testcases = original
    data_dir = Path(cmd_tools.DATA_DIR)
    for kind in COPIED_KINDS:
        if (data_dir / kind).is_dir():
            shutil.copytree(data_dir / kind, tmp / kind)
    return cases


def io_dtypes(values) -> tuple[set[str], bool]:
    dtypes, tensor_only = set(), True
    for v in values:
        if v.type.HasField("tensor_type"):
            dtypes.add(TensorProto.DataType.Name(v.type.tensor_type.elem_type).lower())
        else:
            tensor_only = False
    return dtypes, tensor_only


def verify_and_index(root: Path, rtol_atol: dict[str, tuple[float, float]]) -> list[dict]:
    """Check the layout of every test dir; return index entries. Exits on a bad layout."""
    index, problems = [], []
    for kind in GENERATED_KINDS + COPIED_KINDS:
        kind_dir = root / kind
        if not kind_dir.is_dir():
            continue
        for test in sorted(p for p in kind_dir.iterdir() if p.is_dir()):
            model_path = test / "model.onnx"
            data = test / "test_data_set_0"
            if not model_path.is_file() or not data.is_dir():
                problems.append(f"{kind}/{test.name}: missing model.onnx or test_data_set_0")
                continue
            model = onnx.load(str(model_path))
            g = model.graph
            inits = {i.name for i in g.initializer}
            n_in = len(list(data.glob("input_*.pb")))
            n_out = len(list(data.glob("output_*.pb")))
            feedable = [i for i in g.input if i.name not in inits]
            if n_out != len(g.output) or n_in > len(feedable):
                problems.append(
                    f"{kind}/{test.name}: {n_in} inputs/{n_out} outputs on disk, "
                    f"graph has {len(feedable)}/{len(g.output)}"
                )
            for k in range(n_in):
                if not (data / f"input_{k}.pb").is_file():
                    problems.append(f"{kind}/{test.name}: input_{k}.pb missing (gap)")
            dtypes, tensor_only = io_dtypes(list(g.input) + list(g.output))
            opset = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), 0)
            rtol, atol = rtol_atol.get(test.name, (1e-3, 1e-7))
            index.append(
                {
                    "name": test.name,
                    "kind": kind,
                    "ops": sorted({n.op_type for n in g.node}),
                    "opset": opset,
                    "dtypes": sorted(dtypes),
                    "tensor_only": tensor_only,
                    "rtol": rtol,
                    "atol": atol,
                }
            )
    if problems:
        print("gen_conformance: layout problems:\n  " + "\n  ".join(problems[:20]), file=sys.stderr)
        sys.exit(1)
    return index


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out", nargs="?", default=str(REPO / "conformance-data"))
    ap.add_argument("--force", action="store_true", help="regenerate even if up to date")
    args = ap.parse_args()
    out = Path(args.out).resolve()
    stamp = out / ".stamp"
    if not args.force and stamp.is_file() and stamp.read_text() == stamp_value():
        n = len(json.loads((out / "index.json").read_text()))
        print(f"conformance: up to date ({n} tests in {out})")
        return

    t0 = time.time()
    out.mkdir(parents=True, exist_ok=True)
    tmp = out / f".tmp-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    cases = generate(tmp)
    rtol_atol = {c.name: (c.rtol, c.atol) for c in cases}
    index = verify_and_index(tmp, rtol_atol)
    # swap each kind folder in, so readers never see a half-written tree for long
    for kind in GENERATED_KINDS + COPIED_KINDS:
        if (tmp / kind).is_dir():
            old = out / f".old-{kind}-{os.getpid()}"
            if (out / kind).exists():
                (out / kind).rename(old)
            (tmp / kind).rename(out / kind)
            shutil.rmtree(old, ignore_errors=True)
    shutil.rmtree(tmp, ignore_errors=True)
    (out / "index.json").write_text(
        "[\n" + ",\n".join(json.dumps(e) for e in index) + "\n]\n"
    )
    stamp.write_text(stamp_value())
    by_kind = {}
    for e in index:
        by_kind[e["kind"]] = by_kind.get(e["kind"], 0) + 1
    summary = ", ".join(f"{k}: {v}" for k, v in by_kind.items())
    print(f"conformance: {len(cases)} generated cases, {len(index)} tests ({summary}) "
          f"in {out} [{time.time() - t0:.1f} s]")


if __name__ == "__main__":
    main()
