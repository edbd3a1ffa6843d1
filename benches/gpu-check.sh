#!/bin/bash
# benches/gpu-check.sh (issue 42): the GPU check on a real GPU server and
# its real stack, and what it costs the plan. Run as root (no sshd needed):
#
#   OUT=dir OVERLAY_BIN=overlay [BASE_BIN=overlay-before] [VENV=/path/to/venv] [REPS=2] bash benches/gpu-check.sh
#
# Prints, each also kept in OUT:
#   1. `overlay doctor --venv VENV`: the host's driver and GPUs, and
#      problems (a healthy server: none of kind gpu);
#   2. `overlay plan` (local route) from VENV to a copy of it without the
#      torch stack (torch, triton, the nvidia wheels, torchvision): the
#      machine lines and the predicted problems (0 new expected);
#   3. the same plan with an older driver faked in a private mount
#      namespace (570.172.08 bound over /proc/driver/nvidia/version and
#      /sys/module/nvidia/version): a CUDA 13 stack must be caught;
#   4. the same plan with 8 Tesla V100s faked (an nvidia-smi wrapper first
#      on PATH): the kernels' lists of the real libraries, per file;
#   5. timings: a cold plan (the agents' caches removed, the page cache
#      dropped) and a warm one, of this build and of BASE_BIN interleaved,
#      REPS times; "TIME method rep real user sys", medians at the end.
set -u
BIN=$(realpath "${OVERLAY_BIN:-$PWD/.dev/new/overlay}")
chmod +x "$BIN"
BUILDS="new=$BIN"
if [ -n "${BASE_BIN:-}" ]; then
  BASE=$(realpath "$BASE_BIN"); chmod +x "$BASE"; BUILDS="$BUILDS base=$BASE"
fi
REPS=${REPS:-2}
OUT=${OUT:-/tmp/gpu-check-out}
mkdir -p "$OUT"
VENV=${VENV:-$(python3 -c 'import sys;print(sys.prefix)')}
VENV=$(realpath "$VENV")
PY=$VENV/bin/python
SITE=$("$PY" -c 'import sysconfig;print(sysconfig.get_paths()["purelib"])')
W=${WORK:-/tmp/gpu-check}
rm -rf "$W"; mkdir -p "$W/t"
echo "venv $VENV; $("$PY" -V); $(nproc) cores; $("$BIN" --version 2>&1)"

echo "== 1. doctor --venv on the real stack"
"$BIN" doctor --venv "$VENV" > "$OUT/doctor.txt" 2> "$OUT/doctor.err"; echo "exit $?"
cat "$OUT/doctor.err"; head -40 "$OUT/doctor.txt"
"$BIN" doctor --venv "$VENV" --json > "$OUT/doctor.json" 2>/dev/null

cd "$SITE" || exit 2
STACK=$(ls -d torch torch-*.dist-info torchvision torchvision-*.dist-info torchvision.libs \
  triton triton-*.dist-info nvidia nvidia_*.dist-info functorch torchgen 2>/dev/null)
T=$W/t/venv
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

echo "== 2. plan of the stack onto a copy without it (this host's real driver and GPUs)"
"$BIN" plan src dst > "$OUT/plan.txt" 2>&1; echo "exit $?"
grep -v '^  [a-z]* ' "$OUT/plan.txt" | head -40
"$BIN" plan src dst --json -o "$W/p.json" > "$OUT/plan.json" 2>/dev/null

echo "== 3. the same plan with driver 570.172.08 faked"
echo "NVRM version: NVIDIA UNIX x86_64 Kernel Module  570.172.08  Tue Jul  8 18:26:53 UTC 2025" > "$W/fake-version"
echo "570.172.08" > "$W/fake-sys-version"
unshare --mount --propagation private sh -c '
  mount --bind "$1" /proc/driver/nvidia/version && mount --bind "$2" /sys/module/nvidia/version &&
  cat /proc/driver/nvidia/version && "$3" plan src dst -o "$4"' sh \
  "$W/fake-version" "$W/fake-sys-version" "$BIN" "$W/p570.json" > "$OUT/plan-570.txt" 2>&1
echo "exit $?"; grep -v '^  [a-z]* ' "$OUT/plan-570.txt" | head -40

echo "== 4. the same plan with 8 Tesla V100s faked (nvidia-smi wrapper)"
mkdir -p "$W/smi"
cat > "$W/smi/nvidia-smi" <<'SH'
#!/bin/sh
case "$*" in
  *--query-gpu=*) for i in 1 2 3 4 5 6 7 8; do echo "Tesla V100-SXM2-32GB, 7.0, 32768"; done ;;
  *) exit 0 ;;
esac
SH
chmod +x "$W/smi/nvidia-smi"
PATH="$W/smi:$PATH" "$BIN" plan src dst -v -o "$W/pv100.json" > "$OUT/plan-v100.txt" 2>&1
echo "exit $?"; grep -E 'gpu|predicted|dst:' "$OUT/plan-v100.txt" | head -60

echo "== 5. cold and warm plan timings"
declare -A R
TIMEFORMAT='%R %U %S'
for rep in $(seq "$REPS"); do
  for b in $BUILDS; do
    name=${b%%=*}; bin=${b#*=}; sfx=""; [ "$name" = new ] || sfx="-$name"
    rm -rf ~/.cache/overlay; sync; echo 3 > /proc/sys/vm/drop_caches
    t=$( { time "$bin" plan src dst -q -o "$W/pt.json" > "$OUT/cold$sfx-$rep.txt" 2>&1 ; } 2>&1 )
    echo "TIME cold$sfx $rep $t"; R[cold$sfx]="${R[cold$sfx]:-} ${t%% *}"
    t=$( { time "$bin" plan src dst -q -o "$W/pt.json" > "$OUT/warm$sfx-$rep.txt" 2>&1 ; } 2>&1 )
    echo "TIME warm$sfx $rep $t"; R[warm$sfx]="${R[warm$sfx]:-} ${t%% *}"
  done
done
for m in "${!R[@]}"; do
  echo "MEDIAN $m $(echo ${R[$m]} | tr ' ' '\n' | sort -n | awk '{a[NR]=$1} END {print (NR%2 ? a[(NR+1)/2] : (a[NR/2]+a[NR/2+1])/2)}') (${R[$m]} )"
done | sort
