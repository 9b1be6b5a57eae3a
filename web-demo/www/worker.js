// The demo's tandem worker (a module worker): owns the wasm build, the page's GPU and every
// tandem Session, so that model loading, `auto` calibration and runs never block the page.
// The page (app.js) posts {id, op, args} and gets {id, result} or {id, error} back:
//   init {model: Uint8Array}         -> gpuInfo() (+ the adapter's name from this worker's
//                                       navigator.gpu): {available, reason?, adapter?, links...}
//   run  {placement, inputs}         -> {outputs, ms, report}: one session.run(inputs) on the
//                                       placement's session (created on first use), its
//                                       latency measured here and session.report()
import init, { Session, gpuInfo } from "./pkg/tandem_web_demo.js";

const sessions = {};
let model;

const ops = {
  async init(args) {
    model = args.model;
    await init();
    const gpu = await gpuInfo();
    if (gpu.available) {
      // wgpu's WebGPU backend leaves the adapter's name empty: ask the browser.
      const info = (await navigator.gpu.requestAdapter())?.info;
      if (info) gpu.adapter = `WebGPU ${[info.vendor, info.architecture, info.device, info.description].filter((x) => x).join(" ")}`;
    }
    return gpu;
  },
  async run({ placement, inputs }) {
    sessions[placement] ??= Session.create(model, { placement });
    const s = await sessions[placement];
    const t0 = performance.now();
    const outputs = await s.run(inputs);
    const ms = performance.now() - t0;
    return { outputs, ms, report: s.report() };
  },
};

self.onmessage = async ({ data: { id, op, args } }) => {
  try {
    self.postMessage({ id, result: await ops[op](args) });
  } catch (e) {
    self.postMessage({ id, error: String(e?.message ?? e) });
  }
};
