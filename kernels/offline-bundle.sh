#!/usr/bin/env bash
# Build the offline bundle a GPU host without network needs for `make test-gpu` and `make bench`:
#   .devbundle/site.tar.xz  TileLang and the packages it imports that a torch host lacks, and
#                           FlashMLA's sparse decode (sgl-flash-mla), unpacked as one site folder
#   .devbundle/sgl/         SGLang's tilelang_kernel.py from the pinned wheel (the benchmark's baseline)
#   .devbundle/BUNDLE       what is in it; kernels.mk unpacks site.tar.xz again when this changes
#
#   bash kernels/offline-bundle.sh [--python 3.12] [--platform x86_64|aarch64] [--out .devbundle]
#
# Runs on any machine with python3 >= 3.11, pip and network (`make gpu-bundle`). The GPU host
# needs python3 of the same version with torch, triton, numpy and pytest; copy the folder to the
# checkout there and the make targets put site/ on PYTHONPATH (kernels/kernels.mk).
set -euo pipefail
cd "$(dirname "$0")/.."

python_version=3.12
platform=x86_64
out=.devbundle
while [ $# -gt 0 ]; do
  case "$1" in
    --python|--platform|--out)
      [ -n "${2:-}" ] || { echo "offline-bundle.sh: $1 needs a value" >&2; exit 2; } ;;
  esac
  case "$1" in
    --python) python_version=$2; shift 2 ;;
    --platform) platform=$2; shift 2 ;;
    --out) out=$2; shift 2 ;;
    *) echo "offline-bundle.sh: unknown argument '$1' (use --python X.Y, --platform x86_64|aarch64, --out DIR)" >&2
       exit 2 ;;
  esac
done
case "$platform" in
  x86_64|aarch64) ;;
  *) echo "offline-bundle.sh: --platform must be x86_64 or aarch64, not '$platform'" >&2; exit 2 ;;
esac
[[ "$python_version" =~ ^3\.[0-9]+$ ]] || { echo "offline-bundle.sh: --python takes X.Y, e.g. 3.12" >&2; exit 2; }

# The pinned versions: dsaops/pins.toml, the one place they are written, with each wheel file's sha256
# (check: one line and exit 2 for a file that is not the one pinned).
pin() { PYTHONPATH=. python3 -m dsaops.pins "$1"; }
check() { PYTHONPATH=. python3 -m dsaops.pins --check-wheel "$@"; }
sglang=$(pin sglang)
tilelang=$(pin tilelang)
flashmla=$(pin sgl-flash-mla)
# What TileLang imports beyond torch, triton and numpy (pins.toml's offline-bundle table)
bundled=$(pin --bundle)
mapfile -t needs <<< "$bundled"

# Everything is made in $work and $stage (beside $out, so that its files move in by rename): a build
# that fails leaves the bundle before it whole.
work=$(mktemp -d)
made=""
[ -d "$out" ] || made=$out
mkdir -p "$out"
stage=$(mktemp -d "$out/.partial.XXXXXX")
# rmdir: an $out this run made and left empty; a folder the user gave stays
trap 'rm -rf "$work" "$stage"; [ -z "$made" ] || rmdir "$made" 2>/dev/null || true' EXIT
tags=()
# pip takes the first tag a wheel has; manylinux_2_34 last, for the aarch64 wheels of TileLang and z3
# (glibc 2.34 on the host)
for t in manylinux_2_28 manylinux_2_27 manylinux_2_24 manylinux_2_17 manylinux2014 manylinux_2_34; do
  tags+=(--platform "${t}_$platform")
done

echo "== wheels for CPython $python_version on $platform: tilelang $tilelang, sgl-flash-mla $flashmla"
python3 -m pip download -q --no-deps --only-binary=:all: --python-version "$python_version" \
  --implementation cp "${tags[@]}" -d "$work/wheels" \
  "tilelang==$tilelang" "sgl-flash-mla==$flashmla" "${needs[@]}"
check "$work"/wheels/*.whl --downloaded
mkdir -p "$work/site"
for wheel in "$work"/wheels/*.whl; do python3 -m zipfile -e "$wheel" "$work/site"; done

# Some wheels ship one shared library under two names (z3's libz3.so): keep one file and a link.
python3 - "$work/site" <<'EOF'
import hashlib, os, sys
from pathlib import Path

first = {}
for path in sorted(Path(sys.argv[1]).rglob("*.so*")):
    if path.is_symlink() or not path.is_file() or path.stat().st_size < (1 << 20):
        continue
    digest = (path.parent, hashlib.sha256(path.read_bytes()).hexdigest())
    if digest in first:
        path.unlink()
        path.symlink_to(first[digest].name)
    else:
        first[digest] = path
EOF

echo "== SGLang $sglang's tilelang_kernel.py"
kernel=sglang/kernels/ops/attention/dsa/tilelang_kernel.py
mkdir -p "$stage/sgl/$(dirname "$kernel")"
baseline() {
  python3 - "$1" "$kernel" "$stage/sgl/$kernel" <<'EOF'
import sys, zipfile, zlib

wheel, member, dest = sys.argv[1:]
try:
    with zipfile.ZipFile(wheel) as z:
        data = z.read(member)  # checks the member's CRC
except (OSError, EOFError, KeyError, zipfile.BadZipFile, zlib.error) as e:
    sys.exit(f"offline-bundle.sh: {wheel}: no whole {member} in it ({e})")
with open(dest, "wb") as f:
    f.write(data)
EOF
}
# The cached wheel (any platform's: the kernel is Python), else, when there is none or it is damaged, a download;
# either only with its pinned sha256 (a whole zip can still be another file).
shopt -s nullglob
cached=("${DSAOPS_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/dsaops}"/wheels/sglang-"$sglang"-*.whl)
shopt -u nullglob
if [ ${#cached[@]} -eq 0 ] || ! baseline "${cached[0]}"; then
  python3 -m pip download -q --no-deps "sglang==$sglang" -d "$work/sglang"
  downloaded=$(ls "$work"/sglang/sglang-"$sglang"-*.whl)
  check "$downloaded" --downloaded
  baseline "$downloaded"
else
  check "${cached[0]}"
fi

manifest="python $python_version $platform; tilelang $tilelang; sgl-flash-mla $flashmla; sglang $sglang; ${needs[*]}"
echo "$manifest" > "$work/site/BUNDLE"
echo "$manifest" > "$stage/BUNDLE"
tar -C "$work" -cf - site | xz -T0 -6 > "$stage/site.tar.xz"
size=$(du -sb "$stage" | cut -f1)
if [ "$size" -gt $((64 << 20)) ]; then
  echo "offline-bundle.sh: the bundle is $((size >> 20)) MiB, over the 64 MiB a carried folder may take" >&2
  exit 1
fi
# BUNDLE last: kernels.mk unpacks site.tar.xz again when BUNDLE changes
rm -rf "$out/sgl"
mv "$stage/sgl" "$stage/site.tar.xz" "$out/"
mv "$stage/BUNDLE" "$out/BUNDLE"
du -sh "$out"
