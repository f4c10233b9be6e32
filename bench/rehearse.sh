#!/usr/bin/env bash
# Rehearse bench/scale.sh as the 16-core machine runs it, install path
# included: an Ubuntu 24.04 root (Python 3.12, no compiler, no clang) in a
# chroot on this machine; in it a venv with what that machine's Python brings
# (numpy, pyarrow, pyyaml, rich, click, psutil, prometheus-client), a clean
# clone of this checkout with .dev and bench/build beside it (what the device
# run carries), and scale.sh run with LOCAL=0: the cp312 wheels installed with
# pip --no-index, kernmlops run from them, libbpf from .dev/lib.
#
#   bash bench/bundle.sh && bash bench/rehearse.sh [ROOT]
#
# ROOT (default /var/tmp/kmo-noble) is made once with debootstrap (root, the
# Ubuntu archive, ~2 min) and kept. BUDGET_S, STORM_S and STORM_TREE_S are
# passed on (default 150, 2, 6: short runs; the phases wait for a quiet
# machine, so run it alone). The results land in ROOT/tmp/out.
set -euo pipefail
ROOT=${1:-/var/tmp/kmo-noble}
REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
MIRROR=${MIRROR:-http://archive.ubuntu.com/ubuntu}
[ "$(id -u)" = 0 ] || { echo "error: rehearse.sh needs root (debootstrap, chroot, BPF)" >&2; exit 2; }
[ -d "$REPO/.dev/whl" ] || { echo "error: no .dev/whl: run bash bench/bundle.sh first" >&2; exit 2; }
# root chroots into ROOT and runs what is there: it must be root's alone (the
# default lies in a folder every user may write in)
if [ -e "$ROOT" ] || [ -L "$ROOT" ]; then
  if [ -L "$ROOT" ] || [ "$(stat -c %u "$ROOT")" != 0 ] || (( 0$(stat -c %a "$ROOT") & 022 )); then
    echo "error: $ROOT is a link, another user's, or writable by others: give another ROOT" >&2
    exit 2
  fi
fi

if [ ! -x "$ROOT/usr/bin/python3.12" ]; then
  command -v debootstrap >/dev/null || apt-get install -y debootstrap zstd
  script=/usr/share/debootstrap/scripts/noble
  [ -e "$script" ] || script=/usr/share/debootstrap/scripts/gutsy # Ubuntu's common script
  [ -d "$ROOT" ] || mkdir -m 0755 "$ROOT"
  debootstrap --no-check-gpg --variant=minbase --components=main,universe \
    --include=python3.12,python3-pip,python3.12-venv,xz-utils,procps noble "$ROOT" "$MIRROR" "$script"
fi
if ! chroot "$ROOT" /opt/torch/.venv/bin/python3 -c "import numpy, pyarrow, yaml, rich, click, psutil, prometheus_client" 2>/dev/null; then
  # that machine's Python comes with these; downloaded here for cp312 (the
  # chroot's pip may not trust this machine's TLS proxy)
  rm -rf "$ROOT/tmp/hostwhl" && mkdir -p "$ROOT/tmp/hostwhl"
  "$REPO/.venv/bin/pip" download -q --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
    -d "$ROOT/tmp/hostwhl" numpy pyarrow pyyaml rich click psutil prometheus-client
  chroot "$ROOT" python3.12 -m venv /opt/torch/.venv
  chroot "$ROOT" sh -c '/opt/torch/.venv/bin/pip install -q --no-index /tmp/hostwhl/*.whl'
fi

# what the device run gets: the tracked and untracked files, .dev and bench/build
rm -rf "$ROOT/repo" "$ROOT/tmp/out" "$ROOT/tmp/kmo-site"
git clone -q "$REPO" "$ROOT/repo"
git -C "$REPO" ls-files --others --exclude-standard -z | (cd "$REPO" && xargs -0r cp --parents -t "$ROOT/repo")
cp -a "$REPO/.dev" "$ROOT/repo/.dev"
cp -a "$REPO/bench/build" "$ROOT/repo/bench/build"

cleanup() { for m in sys dev proc; do umount -R -l "$ROOT/$m" 2>/dev/null || true; done; }
trap cleanup EXIT
mount -t proc proc "$ROOT/proc"
for m in sys dev; do mount --rbind "/$m" "$ROOT/$m" && mount --make-rslave "$ROOT/$m"; done
chroot "$ROOT" env -i PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin HOME=/root \
  OUT=/tmp/out BUDGET_S="${BUDGET_S:-150}" STORM_S="${STORM_S:-2}" STORM_TREE_S="${STORM_TREE_S:-6}" \
  bash -c 'if command -v clang; then echo "error: clang in the chroot" >&2; exit 2; fi
           cd /repo && bash bench/scale.sh'
echo "results: $ROOT/tmp/out"
