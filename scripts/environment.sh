#!/usr/bin/env bash
# The images' declared environment (deploy/images/environment.list), pinned
# for each of its architectures in deploy/images/environment.<arch>.lock: one
# line per Debian package,
#
#   <package> <architecture> <version> <sha256 of the .deb>
#
# Every command but `lock` works for one architecture: $ARCH, by default the
# machine's (images are built on a machine of their architecture).
#
#   scripts/environment.sh lock [ARCH...]
#                                      resolve the list's packages and their
#                                      dependencies for each ARCH (default:
#                                      every declared one) and write the locks
#   scripts/environment.sh arch        the architecture in use, if declared
#   scripts/environment.sh root DIR    DIR: every locked package extracted,
#                                      with DIR/.packages/<package>.{control,files}
#                                      (its control fields and the files it holds)
#   scripts/environment.sh install ENV DEST SRC[:TO]...
#                                      copies ENV's file SRC to DEST's TO (default
#                                      SRC), then the shared libraries and loader
#                                      that every TO (or a file already in DEST)
#                                      loads, resolved in ENV, at their ENV paths
#   scripts/environment.sh cargo ENV ARGS...
#                                      cargo ARGS with ENV as the sysroot: the
#                                      linker, C compilers, pkg-config and
#                                      bindgen take headers and libraries from ENV
#   scripts/environment.sh record ENV DEST [PACKAGE...]
#                                      records the packages owning DEST's files
#                                      (outside /etc and /var) and the PACKAGEs as
#                                      DEST/var/lib/dpkg/status.d/<package> with
#                                      their copyright files, where SBOM tools read
#                                      them (the distroless layout)
#
# apt runs with a state of its own under target/environment (no installed
# packages, no sources but the declared suite's), so the build host's own
# packages and sources play no part. The mirror is the machine's: its URIs
# are read from its apt sources. Every .deb is checked against the lock's
# SHA-256 before it is used; a locked version the mirror no longer has is
# an error that says so (refresh the lock, and review its diff).
set -euo pipefail
umask 022
cd "$(dirname "$0")/.."
list=deploy/images/environment.list
state=$PWD/target/environment

field() { sed -n "s/^$1[[:space:]]\+//p" "$list"; }
suite=$(field suite)
read -r -a declared <<<"$(field architectures)"
read -r -a runtime <<<"$(field runtime)"
read -r -a build <<<"$(field build)"
arch=${ARCH:-$(dpkg --print-architecture)}
case " ${declared[*]} " in
  *" $arch "*) ;;
  *) echo "environment.sh: architecture $arch is not one of environment.list's (${declared[*]})" >&2; exit 1 ;;
esac
lock=deploy/images/environment.$arch.lock
# Where Debian puts the libraries and the loader of that architecture.
case $arch in
  amd64) multiarch=x86_64-linux-gnu loader=/lib64/ld-linux-x86-64.so.2 ;;
  arm64) multiarch=aarch64-linux-gnu loader=/lib/ld-linux-aarch64.so.1 ;;
  *) echo "environment.sh: architecture $arch is not supported (amd64, arm64)" >&2; exit 1 ;;
esac

# The machine's mirror for Debian and for its security archive.
mirrors() {
  grep -hs -e '^URIs:' -e '^deb ' /etc/apt/sources.list /etc/apt/sources.list.d/*.sources \
    /etc/apt/sources.list.d/*.list |
    sed -e 's/^URIs:[[:space:]]*//' -e 's/^deb[[:space:]]\+\(\[[^]]*\][[:space:]]\+\)\?//' |
    awk '{print $1}' | sort -u
}
debian=$(mirrors | grep -v -e '-security' | grep '/debian/\?$' | head -n1 || true)
security=$(mirrors | grep -e 'debian-security' | head -n1 || true)
[ -n "$debian" ] || { echo "environment.sh: no Debian mirror in the machine's apt sources" >&2; exit 1; }

apt_opts=(
  -o "Dir::State=$state/apt/state" -o "Dir::State::status=$state/apt/state/status"
  -o "Dir::Cache=$state/apt/cache" -o "Dir::Etc::SourceList=$state/apt/sources.list"
  -o "Dir::Etc::SourceParts=$state/apt/empty" -o "Dir::Etc::Preferences=$state/apt/empty/none"
  -o "Dir::Etc::PreferencesParts=$state/apt/empty"
  -o "APT::Architecture=$arch" -o "APT::Architectures=$arch"
  -o "APT::Install-Recommends=false" -o "APT::Sandbox::User=root"
  -o "Acquire::Languages=none" -o "Debug::NoLocking=true"
)

apt_update() {
  mkdir -p "$state/apt/state/lists/partial" "$state/apt/cache/archives/partial" "$state/apt/empty"
  : >"$state/apt/state/status"
  {
    echo "deb [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] $debian $suite main"
    echo "deb [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] $debian $suite-updates main"
    [ -z "$security" ] ||
      echo "deb [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] $security $suite-security main"
  } >"$state/apt/sources.list"
  apt-get "${apt_opts[@]}" -qq update
}

case ${1:-} in
  arch)
    echo "$arch"
    ;;
  lock)
    shift
    [ $# -gt 0 ] || set -- "${declared[@]}"
    for a in "$@"; do ARCH=$a "$0" lock-one; done
    ;;
  lock-one)
    apt_update
    # With no package installed, apt's plan is the whole closure.
    apt-get "${apt_opts[@]}" -s install "${runtime[@]}" "${build[@]}" |
      sed -n 's/^Inst \([^ ]*\) (\([^ ]*\) [^[]*\[\([^]]*\)\]).*$/\1 \3 \2/p' | sort |
      while read -r pkg a version; do
        sha=$(apt-cache "${apt_opts[@]}" show "$pkg:$a=$version" | sed -n 's/^SHA256: //p' | head -n1)
        echo "$pkg $a $version $sha"
      done >"$lock.new"
    {
      echo "# Generated by scripts/environment.sh lock from environment.list: do not edit."
      echo "# suite $suite, architecture $arch"
      cat "$lock.new"
    } >"$lock"
    rm -f "$lock.new"
    echo "locked $(grep -vc '^#' "$lock") packages in $lock"
    ;;
  root)
    out=${2:?usage: scripts/environment.sh root DIR}
    # Already made from this lock: nothing to do.
    if cmp -s "$lock" "$out/.packages/lock"; then exit 0; fi
    debs=$state/debs
    mkdir -p "$debs"
    # Downloads what the cache lacks (apt checks the mirror's signed indexes).
    missing=()
    while read -r pkg a version sha; do
      f=$debs/${pkg}_${a}_$sha.deb
      [ -f "$f" ] && [ "$(sha256sum <"$f" | cut -d' ' -f1)" = "$sha" ] || missing+=("$pkg:$a=$version")
    done < <(grep -v '^#' "$lock")
    if [ ${#missing[@]} -gt 0 ]; then
      echo "==> environment: downloading ${#missing[@]} Debian packages ($suite, $arch)"
      apt_update
      dl=$state/download
      rm -rf "$dl" && mkdir -p "$dl"
      if ! (cd "$dl" && apt-get "${apt_opts[@]}" -qq download "${missing[@]}"); then
        for p in "${missing[@]}"; do
          apt-cache "${apt_opts[@]}" show "$p" >/dev/null 2>&1 ||
            echo "environment.sh: the mirror has no ${p%%:*} ${p#*=}, the version $lock pins" >&2
        done
        echo "environment.sh: run 'scripts/environment.sh lock' and review the change" >&2
        exit 1
      fi
      while read -r pkg a version sha; do
        for f in "$dl/${pkg}_"*"_$a.deb"; do
          [ -f "$f" ] || continue
          got=$(sha256sum <"$f" | cut -d' ' -f1)
          [ "$got" = "$sha" ] || {
            echo "environment.sh: $pkg $version has SHA-256 $got, the lock says $sha" >&2
            exit 1
          }
          mv "$f" "$debs/${pkg}_${a}_$sha.deb"
        done
      done < <(grep -v '^#' "$lock")
      rm -rf "$dl"
    fi
    rm -rf "$out"
    mkdir -p "$out/.packages"
    while read -r pkg a _ sha; do
      f=$debs/${pkg}_${a}_$sha.deb
      dpkg-deb -x "$f" "$out"
      dpkg-deb -f "$f" >"$out/.packages/$pkg.control"
      dpkg-deb -c "$f" | awk '{print $6}' | sed -e 's|^\./|/|' -e '/\/$/d' >"$out/.packages/$pkg.files"
    done < <(grep -v '^#' "$lock")
    # Absolute links point into DIR, not at the host (the linker reads it as a sysroot).
    find "$out" -type l -lname '/*' | while read -r l; do
      ln -sfn "$(realpath -ms --relative-to="$(dirname "$l")" "$out$(readlink "$l")")" "$l"
    done
    cp "$lock" "$out/.packages/lock"
    ;;
  install)
    env=${2:?usage: install ENV DEST SRC[:TO]...} dest=${3:?usage: install ENV DEST SRC[:TO]...}
    shift 3
    elves=()
    for spec in "$@"; do
      src=${spec%%:*} to=${spec#*:}
      if [ ! -e "$dest$to" ]; then
        [ -e "$env$src" ] || { echo "environment.sh: the environment has no $src" >&2; exit 1; }
        install -D -m 0755 "$(readlink -f "$env$src")" "$dest$to"
      fi
      elves+=("$dest$to")
    done
    # The environment's loader, told to look only in the environment: a
    # library it finds elsewhere (the host's cache) is a missing package.
    libpath=$env/lib/$multiarch:$env/usr/lib/$multiarch
    for elf in "${elves[@]}"; do
      "$env$loader" --library-path "$libpath" --list "$elf" |
        awk '/=> not found/ {print "missing:" $1} /=> \// {print $3} /^\t\/[^ ]+ \(/ {print $1}' |
        while read -r lib; do
          case $lib in
            missing:*) echo "environment.sh: ${elf#"$dest"} loads ${lib#missing:}, which no package of the lock holds" >&2; exit 1 ;;
            "$env"/*) echo "${lib#"$env"}" ;;
            "$loader") echo "$lib" ;;
            *) echo "environment.sh: ${elf#"$dest"} loads $lib, which no package of the lock holds" >&2; exit 1 ;;
          esac
        done
    done | sort -u | while read -r lib; do
      install -D -m 0755 "$(readlink -f "$env$lib")" "$dest$lib"
    done
    ;;
  cargo)
    env=$(realpath "${2:?usage: cargo ENV ARGS...}")
    shift 2
    RUSTFLAGS="${RUSTFLAGS:-} -C link-arg=--sysroot=$env" \
      CFLAGS="--sysroot=$env" CXXFLAGS="--sysroot=$env" \
      BINDGEN_EXTRA_CLANG_ARGS="--sysroot=$env" \
      PKG_CONFIG_SYSROOT_DIR="$env" \
      PKG_CONFIG_LIBDIR="$env/usr/lib/$multiarch/pkgconfig:$env/usr/share/pkgconfig" \
      exec cargo "$@"
    ;;
  record)
    env=${2:?usage: record ENV DEST [PACKAGE...]} dest=${3:?usage: record ENV DEST [PACKAGE...]}
    shift 3
    pkgs=("$@")
    while IFS= read -r f; do
      path=/${f#"$dest"/}
      owner=$(grep -lFx -e "$path" "$env"/.packages/*.files | head -n1 || true)
      [ -z "$owner" ] || pkgs+=("$(basename "$owner" .files)")
    done < <(find "$dest" -type f ! -path "$dest/etc/*" ! -path "$dest/var/*")
    # A package whose doc directory links to another's (libgcc-s1 to
    # gcc-12-base) carries that package's copyright: record both.
    for p in "${pkgs[@]}"; do
      doc=$(basename "$(readlink -f "$env/usr/share/doc/$p")")
      [ "$doc" = "$p" ] || [ ! -f "$env/.packages/$doc.control" ] || pkgs+=("$doc")
    done
    mkdir -p "$dest/var/lib/dpkg/status.d"
    for p in $(printf '%s\n' "${pkgs[@]}" | sort -u); do
      [ -f "$env/.packages/$p.control" ] || { echo "environment.sh: $p is not in the lock" >&2; exit 1; }
      install -m 0644 "$env/.packages/$p.control" "$dest/var/lib/dpkg/status.d/$p"
      if [ -f "$env/usr/share/doc/$p/copyright" ]; then
        install -D -m 0644 "$env/usr/share/doc/$p/copyright" "$dest/usr/share/doc/$p/copyright"
      fi
    done
    ;;
  *)
    echo "usage: scripts/environment.sh lock [ARCH...] | arch | root DIR | install ENV DEST SRC[:TO]... | cargo ENV ARGS... | record ENV DEST [PACKAGE...]" >&2
    exit 2
    ;;
esac
