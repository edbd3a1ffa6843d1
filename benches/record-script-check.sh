#!/bin/bash
# benches/record-script-check.sh (issue 43): after overlay's own apply,
# `overlay doctor` finds no problem that the source lacks, on a real stack.
# Run as root on a host with a real venv (no sshd needed):
#
#   OUT=dir OVERLAY_BIN=overlay [VENV=/path/to/venv] [WORK=/tmp/record-check] bash benches/record-script-check.sh
#
# The target is a copy of VENV (default: the venv of the `python3` on PATH)
# at another path (`cp -a`, as operators clone environments: every RECORD
# byte-identical to the source's, every script still naming VENV) without
# the console and GUI scripts of its distributions (entry_points.txt). The
# plan of every distribution (local route) places the scripts with their
# shebang for the copy; the RECORDs that list them must be in the plan
# (replaced although alike) and, after the apply, describe them. Printed:
# the scripts removed, the RECORDs the plan replaces, `overlay doctor` of
# the source and of the copy (`--venv`), the copy's problems the source
# lacks, a "changed" finding for any removed script (each one a FAIL), what
# a second plan lists, and whether rollback brought every RECORD of the
# copy back byte for byte. Everything goes to OUT as well
# (plan.json, doctor-src.json, doctor-copy.json, apply.err, ...). Exit 0
# when no FAIL line was printed.
set -u
BIN=$(realpath "${OVERLAY_BIN:-$PWD/devbin/overlay}")
chmod +x "$BIN"
OUT=${OUT:-/tmp/record-check-out}
mkdir -p "$OUT"
VENV=${VENV:-$(python3 -c 'import sys;print(sys.prefix)')}
VENV=$(realpath "$VENV")
PY=$VENV/bin/python
W=${WORK:-/tmp/record-check}
rm -rf "$W"; mkdir -p "$W/t"
C=$W/t/venv
echo "venv $VENV; $("$PY" -V); $("$BIN" --version 2>&1)"
cp -a "$VENV" "$C" || { echo "FAIL: cp -a $VENV $C"; exit 2; }
SITE_REL=$("$PY" -c 'import os,sys,sysconfig;print(os.path.relpath(sysconfig.get_paths()["purelib"], sys.prefix))')

# The console and GUI scripts of every distribution, removed from the copy:
# "DIST bin/NAME" per line.
"$PY" - "$C" "$SITE_REL" > "$OUT/removed.txt" <<'PY'
import configparser, os, sys
copy, site_rel = sys.argv[1], sys.argv[2]
site = os.path.join(copy, site_rel)
for di in sorted(os.listdir(site)):
    ep = os.path.join(site, di, "entry_points.txt")
    if not di.endswith(".dist-info") or not os.path.isfile(ep):
        continue
    cp = configparser.ConfigParser(interpolation=None, delimiters=("=",))
    cp.optionxform = str
    try:
        cp.read(ep, encoding="utf-8")
    except configparser.Error:
        continue
    for section in ("console_scripts", "gui_scripts"):
        if not cp.has_section(section):
            continue
        for name in cp[section]:
            p = os.path.join(copy, "bin", name)
            if os.path.isfile(p) and not os.path.islink(p):
                os.remove(p)
                print(di.split("-")[0], "bin/" + name)
PY
echo "removed from the copy: $(wc -l < "$OUT/removed.txt") scripts"
sed 's/^/  /' "$OUT/removed.txt"
[ -s "$OUT/removed.txt" ] || { echo "FAIL: no console script to remove"; exit 2; }
(cd "$C/$SITE_REL" && sha256sum ./*.dist-info/RECORD) > "$W/records.sha256"

cat > "$W/t/overlay.toml" <<TOML
[hosts.src]
venv = "$VENV"
[hosts.dst]
venv = "$C"
[sets.all]
dists = ["*"]
TOML
cd "$W/t" || exit 2
FAIL=0
fail() { echo "FAIL: $*"; FAIL=1; }

"$BIN" plan src dst --json > "$OUT/plan.json" 2> "$OUT/plan.err" || { cat "$OUT/plan.err"; echo "FAIL: plan"; exit 1; }
python3 - "$OUT/plan.json" "$OUT/removed.txt" <<'PY' || FAIL=1
import json, sys
plan = json.load(open(sys.argv[1]))
removed = [l.split()[1] for l in open(sys.argv[2]) if l.strip()]
changes = [c for s in plan["sets"] for c in s["changes"]]
by = {}
for c in changes:
    by.setdefault(c["action"], []).append(c["path"])
print("plan: " + ", ".join(f"{a} {len(p)}" for a, p in sorted(by.items())))
records = sorted(p for p in by.get("replace", []) if p.endswith(".dist-info/RECORD"))
print(f"RECORDs the plan replaces: {len(records)}")
for r in records:
    print("  " + r)
added = set(by.get("add", []))
missing = [s for s in removed if "../../../" + s not in added]
if missing:
    print("FAIL: removed scripts the plan does not add: " + " ".join(missing))
    sys.exit(1)
PY

"$BIN" apply -vv > "$OUT/apply.out" 2> "$OUT/apply.err" || { tail "$OUT/apply.err"; echo "FAIL: apply"; exit 1; }
grep -E "route|Applied|drift" "$OUT/apply.err" | head -5
"$BIN" doctor --venv "$VENV" --json > "$OUT/doctor-src.json" 2> "$OUT/doctor-src.err"
"$BIN" doctor --venv "$C" --json > "$OUT/doctor-copy.json" 2> "$OUT/doctor-copy.err"
"$BIN" doctor --venv "$C" > "$OUT/doctor-copy.txt" 2>&1
python3 - "$OUT/doctor-src.json" "$OUT/doctor-copy.json" "$OUT/removed.txt" <<'PY' || FAIL=1
import json, sys
def problems(path):
    doc = json.load(open(path))
    return [f for f in doc["report"]["findings"] if f.get("class") != "note"]
src, copy = problems(sys.argv[1]), problems(sys.argv[2])
key = lambda f: (f["kind"], f.get("path") or "", f.get("dist") or "")
known = {key(f) for f in src}
print(f"doctor: source {len(src)} problems, copy after the apply {len(copy)}")
for f in copy:
    print(f"  copy: {f['kind']}: {f.get('dist') or ''} {f.get('path') or ''}: {f['reason']}")
new = [f for f in copy if key(f) not in known]
print(f"problems of the copy the source lacks: {len(new)}")
for f in new:
    print(f"  NEW {f['kind']}: {f.get('dist') or ''} {f.get('path') or ''}: {f['reason']}")
removed = {"../../../" + l.split()[1] for l in open(sys.argv[3]) if l.strip()}
bad = [f for f in copy if f["kind"] == "changed" and f.get("path") in removed]
for f in bad:
    print(f"FAIL: changed finding for a script the apply placed: {f.get('path')}: {f['reason']}")
sys.exit(1 if bad or new else 0)
PY

# What a second plan lists (the RECORDs rewritten on the copy differ from
# the source's in the scripts' rows).
"$BIN" plan src dst --json > "$OUT/replan.json" 2> "$OUT/replan.err" &&
  python3 -c 'import json,sys; p=json.load(open(sys.argv[1])); c=[c for s in p["sets"] for c in s["changes"]]; print("second plan: %d changes: %s" % (len(c), " ".join(sorted(x["action"]+":"+x["path"] for x in c))[:2000]))' "$OUT/replan.json"

"$BIN" rollback --venv "$C" -vv > "$OUT/rollback.out" 2> "$OUT/rollback.err" || { tail "$OUT/rollback.err"; fail "rollback"; }
if (cd "$C/$SITE_REL" && sha256sum --quiet -c "$W/records.sha256"); then
  echo "rollback: every RECORD of the copy as before, byte for byte"
else
  fail "RECORDs after rollback differ"
fi
for s in $(cut -d' ' -f2 "$OUT/removed.txt"); do
  [ -e "$C/$s" ] && fail "$s still there after rollback"
done
[ "$FAIL" = 0 ] && echo "OK" || echo "FAILED"
exit "$FAIL"
