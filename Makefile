# The two entry points. Each installs the Debian packages it needs.
.PHONY: demo test check build bench images

demo:
	scripts/deps.sh test
	cargo build --workspace --locked --bins
	# hostd finds the demo's disks as loop devices: a test-only resolver.
	cargo build --locked -p proxmox-csi-hostd --features loop-resolver
	cargo run --quiet --locked -p demo

test:
	scripts/test.sh

# Minutes, not twenty: no root, no QEMU (see README, "Tests").
check:
	scripts/check.sh

bench:
	scripts/bench.sh

# OCI image layouts and SBOMs under target/images (no container daemon).
images:
	scripts/images.sh

build:
	scripts/deps.sh build
	cargo build --workspace --locked
