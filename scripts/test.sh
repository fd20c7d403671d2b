#!/usr/bin/env bash
# The whole test suite: build with zero warnings, then every test.
set -euo pipefail
cd "$(dirname "$0")/.."

scripts/deps.sh test
scripts/pytools.sh

echo "==> rustfmt and clippy (warnings are errors)"
cargo fmt --all --check
cargo clippy --workspace --all-targets --locked -- -D warnings

echo "==> building (warnings are errors)"
log=$(mktemp)
trap 'rm -f "$log"' EXIT
cargo build --workspace --all-targets --locked 2>&1 | tee "$log"
if grep -qE '^(warning|error)(\[|:)' "$log"; then
  echo "build produced warnings or errors: see above" >&2
  exit 1
fi

echo "==> images (checked by tests/packaging/tests/images.rs)"
scripts/images.sh

echo "==> tests"
cargo test --workspace --locked

scripts/fuzz.sh
