#!/usr/bin/env bash
# The release workflow's image step: each image's layouts of every
# architecture built (`make release` on each runner) pushed to REGISTRY,
# joined into one image index tagged VERSION, the index signed keyless with cosign, and each
# architecture's SBOM attested to its image. Runs only on the hosted runner
# (it needs the registry and the workflow's OIDC identity: docs/release.md).
#
# Usage: scripts/publish-images.sh VERSION ARTIFACTS REGISTRY
#   ARTIFACTS holds release-<arch>/v<VERSION>/ as the build jobs uploaded it.
set -euo pipefail
[ $# -eq 3 ] || { echo "usage: scripts/publish-images.sh VERSION ARTIFACTS REGISTRY" >&2; exit 2; }
version=$1
artifacts=$2
registry=$3
archs=()
for d in "$artifacts"/release-*; do
  archs+=("${d##*/release-}")
done
[ ${#archs[@]} -gt 0 ] || { echo "publish-images.sh: no release-<arch> in $artifacts" >&2; exit 1; }
for name in proxmox-csi-controller proxmox-csi-node proxmox-csi-hostd proxmox-csi-hostd-talos; do
  refs=()
  for arch in "${archs[@]}"; do
    dir=$artifacts/release-$arch/v$version
    ref=$registry/$name:$version-$arch
    skopeo copy --all --preserve-digests "oci:$dir/images/$name:$version" "docker://$ref"
    skopeo inspect --raw "docker://$ref" > "$name-$arch.json"
    digest=$(skopeo manifest-digest "$name-$arch.json")
    cosign attest --yes --type cyclonedx --predicate "$dir/$name.cdx.json" "$registry/$name@$digest"
    refs+=("$ref")
  done
  docker buildx imagetools create --tag "$registry/$name:$version" "${refs[@]}"
  skopeo inspect --raw "docker://$registry/$name:$version" > "$name.json"
  cosign sign --yes "$registry/$name@$(skopeo manifest-digest "$name.json")"
  echo "$registry/$name:$version"
done
