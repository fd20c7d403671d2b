# The two entry points. Each installs the Debian packages it needs.
.PHONY: demo test check build bench images release

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

# What a release publishes, for this machine's architecture, under
# target/release/v$(VERSION) (docs/release.md): `make release VERSION=0.1.0`.
release:
	@test -n "$(VERSION)" || { echo "make release VERSION=x.y.z" >&2; exit 2; }
	scripts/release.sh $(VERSION)

build:
	scripts/deps.sh build
	cargo build --workspace --locked
