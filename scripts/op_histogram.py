#!/usr/bin/env python3
"""Print the ONNX op types used by every model in models/manifest.json.

Sits between models/ (written by fetch_models.py) and the people choosing which
operators tandem implements next.

Usage: op_histogram.py [--manifest models/manifest.json] [--missing]
  per model: its op types with counts; then the union: op type, total node count,
  number of models using it. With --missing, also lists the op types that
  `cargo run --release -q --bin tandem -- ops` (one supported op type
  per line) does not report, and which models each one blocks.
Needs only the onnx package (the .venv made by scripts/setup.sh).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from collections import Counter
from pathlib import Path

import onnx

REPO = Path(__file__).resolve().parent.parent


def graph_ops(graph: onnx.GraphProto, counts: Counter) -> None:
    """Count op types, descending into If/Loop/Scan subgraphs."""
    for node in graph.node:
        key = node.op_type if node.domain in ("", "ai.onnx") else f"{node.domain}.{node.op_type}"
        counts[key] += 1
        for attr in node.attribute:
            if attr.type == onnx.AttributeProto.GRAPH:
                graph_ops(attr.g, counts)
            elif attr.type == onnx.AttributeProto.GRAPHS:
                for g in attr.graphs:
                    graph_ops(g, counts)


def supported_ops() -> set[str] | None:
    """Op types tandem reports, or None when the `ops` subcommand is not there yet."""
    # no -p: the `tandem` binary is found in whichever workspace crate holds it
    cmd = ["cargo", "run", "--release", "-q", "--bin", "tandem", "--", "ops"]
    try:
        res = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=1800)
    except (OSError, subprocess.TimeoutExpired) as e:
        print(f"(could not run {' '.join(cmd)}: {e})")
        return None
    ops = {line.strip() for line in res.stdout.splitlines() if line.strip()}
    if res.returncode != 0 or not ops:
        tail = " | ".join(res.stderr.strip().splitlines()[:3]) or "no output"
        print(f"(`tandem ops` not available yet: exit {res.returncode}: {tail})")
        return None
    return ops


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--manifest", default=str(REPO / "models" / "manifest.json"))
    ap.add_argument("--missing", action="store_true", help="list op types tandem does not support")
    args = ap.parse_args()
    manifest = Path(args.manifest)
    if not manifest.is_file():
        sys.exit(f"{manifest} not found: run scripts/setup.sh (or scripts/fetch_models.py) first")

    per_model: dict[str, Counter] = {}
    for entry in json.loads(manifest.read_text()):
        counts: Counter = Counter()
        graph_ops(onnx.load(str(manifest.parent / entry["path"]), load_external_data=False).graph, counts)
        per_model[entry["name"]] = counts

    width = max(len(n) for n in per_model)
    for name, counts in per_model.items():
        ops = ", ".join(f"{op}:{n}" for op, n in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0])))
        print(f"{name:<{width}}  {sum(counts.values()):5d} nodes  {ops}")

    total: Counter = Counter()
    users: dict[str, list[str]] = {}
    for name, counts in per_model.items():
        total.update(counts)
        for op in counts:
            users.setdefault(op, []).append(name)
    print(f"\nunion: {len(total)} op types over {len(per_model)} models")
    print(f"{'op type':<24} {'nodes':>6} {'models':>6}")
    for op, n in sorted(total.items(), key=lambda kv: (-kv[1], kv[0])):
        print(f"{op:<24} {n:6d} {len(users[op]):6d}")

    if args.missing:
        supported = supported_ops()
        if supported is None:
            return
        missing = sorted(op for op in total if op not in supported)
        print(f"\nunsupported by tandem: {len(missing)} of {len(total)} op types")
        for op in missing:
            print(f"  {op:<22} used by {', '.join(users[op])}")
        blocked = {m for op in missing for m in users[op]}
        ready = [m for m in per_model if m not in blocked]
        print(f"models with every op supported: {', '.join(ready) or 'none'}")


if __name__ == "__main__":
    main()
