#!/usr/bin/env bash
# Assembles the Talos system extension tree without Docker:
#
#   <out>/manifest.yaml
#   <out>/rootfs/usr/local/etc/containers/proxmox-csi-hostd.yaml
#   <out>/rootfs/usr/local/lib/containers/proxmox-csi-hostd/   (the service's own root)
#
# The service's root holds hostd, the filesystem tools it runs, their
# configuration and every shared library they need, so it depends on nothing
# of the Talos host. Tools, libraries and configuration come from the images'
# declared environment (deploy/images/environment.list, pinned in its lock
# for the machine's architecture),
# never from the machine that assembles the tree.
#
# Usage: talos-extension/assemble.sh <out-dir> <hostd binary> [<environment root>]
# The environment root defaults to target/environment/root, made if missing
# (scripts/environment.sh root). `make images` builds hostd against it.
set -euo pipefail
umask 022

here=$(cd "$(dirname "$0")" && pwd)
repo=$(dirname "$here")
out=${1:?usage: assemble.sh <out-dir> <hostd binary> [<environment root>]}
bin=${2:?usage: assemble.sh <out-dir> <hostd binary> [<environment root>]}
env=${3:-$repo/target/environment/root}
name=proxmox-csi-hostd
# The tools hostd runs, where the environment's packages install them.
tools=(/sbin/mkfs.ext4 /sbin/resize2fs /sbin/mkfs.xfs /usr/sbin/xfs_growfs)

[ -x "$bin" ] || { echo "assemble.sh: $bin is not an executable" >&2; exit 1; }
[ $# -ge 3 ] || "$repo/scripts/environment.sh" root "$env"

rm -rf "$out"
svc=$out/rootfs/usr/local/lib/containers/$name
mkdir -p "$out/rootfs/usr/local/etc/containers" "$svc/usr/bin" "$svc/usr/sbin" "$svc/etc"

version=$("$bin" --version | awk '{print $2}')
sed "s/^  version: .*/  version: $version/" "$here/manifest.yaml" > "$out/manifest.yaml"
install -m 0644 "$here/$name.yaml" "$out/rootfs/usr/local/etc/containers/$name.yaml"
install -m 0755 "$bin" "$svc/usr/bin/$name"

installs=("/usr/bin/$name")
for t in "${tools[@]}"; do installs+=("$t:/usr/sbin/$(basename "$t")"); done
"$repo/scripts/environment.sh" install "$env" "$svc" "${installs[@]}"
# mke2fs's defaults (ext4's features) come from its config file.
install -m 0644 "$env/etc/mke2fs.conf" "$svc/etc/mke2fs.conf"
# The distribution the service root's userland is (SBOM tools read it).
install -m 0644 "$(readlink -f "$env/etc/os-release")" "$svc/etc/os-release"

# The loader's search path inside the service root.
# (Listed before the file is written: find must not see ld.so.conf itself.)
dirs=$(find "$svc" -path "$svc/etc" -prune -o -name '*.so*' -printf '%h\n' | sed "s|^$svc||" | sort -u)
printf '%s\n' "$dirs" > "$svc/etc/ld.so.conf"
ldconfig -r "$svc" 2>/dev/null || true

# Talos refuses world-writable files; keep everything root-owned and tidy.
chmod -R go-w "$out"
find "$out" -type d -exec chmod 0755 {} +
echo "assembled $name $version in $out ($(du -sh "$out" | cut -f1))"
