#!/bin/bash
# benches/record-script-check.sh (issue 43): after overlay's own apply,
# `overlay doctor` finds no problem that the source lacks, on a real stack.
# Run as root on a host with a real venv (no sshd needed):
#
#   OUT=dir OVERLAY_BIN=overlay [VENV=/path/to/venv] [WORK=/tmp/record-check] [ALL=1] bash benches/record-script-check.sh
#
# The target is a copy of VENV (default: the venv of the `python3` on PATH)
# at another path (`cp -a`, as operators clone environments: every RECORD
# byte-identical to the source's, every script still naming VENV) without
# the console and GUI scripts of its distributions (entry_points.txt). The
# plan of the distributions that own them (ALL=1: of every distribution;
# local route) places the scripts with their
# shebang for the copy; the RECORDs that list them must be in the plan
# (replaced although alike) and, after the apply, describe them. Printed:
# the scripts removed, the RECORDs the plan replaces, `overlay doctor` of
# the source and of the copy (`--venv`, before and after the apply), the
# copy's problems the source lacks (a FAIL where the apply placed the
# path: a "changed" script is issue 43), what
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

# The set: the distributions whose scripts were removed (ALL=1: every
# distribution, which hashes the whole venv on both sides).
if [ "${ALL:-0}" = 1 ]; then
  DISTS='"*"'
else
  DISTS=$(cut -d' ' -f1 "$OUT/removed.txt" | sort -u | sed 's/.*/"&"/' | paste -sd, -)
fi
cat > "$W/t/overlay.toml" <<TOML
[hosts.src]
venv = "$VENV"
[hosts.dst]
venv = "$C"
[sets.scripts]
dists = [$DISTS]
TOML
echo "set: dists = [$DISTS]"
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

"$BIN" doctor --venv "$C" --json > "$OUT/doctor-copy-before.json" 2> "$OUT/doctor-copy-before.err"
"$BIN" apply -vv > "$OUT/apply.out" 2> "$OUT/apply.err" || { tail "$OUT/apply.err"; echo "FAIL: apply"; exit 1; }
grep -E "Applied|drift" "$OUT/apply.err" | head -5
"$BIN" doctor --venv "$VENV" --json > "$OUT/doctor-src.json" 2> "$OUT/doctor-src.err"
"$BIN" doctor --venv "$C" --json > "$OUT/doctor-copy.json" 2> "$OUT/doctor-copy.err"
"$BIN" doctor --venv "$C" > "$OUT/doctor-copy.txt" 2>&1
python3 - "$OUT/doctor-src.json" "$OUT/doctor-copy-before.json" "$OUT/doctor-copy.json" "$OUT/plan.json" <<'PY' || FAIL=1
import json, sys
def problems(path):
    doc = json.load(open(path))
    return [f for f in doc["report"]["findings"] if f.get("class") != "note"]
src, before, copy = (problems(p) for p in sys.argv[1:4])
plan = json.load(open(sys.argv[4]))
placed = {c["path"] for s in plan["sets"] for c in s["changes"] if c["action"] != "delete"}
key = lambda f: (f["kind"], f.get("path") or "", f.get("dist") or "")
show = lambda f: f"{f['kind']}: {f.get('dist') or ''} {f.get('path') or ''}: {f['reason']}"
in_src = {key(f) for f in src}
in_before = {key(f) for f in before}
print(f"doctor: source {len(src)} problems; copy {len(before)} before the apply, {len(copy)} after")
for f in copy:
    print("  copy after: " + show(f))
new = [f for f in copy if key(f) not in in_src]
print(f"problems of the copy after the apply that the source lacks: {len(new)}"
      f" ({sum(key(f) in in_before for f in new)} of them the copy's before the apply)")
for f in new:
    print(("  (before too) " if key(f) in in_before else "  NEW ") + show(f))
# A problem the source lacks on a path the apply placed is overlay's.
bad = [f for f in new if f.get("path") in placed]
for f in bad:
    print("FAIL: on a path the apply placed: " + show(f))
sys.exit(1 if bad else 0)
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
