#!/usr/bin/env bash
# `overlay pack` against `tar | zstd -T0 -3` of the same files (issue 32's
# goal: pack within 1.3x), on the real-wheel stack's source venv
# (benches/realstack.py), interleaved, REPS repetitions, the page cache
# dropped before every run. pack runs with the source as a local host (its
# agent on this machine, as `overlay pack` on the source host itself), once
# with overlay's hash cache emptied first (cold: every file read twice,
# once to hash it for the index, once into the bundle) and once with it
# kept (warm: the second and later packs of a host).
#
#   OVERLAY=target/x86_64-unknown-linux-musl/release/overlay benches/pack.sh [REPS]
#
# Prints one line per run and the medians; the bundles are checked to be
# byte-identical from run to run.
set -euo pipefail
BIN=${OVERLAY:-target/x86_64-unknown-linux-musl/release/overlay}
BIN=$(realpath "$BIN")
REPS=${1:-2}
SRC=${SRC:-/work/realstack/venvs/source}
OUT=${OUT:-/tmp/packbench}
[ -f "$SRC/pyvenv.cfg" ] || { echo "no venv at $SRC: run benches/realstack.py first" >&2; exit 2; }
rm -rf "$OUT"; mkdir -p "$OUT"
cd "$OUT"
cat > overlay.toml <<TOML
[hosts.src]
venv = "$SRC"
[sets.torch]
dists = ["torch"]
[sets.triton]
dists = ["triton"]
[sets.nvidia-cu13]
dists = ["nvidia-*", "cuda-*"]
[sets.torchvision]
dists = ["torchvision"]
TOML
cold() { sync; echo 3 > /proc/sys/vm/drop_caches 2>/dev/null || echo "(could not drop the page cache)" >&2; }
now() { date +%s.%N; }
hashcache() { rm -rf "$HOME/.cache/overlay/hashes"; }

# The files the bundle holds, for tar: its regular files and symlinks.
"$BIN" pack src -o first.ovl >/dev/null 2>first.log
zstd -dcq first.ovl | tar -t | sed -n 's#^venv/##p' | grep -v '/$' > files.txt
echo "bundle: $(wc -l < files.txt) files and symlinks, $(stat -c %s first.ovl) bytes"

declare -A T
for rep in $(seq "$REPS"); do
  for m in pack-cold pack-warm tar-zstd; do
    cold
    case $m in
      pack-cold) hashcache; t0=$(now); "$BIN" pack src -o "$m.ovl" >/dev/null 2>"$m.log"; t1=$(now)
        cmp -s first.ovl "$m.ovl" || { echo "pack-cold: not byte-identical to the first pack" >&2; exit 1; };;
      pack-warm) t0=$(now); "$BIN" pack src -o "$m.ovl" >/dev/null 2>"$m.log"; t1=$(now)
        cmp -s first.ovl "$m.ovl" || { echo "pack-warm: not byte-identical to the first pack" >&2; exit 1; };;
      tar-zstd) t0=$(now); tar -C "$SRC" --no-recursion -cf - -T files.txt | zstd -T0 -3 -q -f -o "$m.tar.zst"; sync -f "$m.tar.zst"; t1=$(now);;
    esac
    s=$(awk -v a="$t0" -v b="$t1" 'BEGIN { printf "%.2f", b - a }')
    T[$m]="${T[$m]:-} $s"
    case $m in tar-zstd) f=$m.tar.zst;; *) f=$m.ovl;; esac
    size=$(stat -c %s "$f")
    echo "rep $rep $m: $s s, $size bytes"
  done
done
med() { printf '%s\n' $1 | sort -n | awk '{a[NR]=$1} END {print (NR%2 ? a[(NR+1)/2] : (a[NR/2]+a[NR/2+1])/2)}'; }
tz=$(med "${T[tar-zstd]}")
for m in pack-cold pack-warm tar-zstd; do
  mm=$(med "${T[$m]}")
  echo "median $m: $mm s ($(awk -v a="$mm" -v b="$tz" 'BEGIN { printf "%.2f", a / b }')x tar|zstd)"
done
