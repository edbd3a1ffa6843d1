#!/usr/bin/python3
"""A corpus of real traps, built from the real-wheel stack of
benches/realstack.py: does `overlay plan` predict each one before anything
is copied, and does it stay silent on the overlays that are consistent?
Results in docs/benchmarks.md ("The corpus of real traps").

    benches/traps.py --overlay BIN [--realstack DIR] [--work DIR] [--confirm]

The base is the real stack's two venvs (torch 2.15.0 with the CUDA 13
wheels on the source, torch 2.9.1 with the CUDA 12.8 wheels on the
target, both made by pip from PyPI wheels). Each case copies a venv by
hard links (overlay never writes a file in place; where a case changes a
file it writes a new one and renames it over the link), writes a manifest
of local hosts, and runs `overlay plan --json`.

Consistent overlays (expected: 0 new problems, 0 warnings):
  stack      torch, triton, the CUDA 13 wheels (nvidia-*, cuda-*),
             torchvision, setuptools (torch 2.15 needs >=77, the target has 66)
  everything every distribution of the source (`dists = ["*"]`)
  reverse    the target's CUDA 12.8 stack back onto a copy of the source

Traps (each must be predicted: the plan names the cause):
  new-dependency    the CUDA 13 set without `cuda-*`: torch 2.15 needs
                    cuda-toolkit and cuda-bindings, absent on the target
  pinned-sibling    no torchvision set: the target's torchvision 0.24.1 pins
                    torch==2.9.1 and is built against its ABI
  other-cuda-major  no CUDA set: torch 2.15 (CUDA 13) onto the target's
                    CUDA 12.8 libraries
  damaged-source    the source's torchvision/_C_stable.so cut in half
  second-dist-info  a leftover torchvision-0.23.0.dist-info on the target
  edited-target     a hand edit to the target's torch/utils/data/dataloader.py,
                    which the overlay replaces: its backup is the only copy

With --confirm, each case's plan is also applied (local route) and the
prediction is checked against the result: `pip check`, `import torch,
torchvision` (with PYTHONDONTWRITEBYTECODE), and `overlay doctor` (its
problems before and after). Each venv runs at /root/venv in a private mount
namespace, as it was built. Needs root. Prints a JSON report and a Markdown
table.
"""

import argparse
import base64
import hashlib
import json
import os
import shutil
import subprocess
import sys
import time

SITE = "lib/python3.11/site-packages"

SETS = {
    "torch": '[sets.torch]\ndists = ["torch"]\n',
    "triton": '[sets.triton]\ndists = ["triton"]\n',
    "cuda13": '[sets.nvidia-cu13]\ndists = ["nvidia-*", "cuda-*"]\n',
    "nvidia-only": '[sets.nvidia-cu13]\ndists = ["nvidia-*"]\n',
    "torchvision": '[sets.torchvision]\ndists = ["torchvision"]\n',
    "setuptools": '[sets.setuptools]\ndists = ["setuptools"]\n',
    "everything": '[sets.everything]\ndists = ["*"]\n',
}
STACK = ["torch", "triton", "cuda13", "torchvision", "setuptools"]


def log(msg):
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def replace_file(path, data):
    """Write `data` to a new file and rename it over `path` (which may be
    a hard link into the pristine venvs: they stay untouched)."""
    st = os.stat(path)
    tmp = path + ".traps-tmp"
    with open(tmp, "wb") as f:
        f.write(data)
    os.chmod(tmp, st.st_mode & 0o7777)
    os.rename(tmp, path)


def cut_in_half(venv):
    p = os.path.join(venv, SITE, "torchvision/_C_stable.so")
    data = open(p, "rb").read()
    replace_file(p, data[:len(data) // 2])


def second_dist_info(venv):
    site = os.path.join(venv, SITE)
    src = os.path.join(site, "torchvision-0.24.1.dist-info")
    dst = os.path.join(site, "torchvision-0.23.0.dist-info")
    os.makedirs(dst)
    for f in os.listdir(src):
        data = open(os.path.join(src, f), "rb").read()
        if f == "METADATA":
            data = data.replace(b"\nVersion: 0.24.1", b"\nVersion: 0.23.0", 1)
        if f != "RECORD":
            with open(os.path.join(dst, f), "wb") as out:
                out.write(data)
    # Its RECORD as pip wrote it for 0.23.0's dist-info: the package's rows
    # as they are, the dist-info's own rows with their hashes.
    rows = []
    for line in open(os.path.join(src, "RECORD")).read().splitlines():
        path = line.split(",")[0].replace("torchvision-0.24.1.dist-info", "torchvision-0.23.0.dist-info")
        own = os.path.join(site, path)
        if path.startswith("torchvision-0.23.0.dist-info/") and not path.endswith("/RECORD"):
            data = open(own, "rb").read()
            digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
            line = f"{path},sha256={digest},{len(data)}"
        elif path.endswith("/RECORD"):
            line = f"{path},,"
        rows.append(line)
    with open(os.path.join(dst, "RECORD"), "w") as out:
        out.write("\n".join(rows) + "\n")


def edit_target(venv):
    p = os.path.join(venv, SITE, "torch/utils/data/dataloader.py")
    replace_file(p, open(p, "rb").read() + b"\n# site patch: prefetch_factor default 4 (ticket 1234)\n")


# name: (kind, sets, reverse, mutate source, mutate target, what the plan must say)
CASES = [
    ("stack", "consistent", STACK, False, None, None, []),
    ("everything", "consistent", ["everything"], False, None, None, []),
    ("reverse", "consistent", ["torch", "triton", "cuda13", "torchvision"], True, None, None, []),
    ("new-dependency", "trap", ["torch", "triton", "nvidia-only", "torchvision", "setuptools"], False, None, None,
     [("problem", "requirements", "cuda-toolkit"), ("problem", "requirements", "cuda-bindings")]),
    ("pinned-sibling", "trap", ["torch", "triton", "cuda13", "setuptools"], False, None, None,
     [("problem", "requirements", "torchvision 0.24.1 requires torch (==2.9.1)")]),
    ("other-cuda-major", "trap", ["torch", "triton", "torchvision", "setuptools"], False, None, None,
     [("problem", "elf", "needs libcudart.so.13, which is not found")]),
    ("damaged-source", "trap", STACK, False, cut_in_half, None,
     [("warning", None, "torchvision/_C_stable.so of torchvision on src differs from its RECORD")]),
    ("second-dist-info", "trap", STACK, False, None, second_dist_info,
     [("warning", None, "dst has 2 dist-infos of torchvision")]),
    ("edited-target", "trap", STACK, False, None, edit_target,
     [("warning", None, "torch/utils/data/dataloader.py"), ("warning", None, "only copy")]),
]


def manifest(path, src, dst, sets):
    with open(path, "w") as f:
        f.write(f'[hosts.src]\nvenv = "{src}"\n\n[hosts.dst]\nvenv = "{dst}"\n\n')
        f.write("\n".join(SETS[s] for s in sets))


def in_ns(venv, cmd, env=None):
    """`cmd` with `venv` bind-mounted at /root/venv in a private mount namespace."""
    script = 'mkdir -p /root/venv && mount --bind "$0" /root/venv && exec "$@"'
    return subprocess.run(["unshare", "--mount", "--propagation", "private", "sh", "-c", script, venv] + cmd,
                          env=env, capture_output=True, text=True)


def doctor_problems(overlay, venv):
    r = in_ns(venv, [overlay, "doctor", "--venv", "/root/venv", "--json", "-q"])
    if r.returncode not in (0, 1):
        return None, r.stderr.strip()[-300:]
    d = json.loads(r.stdout)
    return [f for f in d["report"]["findings"] if f.get("class", "problem") == "problem"], None


def confirm(a, work, src, dst, plan_file):
    """Apply the plan and look at what it left: pip check, the imports,
    doctor's problems against the target's before."""
    before, _ = doctor_problems(a.overlay, dst)
    t = time.monotonic()
    ap = subprocess.run([a.overlay, "--manifest", os.path.join(work, "overlay.toml"), "-q", "apply", plan_file],
                        capture_output=True, text=True, cwd=work)
    out = {"apply_rc": ap.returncode, "apply_s": round(time.monotonic() - t, 1)}
    if ap.returncode != 0:
        out["apply_err"] = ap.stderr.strip()[-400:]
        return out
    env = dict(os.environ, PYTHONDONTWRITEBYTECODE="1")
    pc = in_ns(dst, ["/root/venv/bin/python", "-m", "pip", "check", "--disable-pip-version-check"], env)
    out["pip_check"] = "clean" if pc.returncode == 0 else pc.stdout.strip().splitlines()
    im = in_ns(dst, ["/root/venv/bin/python", "-c", "import torch, torchvision; print(torch.__version__)"], env)
    out["import"] = ("ok " + im.stdout.strip() if im.returncode == 0
                     else im.stderr.strip().splitlines()[-1:] or [f"died with exit {im.returncode}"])
    after, err = doctor_problems(a.overlay, dst)
    if after is None:
        out["doctor"] = err
    else:
        key = lambda f: (f["kind"], f.get("dist"), f.get("path"), f.get("reason"))
        old = {key(f) for f in before or []}
        new = [f for f in after if key(f) not in old]
        out["doctor_new_problems"] = len(new)
        out["doctor_new"] = [f"{f['kind']} {f.get('dist')} {f.get('path') or ''} {f['reason'][:160]}" for f in new[:8]]
    return out


def run_case(a, case):
    name, kind, sets, reverse, mut_src, mut_dst, expect = case
    work = os.path.join(a.work, name)
    shutil.rmtree(work, ignore_errors=True)
    os.makedirs(work)
    pristine_src = os.path.join(a.realstack, "venvs/source")
    pristine_dst = os.path.join(a.realstack, "venvs/target")
    if reverse:
        pristine_src, pristine_dst = pristine_dst, pristine_src
    src, dst = pristine_src, os.path.join(work, "target")
    if mut_src:
        src = os.path.join(work, "source")
        subprocess.run(["cp", "-al", pristine_src, src], check=True)
        mut_src(src)
    subprocess.run(["cp", "-al", pristine_dst, dst], check=True)
    if mut_dst:
        mut_dst(dst)
    m = os.path.join(work, "overlay.toml")
    manifest(m, src, dst, sets)
    plan_file = os.path.join(work, "plan.json")
    t = time.monotonic()
    r = subprocess.run([a.overlay, "--manifest", m, "plan", "src", "dst", "--json", "--out", plan_file],
                       capture_output=True, text=True, cwd=work)
    plan_s = round(time.monotonic() - t, 2)
    if r.returncode not in (0, 1):
        return {"case": name, "kind": kind, "error": r.stderr.strip()[-500:]}
    p = json.loads(r.stdout)
    new = [x for x in p["problems"] if not x.get("preexisting") and not x.get("optional")]
    lines = ([("problem", x["check"], x["reason"]) for x in new]
             + [("warning", None, w["message"]) for w in p["warnings"]])
    predicted = []
    for want_kind, want_check, text in expect:
        hit = [l for l in lines if l[0] == want_kind and (want_check is None or l[1] == want_check) and text in l[2]]
        predicted.append(bool(hit))
    # What the plan said, the lines that predict the trap first.
    lines.sort(key=lambda l: not any(e[2] and e[2] in l[2] for e in expect))
    res = {
        "case": name,
        "kind": kind,
        "sets": sets,
        "plan_s": plan_s,
        "new_problems": len(new),
        "warnings": len(p["warnings"]),
        "preexisting_or_optional": len(p["problems"]) - len(new),
        "expected": [e[2] or e[1] for e in expect],
        "predicted": all(predicted) if expect else None,
        "said": [f"[{l[1] or l[0]}] {l[2]}" for l in lines],
    }
    if a.confirm:
        log(f"{name}: apply and check")
        res["confirm"] = confirm(a, work, src, dst, plan_file)
    shutil.rmtree(work, ignore_errors=True)
    return res


def row(r):
    if "error" in r:
        return f"| {r['case']} | {r['kind']} | plan failed: {r['error'][:120]} | | | |"
    said = "; ".join(s[:150] for s in r["said"][:3]) or "nothing"
    if len(r["said"]) > 3:
        said += f"; and {len(r['said']) - 3} more"
    verdict = ("0 new problems, 0 warnings" if r["new_problems"] == 0 and r["warnings"] == 0 else "NOT QUIET") \
        if r["kind"] == "consistent" else ("predicted" if r["predicted"] else "MISSED")
    c = r.get("confirm")
    after = ""
    if c:
        after = (f"pip check: {'clean' if c.get('pip_check') == 'clean' else '; '.join(c.get('pip_check') or [])[:160]}; "
                 f"import: {c.get('import') if isinstance(c.get('import'), str) else ' '.join(c.get('import') or [])[:160]}; "
                 f"doctor: {c.get('doctor_new_problems', '?')} new problems")
        if c.get("apply_rc"):
            after = f"apply exit {c['apply_rc']}: {c.get('apply_err', '')[:160]}"
    return (f"| {r['case']} | {verdict} | {r['new_problems']} / {r['warnings']} | {said.replace('|', '/')} "
            f"| {after.replace('|', '/')} | {r['plan_s']} |")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--overlay", required=True)
    ap.add_argument("--realstack", default="/work/realstack")
    ap.add_argument("--work", default="/tmp/overlay-traps")
    ap.add_argument("--confirm", action="store_true", help="apply each plan and check the result")
    ap.add_argument("--only", action="append", help="run only this case (repeatable)")
    a = ap.parse_args()
    a.overlay = os.path.abspath(a.overlay)
    results = []
    for case in CASES:
        if a.only and case[0] not in a.only:
            continue
        log(f"{case[0]}: plan")
        results.append(run_case(a, case))
    print(json.dumps(results, indent=1))
    print()
    print("| case | verdict | new problems / warnings | what the plan said | after apply | plan (s) |")
    print("|---|---|---|---|---|---|")
    for r in results:
        print(row(r))
    bad = [r for r in results if "error" in r or
           (r["kind"] == "consistent" and (r["new_problems"] or r["warnings"])) or
           (r["kind"] == "trap" and not r["predicted"])]
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
