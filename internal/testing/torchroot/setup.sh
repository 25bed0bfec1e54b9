#!/usr/bin/env bash
# Makes the torch root: a minimal Debian trixie tree holding trixie's
# python3-torch (torch 2.6 on Python 3.13) and torchvision, so that the Python
# bindings' tests also run on a torch 2.x where the host's Debian (bookworm)
# has torch 1.13. internal/testing/torchroot/python3 runs its interpreter;
# GOROVOD_TEST_PYTHON names that to the tests of bindings/python:
#
#   sudo internal/testing/torchroot/setup.sh
#   GOROVOD_TEST_PYTHON=$PWD/internal/testing/torchroot/python3 go test ./bindings/python
#
# Needs root and Debian's archive (debootstrap and apt-get fetch from it):
# 1.5 GB on disk, 2 min 11 s where it was first made. Does nothing when
# the root is there and imports torch. GOROVOD_TORCH_ROOT places it
# (default /var/cache/gorovod/torch-root, outside any checkout).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=${GOROVOD_TORCH_ROOT:-/var/cache/gorovod/torch-root}
mirror=${GOROVOD_DEBIAN_MIRROR:-http://deb.debian.org/debian}

if GOROVOD_TORCH_ROOT=$root "$here/python3" -c 'import torch, torchvision, cloudpickle, setuptools.command' 2>/dev/null; then
  exit 0
fi
if ! command -v debootstrap >/dev/null 2>&1; then
  apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends debootstrap
fi
# Built beside the root and moved into place whole, so that an interrupted run
# leaves no half root that the check above would take.
rm -rf "$root.new"
mkdir -p "$(dirname "$root")"
debootstrap --variant=minbase trixie "$root.new" "$mirror"
chroot "$root.new" env DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends \
  python3-torch python3-torchvision python3-cloudpickle python3-setuptools libopenblas0-pthread
chroot "$root.new" apt-get clean
# Where python3 mounts the host's /usr/share/datasets in the root's /usr.
mkdir -p "$root.new/usr/share/datasets"
rm -rf "$root"
mv "$root.new" "$root"
GOROVOD_TORCH_ROOT=$root "$here/python3" -c 'import sys, torch; print("torch root:", torch.__version__, "on Python", sys.version.split()[0])'
