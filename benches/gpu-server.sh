#!/bin/bash
# benches/gpu-server.sh (docs/benchmarks.md, "Issue 31"): run on a GPU
# server as root, with OUT set to a folder for the outputs. Issue 31: doctor on the GPU server's own venv (cold, warm,
# comparator), then a full-stack local apply onto a copy missing the torch
# stack, doctor after it, the bytecode and RECORD check, and rollback.
set -u
BIN=${OVERLAY_BIN:-$PWD/devbin/overlay}   # the static release binary
chmod +x $BIN
VENV=$(python3 -c 'import sys;print(sys.prefix)')
SITE=$(python3 -c 'import sysconfig;print(sysconfig.get_paths()["purelib"])')
echo "venv $VENV site $SITE"; nproc; df -h /tmp "$VENV" | cat
python3 -V
echo "files: $(find $VENV -type f | wc -l), pyc: $(find $VENV -name '*.pyc' | wc -l), py: $(find $SITE -name '*.py' | wc -l)"
ls $SITE | grep -c dist-info
drop() { sync; echo 3 > /proc/sys/vm/drop_caches; }
t() { local s=$EPOCHREALTIME; "$@"; local rc=$?; python3 -c "import sys; print('TIME %.2f rc=%s :: %s' % (float(sys.argv[2]) - float(sys.argv[1]), sys.argv[3], sys.argv[4]))" "$s" "$EPOCHREALTIME" "$rc" "$*" >&2; return $rc; }
for i in 1 2; do
  rm -rf ~/.cache/overlay; drop; t $BIN doctor --venv $VENV > $OUT/doctor-cold.txt 2> $OUT/doctor-cold.err
  echo "(doctor cold $i: no hash cache, page cache dropped)"
  drop; t sh -c "find $VENV -type f -print0 | xargs -0 -P 16 -n 256 sha256sum > /dev/null"
  echo "(find|xargs -P16 sha256sum cold $i)"
done
t sh -c "find $VENV -type f -print0 | xargs -0 -P 16 -n 256 sha256sum > /dev/null"; echo "(find|xargs warm)"
$BIN doctor --venv $VENV > /dev/null 2>&1
for i in 1 2 3; do t $BIN doctor --venv $VENV > $OUT/doctor-warm.txt 2> $OUT/doctor-warm.err; done; echo "(doctor warm x3)"
drop; t $BIN doctor --venv $VENV > /dev/null 2>&1; echo "(doctor: hash cache kept, page cache dropped)"
OVERLAY_NO_HASH_CACHE=1 t $BIN doctor --venv $VENV > /dev/null 2>&1; echo "(doctor: no hash cache, page cache warm)"
cat $OUT/doctor-cold.err $OUT/doctor-warm.err
# A target: the same venv without the torch stack.
T=/tmp/t/venv; rm -rf /tmp/t; mkdir -p /tmp/t
t cp -a $VENV $T
TS=$T/${SITE#$VENV/}
( cd $TS && rm -rf torch torch-*.dist-info torchvision torchvision-*.dist-info torchvision.libs triton triton-*.dist-info nvidia nvidia_*.dist-info functorch torchgen )
$T/bin/python -V
cat > /tmp/t/overlay.toml <<TOML
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
cd /tmp/t
$BIN doctor --venv $T > $OUT/doctor-target-before.txt 2>&1; echo "doctor target before rc=$?"
find $T -name '*.pyc' | sort | xargs sha256sum > /tmp/t/pyc-before.txt
t $BIN plan src dst > $OUT/plan.txt 2>&1; echo "plan rc=$?"; tail -5 $OUT/plan.txt
drop; t $BIN apply > $OUT/apply.txt 2>&1; echo "apply rc=$?"; tail -3 $OUT/apply.txt
$BIN doctor --venv $T > $OUT/doctor-target-after.txt 2>&1; echo "doctor target after rc=$?"; tail -15 $OUT/doctor-target-after.txt
cat > /tmp/t/check.py <<'PY'
import base64, csv, hashlib, importlib.util, os, sys, sysconfig, json
site = sysconfig.get_paths()["purelib"]
py = valid = rows = bad = 0
for di in sorted(os.listdir(site)):
    if not di.endswith(".dist-info") or not di.split("-")[0].lower().startswith(("torch", "triton", "nvidia")):
        continue
    for row in csv.reader(open(os.path.join(site, di, "RECORD"), newline="")):
        p = os.path.normpath(os.path.join(site, row[0]))
        if row[0].endswith(".py") and not row[0].startswith(".."):
            py += 1
            try:
                h = open(importlib.util.cache_from_source(p), "rb").read(16); st = os.stat(p)
                valid += (int.from_bytes(h[8:12], "little") == int(st.st_mtime) & 0xFFFFFFFF and int.from_bytes(h[12:16], "little") == st.st_size & 0xFFFFFFFF)
            except OSError:
                pass
        if len(row) >= 3 and row[1].startswith("sha256="):
            rows += 1
            try:
                d = open(p, "rb").read()
                ok = row[1] == "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(d).digest()).rstrip(b"=").decode() and row[2] == str(len(d))
            except OSError:
                ok = False
            bad += not ok
print(json.dumps({"py": py, "valid_pyc": valid, "record_rows": rows, "bad_rows": bad}))
PY
echo "source: $(python3 /tmp/t/check.py)"; echo "target: $($T/bin/python /tmp/t/check.py)"
for v in $VENV $T; do for i in 1 2 3; do PYTHONDONTWRITEBYTECODE=1 t $v/bin/python -c "import torch" ; done; done
t $BIN rollback dst > $OUT/rollback.txt 2>&1; echo "rollback rc=$?"; cat $OUT/rollback.txt
find $T -name '*.pyc' | sort | xargs sha256sum > /tmp/t/pyc-after.txt
cmp /tmp/t/pyc-before.txt /tmp/t/pyc-after.txt && echo "pyc after rollback: same"
