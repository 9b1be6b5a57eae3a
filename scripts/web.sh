#!/usr/bin/env bash
# scripts/web.sh: the browser demo (web-demo/).
#   build  rustup target wasm32, wasm-bindgen-cli at the version Cargo.lock pins (installed if
#          missing, ~5 min), the wasm build (SIMD128), wasm-bindgen --target web, the page, the
#          model (from models/, fetched by scripts/setup.sh) and onnxruntime-web into web-demo/dist/
#   serve  serve web-demo/dist on http://127.0.0.1:${PORT:-8080}
#   bench  build, then magika on the CPU in Node's V8: tandem's wasm build against
#          onnxruntime-web's wasm backend, one thread each, in alternating rounds
#          (web-demo/test/node_bench.mjs; ROUNDS and RUNS from the environment)
#   test   the ops tests of wasm-only code (cpu_gemm_lanes.rs) built for wasm32-wasip1 with
#          SIMD128 and run in Node's WASI (web-demo/test/wasi_run.mjs); then build, then
#          headless Chromium (WebGPU on SwiftShader) through Playwright: tandem on cpu, gpu
#          and auto and onnxruntime-web (wasm, webgpu) against onnxruntime's outputs; results
#          and a screenshot in web-demo/out/. Fails when WebGPU has no adapter, and
#          when the page's main thread stalls during runs (tandem runs in a Web Worker).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
DIST=web-demo/dist
WASM=target/wasm32-unknown-unknown/release/tandem_web_demo.wasm

# The Rust target $1, added with rustup when it is missing.
rust_target() {
  rustup target list --installed | grep -q "^$1\$" || rustup target add "$1"
}

npm_deps() {
  if [ ! -d web-demo/node_modules/playwright-core ] || [ ! -d web-demo/node_modules/onnxruntime-web ]; then
    (cd web-demo && npm install --no-audit --no-fund --loglevel=error)
  fi
}

build() {
  rust_target wasm32-unknown-unknown
  local ver
  ver=$(grep -A1 '^name = "wasm-bindgen"$' Cargo.lock | sed -n 's/^version = "\(.*\)"$/\1/p')
  if ! wasm-bindgen --version 2>/dev/null | grep -q " $ver\$"; then
    echo "web: installing wasm-bindgen-cli $ver (the version in Cargo.lock)"
    # --debug: a 69 s build instead of 155 s here, and 3.6 s instead of 0.9 s per bindgen run.
    cargo install wasm-bindgen-cli --version "$ver" --locked --debug ||
      cargo install wasm-bindgen-cli --version "$ver" --debug
  fi
  [ -f models/magika/model.onnx ] || bash scripts/setup.sh
  # SIMD128: every browser with WebGPU has it (see README "Browser demo" for what it buys).
  CARGO_TARGET_WASM32_UNKNOWN_UNKNOWN_RUSTFLAGS="${WEB_RUSTFLAGS--C target-feature=+simd128}" \
    cargo build --release -p tandem-web-demo --target wasm32-unknown-unknown
  rm -rf "$DIST"
  mkdir -p "$DIST/models/magika" "$DIST/ort"
  wasm-bindgen --target web --no-typescript --remove-name-section --out-dir "$DIST/pkg" "$WASM"
  cp web-demo/www/* "$DIST/"
  cp models/magika/model.onnx models/magika/config.json "$DIST/models/magika/"
  npm_deps
  cp web-demo/node_modules/onnxruntime-web/dist/ort.all.min.mjs \
    web-demo/node_modules/onnxruntime-web/dist/ort-wasm-simd-threaded.jsep.{mjs,wasm} \
    web-demo/node_modules/onnxruntime-web/dist/ort-wasm-simd-threaded.{mjs,wasm} "$DIST/ort/"
  echo "web: built $DIST ($(du -h "$DIST/pkg/tandem_web_demo_bg.wasm" | cut -f1) wasm)"
}

serve() {
  local port=${PORT:-8080}
  echo "web: http://127.0.0.1:$port/"
  exec python3 -c '
import functools, http.server, sys
h = functools.partial(http.server.SimpleHTTPRequestHandler, directory=sys.argv[1])
h.func.extensions_map.update({".mjs": "text/javascript", ".js": "text/javascript", ".wasm": "application/wasm"})
http.server.ThreadingHTTPServer(("127.0.0.1", int(sys.argv[2])), h).serve_forever()
' "$DIST" "$port"
}

# The GEMM tile's SIMD128 intrinsics compile only for wasm32: its unit test (shapes around every
# tile, strip and K-block edge, against f64 sums) runs here on wasm's lanes; natively it runs
# the plain-array fallback. Filtered to that module: other ops tests spawn threads, which
# wasm32-wasip1 has not.
wasm_unit_tests() {
  rust_target wasm32-wasip1
  echo "web: cpu_gemm_lanes tests on wasm32-wasip1 + SIMD128 in Node's WASI"
  local out
  out=$(CARGO_TARGET_WASM32_WASIP1_RUSTFLAGS="-C target-feature=+simd128" \
    CARGO_TARGET_WASM32_WASIP1_RUNNER="node --no-warnings $PWD/web-demo/test/wasi_run.mjs" \
    cargo test --release -q -p tandem-ops --lib --target wasm32-wasip1 cpu_gemm::lanes:: 2>&1) ||
    { echo "$out"; return 1; }
  echo "$out" | grep "test result"
  # A renamed test would leave the filter matching none.
  echo "$out" | grep -q "test result: ok. [1-9]" || { echo "web: no cpu_gemm_lanes test ran" >&2; return 1; }
}

test_() {
  # Only what is missing: a machine whose Node.js comes from elsewhere (nodesource's package
  # carries npm and conflicts with Debian's npm) must not be asked to take Debian's.
  local want=()
  [ -x /usr/bin/chromium ] || want+=(chromium)
  command -v node >/dev/null || want+=(nodejs)
  command -v npm >/dev/null || want+=(npm)
  if [ ${#want[@]} -gt 0 ]; then
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${want[@]}" >/dev/null
  fi
  wasm_unit_tests
  build
  mkdir -p web-demo/out
  # The reference: onnxruntime (Python) on the same samples, with magika's preprocessing
  # written again in Python (an independent check of the page's JS preprocessing too).
  .venv/bin/python web-demo/test/reference.py web-demo/www/samples.json models/magika \
    > web-demo/out/reference.json
  # Every kernel's WGSL, for Chrome's compiler (Tint) to check in browser.mjs.
  rm -rf web-demo/out/wgsl
  # Under scripts/test.sh, the example its `cargo test` built just now: a release build of it
  # here rebuilt naga, its dev-dependency, in CI's other profile (naga alone took 95 s of a
  # release test build's units on a 2-core host).
  local dump="target/${TANDEM_TEST_PROFILE:-}/examples/dump_wgsl"
  if [ -n "${TANDEM_TEST_PROFILE:-}" ] && [ -x "$dump" ]; then
    "$dump" web-demo/out/wgsl
  else
    cargo run --release -q -p tandem-shaders --example dump_wgsl -- web-demo/out/wgsl
  fi
  local port=${PORT:-8089}
  PORT=$port serve >/dev/null 2>&1 &
  SERVER=$!
  trap 'kill $SERVER 2>/dev/null || true' EXIT
  node web-demo/test/browser.mjs "http://127.0.0.1:$port/" web-demo/out
}

case "${1:-}" in
  build) build ;;
  serve) [ -d "$DIST" ] || build; serve ;;
  bench)
    build
    node web-demo/test/node_bench.mjs "${ROUNDS:-5}" "${RUNS:-10}"
    ;;
  test) test_ ;;
  *) echo "usage: scripts/web.sh build|serve|bench|test" >&2; exit 2 ;;
esac
