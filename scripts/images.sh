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
# Every file that is not the driver's own comes from the declared environment
# (deploy/images/environment.list, pinned in environment.<arch>.lock; made by
# scripts/environment.sh), and the binaries are linked against it as their
# sysroot: nothing is taken from the build host's libraries.
#
# The binaries are built with cargo-auditable, which records their crates in
# the binary for syft; the Debian packages whose files an image holds are
# recorded as /var/lib/dpkg/status.d/<package> (with their copyright files),
# as distroless images do, where syft reads them.
#
# Usage: scripts/images.sh [--out DIR] [--prebuilt]
#   --prebuilt  use target/images-build/release as it is (no cargo build)
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
arch=$(scripts/environment.sh arch)
env_root=$repo/target/environment/root
bins=$repo/target/images-build/release
scripts/environment.sh root "$env_root"

if $build; then
  if ! command -v cargo-auditable >/dev/null; then
    echo "==> installing cargo-auditable"
    cargo install --locked --quiet cargo-auditable --version 0.7.7
  fi
  echo "==> building release binaries against the environment (cargo auditable)"
  CARGO_TARGET_DIR=$repo/target/images-build scripts/environment.sh cargo "$env_root" \
    auditable build --release --locked -p proxmox-csi-controller -p proxmox-csi-node -p proxmox-csi-hostd -p pvecsictl
fi
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
mkdir -p "$out"

# The binaries without their symbol tables (strip keeps cargo-auditable's
# .dep-v0 section, which is not debug information).
release=$work/bin
mkdir -p "$release"
for b in proxmox-csi-controller proxmox-csi-node proxmox-csi-hostd; do
  [ -x "$bins/$b" ] || { echo "images.sh: $bins/$b is missing" >&2; exit 1; }
  strip --strip-all -o "$release/$b" "$bins/$b"
done

# /etc: passwd and group with root and uid/gid 65532 (`nonroot`), and
# the distribution the libraries come from (/etc/os-release, which SBOM
# tools read to name Debian packages).
add_etc() {
  local root=$1
  mkdir -p "$root/etc"
  install -m 0644 "$(readlink -f "$env_root/etc/os-release")" "$root/etc/os-release"
  printf 'root:x:0:0:root:/root:/sbin/nologin\nnonroot:x:65532:65532:nonroot:/home/nonroot:/sbin/nologin\n' > "$root/etc/passwd"
  printf 'root:x:0:\nnonroot:x:65532:\n' > "$root/etc/group"
}

# A minimal root for BINARY at /usr/local/bin.
plugin_root() {
  local root=$1 bin=$2
  install -D -m 0755 "$release/$bin" "$root/usr/local/bin/$bin"
  scripts/environment.sh install "$env_root" "$root" "/usr/local/bin/$bin"
  add_etc "$root"
  install -d -m 1777 "$root/tmp"
}

# image NAME ROOTFS USER DESCRIPTION ENTRYPOINT...: the layout $out/NAME, tag $version,
# and its SBOM $out/NAME.cdx.json (scanned from the image, or the file $SBOM names).
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
  if [ -n "${SBOM:-}" ]; then
    install -m 0644 "$SBOM" "$out/$name.cdx.json"
  else
    "$syft" scan -q "oci-dir:$layout" -o "cyclonedx-json=$out/$name.cdx.json"
  fi
  # The architecture the image holds, said where registry clients read it:
  # the tag names an image index whose one entry carries its platform, so a
  # pull for another architecture (an arm64 installer) fails instead of
  # silently taking this one. Prints the digest and the layers' size.
  python3 - "$layout" "$name" "$arch" "$(du -sh --apparent-size "$rootfs" | cut -f1)" <<'PY'
import hashlib, json, sys
layout, name, arch, unpacked = sys.argv[1:]
def blob(digest):
    return f"{layout}/blobs/sha256/{digest.split(':')[1]}"
index = json.load(open(f"{layout}/index.json"))
entry = index["manifests"][0]
manifest = json.load(open(blob(entry["digest"])))
size = sum(layer["size"] for layer in manifest["layers"])
image_index = {
    "schemaVersion": 2,
    "mediaType": "application/vnd.oci.image.index.v1+json",
    "manifests": [{
        "mediaType": entry["mediaType"],
        "digest": entry["digest"],
        "size": entry["size"],
        "platform": {"architecture": arch, "os": "linux"},
    }],
}
raw = json.dumps(image_index, separators=(",", ":"), sort_keys=True).encode()
digest = "sha256:" + hashlib.sha256(raw).hexdigest()
open(blob(digest), "wb").write(raw)
index["manifests"] = [{
    "mediaType": image_index["mediaType"],
    "digest": digest,
    "size": len(raw),
    "annotations": entry.get("annotations", {}),
}]
open(f"{layout}/index.json", "w").write(json.dumps(index, separators=(",", ":"), sort_keys=True))
print(f"{name:<26} {digest}  {arch}, layers {size // 1024} KiB compressed, rootfs {unpacked}")
PY
}

# SBOMs of a directory as WORK/NAME.{spdx,cdx}.json, their random and
# time fields fixed (a namespace and serial number from their contents, the
# commit's time) so that an image holding one stays reproducible.
dir_sbom() {
  local dir=$1 name=$2
  (cd "$dir" && "$syft" scan -q dir:. --source-name "$name" --source-version "$version" \
    -o "spdx-json=$work/$name.spdx.json" -o "cyclonedx-json=$work/$name.cdx.json")
  python3 - "$work/$name" "$created" "$source_url" "$version" <<'PY'
import hashlib, json, sys, uuid
base, created, source, version = sys.argv[1:]
name = base.rsplit("/", 1)[1]
def digest(doc):
    return hashlib.sha256(json.dumps(doc, sort_keys=True).encode()).hexdigest()
spdx = json.load(open(f"{base}.spdx.json"))
spdx["creationInfo"]["created"] = created
spdx["documentNamespace"] = ""
spdx["documentNamespace"] = f"{source}/spdx/{name}-{version}-{digest(spdx)[:32]}"
json.dump(spdx, open(f"{base}.spdx.json", "w"), indent=1, sort_keys=True)
cdx = json.load(open(f"{base}.cdx.json"))
cdx["metadata"]["timestamp"] = created
cdx["serialNumber"] = ""
cdx["serialNumber"] = f"urn:uuid:{uuid.UUID(hex=digest(cdx)[:32], version=5)}"
json.dump(cdx, open(f"{base}.cdx.json", "w"), indent=1, sort_keys=True)
PY
}

echo "==> images $version ($created, $revision) in $out"

plugin_root "$work/controller" proxmox-csi-controller
# The Proxmox API's CA may be a public one: Debian's bundle, read by
# rustls-native-certs, made as update-ca-certificates makes it (every
# certificate of the package, in the order of their paths).
bundle=$work/controller/etc/ssl/certs/ca-certificates.crt
mkdir -p "$(dirname "$bundle")"
find "$env_root/usr/share/ca-certificates" -name '*.crt' | LC_ALL=C sort |
  while read -r crt; do sed -e '$a\' "$crt"; done >"$bundle"
chmod 0644 "$bundle"
scripts/environment.sh record "$env_root" "$work/controller" ca-certificates base-files
image proxmox-csi-controller "$work/controller" 65532:65532 \
  "Proxmox VE CSI driver: controller" /usr/local/bin/proxmox-csi-controller

plugin_root "$work/node" proxmox-csi-node
scripts/environment.sh record "$env_root" "$work/node" base-files
image proxmox-csi-node "$work/node" 65532:65532 \
  "Proxmox VE CSI driver: node plugin (unprivileged)" /usr/local/bin/proxmox-csi-node

# The extension tree, and hostd's image from the same service root.
talos-extension/assemble.sh "$work/ext" "$release/proxmox-csi-hostd" "$env_root" >/dev/null
svc=$work/ext/rootfs/usr/local/lib/containers/proxmox-csi-hostd
scripts/environment.sh record "$env_root" "$svc" e2fsprogs base-files
cp -a "$svc" "$work/hostd"
add_etc "$work/hostd"
scripts/environment.sh record "$env_root" "$work/hostd" base-files
image proxmox-csi-hostd "$work/hostd" 0:0 \
  "Proxmox VE CSI driver: hostd, the privileged host daemon" /usr/bin/proxmox-csi-hostd
# The extension's SBOM: Talos's layout keeps /var/lib/dpkg out of the
# image's root, where image scanners look, so its service root is scanned as
# a directory; the SPDX document goes inside, where siderolabs/extensions'
# recipes put theirs (bldr's sbom outputPath, /usr/local/share/spdx).
dir_sbom "$svc" proxmox-csi-hostd-talos
install -D -m 0644 "$work/proxmox-csi-hostd-talos.spdx.json" \
  "$work/ext/rootfs/usr/local/share/spdx/proxmox-csi-hostd.spdx.json"
# Talos unpacks an extension image; it never runs it (no entrypoint).
SBOM=$work/proxmox-csi-hostd-talos.cdx.json image proxmox-csi-hostd-talos "$work/ext" 0:0 \
  "Proxmox VE CSI driver: hostd as a Talos system extension"
