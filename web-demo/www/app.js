// The demo page: runs magika with tandem (its wasm build lives in a module worker, worker.js, so
// that loading, calibration and runs never block the page) with placement cpu, gpu and auto,
// shows the result, the latency per placement and a per-op timeline, and (benchmark) runs
// onnxruntime-web's wasm and webgpu execution providers on the same model and input.
// `window.demo` is what scripts/web.sh test drives.
import { features, top } from "./magika.js";
import { drawTimeline } from "./timeline.js";

const $ = (id) => document.getElementById(id);
const params = new URLSearchParams(location.search);
const tandem = new Worker(new URL("./worker.js", import.meta.url), { type: "module" });
const pending = new Map();
const placementsRun = new Set();
const latencies = { cpu: [], gpu: [], auto: [] };
let model, labels, samples, gpu;

const BUDGET_MS = 15000; // benchmark time per runtime and placement, after 3 runs
const status = (s) => { $("status").textContent = s; };
const p50 = (v) => { const s = [...v].sort((a, b) => a - b); return s[Math.floor(s.length / 2)]; };
const tokensOf = (text) => features(new TextEncoder().encode(text));

// One request to the worker (see worker.js for the ops): a promise of its result.
let nextId = 0;
function ask(op, args) {
  const id = nextId++;
  return new Promise((resolve, reject) => {
    pending.set(id, { resolve, reject });
    tandem.postMessage({ id, op, args });
  });
}
tandem.onmessage = ({ data: { id, result, error } }) => {
  const p = pending.get(id);
  pending.delete(id);
  if (error === undefined) p.resolve(result);
  else p.reject(new Error(error));
};
tandem.onerror = (e) => {
  for (const p of pending.values()) p.reject(new Error(`tandem worker: ${e.message}`));
  pending.clear();
};

// The page's responsiveness while work is in flight: a 1 ms interval timer (Chrome runs it
// every ~4 ms) whose longest gap between ticks is the longest time the main thread could not run
// anything (a blocking call, a long task). `stop()` -> that gap in ms.
function stallMeter() {
  let last = performance.now(), longest = 0;
  const tick = () => { const t = performance.now(); longest = Math.max(longest, t - last); last = t; };
  const id = setInterval(tick, 1);
  return { stop: () => { tick(); clearInterval(id); return longest; } };
}

// One run in the worker: {probs, ms (the run, timed in the worker), report, stallMs (the page's
// longest stall meanwhile)}.
async function classify(placement, tokens) {
  const meter = stallMeter();
  placementsRun.add(placement);
  const r = await ask("run", { placement, inputs: { bytes: { dtype: "int32", shape: [1, 2048], data: tokens } } });
  return { probs: r.outputs.target_label.data, ms: r.ms, report: r.report, stallMs: meter.stop() };
}

function show(placement, r) {
  latencies[placement].push(r.ms);
  const { label, score } = top(r.probs, labels);
  const n = r.report.run.nodes;
  const count = (d) => n.filter((x) => x.device === d).length;
  const fell = n.filter((x) => x.fallback);
  let row = document.querySelector(`#results tr[data-p="${placement}"]`);
  if (!row) {
    row = $("results").insertRow();
    row.dataset.p = placement;
  }
  row.innerHTML = `<td>${placement}</td><td><b>${label}</b></td><td>${score.toFixed(4)}</td>` +
    `<td>${r.ms.toFixed(2)}</td><td>${p50(latencies[placement]).toFixed(2)} (${latencies[placement].length} runs)</td>` +
    `<td>${r.stallMs.toFixed(1)}</td>` +
    `<td>${count("cpu")} / ${count("gpu")} / ${count("split")}` +
    (fell.length ? ` <span title="${fell[0].fallback.replace(/"/g, "'")}" style="color:#b00">(${fell.length} fell back to the CPU)</span>` : "") + "</td>";
  let lane = document.querySelector(`#timelines div[data-p="${placement}"]`);
  if (!lane) {
    lane = document.createElement("div");
    lane.dataset.p = placement;
    $("timelines").append(lane);
  }
  lane.innerHTML = `<h3>${placement}</h3>` + drawTimeline(r.report.run);
}

async function runOn(placement) {
  status(`running on ${placement}...`);
  try {
    show(placement, await classify(placement, tokensOf($("text").value)));
    status("");
  } catch (e) {
    status(`${placement}: ${e.message ?? e}`);
    throw e;
  }
}

// Per placement: p50 over `runs` timed runs (after one warm-up) and the outputs for every sample;
// the same for onnxruntime-web's wasm and webgpu EPs (single-threaded wasm, like tandem's).
async function benchmark(runs = 20) {
  const result = { tandem: {}, ort: {}, gpu, userAgent: navigator.userAgent };
  const tokens = samples.map((s) => tokensOf(s.text));
  const placements = gpu.available ? ["cpu", "gpu", "auto"] : ["cpu"];
  for (const p of placements) {
    status(`benchmark: tandem ${p}`);
    const outputs = {};
    for (let i = 0; i < samples.length; i++) outputs[samples[i].name] = Array.from((await classify(p, tokens[i])).probs);
    // At most `runs` runs, and no more than 3 once BUDGET_MS is spent (a software WebGPU
    // adapter takes seconds per run).
    const times = [], stalls = [];
    let last;
    const began = performance.now();
    for (let k = 0; k < runs && (k < 3 || performance.now() - began < BUDGET_MS); k++) {
      last = await classify(p, tokens[0]);
      times.push(last.ms);
      stalls.push(last.stallMs);
    }
    latencies[p] = times.slice(0, -1);
    show(p, last);
    result.tandem[p] = { p50Ms: p50(times), times, stalls, outputs, report: last.report };
  }
  status("benchmark: onnxruntime-web");
  const ort = await import("./ort/ort.all.min.mjs");
  ort.env.wasm.wasmPaths = new URL("./ort/", location.href).href;
  ort.env.wasm.numThreads = 1;
  ort.env.wasm.proxy = true; // its own worker: the page stays responsive during its runs too
  for (const ep of gpu.available ? ["wasm", "webgpu"] : ["wasm"]) {
    try {
      const s = await ort.InferenceSession.create(model.slice(), { executionProviders: [ep] });
      const run = async (t) => {
        const meter = stallMeter();
        const t0 = performance.now();
        // Copies (here and of the model): the proxy transfers (detaches) buffers to its worker.
        const out = await s.run({ bytes: new ort.Tensor("int32", t.slice(), [1, 2048]) });
        const probs = await out.target_label.getData();
        return { probs, ms: performance.now() - t0, stallMs: meter.stop() };
      };
      const outputs = {};
      for (let i = 0; i < samples.length; i++) outputs[samples[i].name] = Array.from((await run(tokens[i])).probs);
      const times = [], stalls = [];
      const began = performance.now();
      for (let k = 0; k < runs && (k < 3 || performance.now() - began < BUDGET_MS); k++) {
        const r = await run(tokens[0]);
        times.push(r.ms);
        stalls.push(r.stallMs);
      }
      result.ort[ep] = { p50Ms: p50(times), times, stalls, outputs };
    } catch (e) {
      result.ort[ep] = { error: String(e.message ?? e) };
    }
  }
  const t = $("peers");
  t.style.display = "";
  const row = (name, r) => `<tr><td>${name}</td>` + (r.error ? `<td colspan="2">${r.error}</td>` :
    `<td>${r.p50Ms.toFixed(2)}</td><td>${Math.max(...r.stalls).toFixed(1)}</td>`) + "</tr>";
  t.innerHTML = "<tr><th>runtime</th><th>p50 (ms), sample 0</th><th>longest page stall (ms) during a run</th></tr>" +
    Object.entries(result.tandem).map(([p, r]) => row(`tandem ${p}`, r)).join("") +
    Object.entries(result.ort).map(([p, r]) => row(`onnxruntime-web ${p}`, r)).join("");
  status(`benchmark done (up to ${runs} runs each, ${BUDGET_MS / 1000} s at most after 3)`);
  return result;
}

async function main() {
  const t0 = performance.now();
  [model, labels, samples] = await Promise.all([
    fetch("models/magika/model.onnx").then((r) => r.arrayBuffer()).then((b) => new Uint8Array(b)),
    fetch("models/magika/config.json").then((r) => r.json()).then((c) => c.target_labels_space),
    fetch("samples.json").then((r) => r.json()),
  ]);
  for (const s of samples) $("sample").add(new Option(s.name, s.name));
  $("sample").onchange = () => { $("text").value = samples.find((s) => s.name === $("sample").value).text; };
  $("text").value = samples[0].text;
  gpu = await ask("init", { model });
  const n = $("notice");
  if (gpu.available) {
    n.className = "ok";
    n.textContent = `WebGPU: ${gpu.adapter}; maxStorageBufferBindingSize ${gpu.maxStorageBufferBindingSize} B, ` +
      `maxBufferSize ${gpu.maxBufferSize} B; readback round trip ${gpu.links.syncMs.toFixed(2)} ms (measured here, used by auto).`;
  } else {
    n.className = "warn";
    n.textContent = `No WebGPU here (${gpu.reason}): running on the CPU (wasm) only.`;
    for (const b of document.querySelectorAll("button[data-p=gpu], button[data-p=auto]")) b.disabled = true;
  }
  for (const b of document.querySelectorAll("button[data-p]")) b.onclick = () => runOn(b.dataset.p);
  $("bench").onclick = () => benchmark();
  window.demo = { classify, benchmark, gpu, samples, labels, sessions: () => [...placementsRun], ready: true };
  // ?placement=P: cold start of one placement (page load to first result), for the test.
  const only = params.get("placement");
  if (only) {
    const r = await classify(only, tokensOf(samples[0].text));
    show(only, r);
    window.demo.cold = { placement: only, ms: performance.now(), initMs: performance.now() - t0, label: top(r.probs, labels).label };
  }
}

main().catch((e) => {
  status(`error: ${e.message ?? e}`);
  window.demo = { error: String(e.message ?? e), ready: true };
});
