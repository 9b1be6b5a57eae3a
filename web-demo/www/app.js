// The demo page: loads tandem's wasm build and magika, runs it with placement cpu, gpu and auto,
// shows the result, the latency per placement and a per-op timeline, and (benchmark) runs
// onnxruntime-web's wasm and webgpu execution providers on the same model and input.
// `window.demo` is what scripts/web.sh test drives.
import init, { Session, gpuInfo } from "./pkg/tandem_web_demo.js";
import { features, top } from "./magika.js";
import { drawTimeline } from "./timeline.js";

const $ = (id) => document.getElementById(id);
const params = new URLSearchParams(location.search);
const sessions = {};
const latencies = { cpu: [], gpu: [], auto: [] };
let model, labels, samples, gpu;

const BUDGET_MS = 15000; // benchmark time per runtime and placement, after 3 runs
const status = (s) => { $("status").textContent = s; };
const p50 = (v) => { const s = [...v].sort((a, b) => a - b); return s[Math.floor(s.length / 2)]; };
const tokensOf = (text) => features(new TextEncoder().encode(text));

async function session(placement) {
  sessions[placement] ??= Session.create(model, { placement });
  return sessions[placement];
}

// One run: {probs, ms, report}.
async function classify(placement, tokens) {
  const s = await session(placement);
  const t0 = performance.now();
  const out = await s.run({ bytes: { dtype: "int32", shape: [1, 2048], data: tokens } });
  const ms = performance.now() - t0;
  return { probs: out.target_label.data, ms, report: s.report() };
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
    const times = [];
    let last;
    const began = performance.now();
    for (let k = 0; k < runs && (k < 3 || performance.now() - began < BUDGET_MS); k++) {
      last = await classify(p, tokens[0]);
      times.push(last.ms);
    }
    latencies[p] = times.slice(0, -1);
    show(p, last);
    result.tandem[p] = { p50Ms: p50(times), times, outputs, report: last.report };
  }
  status("benchmark: onnxruntime-web");
  const ort = await import("./ort/ort.all.min.mjs");
  ort.env.wasm.wasmPaths = new URL("./ort/", location.href).href;
  ort.env.wasm.numThreads = 1;
  for (const ep of gpu.available ? ["wasm", "webgpu"] : ["wasm"]) {
    try {
      const s = await ort.InferenceSession.create(model, { executionProviders: [ep] });
      const run = async (t) => {
        const t0 = performance.now();
        const out = await s.run({ bytes: new ort.Tensor("int32", t, [1, 2048]) });
        return { probs: await out.target_label.getData(), ms: performance.now() - t0 };
      };
      const outputs = {};
      for (let i = 0; i < samples.length; i++) outputs[samples[i].name] = Array.from((await run(tokens[i])).probs);
      const times = [];
      const began = performance.now();
      for (let k = 0; k < runs && (k < 3 || performance.now() - began < BUDGET_MS); k++) times.push((await run(tokens[0])).ms);
      result.ort[ep] = { p50Ms: p50(times), times, outputs };
    } catch (e) {
      result.ort[ep] = { error: String(e.message ?? e) };
    }
  }
  const t = $("peers");
  t.style.display = "";
  t.innerHTML = "<tr><th>runtime</th><th>p50 (ms), sample 0</th></tr>" +
    Object.entries(result.tandem).map(([p, r]) => `<tr><td>tandem ${p}</td><td>${r.p50Ms.toFixed(2)}</td></tr>`).join("") +
    Object.entries(result.ort).map(([p, r]) => `<tr><td>onnxruntime-web ${p}</td><td>${r.error ?? r.p50Ms.toFixed(2)}</td></tr>`).join("");
  status(`benchmark done (up to ${runs} runs each, ${BUDGET_MS / 1000} s at most after 3)`);
  return result;
}

async function main() {
  const t0 = performance.now();
  await init();
  [model, labels, samples] = await Promise.all([
    fetch("models/magika/model.onnx").then((r) => r.arrayBuffer()).then((b) => new Uint8Array(b)),
    fetch("models/magika/config.json").then((r) => r.json()).then((c) => c.target_labels_space),
    fetch("samples.json").then((r) => r.json()),
  ]);
  for (const s of samples) $("sample").add(new Option(s.name, s.name));
  $("sample").onchange = () => { $("text").value = samples.find((s) => s.name === $("sample").value).text; };
  $("text").value = samples[0].text;
  gpu = await gpuInfo();
  if (gpu.available) {
    // wgpu's WebGPU backend leaves the adapter's name empty: ask the browser.
    const info = (await navigator.gpu.requestAdapter())?.info;
    if (info) gpu.adapter = `WebGPU ${[info.vendor, info.architecture, info.device, info.description].filter((x) => x).join(" ")}`;
  }
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
  window.demo = { classify, benchmark, gpu, samples, labels, sessions: () => Object.keys(sessions), ready: true };
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
