#!/usr/bin/env bash
# Runs every fuzz target (fuzz/fuzz_targets, libFuzzer through the
# libfuzzer-sys crate) for a bounded time (FUZZ_SECONDS each, 5 by default)
# from the committed corpus in fuzz/corpus; new inputs go to a scratch
# directory, crashes to fuzz/artifacts. Built with the stable toolchain and
# the coverage instrumentation libFuzzer needs (the flags cargo-fuzz passes,
# without a sanitizer: the targets are safe Rust, and a panic is the
# failure), in release with debug assertions, for the host target so that
# build scripts and proc macros stay uninstrumented.
#
# Usage: scripts/fuzz.sh [build|run]   (both by default; `make test` builds
# beside the tests at the lowest priority and runs after them)
set -euo pipefail
cd "$(dirname "$0")/../fuzz"
what=${1:-all}
seconds=${FUZZ_SECONDS:-5}
host=$(rustc -vV | sed -n 's/^host: //p')
export RUSTFLAGS="-Cpasses=sancov-module -Cllvm-args=-sanitizer-coverage-level=4 \
-Cllvm-args=-sanitizer-coverage-inline-8bit-counters -Cllvm-args=-sanitizer-coverage-pc-table \
-Cllvm-args=-sanitizer-coverage-trace-compares --cfg fuzzing -Cdebug-assertions"
# The workspace of make test lints its crates through clippy-driver; these
# targets are built by rustc alone.
unset RUSTC_WORKSPACE_WRAPPER
if [ "$what" != run ]; then
  echo "==> building the fuzz targets"
  cargo build --release --locked --target "$host" --bins
fi
[ "$what" != build ] || exit 0
echo "==> fuzz targets (${seconds} s each)"
scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT
mkdir -p artifacts
failed=0
for src in fuzz_targets/*.rs; do
  t=$(basename "$src" .rs)
  mkdir -p "$scratch/$t" "artifacts/$t"
  if "target/$host/release/$t" -max_total_time="$seconds" -artifact_prefix="artifacts/$t/" \
    "$scratch/$t" "corpus/$t" >"$scratch/$t.log" 2>&1; then
    echo "ok    $t: $(grep -Eo 'Done [0-9]+ runs' "$scratch/$t.log" | tail -1)"
  else
    echo "FAIL  $t: see fuzz/artifacts/$t"; grep -E 'panicked at|assertion' "$scratch/$t.log" | head -3
    failed=$((failed + 1))
  fi
done
[ "$failed" -eq 0 ]
