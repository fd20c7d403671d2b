#!/usr/bin/env bash
# The whole test suite: build with zero warnings, then every test. Ends with
# a table of where the time went.
set -euo pipefail
cd "$(dirname "$0")/.."

steps=()
# Runs one step ("name" command...) and records its wall time.
step() {
  local name=$1 start=$SECONDS
  shift
  "$@"
  steps+=("$(printf '%-34s %5d s' "$name" $((SECONDS - start)))")
}
table() {
  echo "==> time per step"
  printf '%s\n' "${steps[@]}"
  printf '%-34s %5d s\n' "total" "$SECONDS"
}
trap table EXIT

step "Debian packages" scripts/deps.sh test
step "Python tools" scripts/pytools.sh

echo "==> rustfmt and clippy (warnings are errors)"
step "rustfmt" cargo fmt --all --check
step "clippy" cargo clippy --workspace --all-targets --locked -- -D warnings

echo "==> building (warnings are errors)"
log=$(mktemp)
trap 'rm -f "$log"; table' EXIT
build() {
  cargo build --workspace --all-targets --locked 2>&1 | tee "$log"
  if grep -qE '^(warning|error)(\[|:)' "$log"; then
    echo "build produced warnings or errors: see above" >&2
    return 1
  fi
}
step "build (debug, all targets)" build

echo "==> images (checked by tests/packaging/tests/images.rs)"
step "images (release build, layouts)" scripts/images.sh

echo "==> tests and the fuzz smoke (the guest VMs' binaries beside the others: scripts/run-tests.py)"
step "tests, fuzz smoke" scripts/run-tests.py
