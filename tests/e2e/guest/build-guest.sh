#!/usr/bin/env bash
# Builds the end-to-end test guest: a Debian kernel and an initramfs with
# busybox, udevd (with the device-mapper rules), cryptsetup, e2fsprogs,
# xfsprogs and the kernel modules for virtio-scsi, sd, dm-crypt, ext4, xfs,
# 9p and virtio-net. The driver's binaries are not baked in: the guest
# mounts them over 9p, so a rebuild needs no new image.
#
#   build-guest.sh OUT_DIR     writes OUT_DIR/vmlinuz and OUT_DIR/initramfs.cpio.gz
set -euo pipefail
out=$(realpath -m "${1:?usage: build-guest.sh OUT_DIR}")
here=$(cd "$(dirname "$0")" && pwd)
mkdir -p "$out"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

# The kernel package, unpacked (no install, no initramfs-tools trigger).
pkg=$(apt-cache depends linux-image-amd64 | awk '/Depends: linux-image-[0-9]/{print $2; exit}')
[ -n "$pkg" ] || { echo "build-guest: no linux-image package found (apt-get update?)" >&2; exit 1; }
(cd "$work" && apt-get download -q "$pkg" >/dev/null)
dpkg-deb -x "$work"/linux-image-*.deb "$work/k"
kver=$(ls "$work/k/lib/modules")
depmod -b "$work/k" "$kver"
cp "$work"/k/boot/vmlinuz-* "$out/vmlinuz"

root="$work/root"
mkdir -p "$root"/{bin,sbin,etc,proc,sys,dev,run,tmp,mnt,root,var/lib,usr/bin,usr/sbin,lib/modules,lib/udev/rules.d,etc/udev,host,lib64}
cp /usr/bin/busybox "$root/bin/busybox"
for a in $(/usr/bin/busybox --list); do [ -e "$root/bin/$a" ] || ln -s busybox "$root/bin/$a"; done
rm -f "$root"/bin/{modprobe,insmod,rmmod,lsmod,depmod,modinfo}

# A binary and the shared libraries ldd names.
add() {
  local src dst
  src=$(command -v "$1" || echo "$1")
  dst=${2:-$src}
  mkdir -p "$root$(dirname "$dst")"
  cp -L "$src" "$root$dst"
  for lib in $(ldd "$src" 2>/dev/null | grep -oE '/[^ ]+'); do
    [ -e "$root$lib" ] || { mkdir -p "$root$(dirname "$lib")"; cp -L "$lib" "$root$lib"; }
  done
}
for b in kmod udevadm cryptsetup dmsetup mkfs.ext4 mke2fs resize2fs e2fsck mkfs.xfs xfs_growfs xfs_repair \
         blkid blockdev lsblk findmnt sha256sum; do
  add "$b"
done
add /lib/udev/scsi_id
for a in modprobe insmod rmmod lsmod depmod modinfo; do ln -sf "$(command -v kmod)" "$root/bin/$a"; done
mkdir -p "$root/lib/systemd"
ln -sf "$(command -v udevadm)" "$root/lib/systemd/systemd-udevd"
# Rust binaries shared over 9p need these too.
for b in ${GUEST_LIBS_FOR:-}; do
  for lib in $(ldd "$b" 2>/dev/null | grep -oE '/[^ ]+'); do
    [ -e "$root$lib" ] || { mkdir -p "$root$(dirname "$lib")"; cp -L "$lib" "$root$lib"; }
  done
done

# udev rules call /sbin/dmsetup and /sbin/blkid: on a merged-/usr host the
# tools came from /usr/sbin, so give them their classic paths too.
for f in "$root"/usr/sbin/*; do ln -sf "/usr/sbin/${f##*/}" "$root/sbin/${f##*/}"; done
for f in "$root"/usr/bin/*; do [ -e "$root/bin/${f##*/}" ] || ln -sf "/usr/bin/${f##*/}" "$root/bin/${f##*/}"; done

for r in 50-udev-default 55-dm 60-block 60-persistent-storage 60-persistent-storage-dm 80-drivers 95-dm-notify; do
  cp "/lib/udev/rules.d/$r.rules" "$root/lib/udev/rules.d/"
done
printf 'root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/:/bin/false\n' > "$root/etc/passwd"
printf 'root:x:0:\ndisk:x:6:\ntty:x:5:\nkmem:x:15:\nnogroup:x:65534:\n' > "$root/etc/group"

mods="virtio_pci virtio_scsi sd_mod scsi_mod dm_mod dm_crypt xts ecb aesni_intel aes_generic cbc sha256_generic algif_hash
      crc32c_generic algif_skcipher af_alg ext4 xfs 9p 9pnet_virtio virtio_net virtio_console"
for m in $mods; do
  modprobe -d "$work/k" -S "$kver" --show-depends "$m" 2>/dev/null | awk '/^insmod/{print $2}'
done | sort -u | while read -r f; do
  rel=${f#"$work/k"}
  mkdir -p "$root$(dirname "$rel")"
  cp "$f" "$root$rel"
done
cp "$work/k/lib/modules/$kver"/modules.{order,builtin,builtin.modinfo} "$root/lib/modules/$kver/" 2>/dev/null || true
depmod -b "$root" "$kver"
echo "$mods" | tr -s ' \n' '\n' | grep . > "$root/etc/modules"

cp "$here/init" "$root/init"
chmod +x "$root/init"
(cd "$root" && find . | cpio -o -H newc --quiet | gzip -1 > "$out/initramfs.cpio.gz")
echo "guest: kernel $kver, initramfs $(du -h "$out/initramfs.cpio.gz" | cut -f1)"
