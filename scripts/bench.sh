#!/usr/bin/env bash
# Every benchmark from one release build, side by side, in one run; the
# figures go to docs/BENCHMARKS.md with this command. Needs root (loop
# devices) and QEMU (the guest); SOAK_SECONDS sets the fault campaign's length (10 minutes by default).
set -euo pipefail
cd "$(dirname "$0")/.."

scripts/deps.sh test
echo "==> release build"
cargo build --release --locked -p bench -p proxmox-csi-controller -p proxmox-csi-node
# hostd finds the loop devices by WWN: the test-only resolver.
cargo build --release --locked -p proxmox-csi-hostd --features loop-resolver

run() {
  echo "==> bench $*"
  target/release/bench "$@"
}
run attach-burst
run sidecar-burst
run scale
run kube-calls
run stage
run footprint
run guest-stage
echo "==> soak"
target/release/soak --seconds "${SOAK_SECONDS:-600}" --fault-rate 0.3
