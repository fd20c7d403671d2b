#!/usr/bin/env bash
# `make images`: OCI image layouts of the driver under target/images/, built
# without a container daemon (umoci), each with a CycloneDX SBOM (syft):
#
#   proxmox-csi-controller   the controller: binary, its libraries, CA bundle, uid 65532
#   proxmox-csi-node         the node plugin: binary, its libraries, uid 65532
#   proxmox-csi-hostd        hostd for the privileged DaemonSet: hostd, mkfs and
#                            resize tools and their libraries, as root
#   proxmox-csi-hostd-talos  the Talos system extension: /manifest.yaml and
#                            /rootfs/usr/local/... (talos-extension/assemble.sh)
#
# Reproducible: every file's time is the last commit's (SOURCE_DATE_EPOCH
# overrides it), as are the images' creation and history times; owners are
# root and modes do not depend on the umask, so the same binaries give the
# same digests.
#
# The binaries are built with cargo-auditable, which records their crates in
# the binary for syft; the Debian packages whose files an image holds are
# recorded as /var/lib/dpkg/status.d/<package> (with their copyright files),
# as distroless images do, where syft reads them.
#
# Usage: scripts/images.sh [--out DIR] [--prebuilt]
#   --prebuilt  use target/release as it is (no cargo build)
set -euo pipefail
# Modes of the files made here must not depend on the caller's umask.
umask 022
cd "$(dirname "$0")/.."
repo=$(pwd)
out=$repo/target/images
build=true
while [ $# -gt 0 ]; do
  case $1 in
    --out) out=$2; shift 2 ;;
    --prebuilt) build=false; shift ;;
    *) echo "usage: scripts/images.sh [--out DIR] [--prebuilt]" >&2; exit 2 ;;
  esac
done

scripts/deps.sh images
scripts/pytools.sh
syft=${PROXMOX_CSI_TOOLS:-/opt/proxmox-csi-tools}/bin/syft

# The version is the crate's (the chart's appVersion); the chart's and the
# manifests' image references end in these names (tests/packaging/tests/images.rs).
version=$(sed -n '/^\[workspace.package\]/,/^\[/s/^version = "\(.*\)"/\1/p' Cargo.toml)
source_url=$(sed -n '/^\[workspace.package\]/,/^\[/s/^repository = "\(.*\)"/\1/p' Cargo.toml)
license=$(sed -n '/^\[workspace.package\]/,/^\[/s/^license = "\(.*\)"/\1/p' Cargo.toml)
revision=$(git rev-parse HEAD 2>/dev/null || echo unknown)
epoch=${SOURCE_DATE_EPOCH:-$(git log -1 --format=%ct 2>/dev/null || echo 0)}
created=$(date -u -d "@$epoch" +%Y-%m-%dT%H:%M:%SZ)
arch=$(dpkg --print-architecture)

if $build; then
  if ! command -v cargo-auditable >/dev/null; then
    echo "==> installing cargo-auditable"
    cargo install --locked --quiet cargo-auditable --version 0.7.7
  fi
  echo "==> building release binaries (cargo auditable)"
  cargo auditable build --release --locked -p proxmox-csi-controller -p proxmox-csi-node -p proxmox-csi-hostd
fi
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
mkdir -p "$out"

# The binaries without their symbol tables (strip keeps cargo-auditable's
# .dep-v0 section, which is not debug information).
release=$work/bin
mkdir -p "$release"
for b in proxmox-csi-controller proxmox-csi-node proxmox-csi-hostd; do
  [ -x "$repo/target/release/$b" ] || { echo "images.sh: target/release/$b is missing" >&2; exit 1; }
  strip --strip-all -o "$release/$b" "$repo/target/release/$b"
done

# The files given (paths inside ROOT) and the shared libraries and loader
# they load, copied from this host at the paths they ask for.
add_libraries() {
  local root=$1; shift
  local elf lib
  for elf in "$@"; do
    ldd "$root$elf" | awk '/=> \// {print $3} /^\t\/[^ ]+ \(/ {print $1}'
  done | sort -u | while read -r lib; do
    install -D -m 0755 "$(readlink -f "$lib")" "$root$lib"
  done
}

# The Debian package owning host file PATH (merged /usr: tried both ways).
owner() {
  local p=$1 alt
  alt=$(readlink -f "$p")
  for c in "$p" "$alt" "${p#/usr}" "/usr$p" "${alt#/usr}"; do
    dpkg-query -S "$c" 2>/dev/null | head -n1 | cut -d: -f1 && return 0
  done
  return 1
}

# Records the Debian packages whose files lie under ROOT (each file's host
# path is its path below ROOT) plus EXTRA packages, for the SBOM.
record_packages() {
  local root=$1; shift
  local pkgs=("$@") f p
  while IFS= read -r f; do
    p=$(owner "/${f#"$root"/}") && pkgs+=("$p")
  done < <(find "$root" -type f ! -path "$root/etc/*" ! -path "$root/var/*")
  mkdir -p "$root/var/lib/dpkg/status.d"
  for p in $(printf '%s\n' "${pkgs[@]}" | sort -u); do
    dpkg-query -s "$p" > "$root/var/lib/dpkg/status.d/$p"
    if [ -f "/usr/share/doc/$p/copyright" ]; then
      install -D -m 0644 "/usr/share/doc/$p/copyright" "$root/usr/share/doc/$p/copyright"
    fi
  done
}

# /etc: passwd and group with root and uid/gid 65532 (`nonroot`), and
# the distribution the libraries come from (/etc/os-release, which SBOM
# tools read to name Debian packages).
add_etc() {
  local root=$1
  mkdir -p "$root/etc"
  install -m 0644 "$(readlink -f /etc/os-release)" "$root/etc/os-release"
  printf 'root:x:0:0:root:/root:/sbin/nologin\nnonroot:x:65532:65532:nonroot:/home/nonroot:/sbin/nologin\n' > "$root/etc/passwd"
  printf 'root:x:0:\nnonroot:x:65532:\n' > "$root/etc/group"
}

# A minimal root for BINARY at /usr/local/bin.
plugin_root() {
  local root=$1 bin=$2
  install -D -m 0755 "$release/$bin" "$root/usr/local/bin/$bin"
  add_libraries "$root" "/usr/local/bin/$bin"
  add_etc "$root"
  install -d -m 1777 "$root/tmp"
}

# image NAME ROOTFS USER DESCRIPTION ENTRYPOINT...: the layout $out/NAME, tag $version.
image() {
  local name=$1 rootfs=$2 user=$3 description=$4; shift 4
  local layout=$out/$name bundle=$work/bundle-$name
  local entry=() e
  for e in "$@"; do entry+=(--config.entrypoint "$e"); done
  rm -rf "$layout"
  # Ownership and times as the image should have them, whoever built the tree.
  chown -R 0:0 "$rootfs"
  find "$rootfs" -exec touch -h -d "@$epoch" {} +
  umoci init --layout "$layout"
  umoci new --image "$layout:$version"
  umoci unpack --image "$layout:$version" "$bundle" >/dev/null
  cp -a "$rootfs/." "$bundle/rootfs/"
  touch -h -d "@$epoch" "$bundle/rootfs"
  umoci repack --image "$layout:$version" \
    --history.created "$created" --history.created_by "scripts/images.sh" \
    --history.comment "$name $version" "$bundle"
  umoci config --image "$layout:$version" --no-history \
    --created "$created" --author "$source_url" \
    --os linux --architecture "$arch" --config.user "$user" \
    --config.env PATH=/usr/local/bin:/usr/sbin:/usr/bin \
    "${entry[@]}" \
    --config.label "org.opencontainers.image.title=$name" \
    --config.label "org.opencontainers.image.description=$description" \
    --config.label "org.opencontainers.image.source=$source_url" \
    --config.label "org.opencontainers.image.version=$version" \
    --config.label "org.opencontainers.image.revision=$revision" \
    --config.label "org.opencontainers.image.licenses=$license" \
    --config.label "org.opencontainers.image.created=$created"
  umoci gc --layout "$layout"
  rm -rf "$bundle"
  "$syft" scan -q "oci-dir:$layout" -o "cyclonedx-json=$out/$name.cdx.json"
  # The manifest's digest and its layers' compressed size, as a registry stores them.
  python3 - "$layout" "$name" "$(du -sh --apparent-size "$rootfs" | cut -f1)" <<'PY'
import json, sys
layout, name, unpacked = sys.argv[1:]
index = json.load(open(f"{layout}/index.json"))
digest = index["manifests"][0]["digest"]
manifest = json.load(open(f"{layout}/blobs/sha256/{digest.split(':')[1]}"))
size = sum(layer["size"] for layer in manifest["layers"])
print(f"{name:<26} {digest}  layers {size // 1024} KiB compressed, rootfs {unpacked}")
PY
}

echo "==> images $version ($created, $revision) in $out"

plugin_root "$work/controller" proxmox-csi-controller
# The Proxmox API's CA may be a public one: Debian's bundle, read by rustls-native-certs.
install -D -m 0644 /etc/ssl/certs/ca-certificates.crt "$work/controller/etc/ssl/certs/ca-certificates.crt"
record_packages "$work/controller" ca-certificates
image proxmox-csi-controller "$work/controller" 65532:65532 \
  "Proxmox VE CSI driver: controller" /usr/local/bin/proxmox-csi-controller

plugin_root "$work/node" proxmox-csi-node
record_packages "$work/node"
image proxmox-csi-node "$work/node" 65532:65532 \
  "Proxmox VE CSI driver: node plugin (unprivileged)" /usr/local/bin/proxmox-csi-node

# The extension tree, and hostd's image from the same service root.
talos-extension/assemble.sh "$work/ext" "$release/proxmox-csi-hostd" >/dev/null
svc=$work/ext/rootfs/usr/local/lib/containers/proxmox-csi-hostd
record_packages "$svc"
cp -a "$svc" "$work/hostd"
add_etc "$work/hostd"
image proxmox-csi-hostd "$work/hostd" 0:0 \
  "Proxmox VE CSI driver: hostd, the privileged host daemon" /usr/bin/proxmox-csi-hostd
# Talos unpacks an extension image; it never runs it (no entrypoint).
image proxmox-csi-hostd-talos "$work/ext" 0:0 \
  "Proxmox VE CSI driver: hostd as a Talos system extension"
