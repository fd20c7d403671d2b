#!/usr/bin/env bash
# `make release VERSION=x.y.z`: everything a release publishes, for this
# machine's architecture, under target/release/v<version>/:
#
#   images/<name>/            the four OCI image layouts (each an OCI image
#                             index tagged <version>), as `make images` builds them
#   <name>.cdx.json           each image's CycloneDX SBOM
#   proxmox-csi-plugin-<version>.tgz
#                             the Helm chart, packaged as `helm package` does
#   proxmox-csi.yaml          the kustomize base rendered into one file: the
#                             URL Talos's cluster.externalCloudProvider.manifests takes
#   pvecsictl-linux-<arch>    the operator CLI
#   proxmox-csi-<version>.tar.gz
#                             the source at HEAD (git archive), which the
#                             siderolabs recipe builds hostd from
#   siderolabs/storage/proxmox-csi-hostd/
#                             the recipe for siderolabs/extensions, complete:
#                             its vars.yaml names that tarball's checksums
#   SHA256SUMS                the checksums of all of the above files
#
# The release workflow (.github/workflows/release.yml) runs this on an amd64
# and an arm64 runner, joins the two architectures' images into one index
# per image, signs and pushes; docs/release.md says which steps only it runs.
#
# Usage: scripts/release.sh VERSION [--prebuilt]
#   --prebuilt  take the images and binaries `make images` left (no build)
set -euo pipefail
umask 022
cd "$(dirname "$0")/.."
usage() { echo "usage: scripts/release.sh VERSION [--prebuilt]" >&2; exit 2; }
[ $# -ge 1 ] || usage
version=${1#v}
shift
prebuilt=()
while [ $# -gt 0 ]; do
  case $1 in
    --prebuilt) prebuilt=(--prebuilt); shift ;;
    *) usage ;;
  esac
done

crate=$(sed -n '/^\[workspace.package\]/,/^\[/s/^version = "\(.*\)"/\1/p' Cargo.toml)
if [ "$version" != "$crate" ]; then
  echo "release.sh: VERSION $version is not the workspace's version $crate: set [workspace.package] version in Cargo.toml (and the chart's version and appVersion) first" >&2
  exit 2
fi
chart_version=$(sed -n 's/^version: //p' deploy/helm/proxmox-csi-plugin/Chart.yaml)
if [ "$chart_version" != "$version" ]; then
  echo "release.sh: deploy/helm/proxmox-csi-plugin/Chart.yaml has version $chart_version, not $version" >&2
  exit 2
fi
arch=$(scripts/environment.sh arch)
epoch=${SOURCE_DATE_EPOCH:-$(git log -1 --format=%ct 2>/dev/null || echo 0)}
out=target/release/v$version
rm -rf "$out"
mkdir -p "$out"

echo "==> images ($arch)"
scripts/images.sh --out "$out/images" "${prebuilt[@]}"
for sbom in "$out"/images/*.cdx.json; do
  mv "$sbom" "$out/"
done

echo "==> pvecsictl"
strip --strip-all -o "$out/pvecsictl-linux-$arch" target/images-build/release/pvecsictl

echo "==> chart"
# As `helm package`: the chart's directory under its name, gzip without a
# name or time, every entry owned by root with the commit's time.
tar --sort=name --owner=0 --group=0 --numeric-owner --mtime="@$epoch" \
  -C deploy/helm -cf - proxmox-csi-plugin | gzip -n -9 > "$out/proxmox-csi-plugin-$version.tgz"

echo "==> manifests"
kubectl kustomize deploy/kustomize > "$out/proxmox-csi.yaml"

echo "==> source and the siderolabs recipe"
src=proxmox-csi-$version.tar.gz
git archive --format=tar --prefix="proxmox-csi-$version/" HEAD | gzip -n -9 > "$out/$src"
recipe=$out/siderolabs/storage/proxmox-csi-hostd
mkdir -p "$recipe"
cp talos-extension/siderolabs/storage/proxmox-csi-hostd/* "$recipe/"
{
  printf 'VERSION: %s\n' "$version"
  grep -v -e '^VERSION:' -e '^PROXMOX_CSI_SHA' talos-extension/siderolabs/storage/proxmox-csi-hostd/vars.yaml
  printf 'PROXMOX_CSI_SHA256: "%s"\n' "$(sha256sum "$out/$src" | cut -d' ' -f1)"
  printf 'PROXMOX_CSI_SHA512: "%s"\n' "$(sha512sum "$out/$src" | cut -d' ' -f1)"
} > "$recipe/vars.yaml"

sums=$(cd "$out" && find . -maxdepth 1 -type f -printf '%f\n' | sort | xargs sha256sum)
printf '%s\n' "$sums" > "$out/SHA256SUMS"
echo "==> release v$version in $out:"
cat "$out/SHA256SUMS"
