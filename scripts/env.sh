# scripts/env.sh: environment for running tandem here (sourced by demo.sh and test.sh).
# Mesa (lavapipe) warns without a private XDG_RUNTIME_DIR.
if [ -z "${XDG_RUNTIME_DIR:-}" ] || [ ! -d "$XDG_RUNTIME_DIR" ]; then
  export XDG_RUNTIME_DIR="/tmp/xdg-$(id -u)"
  mkdir -p -m 700 "$XDG_RUNTIME_DIR"
fi
# Rust toolchain components the checks use (present in rustup's default profile).
ensure_rust_components() {
  for c in rustfmt clippy; do
    if ! rustup component list --installed 2>/dev/null | grep -q "^$c"; then
      rustup component add "$c" >/dev/null
    fi
  done
}
# The cargo profile of the test build, which scripts/test.sh and scripts/fuzz.sh share: `release`
# here, `ci` in CI (release with tract, a bench peer, unoptimised: half the test build's CPU time
# otherwise; Cargo.toml), or TANDEM_TEST_PROFILE.
test_profile() {
  if [ -n "${TANDEM_TEST_PROFILE:-}" ]; then
    echo "$TANDEM_TEST_PROFILE"
  elif [ "${CI:-}" = "true" ]; then
    echo ci
  else
    echo release
  fi
}
