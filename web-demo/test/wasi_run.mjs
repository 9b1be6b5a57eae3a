// node web-demo/test/wasi_run.mjs FILE.wasm [ARGS...]: runs a wasm32-wasip1 program (a test
// binary cargo built) in Node's WASI, exiting with its status. scripts/web.sh uses it as cargo's
// runner for the ops tests whose code takes a wasm-only path (the SIMD128 GEMM tile of
// ops/src/cpu_gemm_lanes.rs), so they run on wasm's lanes, not only natively.
import { readFile } from "node:fs/promises";
import { WASI } from "node:wasi";

const [file, ...args] = process.argv.slice(2);
const wasi = new WASI({ version: "preview1", args: [file, ...args], env: {}, returnOnExit: true });
const module = await WebAssembly.compile(await readFile(file));
const instance = await WebAssembly.instantiate(module, wasi.getImportObject());
process.exitCode = wasi.start(instance);
