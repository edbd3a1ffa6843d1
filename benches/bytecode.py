#!/usr/bin/python3
"""Is the venv after `overlay apply` what pip would leave? Measured on the
real-wheel stack of benches/realstack.py (docs/benchmarks.md, "Bytecode and
RECORD after apply").

    benches/bytecode.py --overlay BIN [--realstack DIR] [--work DIR] [--reps N]

For each mode (the default, which carries the source's bytecode, and
`--no-compile`, which carries none as overlay did before): copy the pristine
target venv (a hard-link copy: overlay never writes a file in place), plan
and apply the real stack's sets (benches/real-stack.toml's) from the source
venv by the local route, then measure, untimed but for the import:

- bytecode: how many of the applied `.py` files have a valid
  timestamp-based `.pyc` for the interpreter (header mtime and size match),
  on the source and on the target;
- RECORD: the rows with a sha256 of the applied distributions whose file
  does not match, on the source and on the target;
- `import torch` with PYTHONDONTWRITEBYTECODE=1 (nobody may write the
  cache, as for a root-owned venv run by a service), median of N warm runs
  (after one untimed import each), source and target interleaved;
- apply's wall time;
- rollback: every `.pyc` under the target's site-packages afterwards is the
  one that was there before the apply, byte for byte.

Prints a JSON report and a Markdown table. Needs root (a private mount
namespace per venv, so that each runs at /root/venv as it was built).
"""

import argparse
import hashlib
import json
import os
import shutil
import statistics
import subprocess
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SITE = "lib/python3.11/site-packages"

CHECK = r'''
import base64, csv, hashlib, importlib.util, json, os, sys, sysconfig
site = sysconfig.get_paths()["purelib"]
req = json.load(open(sys.argv[1]))
valid = 0
for rel in req["py"]:
    src = os.path.join(site, rel)
    try:
        with open(importlib.util.cache_from_source(src), "rb") as f:
            head = f.read(16)
        st = os.stat(src)
    except OSError:
        continue
    if (head[:4] == importlib.util.MAGIC_NUMBER and int.from_bytes(head[4:8], "little") == 0
            and int.from_bytes(head[8:12], "little") == int(st.st_mtime) & 0xFFFFFFFF
            and int.from_bytes(head[12:16], "little") == st.st_size & 0xFFFFFFFF):
        valid += 1
rows, bad = 0, []
for di in req["dist_infos"]:
    try:
        f = open(os.path.join(site, di, "RECORD"), newline="")
    except OSError:
        continue
    for row in csv.reader(f):
        if len(row) < 3 or not row[1].startswith("sha256="):
            continue
        rows += 1
        try:
            data = open(os.path.normpath(os.path.join(site, row[0])), "rb").read()
        except OSError:
            bad.append(row[0]); continue
        d = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
        if "sha256=" + d != row[1] or str(len(data)) != row[2]:
            bad.append(row[0])
print(json.dumps({"py": len(req["py"]), "valid": valid, "rows": rows, "bad": bad}))
'''


def in_ns(venv, cmd, env=None):
    """Run cmd with `venv` bind-mounted at /root/venv in a private mount namespace."""
    script = 'mkdir -p /root/venv && mount --bind "$0" /root/venv && exec "$@"'
    return subprocess.run(["unshare", "--mount", "--propagation", "private", "sh", "-c", script, venv] + cmd,
                          env=env, capture_output=True, text=True)


def check(venv, req_file):
    out = in_ns(venv, ["/root/venv/bin/python", "-c", CHECK, req_file])
    if out.returncode != 0:
        sys.exit(f"check in {venv} failed: {out.stderr}")
    return json.loads(out.stdout)


def import_times(venvs, reps):
    """`import torch` in each venv, interleaved, `reps` times: the median
    and the runs of each."""
    env = dict(os.environ, PYTHONDONTWRITEBYTECODE="1")
    times = [[] for _ in venvs]
    # One untimed import each first: the apply wrote the big libraries past
    # the page cache, and the comparison is of warm starts.
    for venv in venvs:
        in_ns(venv, ["/root/venv/bin/python", "-c", "import torch"], env)
    for _ in range(reps):
        for i, venv in enumerate(venvs):
            t = time.monotonic()
            out = in_ns(venv, ["/root/venv/bin/python", "-c", "import torch"], env)
            if out.returncode != 0:
                sys.exit(f"import torch in {venv}: {out.stderr.strip().splitlines()[-1:]}")
            times[i].append(round(time.monotonic() - t, 2))
    return [(statistics.median(t), t) for t in times]


def pycs(venv):
    out = {}
    for root, _, files in os.walk(os.path.join(venv, SITE)):
        for f in files:
            if f.endswith(".pyc"):
                p = os.path.join(root, f)
                out[os.path.relpath(p, venv)] = hashlib.sha256(open(p, "rb").read()).hexdigest()
    return out


def manifest(work, src, dst):
    text = open(os.path.join(REPO, "benches/real-stack.toml")).read()
    sets = text[text.index("# torch itself"):text.index("[preflight]")]
    m = os.path.join(work, "overlay.toml")
    with open(m, "w") as f:
        f.write(f'[hosts.src]\nvenv = "{src}"\n\n[hosts.dst]\nvenv = "{dst}"\n\n{sets}')
    return m


def run_mode(a, mode, extra):
    work = os.path.join(a.work, mode)
    shutil.rmtree(work, ignore_errors=True)
    os.makedirs(work)
    src = os.path.join(a.realstack, "venvs/source")
    dst = os.path.join(work, "target")
    subprocess.run(["cp", "-al", os.path.join(a.realstack, "venvs/target"), dst], check=True)
    m = manifest(work, src, dst)
    ov = [a.overlay, "--manifest", m, "-q"]
    plan = subprocess.run(ov + ["plan", "src", "dst", "--json", "--out", os.path.join(work, "plan.json")],
                          capture_output=True, text=True, cwd=work)
    if plan.returncode not in (0, 1):
        sys.exit(f"plan failed: {plan.stderr}")
    p = json.loads(plan.stdout)
    placed = [c["path"] for s in p["sets"] for c in s["changes"] if c["action"] != "delete"]
    py = [x for x in placed if x.endswith(".py") and not x.startswith("../")]
    dist_infos = sorted({x[:-len("/RECORD")] for x in placed if x.endswith(".dist-info/RECORD")})
    pyc_carried = [x for x in placed if "/__pycache__/" in x]
    req = os.path.join(work, "req.json")
    json.dump({"py": py, "dist_infos": dist_infos}, open(req, "w"))
    before = pycs(dst)
    t = time.monotonic()
    ap = subprocess.run(ov + ["apply", os.path.join(work, "plan.json")] + extra,
                        capture_output=True, text=True, cwd=work)
    apply_s = time.monotonic() - t
    if ap.returncode != 0:
        sys.exit(f"apply failed: {ap.stderr}")
    r = {
        "mode": mode,
        "applied_py": len(py),
        "pyc_carried": len(pyc_carried),
        "pyc_bytes": sum(c["size"] for s in p["sets"] for c in s["changes"]
                         if c["action"] != "delete" and "/__pycache__/" in c["path"]),
        "bytes": sum(c["size"] for s in p["sets"] for c in s["changes"] if c["action"] != "delete"),
        "apply_s": round(apply_s, 2),
        "source": check(src, req),
        "target": check(dst, req),
    }
    (r["import_source_s"], r["import_source_runs"]), (r["import_target_s"], r["import_target_runs"]) = \
        import_times([src, dst], a.reps)
    for side in ("source", "target"):
        r[side]["bad_rows"] = len(r[side].pop("bad"))
    rb = subprocess.run(ov + ["rollback", "dst"], capture_output=True, text=True, cwd=work)
    after = pycs(dst)
    r["rollback_ok"] = rb.returncode == 0
    r["rollback_pyc_same"] = after == before
    r["rollback_pyc_diff"] = len(set(after.items()) ^ set(before.items()))
    shutil.rmtree(work, ignore_errors=True)
    return r


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--overlay", required=True)
    ap.add_argument("--realstack", default="/work/realstack")
    ap.add_argument("--work", default="/tmp/overlay-bytecode")
    ap.add_argument("--reps", type=int, default=3)
    a = ap.parse_args()
    a.overlay = os.path.abspath(a.overlay)
    results = [run_mode(a, "carried", []), run_mode(a, "--no-compile", ["--no-compile"])]
    print(json.dumps(results, indent=1))
    print()
    print("| mode | applied .py | valid .pyc source / target | .pyc carried (MB) | RECORD rows bad source / target "
          "| import torch source / target (s) | apply (s) | rollback: old .pyc back |")
    print("|---|---|---|---|---|---|---|---|")
    for r in results:
        s, t = r["source"], r["target"]
        print(f"| {r['mode']} | {r['applied_py']} | {s['valid']} / {t['valid']} | {r['pyc_carried']} "
              f"({r['pyc_bytes'] / 1e6:.1f}) | {s['bad_rows']} / {t['bad_rows']} of {t['rows']} | "
              f"{r['import_source_s']:.2f} / {r['import_target_s']:.2f} | {r['apply_s']} | "
              f"{'yes' if r['rollback_pyc_same'] else 'NO (%d differ)' % r['rollback_pyc_diff']} |")


if __name__ == "__main__":
    main()
