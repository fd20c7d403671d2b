#!/usr/bin/env bash
# Installs the Debian packages a target needs, only those missing.
#   scripts/deps.sh build   toolchain libraries for the -sys crates
#   scripts/deps.sh test    build + filesystem tools + kubectl + the packages the guest VM's
#                           initramfs is built from + QEMU (from bookworm-backports on
#                           Debian 12)
#   scripts/deps.sh guest   the same as test
#   scripts/deps.sh images  test + umoci and skopeo (OCI layouts without a daemon) + the CA bundle
set -euo pipefail

want=${1:-test}
build=(pkg-config libudev-dev libcryptsetup-dev libclang-dev libblkid-dev)
# The end-to-end tests build a guest initramfs from these host packages.
test=("${build[@]}" e2fsprogs xfsprogs btrfs-progs util-linux fdisk cryptsetup-bin
      busybox-static udev kmod cpio dmsetup python3-venv)
guest=("${test[@]}")
images=("${test[@]}" umoci skopeo ca-certificates)

case "$want" in
  build) pkgs=("${build[@]}") ;;
  test) pkgs=("${test[@]}") ;;
  guest) pkgs=("${guest[@]}") ;;
  images) pkgs=("${images[@]}") ;;
  *) echo "deps.sh: unknown target '$want' (build, test, guest, images)" >&2; exit 2 ;;
esac

missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done

# `kubectl kustomize` renders the deployment; Debian's kubernetes-client has it.
if [ "$want" != build ] && ! command -v kubectl >/dev/null; then
  missing+=(kubernetes-client)
fi

sudo=()
[ "$(id -u)" -eq 0 ] || sudo=(sudo)

need_qemu=false
if [ "$want" != build ] && ! command -v qemu-system-x86_64 >/dev/null; then
  need_qemu=true
fi

if [ ${#missing[@]} -eq 0 ] && ! $need_qemu; then
  exit 0
fi

export DEBIAN_FRONTEND=noninteractive
if $need_qemu; then
  # The machine's qemu-utils comes from bookworm-backports and breaks bookworm's
  # qemu-system; take QEMU from backports too, from the mirror apt already uses.
  . /etc/os-release
  if [ "${VERSION_CODENAME:-}" = bookworm ] && ! grep -rqs "bookworm-backports" /etc/apt/sources.list /etc/apt/sources.list.d/; then
    uri=$(grep -rhs '^URIs:' /etc/apt/sources.list.d/*.sources | head -n1 | awk '{print $2}')
    [ -n "$uri" ] || uri=$(grep -hs '^deb ' /etc/apt/sources.list | head -n1 | awk '{print $2}')
    printf 'Types: deb\nURIs: %s\nSuites: bookworm-backports\nComponents: main\nSigned-By: /usr/share/keyrings/debian-archive-keyring.gpg\n' "$uri" |
      "${sudo[@]}" tee /etc/apt/sources.list.d/bookworm-backports.sources >/dev/null
  fi
fi

all=("${missing[@]}")
$need_qemu && all+=(qemu-system-x86)
echo "==> installing Debian packages: ${all[*]}"
"${sudo[@]}" apt-get update -qq
if [ ${#missing[@]} -gt 0 ]; then
  "${sudo[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi
if $need_qemu; then
  . /etc/os-release
  if [ "${VERSION_CODENAME:-}" = bookworm ]; then
    "${sudo[@]}" apt-get install -y -qq --no-install-recommends -t bookworm-backports qemu-system-x86 qemu-utils >/dev/null
  else
    "${sudo[@]}" apt-get install -y -qq --no-install-recommends qemu-system-x86 qemu-utils >/dev/null
  fi
fi
