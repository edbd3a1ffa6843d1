#!/bin/bash
# benches/gpu-perf.sh (docs/benchmarks.md, "Issue 33"): the local route,
# rollback and bundles against what the host's storage allows, on a GPU
# server (no sshd needed). Run as root:
#
#   OUT=dir OVERLAY_BIN=overlay [BASE_BIN=overlay-before] [VENV=/path/to/venv] [REPS=2] [CACHE=cold|warm] bash benches/gpu-perf.sh
#
# With BASE_BIN, that build's apply and rollback run too, interleaved
# (methods suffixed "-base"): before and after in the same run.
# The source is VENV (default: the venv of the `python3` on PATH); the
# target is a copy of it without the torch stack (torch, triton, the nvidia
# wheels, torchvision), so an apply adds the whole stack and its rollback
# removes it. REPS repetitions, the methods interleaved, the page cache
# dropped and `sync` run before every timed command (CACHE=warm: then the
# stack's files read back into it, and the storage's own limits, which are
# cold reads and writes, not timed), and `sync` inside every timing
# (overlay makes its files durable itself; the others are given the same):
#   read-1 / read-8 / read-16  cold read of the stack's files, 1 / 8 / 16 readers
#   write-1 / write-4 the stack's size written (dd, 4 MiB blocks, fdatasync), 1 writer / 4 writers
#   read8+write4      read-8 and write-4 at once: what a copy that reads and writes
#                     all it can at the same time gets from this storage
#   tar-tar           tar cf - | tar xf - of the stack into a scratch folder
#   cp-a              cp -a of the stack into a scratch folder
#   cp-8              the same files copied by 8 cp processes at once (the folders made first,
#                     then xargs -P 8 cp -a --parents)
#   rm-rf             rm -rf of the tar-tar copy
#   apply             overlay apply (local route) of a fresh plan (made untimed)
#   apply-lanesN      the same with OVERLAY_COPY_LANES=N (ALT_LANES, default 1: one copying thread)
#   rollback          overlay rollback of that generation
#   apply-bundle      overlay apply --bundle of a bundle of the stack (packed once, untimed)
#   rollback-bundle   overlay rollback --venv of that generation
# Each line: "TIME method rep real user sys" (user and sys: the command's
# children's CPU, from bash's `time`); overlay's -vv stage marks go to
# OUT/METHOD-REP.err. Medians at the end. ONLY="METHOD ..." times just
# those methods.
set -u
BIN=$(realpath "${OVERLAY_BIN:-$PWD/devbin/overlay}")
chmod +x "$BIN"
BUILDS="new=$BIN"
if [ -n "${BASE_BIN:-}" ]; then
  BASE=$(realpath "$BASE_BIN"); chmod +x "$BASE"; BUILDS="$BUILDS base=$BASE"
fi
REPS=${REPS:-2}
CACHE=${CACHE:-cold}
ALT=${ALT_LANES:-1}
OUT=${OUT:-/tmp/gpu-perf-out}
mkdir -p "$OUT"
VENV=${VENV:-$(python3 -c 'import sys;print(sys.prefix)')}
PY=$VENV/bin/python
SITE=$("$PY" -c 'import sysconfig;print(sysconfig.get_paths()["purelib"])')
W=${WORK:-/tmp/gpu-perf}
rm -rf "$W"; mkdir -p "$W"
echo "venv $VENV site $SITE; $(nproc) cores; $("$PY" -V)"
df -h "$W" "$VENV" | cat

cd "$SITE" || exit 2
STACK=$(ls -d torch torch-*.dist-info torchvision torchvision-*.dist-info torchvision.libs \
  triton triton-*.dist-info nvidia nvidia_*.dist-info functorch torchgen 2>/dev/null)
find $STACK \( -type f -o -type l \) > "$W/files.txt"
STACK_BYTES=$(du -scb --apparent-size $STACK | tail -1 | cut -f1)
echo "stack: $(wc -l < "$W/files.txt") files and symlinks, $STACK_BYTES bytes"

T=$W/t/venv; mkdir -p "$W/t"
cp -a "$VENV" "$T"
TS=$T/${SITE#"$VENV"/}
(cd "$TS" && rm -rf $STACK)
cat > "$W/t/overlay.toml" <<TOML
[hosts.src]
venv = "$VENV"
[hosts.dst]
venv = "$T"
[sets.torch]
dists = ["torch"]
[sets.triton]
dists = ["triton"]
[sets.nvidia]
dists = ["nvidia-*"]
[sets.torchvision]
dists = ["torchvision"]
TOML
cd "$W/t" || exit 2
"$BIN" pack src -o "$W/stack.ovl" > /dev/null 2> "$OUT/pack.err" || { echo "pack failed"; cat "$OUT/pack.err"; exit 1; }
echo "bundle: $(stat -c %s "$W/stack.ovl") bytes"

drop() {
  sync; echo 3 > /proc/sys/vm/drop_caches
  [ "$CACHE" = warm ] && read_n 16
}
declare -A R
TIMEFORMAT='%R %U %S'
run() { # run METHOD REP CMD...: drop the cache, time CMD; sync
  local m=$1 rep=$2; shift 2
  # ONLY="m1 m2 ...": time just these methods (the others are skipped).
  [ -z "${ONLY:-}" ] || [[ " $ONLY " == *" $m "* ]] || return 0
  drop
  local t
  t=$( { time { "$@" > "$OUT/$m-$rep.out" 2> "$OUT/$m-$rep.err"; echo $? > "$W/rc"; sync; } ; } 2>&1 )
  local rc; rc=$(cat "$W/rc")
  echo "TIME $m $rep $t rc=$rc"
  [ "$rc" = 0 ] || { echo "  $m failed:"; tail -5 "$OUT/$m-$rep.err"; }
  R[$m]="${R[$m]:-} ${t%% *}"
}
read_n() { # read_n N: cat every file, N readers
  (cd "$SITE" && tr '\n' '\0' < "$W/files.txt" | xargs -0 -P "$1" -n 64 cat > /dev/null)
}
tar_tar() { mkdir -p "$W/scratch" && tar -C "$SITE" -cf - $STACK | tar -C "$W/scratch" -xf -; }
write_n() { # write_n N: the stack's size in N files written at once
  local mb=$(( STACK_BYTES / 1048576 / 4 / $1 )) i
  for i in $(seq "$1"); do dd if=/dev/zero of="$W/w$i" bs=4M count="$mb" conv=fdatasync status=none & done
  wait; rm -f "$W"/w[0-9]*
}
cp_a() { mkdir -p "$W/scratch2" && (cd "$SITE" && cp -a $STACK "$W/scratch2/"); }
cp_8() {
  # The folders first (cp --parents of two files in one new folder at once races on its mkdir).
  mkdir -p "$W/scratch3" && (cd "$SITE" && find $STACK -type d -print0) | (cd "$W/scratch3" && xargs -0 mkdir -p) &&
    (cd "$SITE" && tr '\n' '\0' < "$W/files.txt" | xargs -0 -P 8 -n 64 cp -a --parents -t "$W/scratch3")
}
read_write() { read_n 8 & write_n 4 & wait; }

for rep in $(seq "$REPS"); do
  if [ "$CACHE" = cold ]; then
    run read-1 "$rep" read_n 1
    run read-8 "$rep" read_n 8
    run read-16 "$rep" read_n 16
    run write-1 "$rep" write_n 1
    run write-4 "$rep" write_n 4
    run read8+write4 "$rep" read_write
  fi
  run tar-tar "$rep" tar_tar
  run cp-a "$rep" cp_a
  rm -rf "$W/scratch2"
  run cp-8 "$rep" cp_8
  rm -rf "$W/scratch3"
  run rm-rf "$rep" rm -rf "$W/scratch"
  for b in $BUILDS; do
    name=${b%%=*}; bin=${b#*=}; sfx=""; [ "$name" = new ] || sfx="-$name"
    "$bin" plan src dst > "$OUT/plan$sfx-$rep.txt" 2>&1 || { echo "plan failed"; tail "$OUT/plan$sfx-$rep.txt"; exit 1; }
    run "apply$sfx" "$rep" "$bin" apply -vv
    run "rollback$sfx" "$rep" "$bin" rollback dst -vv
    if [ "$name" = new ]; then
      "$bin" plan src dst > /dev/null 2>&1
      run "apply-lanes$ALT" "$rep" env OVERLAY_COPY_LANES="$ALT" "$bin" apply -vv
      run "rollback-lanes$ALT" "$rep" "$bin" rollback dst -vv
    fi
    [ "$name" = new ] || continue   # the bundle's route did not change
    run "apply-bundle$sfx" "$rep" "$bin" apply --bundle "$W/stack.ovl" --venv "$T" -vv
    run "rollback-bundle$sfx" "$rep" "$bin" rollback --venv "$T" -vv
  done
done
echo "medians (s):"
echo "cache: $CACHE"
for m in read-1 read-8 read-16 write-1 write-4 read8+write4 tar-tar cp-a cp-8 rm-rf apply "apply-lanes$ALT" rollback "rollback-lanes$ALT" apply-bundle rollback-bundle \
  apply-base rollback-base apply-bundle-base rollback-bundle-base; do
  [ -n "${R[$m]:-}" ] || continue
  echo "$m ${R[$m]}" | python3 -c 'import sys,statistics; f=sys.stdin.read().split(); print("  %-16s %6.2f   (%s)" % (f[0], statistics.median(map(float, f[1:])), " ".join(f[1:])))'
done
