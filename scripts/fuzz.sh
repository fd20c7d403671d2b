#!/usr/bin/env bash
# Runs every cargo-fuzz target for a bounded time (FUZZ_SECONDS each, 15 by
# default) from the committed corpus in fuzz/corpus; new inputs go to a
# scratch directory, crashes to fuzz/artifacts. Needs the nightly toolchain.
set -euo pipefail
cd "$(dirname "$0")/.."
seconds=${FUZZ_SECONDS:-15}
if ! rustup toolchain list 2>/dev/null | grep -q '^nightly'; then
  if [ -n "${CI:-}" ]; then
    echo "fuzz.sh: the nightly toolchain is missing and CI is set" >&2
    exit 1
  fi
  echo "SKIPPED: fuzzing needs the nightly toolchain"
  exit 0
fi
command -v cargo-fuzz >/dev/null || cargo install --locked cargo-fuzz@0.13.2
echo "==> fuzz targets (${seconds} s each)"
cargo +nightly fuzz build
scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT
failed=0
for t in $(cargo +nightly fuzz list); do
  mkdir -p "$scratch/$t"
  if cargo +nightly fuzz run "$t" "$scratch/$t" "fuzz/corpus/$t" -- -max_total_time="$seconds" >"$scratch/$t.log" 2>&1; then
    echo "ok    $t: $(grep -Eo 'Done [0-9]+ runs' "$scratch/$t.log" | tail -1)"
  else
    echo "FAIL  $t: see fuzz/artifacts/$t"; grep -E 'panicked at|assertion' "$scratch/$t.log" | head -3
    failed=$((failed + 1))
  fi
done
[ "$failed" -eq 0 ]
