#!/usr/bin/python3
"""The real-wheel stack for `benches/run --stack real`: two venvs built with
pip from the torch/CUDA wheels on PyPI.

    benches/realstack.py [--wheel-cache DIR] [--root DIR]   # prepare only

SOURCE ("cu130"): the newest torch (2.15.0, CUDA 13 wheels: nvidia-cublas,
nvidia-cudnn-cu13, ..., cuda-toolkit, cuda-bindings), its triton (3.9.0) and
the newest torchvision (0.29.2, requires torch>=2.14, built against the
stable ABI). TARGET ("cu128"): torch 2.9.1 (CUDA 12.8 wheels:
nvidia-cublas-cu12, ...), its triton (3.5.1), torchvision 0.24.1 (requires
torch==2.9.1). Both for CPython 3.11 on x86_64 Linux. What these carry and
the synthetic venvs do not: real ELF objects (symbol tables, RUNPATHs,
optional plugins whose dependencies are absent), real METADATA requirements,
whatever breakage the wheels ship with.

Wheels are downloaded once (`pip download`, network) into the wheel cache
(default /work/realstack/wheels) and reused: a side's wheels are first
resolved offline (`pip install --dry-run --no-index --find-links CACHE`);
only when that fails is `pip download` run. The venvs are built in
ROOT/venvs/{source,target} (default ROOT /work/realstack) with
`/usr/bin/python3 -m venv` and `pip install --no-index --find-links CACHE`,
inside a private mount namespace where each is seen at /root/venv (as the
bench's SSH test hosts see it), so console-script shebangs and RECORDs are
what a venv at /root/venv has. A venv is reused while its stamp
(ROOT/venvs/SIDE.stamp: the pins and the exact wheel files, names and
sizes) is unchanged; otherwise it is rebuilt. ROOT/README says what is there.
"""

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
import urllib.parse

DEFAULT_ROOT = "/work/realstack"
SYSTEM_PYTHON = "/usr/bin/python3"   # CPython 3.11 (Debian); the venvs' interpreter
RESOLVER = "python3"                 # any pip >= 22.2 (--dry-run --report), same CPython minor

# The pins. Which versions pair up: torch's METADATA (Requires-Dist: triton,
# nvidia-*) and torchvision's (torch==2.9.1 for 0.24.1; torch>=2.14.0 for 0.29.2).
SIDES = {
    "source": ["torch==2.15.0", "torchvision==0.29.2", "triton==3.9.0"],
    "target": ["torch==2.9.1", "torchvision==0.24.1", "triton==3.5.1"],
}


def _log(msg):
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def pip_env():
    """The environment for pip: no find-links or index settings from outside."""
    e = {k: v for k, v in os.environ.items() if not k.startswith("PIP_") or k in ("PIP_CERT", "PIP_DEFAULT_TIMEOUT")}
    e["PIP_DISABLE_PIP_VERSION_CHECK"] = "1"
    e["PYTHONDONTWRITEBYTECODE"] = "1"
    return e


def resolve(cache, side):
    """The wheel files (names, in CACHE) that `pip install` of SIDE's pins
    picks offline from CACHE, or None when the cache cannot satisfy them."""
    r = subprocess.run([RESOLVER, "-m", "pip", "install", "--dry-run", "--ignore-installed", "--quiet",
                        "--no-index", "--find-links", cache, "--only-binary=:all:", "--report", "-"] + SIDES[side],
                       capture_output=True, text=True, env=pip_env())
    if r.returncode:
        return None
    rep = json.loads(r.stdout)
    names = []
    for it in rep["install"]:
        url = it["download_info"]["url"]
        names.append(os.path.basename(urllib.parse.unquote(urllib.parse.urlparse(url).path)))
    return sorted(names)


def ensure_wheels(cache, side, logdir, log=_log):
    """SIDE's wheel list, downloading into CACHE only what is missing."""
    os.makedirs(cache, exist_ok=True)
    names = resolve(cache, side)
    if names is not None:
        log(f"{side}: {len(names)} wheels present in {cache}")
        return names, 0.0
    os.makedirs(logdir, exist_ok=True)
    lf = os.path.join(logdir, f"download-{side}.log")
    log(f"{side}: pip download {' '.join(SIDES[side])} into {cache} (log {lf}); several GB")
    t0 = time.monotonic()
    with open(lf, "a") as f:
        r = subprocess.run([RESOLVER, "-m", "pip", "download", "--only-binary=:all:", "-d", cache] + SIDES[side],
                           stdout=f, stderr=subprocess.STDOUT, env=pip_env())
    dt = time.monotonic() - t0
    if r.returncode:
        raise SystemExit(f"bench: pip download for the {side} venv failed; see {lf}")
    names = resolve(cache, side)
    if names is None:
        raise SystemExit(f"bench: {cache} still cannot satisfy {SIDES[side]} offline after pip download; see {lf}")
    return names, dt


def stamp_of(cache, side, names):
    return {"pins": SIDES[side], "python": SYSTEM_PYTHON,
            "wheels": [[n, os.path.getsize(os.path.join(cache, n))] for n in names]}


def build_venv(cache, venv, names, log=_log):
    """A fresh venv in VENV, seen at /root/venv while pip installs into it:
    a private mount namespace with a tmpfs on /root (nothing touches the
    real /root) and VENV bound on /root/venv."""
    if os.path.exists(venv):
        shutil.rmtree(venv)
    os.makedirs(venv)
    script = ('set -e\n'
              'mount -t tmpfs -o mode=0700 bench-root /root\n'
              'C="$1"; shift\n'
              'mkdir /root/venv\n'
              'mount --bind "$0" /root/venv\n'
              f'{SYSTEM_PYTHON} -m venv /root/venv\n'
              '/root/venv/bin/python -m pip install -q --no-cache-dir --no-index --no-deps '
              '--no-warn-script-location --find-links "$C" "$@"\n')
    wheels = [os.path.join(cache, n) for n in names]
    r = subprocess.run(["unshare", "--mount", "--propagation", "private", "sh", "-c", script, venv, cache] + wheels,
                       env=pip_env(), stdin=subprocess.DEVNULL)
    if r.returncode:
        shutil.rmtree(venv, ignore_errors=True)
        raise SystemExit(f"bench: building the venv {venv} failed (exit {r.returncode}); "
                         f"check that {cache} holds whole wheels (delete a broken one and rerun)")


def summarize(venv):
    """Files, bytes, shared objects and distributions of a venv."""
    files = nbytes = so = 0
    for dp, dns, fns in os.walk(venv):
        for fn in fns:
            st = os.lstat(os.path.join(dp, fn))
            files += 1
            nbytes += st.st_size
            if ".so" in fn and not fn.endswith(".py"):
                so += 1
    site = os.path.join(venv, "lib", "python3.11", "site-packages")
    dists = sorted(d[:-len(".dist-info")] for d in os.listdir(site) if d.endswith(".dist-info"))
    return {"files": files, "bytes": nbytes, "so": so, "dists": len(dists), "dist_names": dists}


def prepare(root=DEFAULT_ROOT, cache=None, log=_log):
    """Wheels and both venvs, downloaded/built only when missing or changed.
    Returns the meta the bench reports."""
    cache = os.path.abspath(cache or os.path.join(root, "wheels"))
    venvs = os.path.join(root, "venvs")
    os.makedirs(venvs, exist_ok=True)
    meta = {"root": root, "wheel_cache": cache, "sides": {}, "pins": SIDES}
    for side in ("source", "target"):
        names, dl_s = ensure_wheels(cache, side, os.path.join(root, "logs"), log=log)
        venv = os.path.join(venvs, side)
        stamp = stamp_of(cache, side, names)
        sf = os.path.join(venvs, f"{side}.stamp")
        have = None
        if os.path.exists(sf):
            with open(sf) as f:
                have = json.load(f)
        if have == stamp and os.path.isdir(os.path.join(venv, "lib")):
            log(f"{side}: reusing {venv} (stamp unchanged)")
        else:
            log(f"{side}: building {venv} from {len(names)} wheels")
            t0 = time.monotonic()
            if os.path.exists(sf):
                os.unlink(sf)
            build_venv(cache, venv, names, log=log)
            with open(sf, "w") as f:
                json.dump(stamp, f, indent=1)
            log(f"{side}: built in {time.monotonic() - t0:.0f} s")
        s = summarize(venv)
        s["wheels"] = names
        s["wheel_bytes"] = sum(sz for _, sz in stamp["wheels"])
        if dl_s:
            s["download_s"] = round(dl_s)
        meta["sides"][side] = s
    write_readme(root, meta)
    return meta


def write_readme(root, meta):
    lines = [
        "# /work/realstack: a real torch/CUDA wheel stack for overlay's benchmark",
        "",
        "Made by benches/realstack.py (run by `benches/run --stack real|both`, or alone:",
        "`benches/realstack.py [--wheel-cache DIR] [--root DIR]`). Read-only for everyone else:",
        "the bench hard-links the target venv into its own work dir and never writes here",
        "except to (re)build a venv whose stamp changed. Never commit anything from here.",
        "",
        f"- wheels/   wheel cache ({meta['wheel_cache']}): `pip download --only-binary=:all:` of the",
        "            pins below (network, once); reused offline (`pip install --no-index --find-links`).",
        "- venvs/source, venvs/target   the two venvs: `/usr/bin/python3 -m venv` (CPython 3.11) +",
        "            `pip install --no-index --no-deps --find-links wheels/ <exact wheel files>`, built in a",
        "            private mount namespace where each venv is at /root/venv (so shebangs and RECORDs",
        "            say /root/venv, as the bench's SSH test hosts see them).",
        "- venvs/SIDE.stamp   pins + exact wheel files and sizes; a venv is rebuilt when it changes.",
        "- logs/      pip download logs.",
        "- runs/      (if present) saved bench results, e.g. the issue-14 baseline: before.md,",
        "            before-results.json, findings-real*.txt, and the binary that made them.",
        "",
    ]
    for side, d in meta["sides"].items():
        lines.append(f"## {side}: pins {' '.join(meta['pins'][side])}")
        lines.append(f"{d['files']} files, {d['bytes'] / 1e9:.2f} GB installed, {d['so']} shared objects, "
                     f"{d['dists']} dists; {len(d['wheels'])} wheels, {d['wheel_bytes'] / 1e9:.2f} GB:")
        lines += [f"    {w}" for w in d["wheels"]]
        lines.append("")
    with open(os.path.join(root, "README"), "w") as f:
        f.write("\n".join(lines))


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--root", default=DEFAULT_ROOT)
    p.add_argument("--wheel-cache", help="default ROOT/wheels")
    a = p.parse_args()
    meta = prepare(a.root, a.wheel_cache)
    for side, d in meta["sides"].items():
        print(f"{side}: {d['files']} files, {d['bytes'] / 1e9:.2f} GB, {d['so']} .so, {d['dists']} dists")


if __name__ == "__main__":
    main()
