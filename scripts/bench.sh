#!/usr/bin/env bash
# Every benchmark from one release build, side by side, in one run; the
# figures go to docs/BENCHMARKS.md with this command. Needs root (loop
# devices) and QEMU (the guest); SOAK_SECONDS sets the fault campaign's length (10 minutes by default).
set -euo pipefail
cd "$(dirname "$0")/.."

scripts/deps.sh test
echo "==> release build"
cargo build --release --locked -p bench -p proxmox-csi-controller -p proxmox-csi-node -p proxmox-csi-hostd
# The guests run the release binaries as they ship; kept aside before
# hostd is built again for the host benches with the test-only resolver
# that finds loop devices by WWN.
mkdir -p target/guest-bin
cp target/release/proxmox-csi-hostd target/release/proxmox-csi-node target/guest-bin/
cargo build --release --locked -p proxmox-csi-hostd --features loop-resolver
export E2E_BIN_DIR="$PWD/target/guest-bin"

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
run guest-pod
echo "==> soak"
target/release/soak --seconds "${SOAK_SECONDS:-600}" --fault-rate 0.3
