#!/usr/bin/env python3
"""onnxruntime CPU peer of tandem-bench: load one model, make its first run on the given inputs
and write its outputs as .npy, then make its timed runs in the slices the suite asks for (the
rows of a round interleave them, bench-suite/src/interleave.rs) under the suite's rule (at least N
iterations AND at least T seconds of its own time, stopping at a hard cap), and print its
timings as JSON.

Sits between tandem-bench (bench-suite/src/peers/ort.rs spawns it with .venv/bin/python) and the
pip-installed onnxruntime. Errors go to stderr and the exit status is non-zero.

Usage:
  ort_driver.py --numpy-gemm N [--threads 2] [--secs T]   (numpy's BLAS on an N^3 f32 matmul)
  ort_driver.py --model M.onnx --input NAME=FILE.npy ... --out-dir DIR
                [--iters N] [--secs T] [--max-secs X] [--threads 2] [--profile-runs K]
                [--slice-secs S] [--pause-ms P --pause-runs R] [--pin-threads]

With --model it speaks interleave.rs's line protocol: after the first run it prints
`ready {"outputs": [{"name", "path"}]}`; each `go` line on stdin runs timed runs for S seconds
(at least one; the whole rule where S is 0) and answers `slice N` or, once the rule is met,
`done N` (N: timed runs so far); after `finish` it makes R runs each after P ms of sleep
and prints one JSON object: {"runtime": "onnxruntime", "version", "threads", "load_ms",
"first_run_ms", "samples_ms": [...], "after_pause_ms": [...], "peak_rss_kb", "op_times":
[{"op", "count", "ms"}]}. --pin-threads pins the pool's workers one to a CPU (onnxruntime's
`session.intra_op_thread_affinities`: worker i to the (i+1)-th CPU this process may run on,
the caller unpinned, as onnxruntime's own default pool does). peak_rss_kb is the process's ru_maxrss
(Python + numpy + onnxruntime + the model) before op times are taken, so it is an upper bound
on what onnxruntime itself needs. op_times (with --profile-runs K > 0, else empty): a second
session of the same options with onnxruntime's profiler on runs K + 1 times after the timed
runs; each node's kernel time is its median over the last K (the first is that session's
warm-up), summed per op type (onnxruntime's own types after its fusions: FusedConv, QuickGelu,
ReorderInput, ...), largest first. The timed runs never profile. With --numpy-gemm: {"numpy":
version, "gflops": best, "blas": the BLAS numpy links} on stdout alone; the thread count is
set through the BLAS environment variables before numpy loads.
"""
import argparse
import json
import os
import re
import resource
import sys
import time


def numpy_gemm(n, threads, secs):
    for var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ[var] = str(threads)
    import numpy as np

    rng = np.random.default_rng(0)
    a = rng.random((n, n), dtype=np.float32)
    b = rng.random((n, n), dtype=np.float32)
    a @ b  # warm-up
    best = float("inf")
    start = time.perf_counter()
    while time.perf_counter() - start < secs:
        t0 = time.perf_counter()
        a @ b
        best = min(best, time.perf_counter() - t0)
    try:
        cfg = np.show_config(mode="dicts")["Build Dependencies"]["blas"]
        blas = f"{cfg.get('name')} {cfg.get('version')}"
    except Exception:  # older numpy: no dict mode
        blas = "unknown"
    json.dump({"numpy": np.__version__, "gflops": 2 * n**3 / best / 1e9, "blas": blas}, sys.stdout)
    sys.stdout.write("\n")


def op_times(model, opts, feeds, names, runs, out_dir):
    """Per op type, the summed median kernel time of its nodes over `runs` profiled runs."""
    import collections
    import statistics

    opts.enable_profiling = True
    opts.profile_file_prefix = os.path.join(out_dir, "ort_profile")
    sess = ort.InferenceSession(model, opts, providers=["CPUExecutionProvider"])
    for _ in range(runs + 1):  # the first run (a new session's warm-up) is left out below
        sess.run(names, feeds)
    path = sess.end_profiling()
    with open(path) as f:
        events = json.load(f)
    os.remove(path)
    per_node = collections.defaultdict(list)
    for e in events:
        if e.get("cat") == "Node" and e.get("name", "").endswith("_kernel_time"):
            per_node[(e["name"], e.get("args", {}).get("op_name", "?"))].append(e["dur"])
    by_op = collections.defaultdict(lambda: [0, 0.0])
    for (_, op), durs in per_node.items():
        by_op[op][0] += 1
        by_op[op][1] += statistics.median(durs[1:] or durs) / 1e3
    rows = [{"op": op, "count": c, "ms": ms} for op, (c, ms) in by_op.items()]
    return sorted(rows, key=lambda r: -r["ms"])


def safe(name):
    return re.sub(r"[^A-Za-z0-9._-]", "_", name)


def main():
    global np, ort
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--numpy-gemm", type=int, metavar="N")
    p.add_argument("--model")
    p.add_argument("--input", action="append", default=[], metavar="NAME=FILE.npy")
    p.add_argument("--out-dir")
    p.add_argument("--iters", type=int, default=20)
    p.add_argument("--secs", type=float, default=2.0)
    p.add_argument("--max-secs", type=float, default=60.0)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--profile-runs", type=int, default=0, metavar="K")
    p.add_argument("--slice-secs", type=float, default=0.0, metavar="S")
    p.add_argument("--pause-ms", type=float, default=50.0, metavar="P")
    p.add_argument("--pause-runs", type=int, default=0, metavar="R")
    p.add_argument("--pin-threads", action="store_true")
    a = p.parse_args()
    if a.numpy_gemm:
        return numpy_gemm(a.numpy_gemm, a.threads, a.secs)
    if not a.model or not a.out_dir:
        p.error("--model and --out-dir are required")
    import numpy as np
    import onnxruntime as ort

    feeds = {}
    for item in a.input:
        name, _, path = item.partition("=")
        feeds[name] = np.load(path)

    opts = ort.SessionOptions()
    opts.intra_op_num_threads = a.threads
    opts.inter_op_num_threads = 1
    if a.pin_threads and a.threads > 1:
        cpus = sorted(os.sched_getaffinity(0))
        workers = [cpus[(i + 1) % len(cpus)] + 1 for i in range(a.threads - 1)]
        opts.add_session_config_entry(
            "session.intra_op_thread_affinities", ";".join(map(str, workers))
        )
    t0 = time.perf_counter()
    sess = ort.InferenceSession(a.model, opts, providers=["CPUExecutionProvider"])
    load_ms = (time.perf_counter() - t0) * 1e3
    names = [o.name for o in sess.get_outputs()]

    t0 = time.perf_counter()
    outs = sess.run(names, feeds)
    first_ms = (time.perf_counter() - t0) * 1e3

    os.makedirs(a.out_dir, exist_ok=True)
    written = []
    for name, value in zip(names, outs):
        path = os.path.join(a.out_dir, safe(name) + ".npy")
        np.save(path, np.ascontiguousarray(value))
        written.append({"name": name, "path": path})
    say("ready " + json.dumps({"outputs": written}))

    samples = []
    spent = 0.0  # this row's own time: its slices', not the other rows' slices between them

    def met():
        if len(samples) >= a.iters and spent >= a.secs:
            return True
        return spent >= a.max_secs and len(samples) > 0

    for line in sys.stdin:
        command = line.strip()
        if command == "go":
            start, before = time.perf_counter(), spent
            while not met():
                t0 = time.perf_counter()
                sess.run(names, feeds)
                t1 = time.perf_counter()
                samples.append((t1 - t0) * 1e3)
                spent = before + (t1 - start)
                if a.slice_secs > 0 and t1 - start >= a.slice_secs:
                    break
            say(("done " if met() else "slice ") + str(len(samples)))
        elif command == "finish" and met():
            break
        else:
            sys.exit(f"ort_driver.py: unexpected `{command}` on stdin")
    else:
        sys.exit("ort_driver.py: stdin closed before `finish`")

    after_pause = []
    for _ in range(a.pause_runs):
        time.sleep(a.pause_ms / 1e3)
        t0 = time.perf_counter()
        sess.run(names, feeds)
        after_pause.append((time.perf_counter() - t0) * 1e3)

    peak_rss_kb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    ops = op_times(a.model, opts, feeds, names, a.profile_runs, a.out_dir) if a.profile_runs else []

    json.dump(
        {
            "runtime": "onnxruntime",
            "version": ort.__version__,
            "threads": a.threads,
            "load_ms": load_ms,
            "first_run_ms": first_ms,
            "samples_ms": samples,
            "after_pause_ms": after_pause,
            "peak_rss_kb": peak_rss_kb,
            "op_times": ops,
        },
        sys.stdout,
    )
    sys.stdout.write("\n")


def say(line):
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


if __name__ == "__main__":
    main()
