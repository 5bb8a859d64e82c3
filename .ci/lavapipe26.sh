#!/usr/bin/env bash
# Mesa 26's lavapipe (a Vulkan CPU driver with VK_KHR_cooperative_matrix) for the Dawn backend on a
# Debian 12 (bookworm) x86_64 machine without a GPU, and a deno that runs against it.
#
# Dawn (npm webgpu) refuses Mesa 22's lavapipe, bookworm's; Mesa 26.1 (trixie-backports) needs
# glibc >= 2.39 and bookworm has 2.36. So trixie's glibc and Mesa are unpacked into $ROOT beside the
# system (a private apt state: the host's packages and apt lists are left alone; no chroot), and
# $ROOT/bin/deno.bin is a copy of deno whose ELF interpreter and rpath point into $ROOT.
# $ROOT/bin/deno runs it with VK_DRIVER_FILES set to Mesa 26's lavapipe:
#
#   HALFSTEP_BACKEND=dawn $ROOT/bin/deno test -A tests/gpu/kernels/matmul_test.ts
#
# Programs that deno starts (python3, chromium) use the host's libraries as usual. Deno's own WebGPU
# works there too (as on Mesa 22). Idempotent: a second run with the same deno and packages returns at
# once. About 40 s and 400 MB. Needs root (or sudo), deb.debian.org, and deno 2.9.x on PATH.
# Environment: LAVAPIPE26_ROOT (default /opt/lavapipe26), DEBIAN_MIRROR (default deb.debian.org).
set -euo pipefail

ROOT="${LAVAPIPE26_ROOT:-/opt/lavapipe26}"
MIRROR="${DEBIAN_MIRROR:-http://deb.debian.org/debian}"
KEYRING=/usr/share/keyrings/debian-archive-keyring.gpg
PACKAGES=(mesa-vulkan-drivers libvulkan1 libc6 libstdc++6)
start=$(date +%s)
log() { echo "== lavapipe26 [$(($(date +%s) - start))s] $*"; }

case "$ROOT" in /* ) ;; *) echo "LAVAPIPE26_ROOT must be an absolute path, not '$ROOT'" >&2; exit 1 ;; esac
case "$ROOT" in / | /usr | /opt | /tmp | /usr/* | /etc* | /var | /home) echo "refusing LAVAPIPE26_ROOT=$ROOT" >&2; exit 1 ;; esac
[ "$(dpkg --print-architecture 2>/dev/null)" = amd64 ] || { echo "Debian amd64 only" >&2; exit 1; }
SUDO=""
[ "$(id -u)" -eq 0 ] || SUDO="sudo"

deno_bin="$(readlink -f "$(command -v deno)")" || { echo "deno is not on PATH" >&2; exit 1; }
deno_version="$("$deno_bin" --version | head -1)"
# What a finished install was made from: the same deno binary and the same request.
stamp="deno=$deno_version $(sha256sum "$deno_bin" | cut -c1-16) packages=${PACKAGES[*]} mirror=$MIRROR"
if [ -x "$ROOT/bin/deno" ] && [ "$(cat "$ROOT/.stamp" 2>/dev/null)" = "$stamp" ]; then
  log "already installed in $ROOT ($("$ROOT/bin/deno" --version | head -1))"
  exit 0
fi

if ! command -v patchelf >/dev/null; then
  log "host: apt-get install patchelf"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq patchelf >/dev/null
fi

# Build in a fresh folder beside ROOT and move it into place at the end: a run cut short leaves
# ROOT as it was (an earlier install, or nothing), never half made.
new="$ROOT.new"
$SUDO rm -rf "$new"
$SUDO mkdir -p "$new/bin"
A="$(mktemp -d)"
trap 'rm -rf "$A"' EXIT
mkdir -p "$A/etc/apt/apt.conf.d" "$A/etc/apt/preferences.d" "$A/etc/apt/sources.list.d" \
  "$A/var/lib/dpkg" "$A/var/lib/apt/lists/partial" "$A/var/cache/apt/archives/partial"
touch "$A/var/lib/dpkg/status"
cat >"$A/etc/apt/sources.list" <<EOF
deb [signed-by=$KEYRING] $MIRROR trixie main
deb [signed-by=$KEYRING] $MIRROR trixie-updates main
deb [signed-by=$KEYRING] $MIRROR trixie-backports main
EOF
# A private apt: its own lists, status (empty: every dependency is fetched) and cache.
APT=(apt-get -q -o "Dir=$A" -o "Dir::State::status=$A/var/lib/dpkg/status"
  -o APT::Architecture=amd64 -o APT::Architectures=amd64 -o APT::Install-Recommends=false
  -o Debug::NoLocking=true -o APT::Sandbox::User=root)
log "apt (private state in $A): update trixie, trixie-updates, trixie-backports"
"${APT[@]}" update >/dev/null
log "apt: download ${PACKAGES[*]} (mesa from trixie-backports) with their dependencies"
"${APT[@]}" install -y --download-only -t trixie-backports "${PACKAGES[@]}" >/dev/null
debs=("$A"/var/cache/apt/archives/*.deb)
for deb in "${debs[@]}"; do $SUDO dpkg-deb -x "$deb" "$new"; done
mesa=$(basename "$(ls "$A"/var/cache/apt/archives/mesa-vulkan-drivers_*.deb)" .deb)
log "unpacked ${#debs[@]} packages ($mesa) into $new"
LIB="$ROOT/usr/lib/x86_64-linux-gnu"
for f in libvulkan_lvp.so ld-linux-x86-64.so.2 libc.so.6; do
  [ -e "$new/usr/lib/x86_64-linux-gnu/$f" ] || { echo "unpack incomplete: no $f" >&2; exit 1; }
done

log "deno ($deno_version) as $ROOT/bin/deno.bin, interpreter and rpath in $LIB"
$SUDO install -m 0755 "$deno_bin" "$new/bin/deno.bin"
# The paths name ROOT, where the folder will be once moved.
$SUDO patchelf --set-interpreter "$LIB/ld-linux-x86-64.so.2" --force-rpath --set-rpath "$LIB" \
  "$new/bin/deno.bin"
$SUDO tee "$new/bin/deno" >/dev/null <<EOF
#!/bin/sh
# deno against trixie's glibc and Mesa 26's lavapipe (made by .ci/lavapipe26.sh)
export VK_DRIVER_FILES="$ROOT/usr/share/vulkan/icd.d/lvp_icd.json"
exec "$ROOT/bin/deno.bin" "\$@"
EOF
$SUDO chmod 0755 "$new/bin/deno"
echo "$stamp" | $SUDO tee "$new/.stamp" >/dev/null
$SUDO rm -rf "$ROOT"
$SUDO mv "$new" "$ROOT"
log "done: $("$ROOT/bin/deno" --version | head -1) with $mesa, $(du -shx "$ROOT" | cut -f1) in $ROOT"
