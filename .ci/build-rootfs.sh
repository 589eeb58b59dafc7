#!/usr/bin/env bash
# Build (once) a Debian bookworm root filesystem for the tests that need a whole OS: the systemd unit and polkit
# rule tests (booted with systemd-nspawn: a real PID 1 systemd, system bus and polkitd) and the container image
# test (the rootfs becomes the local base image that stands in for python:3.x-slim, which cannot be pulled here).
#
# Usage:  eval "$(.ci/build-rootfs.sh)"
# stdout carries exactly one line, for eval:  VLLM_SIDECAR_ROOTFS=<dir>
# (libpam-systemd provides the logind that polkitd depends on.)
# Everything else goes to stderr. The folder is keyed on this script's hash (the package list lives here) and
# reused once its ".complete" marker exists. Tests copy it; they never change it. Cold: about 2-3 min, 400 MB.
set -euo pipefail

REPO_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
CACHE="${VLLM_SIDECAR_CACHE:-$HOME/.cache/vllm-sidecar}"
MIRROR="${VLLM_SIDECAR_DEBIAN_MIRROR:-http://deb.debian.org/debian}"
PACKAGES="systemd,systemd-sysv,dbus,libpam-systemd,polkitd,python3,python3-venv,ca-certificates"

log() { printf '[build-rootfs] %s\n' "$*" >&2; }

key=$(sha256sum "$REPO_ROOT/.ci/build-rootfs.sh" | cut -c1-16)
ROOTFS="$CACHE/rootfs-bookworm-$key"
mkdir -p "$CACHE"
if command -v flock >/dev/null 2>&1; then
    exec 9>"$CACHE/.rootfs.lock"
    flock 9
fi
if [[ ! -f "$ROOTFS/.complete" ]]; then
    command -v debootstrap >/dev/null || { log "debootstrap is not installed (apt-get install debootstrap)"; exit 1; }
    start=$SECONDS
    rm -rf "$ROOTFS" "$ROOTFS.tmp"
    log "debootstrap bookworm ($PACKAGES) into $ROOTFS"
    if ! debootstrap --variant=minbase --include="$PACKAGES" bookworm "$ROOTFS.tmp" "$MIRROR" >"$CACHE/rootfs.log" 2>&1; then
        tail -20 "$CACHE/rootfs.log" >&2
        log "debootstrap failed (full log: $CACHE/rootfs.log)"
        exit 1
    fi
    # apt's caches are 30+ MB the tests never need.
    rm -rf "$ROOTFS.tmp/var/cache/apt/archives/"*.deb "$ROOTFS.tmp/var/lib/apt/lists/"*
    mv "$ROOTFS.tmp" "$ROOTFS"
    touch "$ROOTFS/.complete"
    log "built in $((SECONDS - start)) s ($(du -sh "$ROOTFS" | cut -f1))"
else
    log "reusing $ROOTFS"
fi
echo "VLLM_SIDECAR_ROOTFS=$ROOTFS"
