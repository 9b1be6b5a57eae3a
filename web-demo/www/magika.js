// magika's model input for one file, as in magika 1.0 (and tandem's cli/src/demo.rs): the first
// and last KiB of the first/last 4 KiB block, whitespace stripped at the outer ends, padded with
// token 256. Returns an Int32Array of 2048 tokens.
const BEG = 1024, END = 1024, BLOCK = 4096, PAD = 256;
const isWs = (b) => b === 0x20 || b === 0x09 || b === 0x0a || b === 0x0d || b === 0x0b || b === 0x0c;

export function features(bytes) {
  const n = Math.min(bytes.length, BLOCK);
  let head = bytes.subarray(0, n);
  let s = 0;
  while (s < head.length && isWs(head[s])) s++;
  head = head.subarray(s);
  let tail = bytes.subarray(bytes.length - n);
  let e = tail.length;
  while (e > 0 && isWs(tail[e - 1])) e--;
  tail = tail.subarray(Math.max(0, e - END), e);
  const out = new Int32Array(BEG + END).fill(PAD);
  for (let i = 0; i < Math.min(BEG, head.length); i++) out[i] = head[i];
  out.set(Int32Array.from(tail), BEG + END - tail.length);
  return out;
}

// The label with the highest probability.
export function top(probs, labels) {
  let best = 0;
  for (let i = 1; i < probs.length; i++) if (probs[i] > probs[best]) best = i;
  return { label: labels[best], score: probs[best] };
}
