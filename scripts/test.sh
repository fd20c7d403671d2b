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

echo "==> rustfmt"
step "rustfmt" cargo fmt --all --check
echo "==> module layout (no import cycles, no file over 600 lines)"
step "module layout" scripts/module-cycles.py --max-lines 600 \
  controller/src hostd/src agent/src pvecsictl/src common/src
# The fuzz crate has its own lock file, built --locked long after this: a
# dependency added to a crate it uses must be in it, found here in seconds.
echo "==> fuzz lock file"
step "fuzz lock file" sh -c \
  'cargo metadata --locked --format-version 1 --manifest-path fuzz/Cargo.toml -q >/dev/null'

# One build that is also the lint: cargo runs the workspace's own crates
# through clippy-driver (as `cargo clippy` does, but compiling them), the
# dependencies through rustc, so clippy's findings and the build's warnings
# come from one pass instead of a `cargo clippy` check of every crate and
# then a build. The tests' build below reuses it (the same wrapper).
clippy_driver=$(rustup which clippy-driver 2>/dev/null || command -v clippy-driver)
echo "==> building with clippy (warnings are errors)"
log=$(mktemp)
trap 'rm -f "$log"; table' EXIT
build() {
  RUSTC_WORKSPACE_WRAPPER=$clippy_driver cargo build --workspace --all-targets --locked 2>&1 | tee "$log"
  if grep -qE '^(warning|error)(\[|:)' "$log"; then
    echo "build produced warnings, clippy findings or errors: see above" >&2
    return 1
  fi
}
step "build and clippy (debug, all targets)" build

echo "==> images (checked by tests/packaging/tests/images.rs)"
step "images (release build, layouts)" scripts/images.sh

echo "==> tests and the fuzz smoke (the guest VMs' binaries beside the others: scripts/run-tests.py)"
# The guest VMs run the images' release binaries, what ships: under QEMU's
# software emulation the debug ones cost a guest test about a quarter more
# CPU (tests/e2e hostd_boundary: 180 s of CPU against 129 s).
step "tests, fuzz smoke" env RUSTC_WORKSPACE_WRAPPER="$clippy_driver" \
  E2E_BIN_DIR="$PWD/target/images-build/release" scripts/run-tests.py
