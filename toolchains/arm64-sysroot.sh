#!/usr/bin/env bash
# Assembles an arm64 sysroot for the edge from Debian's arm64 .debs (apt-get download, then
# dpkg-deb -x into OUT_DIR): nothing :arm64 is ever installed, which would remove amd64 XNNPACK.
# Usage: bash toolchains/arm64-sysroot.sh OUT_DIR
# A second run with the same package list (and this script unchanged) returns at once.
set -euo pipefail
if (($# != 1)); then
  echo "usage: $0 OUT_DIR   (e.g. build/arm64-sysroot)" >&2
  exit 2
fi
out=$1

# What the edge and its tests link, what those libraries need at run time (under qemu, from
# this folder alone: libc, libstdc++), and the headers those libraries' headers include.
packages=(
  libc6 libgcc-s1 libstdc++6
  libxnnpack-dev libxnnpack0 libpthreadpool-dev libpthreadpool0 libcpuinfo-dev libcpuinfo0
  libwebsockets-dev libwebsockets17 libssl-dev libssl3 libcap-dev libcap2 zlib1g-dev zlib1g
  libmbedtls-dev libmbedtls14 libmbedx509-1 libmbedcrypto7
  libflatbuffers-dev libflatbuffers2
  libgtest-dev
)
# Architecture-independent headers the edge's own code includes (downloaded as they are).
packages_all=(
  libcli11-dev
)

stamp_text="$(printf '%s\n' "${packages[@]}" "${packages_all[@]}")
script $(sha256sum "$0" | cut -d' ' -f1)"
if [[ -f $out/.sysroot-stamp && "$(cat "$out/.sysroot-stamp")" == "$stamp_text" ]]; then
  echo "arm64 sysroot: $out is up to date"
  exit 0
fi

# Adding the architecture only lets apt see arm64 package lists; nothing arm64 gets installed.
if ! ls /var/lib/apt/lists/*_binary-arm64_Packages* > /dev/null 2>&1; then
  if [[ $(id -u) -ne 0 ]]; then
    echo "arm64 sysroot: apt has no arm64 package lists; as root run: dpkg --add-architecture arm64 && apt-get update" >&2
    exit 1
  fi
  echo "arm64 sysroot: adding the arm64 architecture to apt's lists (dpkg --add-architecture arm64)"
  dpkg --add-architecture arm64
  apt-get update -qq
fi

# Only a folder this script made (or an empty or absent one) is ever replaced.
if [[ -d $out && ! -f $out/.tandem-sysroot && ! -f $out/.sysroot-stamp && -n $(ls -A "$out") ]]; then
  echo "arm64 sysroot: $out exists and was not made by this script: pick another OUT_DIR or remove it" >&2
  exit 1
fi
rm -rf "$out"
debs=$out/.debs
mkdir -p "$debs"
touch "$out/.tandem-sysroot"
# As root, apt would hand the download to its _apt user, which cannot write here.
sandbox=()
[[ $(id -u) -ne 0 ]] || sandbox=(-o APT::Sandbox::User=root)
(cd "$debs" && apt-get download -q=2 "${sandbox[@]}" "${packages[@]/%/:arm64}" "${packages_all[@]}") || {
  echo "arm64 sysroot: apt-get download of the arm64 packages failed: check the network to Debian's archive," \
       "then run apt-get update" >&2
  exit 1
}
for deb in "$debs"/*.deb; do
  dpkg-deb -x "$deb" "$out"
done
count=$(ls "$debs"/*.deb | wc -l)
rm -rf "$debs"

# Absolute links (e.g. /lib/aarch64-linux-gnu/libfoo.so.1) must resolve inside the sysroot,
# for the linker and for qemu alike: make them relative.
while IFS= read -r link; do
  target=$(readlink "$link")
  [[ $target == /* ]] || continue
  ln -sfn "$(realpath -m --relative-to="$(dirname "$link")" "$out$target")" "$link"
done < <(find "$out" -type l)

printf '%s\n' "$stamp_text" > "$out/.sysroot-stamp"
echo "arm64 sysroot: $count packages extracted into $out"
