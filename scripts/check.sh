#!/usr/bin/env bash
# The fast loop for day-to-day work: formatting, lints and every test that
# needs neither root nor QEMU (no loop devices, mounts or guest VMs).
# `make test` runs everything.
set -euo pipefail
cd "$(dirname "$0")/.."

scripts/deps.sh build

echo "==> rustfmt"
cargo fmt --all --check
echo "==> module layout (no import cycles, no file over 600 lines)"
scripts/module-cycles.py --max-lines 600 controller/src hostd/src agent/src pvecsictl/src common/src
echo "==> clippy (warnings are errors)"
cargo clippy --workspace --all-targets --locked -- -D warnings

# The unit tests, and the integration tests that need neither root nor QEMU.
without_root='kind(lib) | kind(bin)
  | (kind(test) & (package(proxmox-csi-controller) | package(pvecsictl) | package(proxmox-csi-proto) | package(kubesim)))
  | binary_id(/^pvesim::api_/) | binary_id(pvesim::schema_walk)
  | binary_id(proxmox-csi-node::node_info) | binary_id(packaging::deploy)'
if cargo nextest --version >/dev/null 2>&1; then
  # One build for all of them (one feature set), every test side by side:
  # most of them wait on pvesim, not on a core.
  echo "==> tests without root or QEMU (cargo-nextest)"
  cargo nextest run --locked --workspace \
    --exclude e2e --exclude demo --exclude bench --exclude conformance \
    --no-tests=warn --status-level fail --final-status-level slow --test-threads 4 \
    -E "$without_root"
else
  echo "==> unit tests"
  cargo test --locked --workspace --lib --bins \
    --exclude e2e --exclude demo --exclude bench
  echo "==> integration tests without root or QEMU"
  cargo test --locked --tests \
    -p proxmox-csi-controller -p pvecsictl -p proxmox-csi-proto -p kubesim
  cargo test --locked -p pvesim --test api_access --test api_storage --test api_hotplug \
    --test api_qemu --test api_tasks --test api_cluster --test schema_walk
  cargo test --locked -p proxmox-csi-node --test node_info
  cargo test --locked -p packaging --test deploy
fi
