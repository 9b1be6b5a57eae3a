// A run's per-op timeline as SVG: a CPU lane, a GPU lane and a transfer lane, from
// session.report().run (times in ms from the start of the run). Split nodes appear in both
// lanes (CPU rows and GPU rows at once).
const LANES = ["cpu", "gpu", "transfers"];
const COLORS = { cpu: "#3b7dd8", gpu: "#e0812b", split: "#8a4fd1", transfers: "#5aa469" };

export function drawTimeline(run, width = 900) {
  const laneH = 26, top = 18, left = 70;
  const total = Math.max(run.totalMs, 1e-3);
  const x = (ms) => left + (Math.max(0, ms) / total) * (width - left - 10);
  const items = [];
  for (const n of run.nodes) {
    if (n.device === "cpu") items.push({ lane: 0, start: n.startMs, dur: n.timeMs, n, color: COLORS.cpu });
    if (n.device === "gpu") items.push({ lane: 1, start: n.startMs, dur: n.timeMs, n, color: COLORS.gpu });
    if (n.device === "split") {
      items.push({ lane: 0, start: n.startMs, dur: n.timeMs, n, color: COLORS.split });
      items.push({ lane: 1, start: n.startMs, dur: n.gpuTimeMs ?? 0, n, color: COLORS.split });
    }
  }
  for (const t of run.transfers) {
    items.push({ lane: 2, start: t.startMs, dur: t.timeMs, n: { name: `to ${t.to}`, op: `${t.bytes} B` }, color: COLORS.transfers });
  }
  const h = top + LANES.length * laneH + 18;
  const esc = (s) => String(s).replace(/[<>&"]/g, (c) => `&#${c.charCodeAt(0)};`);
  let svg = `<svg xmlns="http://www.w3.org/2000/svg" width="${width}" height="${h}" font-family="sans-serif" font-size="11">`;
  LANES.forEach((l, i) => {
    const y = top + i * laneH;
    svg += `<rect x="${left}" y="${y}" width="${width - left - 10}" height="${laneH - 4}" fill="#f3f3f3"/>`;
    svg += `<text x="4" y="${y + 15}">${l.toUpperCase()}</text>`;
  });
  for (const it of items) {
    const y = top + it.lane * laneH;
    const w = Math.max(1, x(it.start + it.dur) - x(it.start));
    const p = it.n.predicted;
    const tip = `${it.n.name} (${it.n.op}) ${it.dur.toFixed(3)} ms` +
      (p ? `; predicted cpu ${p.cpuMs.toFixed(3)} gpu ${p.gpuMs == null ? "-" : p.gpuMs.toFixed(3)} ms: ${p.why}` : "") +
      (it.n.fallback ? `; fallback: ${it.n.fallback}` : "");
    svg += `<rect x="${x(it.start).toFixed(1)}" y="${y}" width="${w.toFixed(1)}" height="${laneH - 4}" fill="${it.color}" stroke="#fff" stroke-width="0.5"><title>${esc(tip)}</title></rect>`;
  }
  for (let k = 0; k <= 4; k++) {
    const ms = (total * k) / 4;
    svg += `<text x="${x(ms).toFixed(1)}" y="${h - 4}" text-anchor="middle" fill="#555">${ms.toFixed(2)} ms</text>`;
  }
  svg += `<text x="${left}" y="12" fill="#555">run ${run.totalMs.toFixed(2)} ms` +
    (run.predictedMs != null ? `, predicted ${run.predictedMs.toFixed(2)} ms` : "") +
    `; ${run.gpuSubmits} GPU submits, ${run.downloads} readbacks</text>`;
  return svg + "</svg>";
}
