#!/usr/bin/env bash
# Assembles the Talos system extension tree without Docker:
#
#   <out>/manifest.yaml
#   <out>/rootfs/usr/local/etc/containers/proxmox-csi-hostd.yaml
#   <out>/rootfs/usr/local/lib/containers/proxmox-csi-hostd/   (the service's own root)
#
# The service's root holds hostd, the filesystem tools it runs and every shared
# library they need (found with ldd), so it depends on nothing of the Talos host.
#
# Usage: talos-extension/assemble.sh <out-dir> [<hostd binary>]
# The binary defaults to target/release/proxmox-csi-hostd, built if missing.
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
repo=$(dirname "$here")
out=${1:?usage: assemble.sh <out-dir> [<hostd binary>]}
bin=${2:-$repo/target/release/proxmox-csi-hostd}
name=proxmox-csi-hostd
tools=(mkfs.ext4 mkfs.xfs resize2fs xfs_growfs)

if [ ! -x "$bin" ]; then
    echo "building $bin (release)"
    (cd "$repo" && cargo build --release --locked -p proxmox-csi-hostd)
fi
for t in "${tools[@]}"; do
    PATH=$PATH:/usr/sbin:/sbin command -v "$t" >/dev/null || {
        echo "assemble.sh: $t is missing; install e2fsprogs and xfsprogs" >&2
        exit 1
    }
done

rm -rf "$out"
svc=$out/rootfs/usr/local/lib/containers/$name
mkdir -p "$out/rootfs/usr/local/etc/containers" "$svc/usr/bin" "$svc/usr/sbin" "$svc/etc"

version=$("$bin" --version | awk '{print $2}')
sed "s/^  version: .*/  version: $version/" "$here/manifest.yaml" > "$out/manifest.yaml"
install -m 0644 "$here/$name.yaml" "$out/rootfs/usr/local/etc/containers/$name.yaml"
install -m 0755 "$bin" "$svc/usr/bin/$name"

elves=("$svc/usr/bin/$name")
for t in "${tools[@]}"; do
    src=$(PATH=$PATH:/usr/sbin:/sbin command -v "$t")
    install -m 0755 "$(readlink -f "$src")" "$svc/usr/sbin/$t"
    elves+=("$svc/usr/sbin/$t")
done
# mke2fs's defaults (ext4 features) come from its config file.
[ -f /etc/mke2fs.conf ] && install -m 0644 /etc/mke2fs.conf "$svc/etc/mke2fs.conf"

# Shared libraries and the loader, at the paths the binaries ask for.
for elf in "${elves[@]}"; do
    ldd "$elf" | awk '/=> \// {print $3} /^\t\/[^ ]+ \(/ {print $1}'
done | sort -u | while read -r lib; do
    dest=$svc$lib
    mkdir -p "$(dirname "$dest")"
    install -m 0755 "$(readlink -f "$lib")" "$dest"
done
# The loader's search path inside the service root.
# (Listed before the file is written: find must not see ld.so.conf itself.)
dirs=$(find "$svc" -path "$svc/etc" -prune -o -name '*.so*' -printf '%h\n' | sed "s|^$svc||" | sort -u)
printf '%s\n' "$dirs" > "$svc/etc/ld.so.conf"
ldconfig -r "$svc" 2>/dev/null || true

# Talos refuses world-writable files; keep everything root-owned and tidy.
chmod -R go-w "$out"
find "$out" -type d -exec chmod 0755 {} +
echo "assembled $name $version in $out ($(du -sh "$out" | cut -f1))"
