#!/usr/bin/env bash
# The fast loop for day-to-day work: formatting, lints and every test that
# needs neither root nor QEMU (no loop devices, mounts or guest VMs).
# `make test` runs everything.
set -euo pipefail
cd "$(dirname "$0")/.."

scripts/deps.sh build

echo "==> rustfmt"
cargo fmt --all --check
echo "==> clippy (warnings are errors)"
cargo clippy --workspace --all-targets --locked -- -D warnings

echo "==> unit tests"
cargo test --locked --workspace --lib --bins \
  --exclude e2e --exclude demo --exclude bench
echo "==> integration tests without root or QEMU"
cargo test --locked --tests \
  -p proxmox-csi-controller -p pvecsictl -p proxmox-csi-proto -p kubesim
cargo test --locked -p pvesim --test api --test schema_walk
cargo test --locked -p proxmox-csi-node --test node_info
cargo test --locked -p packaging --test deploy
