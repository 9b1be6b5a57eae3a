// node web-demo/test/node_bench.mjs [ROUNDS] [RUNS]: magika on the CPU in wasm, tandem
// (web-demo/dist, placement cpu, one thread) against onnxruntime-web's wasm backend (one
// thread), in Node's V8 (Chromium's engine) without a page. The two take turns run by run
// (which goes first alternates), ROUNDS rounds of RUNS pairs; printed: each side's median over
// all runs, the median and range of the rounds' own ratios (the host's speed drifts within
// minutes, up to 2-4x on the 2-vCPU VMs), and tandem's median time in its Conv and MatMul
// nodes (from session.report()).
// Needs `scripts/web.sh build` first (`scripts/web.sh bench` does both).
import fs from "fs";
import path from "path";
import { fileURLToPath } from "url";

const root = path.join(path.dirname(fileURLToPath(import.meta.url)), "..");
const [rounds, runs] = [+(process.argv[2] ?? 5), +(process.argv[3] ?? 10)];
const { default: init, Session } = await import(path.join(root, "dist/pkg/tandem_web_demo.js"));
await init({ module_or_path: fs.readFileSync(path.join(root, "dist/pkg/tandem_web_demo_bg.wasm")) });
const ort = await import(path.join(root, "node_modules/onnxruntime-web/dist/ort.min.mjs"));
ort.env.wasm.numThreads = 1;

const model = fs.readFileSync(path.join(root, "dist/models/magika/model.onnx"));
// 2048 byte tokens (magika's input), a fixed pseudo-random text.
const tokens = new Int32Array(2048).map((_, i) => (i * 7919) % 257);
const ours = await Session.create(model, { placement: "cpu" });
const theirs = await ort.InferenceSession.create(model, { executionProviders: ["wasm"] });
const mine = { [ours.inputNames()[0]]: { dtype: "int32", shape: [1, 2048], data: tokens } };
const feeds = { [theirs.inputNames[0]]: new ort.Tensor("int32", tokens, [1, 2048]) };

const median = (v) => [...v].sort((a, b) => a - b)[v.length >> 1];
const timed = async (run) => {
  const t0 = performance.now();
  await run();
  return performance.now() - t0;
};
// Warm-up: V8 first runs wasm on its baseline compiler (Liftoff) and swaps in optimised code
// (TurboFan) when it is ready; the first few runs of both took 2-3x the later ones.
for (let i = 0, t0 = performance.now(); i < 10 || performance.now() - t0 < 3000; i++) {
  await ours.run(mine);
  await theirs.run(feeds);
}
const all = { tandem: [], ort: [], gemm: [] };
const ratios = [];
for (let r = 0; r < rounds; r++) {
  const t = [];
  const o = [];
  for (let i = 0; i < runs; i++) {
    const tandemFirst = (r + i) % 2 === 0;
    if (!tandemFirst) o.push(await timed(() => theirs.run(feeds)));
    t.push(await timed(() => ours.run(mine)));
    const nodes = ours.report().run.nodes.filter((n) => n.op === "Conv" || n.op === "MatMul");
    all.gemm.push(nodes.reduce((s, n) => s + n.timeMs, 0));
    if (tandemFirst) o.push(await timed(() => theirs.run(feeds)));
  }
  all.tandem.push(...t);
  all.ort.push(...o);
  ratios.push(median(t) / median(o));
}
const f = (x) => x.toFixed(2);
console.log(`magika, wasm, one thread, ${rounds} rounds of ${runs} alternated runs each`);
console.log(`tandem cpu (wasm)      median ${f(median(all.tandem))} ms (Conv + MatMul ${f(median(all.gemm))} ms)`);
console.log(`onnxruntime-web wasm   median ${f(median(all.ort))} ms`);
console.log(
  `tandem / onnxruntime-web: ${f(median(all.tandem) / median(all.ort))}x ` +
    `(rounds: median ${f(median(ratios))}, ${f(Math.min(...ratios))}-${f(Math.max(...ratios))})`,
);
