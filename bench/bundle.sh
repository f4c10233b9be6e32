#!/usr/bin/env bash
# An offline bundle: what `bench/scale.sh` needs, beside this checkout, on a
# machine with Python 3.12 but no compiler, no stress-ng and no network (the
# 16-core machine of bench/README.md). Run from the repository root, after
# `make setup bench`:
#
#   bash bench/bundle.sh [DIR]      # DIR: default .dev (git ignores it)
#
# DIR gets whl/ (this checkout's wheel, its BPF objects inside, and the cp312
# wheels such a machine lacks, at the versions the venv tests; the largest
# xz-compressed), lib/ (libbpf, libelf and libz from this machine) and
# bin/storm (bench/switch_storm.c, static). bench/build/ gets the count-only
# floor's object. Carry both (`DIR` and `bench/build`) with the checkout; the
# two together stay under 64 MiB.
set -euo pipefail
DIR=${1:-.dev}
PY=.venv/bin/python
[ -x "$PY" ] || { echo "error: no .venv here: run make setup first" >&2; exit 2; }
rm -rf "$DIR/whl" "$DIR/lib" "$DIR/bin"
mkdir -p "$DIR/whl" "$DIR/lib/zlib" "$DIR/bin"

make wheel >/dev/null
cp "$(ls -t dist/kernmlops-*.whl | head -1)" "$DIR/whl/"

# what the machine's Python lacks (it has numpy, pyarrow, pyyaml, rich, click,
# psutil and prometheus-client): at the versions this venv runs the tests with
specs=()
for name in polars polars-runtime-32 pydantic pydantic-core annotated-types \
  typing-inspection typing-extensions pyelftools h11 thrift; do
  ver=$("$PY" -c 'import sys; from importlib.metadata import version; print(version(sys.argv[1]))' "$name")
  specs+=("$name==$ver")
done
"$PY" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
  --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 \
  --platform manylinux2014_x86_64 -d "$DIR/whl" "${specs[@]}"
# the polars runtime's 54 MB: re-zipped without deflate, then xz (about 30 MB: the
# carry's 64 MiB); scale.sh unpacks it
for w in "$DIR"/whl/polars_runtime*.whl; do
  "$PY" -c '
import sys, zipfile
src = sys.argv[1]
with zipfile.ZipFile(src) as zin, zipfile.ZipFile(src + ".stored", "w") as zout:
    for info in zin.infolist():
        zout.writestr(info, zin.read(info), compress_type=zipfile.ZIP_STORED)
' "$w"
  mv "$w.stored" "$w" && xz -T0 -9 "$w"
done

for lib in libbpf.so.1 libelf.so.1; do
  cp -L "$(ldconfig -p | awk -v l="$lib" '$1 == l && /x86-64/ {print $NF; exit}')" "$DIR/lib/"
done
cp -L "$(ldconfig -p | awk '$1 == "libz.so.1" && /x86-64/ {print $NF; exit}')" "$DIR/lib/zlib/"

gcc -O2 -static -o "$DIR/bin/storm" bench/switch_storm.c
"$PY" -c 'from bench.overhead import build_floor; print(build_floor())' >/dev/null

du -sh "$DIR" bench/build
