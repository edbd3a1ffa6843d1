#!/usr/bin/python3
"""Generate a pair of pseudo-venvs shaped like a torch/CUDA + sglang stack.

    benches/genvenv.py OUTDIR [--scale S] [--files N] [--mtimes same|install] [--seed K]

Writes OUTDIR/src (the "cu130" stack: torch 2.9.1+cu130 with the CUDA 13
wheels) and OUTDIR/dst (the "cu128" stack: torch 2.9.1+cu128 with the CUDA
12.8 wheels), plus OUTDIR/summary.json. No pip, no network: each venv is
`pyvenv.cfg` (version = 3.11.2), `bin/python -> /usr/bin/python3.11` and
`lib/python3.11/site-packages/` with, per distribution, a
`NAME-VERSION.dist-info/{METADATA,INSTALLER,WHEEL,RECORD}` whose RECORD lists
every file with its sha256 (urlsafe base64, no padding) and size, and itself
with an empty hash. That is all `overlay` reads. Both venvs are meant to be
seen at /root/venv (console scripts have `#!/root/venv/bin/python`).

Shape at --scale 1 (the default, "full"): about 35,000 files and 6.5-7 GB
per venv: ~33,000 small text files (.py/.pyi/.h/.cuh, 1-30 KB, log-uniform),
~300 shared objects, three of them over 500 MB (libtorch_cuda.so,
libcudnn_engines_precompiled.so.9, libcublasLt.so.13). --scale multiplies the
size of every binary (.so and executables); the small files keep their count
and size (a real venv does not get fewer files on a slower link), so
--scale 0.25 gives ~2 GB per venv. --files N scales the number of small files
(default 35000 total).

Source vs target (what a cu128 -> cu130 transplant plus an upgrade looks like):
  torch, torchvision, torchaudio: same version, other CUDA build: every .so
    differs in content and size; .py/.h identical except a few dozen (most
    with the SAME size, e.g. torch/version.py's cuda = '13.0' vs '12.8'), a
    few files only on one side; dist-info names differ (+cu130 / +cu128).
  CUDA wheels: source nvidia-cublas, nvidia-cuda-runtime, ... (CUDA 13, all in
    nvidia/cu13/{lib,include}) vs target nvidia-cublas-cu12, ... (nvidia/cublas/
    lib, ...): different paths, so adds and deletes; cudnn, nccl, cusparselt
    and nvshmem keep their paths across CUDA majors: replaces.
  sgl-kernel 0.3.17 (source) vs 0.3.16.post3 (target): .so differ, a few .py.
  transformers 4.57.1 vs 4.56.2: a pure-Python upgrade, ~60% of its files
    differ, some only on one side.
  sglang 0.5.4 on both, hand-patched on the source (a few files, two with the
    same size, one new file no RECORD lists).
  Everything else (triton with a 470 MB libtriton.so, numpy, scipy, pandas,
    sympy, ...) is identical.

Content: binaries are an ELF shared object (compiled once with gcc, when
available, so that overlay's ELF preflight parses real headers) followed by
128 KiB chunks drawn from per-flavour pools of random bytes (15%), low-entropy
"code-like" bytes (55%) and repetitive tables (30%): zstd -3 compresses that
~2.5x at ~190 MB/s per core, close to real .so files (libLLVM.so: 3.2x,
librustc_driver.so: 2.7x, ~210 MB/s). Text files are slices of a pool of
generated Python-like lines (zstd -3: ~3.3x; CPython's stdlib: 3.6x).
Flavours: "c" (identical on both sides), "s" (source only), "t" (target
only), so a file that differs shares no blocks with its counterpart (real
cu128 and cu130 builds share little; rsync's delta algorithm gains nothing).

--mtimes same (default): identical files get the same mtime on both sides
(as if the venvs had been rsynced once), so rsync's quick check skips them:
the strongest rsync baseline. --mtimes install: every file gets its side's
install time, as two independent `pip install`s produce.
"""

import argparse
import base64
import hashlib
import json
import os
import random
import shutil
import struct
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor

MB = 1 << 20
KB = 1 << 10
SITE = "lib/python3.11/site-packages"
VENV_AT = "/root/venv"
CHUNK = 128 * KB
BASE_FILES = 35000

T_COMMON = 1759300000   # 2025-10-01: when identical files were installed
T_SRC = 1762000000      # source's later upgrade
T_DST = 1761000000      # target's install


# --------------------------------------------------------------------------
# Content pools
# --------------------------------------------------------------------------

SYLL = ("ten sor mod ule grad par am fwd back ward cu da dev ice shape dim buf fer "
        "node graph op kern el attn mask cache lay er norm proj state dict conf ig arg "
        "kw val ue idx out inp ut self ctx seq len batch size dtype fn").split()


def text_pool(seed, size):
    rng = random.Random(seed)
    words = sorted({"".join(rng.choice(SYLL) for _ in range(rng.randint(1, 3)))
                    for _ in range(3000)})

    def ident():
        w = rng.choice(words)
        return w if rng.random() < 0.6 else w + "_" + rng.choice(words)

    out, n, ind = [], 0, 0
    while n < size:
        r, pad = rng.random(), "    " * ind
        if r < 0.1:
            line = f"{pad}def {ident()}({', '.join(ident() for _ in range(rng.randint(0, 4)))}):"
        elif r < 0.15:
            line = f"{pad}# {' '.join(rng.choice(words) for _ in range(rng.randint(3, 12)))}"
        elif r < 0.2:
            line = f"{pad}return {ident()}({ident()}, {ident()}={rng.randint(0, 4096)})"
        elif r < 0.25:
            line = f"{pad}if {ident()} is not None and {ident()}.{ident()} > {rng.randint(0, 64)}:"
        elif r < 0.3:
            doc = " ".join(rng.choice(words) for _ in range(rng.randint(4, 14))).capitalize()
            line = f'{pad}"""{doc}."""'
        elif r < 0.33:
            line = ""
        elif r < 0.36:
            line = f"{pad}from {ident()}.{ident()} import {ident()}, {ident()}"
        else:
            line = f"{pad}{ident()} = {ident()}.{ident()}({ident()}, {ident()}[{rng.randint(0, 8)}])"
        out.append(line)
        n += len(line) + 1
        if line.endswith(":"):
            ind = min(ind + 1, 4)
        elif rng.random() < 0.2:
            ind = max(ind - 1, 0)
    return "\n".join(out).encode()[:size]


def binary_pools(seed, size):
    """(random, code-like, table) byte pools."""
    rng = random.Random(seed)
    rnd = rng.randbytes(size)
    # code-like: bytes with a skewed distribution (zstd -3: ~2.3x)
    vals = ([0] * 150 + [0xFF] * 20
            + [0x48, 0x8B, 0x89, 0x0F, 0x85, 0xE8, 0x24, 0x44, 0x4C, 0x01, 0x10, 0x20,
               0x08, 0xC0, 0x31, 0x83] * 5 + list(range(6)))
    code = rng.randbytes(size).translate(bytes(vals))
    # tables: 64-byte records from a few templates with a counter (~10x)
    temps = [rng.randbytes(48) for _ in range(16)]
    recs = bytearray()
    i = 0
    while len(recs) < size // 2:
        recs += temps[rng.randrange(16)] + struct.pack("<QQ", i * 64, rng.randrange(1 << 12))
        i += 1
    return rnd, code, bytes(recs)


class Pools:
    def __init__(self, seed, scale):
        bsize = 32 * MB if scale >= 0.1 else 8 * MB
        self.text = {}
        self.bin = {}
        for i, fl in enumerate("cst"):
            self.text[fl] = text_pool(seed * 31 + i, 8 * MB)
            self.bin[fl] = binary_pools(seed * 37 + i, bsize)
        self.elf = elf_template()


def elf_template():
    """A small real shared object (needs libc.so.6), or b'' without gcc."""
    gcc = shutil.which("gcc")
    if not gcc:
        return b""
    with tempfile.TemporaryDirectory() as d:
        src = os.path.join(d, "t.c")
        with open(src, "w") as f:
            f.write("#include <string.h>\nint bench_fill(char *p, int n) { memset(p, 1, n); return n; }\n")
        out = os.path.join(d, "t.so")
        r = subprocess.run([gcc, "-shared", "-fPIC", "-O2", "-s", "-o", out, src],
                           capture_output=True)
        if r.returncode:
            return b""
        with open(out, "rb") as f:
            return f.read()


def chunks(pools, spec, size):
    """Yield the content of a file as memoryviews/bytes."""
    kind = spec[0]
    if kind == "raw":
        yield spec[1]
        return
    if kind == "bin":
        _, flavour, seed = spec
        rng = random.Random(seed)
        head = pools.elf[:size]
        yield head
        left = size - len(head)
        rnd, code, tab = pools.bin[flavour]
        while left > 0:
            n = min(CHUNK, left)
            x = rng.random()
            pool = rnd if x < 0.15 else code if x < 0.70 else tab
            off = rng.randrange(len(pool) - n)
            yield memoryview(pool)[off:off + n]
            left -= n
        return
    if kind in ("text", "textmut"):
        flavour, seed = spec[1], spec[2]
        rng = random.Random(seed)
        pool = pools.text[flavour]
        off = rng.randrange(len(pool) - size) if size < len(pool) else 0
        data = pool[off:off + size]
        if kind == "textmut":
            # a hand patch that keeps the size: a few bytes changed
            m = random.Random(spec[3])
            b = bytearray(data)
            for _ in range(3):
                p = m.randrange(max(1, len(b) - 8))
                b[p:p + 8] = m.choice([b"fixed_up", b"patched!", b"cu13_ok_", b"newpath_"])[:len(b) - p]
            data = bytes(b)
        yield data
        return
    raise ValueError(spec)


# --------------------------------------------------------------------------
# Layout
# --------------------------------------------------------------------------

class Dist:
    def __init__(self, name, version):
        self.name = name
        self.version = version
        self.files = []   # (rel to site-packages, size, spec, mode, mtime-class)
        self.requires = []

    def add(self, rel, size, spec, mode=0o644, cls="c"):
        self.files.append((rel, size, spec, mode, cls))


def log_size(rng, lo=1 * KB, hi=30 * KB):
    return int(lo * (hi / lo) ** rng.random())


WORDS = ("nn functional utils data distributed optim autograd cuda backends jit fx "
         "export onnx quantization sparse testing ao amp profiler compiler dynamo "
         "inductor codegen kernel runtime lowering fusion layers models attention "
         "config serving entrypoints managers schedulers sampling speculative mem_cache "
         "model_executor tokenizer io ops pipelines generation integrations core "
         "linalg special fft signal stats optimize interpolate integrate ndimage "
         "sparse_csgraph cluster spatial io_formats arrays strings parsers plotting "
         "tseries window groupby reshape computation internals printing polys solvers "
         "matrices physics algorithms classes drawing readwrite generators").split()


def tree(rng, top, n, exts=(".py",)):
    """n unique file paths under top/, in a plausible package tree."""
    ndirs = max(1, n // 14)
    dirs = [top]
    while len(dirs) < ndirs:
        parent = rng.choice(dirs)
        if parent.count("/") >= 4:
            continue
        d = f"{parent}/{rng.choice(WORDS)}"
        if d not in dirs:
            dirs.append(d)
        elif rng.random() < 0.3:
            dirs.append(f"{d}_{len(dirs)}")
    paths = []
    seen = set()
    for d in dirs:
        if ".py" in exts:
            paths.append(f"{d}/__init__.py")
            seen.add(paths[-1])
    while len(paths) < n:
        d = rng.choice(dirs)
        name = "_".join(rng.choice(WORDS) for _ in range(rng.randint(1, 2)))
        p = f"{d}/{name}{rng.choice(exts)}"
        if p in seen:
            p = f"{d}/{name}_{len(paths)}{rng.choice(exts)}"
            if p in seen:
                continue
        seen.add(p)
        paths.append(p)
    return paths[:n]


def scaled(n, f):
    return max(1, int(round(n * f)))


def build_layout(scale, nfiles, seed):
    """{"src": [Dist], "dst": [Dist]}"""
    f = nfiles / BASE_FILES * 1.067  # ~nfiles in total (dist-info and binaries do not scale)
    S = {"src": [], "dst": []}
    both = ("src", "dst")
    rid = random.Random(seed)

    def sd(*parts):
        return hash_seed(seed, *parts)

    def binsize(mb):
        return max(16 * KB, int(mb * MB * scale))

    def small_common(dist_by_side, top, n, exts=(".py",), sides=both):
        r = random.Random(sd("tree", top))
        for p in tree(r, top, scaled(n, f), exts):
            size = log_size(r)
            for s in sides:
                dist_by_side[s].add(p, size, ("text", "c", sd("t", p)))

    # ---- identical distributions -------------------------------------
    same = [  # name, version, top, small files, exts, [(rel, MB)]
        ("triton", "3.5.0", "triton", 1300, (".py", ".py", ".h", ".c"),
         [("triton/_C/libtriton.so", 470), ("triton/_C/libproton.so", 10),
          ("triton/backends/nvidia/bin/ptxas", 32), ("triton/backends/nvidia/bin/ptxas-blackwell", 34),
          ("triton/backends/nvidia/bin/nvdisasm", 50), ("triton/backends/nvidia/bin/cuobjdump", 0.7),
          ("triton/backends/amd/lib/ld.lld", 70)]),
        ("numpy", "2.3.4", "numpy", 850, (".py", ".pyi"),
         [(f"numpy/_core/_mod{i}.cpython-311-x86_64-linux-gnu.so", 0.05 + (i % 7) * 0.6) for i in range(30)]
         + [("numpy.libs/libscipy_openblas64_-8fb3d286.so", 34)]),
        ("scipy", "1.16.2", "scipy", 2000, (".py", ".pyi"),
         [(f"scipy/{w}/_ext{i}.cpython-311-x86_64-linux-gnu.so", 0.1 + (i % 9) * 0.15)
          for i, w in zip(range(110), WORDS * 3)]
         + [("scipy.libs/libscipy_openblas-68440149.so", 35), ("scipy.libs/libgfortran-040039e1.so.5.0.0", 2.7)]),
        ("pandas", "2.3.3", "pandas", 1400, (".py", ".pyi"),
         [(f"pandas/_libs/_lib{i}.cpython-311-x86_64-linux-gnu.so", 0.1 + (i % 5) * 0.35) for i in range(45)]),
        ("sympy", "1.14.0", "sympy", 1500, (".py",), []),
        ("networkx", "3.5", "networkx", 1000, (".py",), []),
        ("flashinfer-python", "0.4.1", "flashinfer", 900, (".py", ".cuh", ".cuh", ".h"), []),
        ("torchao", "0.13.0", "torchao", 600, (".py",), [("torchao/_C.abi3.so", 3)]),
        ("setuptools", "80.9.0", "setuptools", 900, (".py",), []),
        ("pip", "25.2", "pip", 1000, (".py",), []),
        ("openai", "2.2.0", "openai", 700, (".py",), []),
        ("pydantic", "2.11.9", "pydantic", 300, (".py",), []),
        ("pydantic-core", "2.33.2", "pydantic_core", 10, (".py", ".pyi"),
         [("pydantic_core/_pydantic_core.cpython-311-x86_64-linux-gnu.so", 4.8)]),
        ("tokenizers", "0.22.1", "tokenizers", 20, (".py", ".pyi"),
         [("tokenizers/tokenizers.abi3.so", 8.5)]),
        ("safetensors", "0.6.2", "safetensors", 15, (".py",), [("safetensors/_safetensors_rust.abi3.so", 1.1)]),
        ("huggingface-hub", "0.35.3", "huggingface_hub", 200, (".py",), []),
        ("aiohttp", "3.12.15", "aiohttp", 100, (".py",),
         [(f"aiohttp/_http{i}.cpython-311-x86_64-linux-gnu.so", 0.8) for i in range(4)]),
        ("fastapi", "0.118.0", "fastapi", 120, (".py",), []),
        ("starlette", "0.48.0", "starlette", 80, (".py",), []),
        ("uvicorn", "0.37.0", "uvicorn", 80, (".py",), []),
        ("uvloop", "0.21.0", "uvloop", 60, (".py", ".pyi"), [("uvloop/loop.cpython-311-x86_64-linux-gnu.so", 15)]),
        ("xgrammar", "0.1.25", "xgrammar", 60, (".py",), [("xgrammar/xgrammar_bindings.cpython-311-x86_64-linux-gnu.so", 21)]),
        ("llguidance", "0.7.30", "llguidance", 40, (".py", ".pyi"), [("llguidance/_lib.abi3.so", 12)]),
        ("outlines-core", "0.2.11", "outlines_core", 20, (".py",), [("outlines_core/outlines_core_rs.abi3.so", 9)]),
        ("pillow", "11.3.0", "PIL", 100, (".py", ".pyi"),
         [(f"PIL/_imaging{i}.cpython-311-x86_64-linux-gnu.so", 1.2) for i in range(10)]),
        ("grpcio", "1.75.1", "grpc", 150, (".py",), [("grpc/_cython/cygrpc.cpython-311-x86_64-linux-gnu.so", 12)]),
        ("protobuf", "6.32.1", "google/protobuf", 150, (".py",), []),
        ("pyzmq", "27.1.0", "zmq", 100, (".py", ".pyi"), [("zmq/backend/cython/_zmq.abi3.so", 4)]),
        ("jinja2", "3.1.6", "jinja2", 30, (".py",), []),
        ("rich", "14.1.0", "rich", 80, (".py",), []),
        ("regex", "2025.9.18", "regex", 10, (".py",), [("regex/_regex.cpython-311-x86_64-linux-gnu.so", 2.4)]),
        ("sentencepiece", "0.2.1", "sentencepiece", 20, (".py",), [("sentencepiece/_sentencepiece.cpython-311-x86_64-linux-gnu.so", 3.2)]),
        ("psutil", "7.1.0", "psutil", 40, (".py",), [("psutil/_psutil_linux.abi3.so", 0.3)]),
        ("requests", "2.32.5", "requests", 20, (".py",), []),
        ("urllib3", "2.5.0", "urllib3", 40, (".py",), []),
        ("datasets", "4.1.1", "datasets", 300, (".py",), []),
        ("accelerate", "1.10.1", "accelerate", 150, (".py",), []),
    ]
    for name, ver, top, n, exts, bins in same:
        d = {s: Dist(name, ver) for s in both}
        small_common(d, top, n, exts)
        for rel, mb in bins:
            for s in both:
                d[s].add(rel, binsize(mb), ("bin", "c", sd("b", rel)), 0o755)
        for s in both:
            S[s].append(d[s])

    # ---- sglang: same wheel, hand-patched on the source ----------------
    d = {s: Dist("sglang", "0.5.4") for s in both}
    r = random.Random(sd("sglang"))
    paths = tree(r, "sglang", scaled(1500, f))
    spec_dir = "sglang/srt/speculative"
    patched = [f"{spec_dir}/eagle_worker.py", f"{spec_dir}/spec_info.py",
               "sglang/srt/server_args.py", f"{spec_dir}/eagle_utils.py"]
    for p in patched:
        if p not in paths:
            paths.append(p)
    for p in paths:
        size = log_size(r)
        for s in both:
            spec = ("text", "c", sd("t", p))
            if s == "src" and p in patched[:2]:
                spec = ("textmut", "c", sd("t", p), sd("mut", p))  # same size
            elif s == "src" and p in patched[2:]:
                size2 = size + 517 + len(p)
                d[s].add(p, size2, ("text", "s", sd("ts", p)), cls="s")
                continue
            d[s].add(p, size, spec, cls="s" if spec[0] == "textmut" else "c")
    for s in both:
        S[s].append(d[s])
    # an unowned hand-added file on the source (carried by a `files` set)
    S["src_extra"] = [(f"{spec_dir}/ddtree_utils.py", 14 * KB, ("text", "s", sd("dd")))]

    # ---- transformers: pure-Python upgrade -----------------------------
    d = {"src": Dist("transformers", "4.57.1"), "dst": Dist("transformers", "4.56.2")}
    r = random.Random(sd("transformers"))
    paths = tree(r, "transformers", scaled(3000, f))
    for p in paths:
        x = r.random()
        size = log_size(r)
        if x < 0.03:
            d["src"].add(p, size, ("text", "s", sd("ts", p)), cls="s")
        elif x < 0.05:
            d["dst"].add(p, size, ("text", "t", sd("tt", p)), cls="t")
        elif x < 0.65:
            d["src"].add(p, size, ("text", "s", sd("ts", p)), cls="s")
            d["dst"].add(p, log_size(r), ("text", "t", sd("tt", p)), cls="t")
        else:
            for s in both:
                d[s].add(p, size, ("text", "c", sd("t", p)))
    for s in both:
        S[s].append(d[s])

    # ---- torch / torchvision / torchaudio: other CUDA build ------------
    cu = {"src": "cu130", "dst": "cu128"}
    fl = {"src": "s", "dst": "t"}

    def cuda_build(name, ver, top, n_py, n_h, libs, n_diff, n_same_size, only):
        d = {s: Dist(name, f"{ver}+{cu[s]}") for s in both}
        r = random.Random(sd(name))
        paths = tree(r, top, scaled(n_py, f), (".py", ".py", ".py", ".pyi"))
        if n_h:
            paths += tree(r, f"{top}/include", scaled(n_h, f), (".h", ".h", ".hpp", ".cuh"))
        r.shuffle(paths)
        k = 0
        for p in paths:
            size = log_size(r)
            if k < n_same_size:
                for s in both:
                    d[s].add(p, size, ("textmut", "c", sd("t", p), sd("mut", p, s)), cls=fl[s])
            elif k < n_diff:
                for s in both:
                    d[s].add(p, log_size(r), ("text", fl[s], sd("t", p, s)), cls=fl[s])
            elif k < n_diff + only:
                d["src"].add(p, size, ("text", "s", sd("t", p, "src")), cls="s")
            elif k < n_diff + 2 * only:
                d["dst"].add(p, size, ("text", "t", sd("t", p, "dst")), cls="t")
            else:
                for s in both:
                    d[s].add(p, size, ("text", "c", sd("t", p)))
            k += 1
        for rel, mb_src, mb_dst in libs:
            for s, mb in (("src", mb_src), ("dst", mb_dst)):
                d[s].add(rel, binsize(mb), ("bin", fl[s], sd("b", rel, s)), 0o755, cls=fl[s])
        return d

    tl = "torch/lib/"
    d = cuda_build("torch", "2.9.1", "torch", 7000, 5500,
                   [(tl + "libtorch_cuda.so", 1230, 1090), (tl + "libtorch_cpu.so", 455, 447),
                    (tl + "libtorch_python.so", 31, 30), (tl + "libc10_cuda.so", 1.3, 1.2),
                    (tl + "libc10.so", 1.3, 1.3), (tl + "libtorch_nvshmem.so", 20, 18),
                    (tl + "libshm.so", 0.05, 0.05), (tl + "libtorch_global_deps.so", 0.02, 0.02),
                    (tl + "libtorch.so", 0.01, 0.01), (tl + "libcaffe2_nvrtc.so", 0.03, 0.03),
                    ("torch/_C.cpython-311-x86_64-linux-gnu.so", 0.04, 0.04),
                    ("functorch/_C.cpython-311-x86_64-linux-gnu.so", 0.3, 0.3),
                    ("torch/bin/torch_shm_manager", 0.03, 0.03)]
                   + [(f"torch/_inductor/_ext{i}.so", 0.2 * (i + 1), 0.2 * (i + 1) + 0.01) for i in range(6)],
                   n_diff=40, n_same_size=25, only=6)
    # torch/version.py: the CUDA build, same size on both sides
    for s in both:
        ver = (f"from typing import Optional\n\n__all__ = ['__version__', 'debug', 'cuda', "
               f"'git_version', 'hip', 'xpu']\n__version__ = '2.9.1+{cu[s]}'\ndebug = False\n"
               f"cuda: Optional[str] = '{'13.0' if s == 'src' else '12.8'}'\n"
               f"git_version = 'd38164a545b4a4e4e0cf73ce67173f70574890b6'\n"
               f"hip: Optional[str] = None\nxpu: Optional[str] = None\n").encode()
        d[s].add("torch/version.py", len(ver), ("raw", ver), cls=fl[s])
        d[s].add(tl + "libgomp.so.1", binsize(0.3), ("bin", "c", sd("b", "gomp")), 0o755)
        d[s].add("torch/bin/protoc", binsize(5), ("bin", "c", sd("b", "protoc")), 0o755)
        for script in ("torchrun", "torchfrtrace"):
            body = (f"#!{VENV_AT}/bin/python\n# -*- coding: utf-8 -*-\nimport re\nimport sys\n"
                    f"from torch.distributed.run import main\nif __name__ == '__main__':\n"
                    f"    sys.argv[0] = re.sub(r'(-script\\.pyw|\\.exe)?$', '', sys.argv[0])\n"
                    f"    sys.exit(main())\n").encode()
            d[s].add(f"../../../bin/{script}", len(body), ("raw", body), 0o755)
    torch = d
    for s in both:
        S[s].append(d[s])
    d = cuda_build("torchvision", "0.24.1", "torchvision", 250, 0,
                   [("torchvision/_C.so", 12, 11), ("torchvision/image.so", 0.6, 0.6)],
                   n_diff=3, n_same_size=2, only=0)
    for s in both:
        d[s].add("torchvision.libs/libjpeg.1c1c4b09.so.8", binsize(0.6), ("bin", "c", sd("b", "jpeg")), 0o755)
        S[s].append(d[s])
    d = cuda_build("torchaudio", "2.9.1", "torchaudio", 300, 0,
                   [("torchaudio/lib/libtorchaudio.so", 5, 5), ("torchaudio/lib/_torchaudio.so", 0.1, 0.1)],
                   n_diff=2, n_same_size=1, only=0)
    for s in both:
        S[s].append(d[s])

    # ---- sgl-kernel: version upgrade with another CUDA build -------------
    d = {"src": Dist("sgl-kernel", "0.3.17"), "dst": Dist("sgl-kernel", "0.3.16.post3")}
    r = random.Random(sd("sgl-kernel"))
    for i, p in enumerate(tree(r, "sgl_kernel", scaled(60, f))):
        size = log_size(r)
        if i < 6:
            for s in both:
                d[s].add(p, log_size(r), ("text", fl[s], sd("t", p, s)), cls=fl[s])
        elif i < 8:
            d["src"].add(p, size, ("text", "s", sd("t", p, "src")), cls="s")
        else:
            for s in both:
                d[s].add(p, size, ("text", "c", sd("t", p)))
    for rel, a, b in (("sgl_kernel/sm90/common_ops.abi3.so", 190, 175),
                      ("sgl_kernel/sm100/common_ops.abi3.so", 180, 165)):
        for s, mb in (("src", a), ("dst", b)):
            d[s].add(rel, binsize(mb), ("bin", fl[s], sd("b", rel, s)), 0o755, cls=fl[s])
    for s in both:
        S[s].append(d[s])

    # ---- CUDA wheels ---------------------------------------------------
    # source: CUDA 13 (nvidia/cu13/...); target: CUDA 12.8 (nvidia/<lib>/...)
    cu13 = [  # name, version, [(lib, MB)], headers
        ("nvidia-cublas", "13.1.0.3", [("libcublas.so.13", 70), ("libcublasLt.so.13", 560), ("libnvblas.so.13", 0.8)], 20),
        ("nvidia-cuda-runtime", "13.0.96", [("libcudart.so.13", 0.7)], 90),
        ("nvidia-cuda-nvrtc", "13.0.88", [("libnvrtc.so.13", 105), ("libnvrtc-builtins.so.13.0", 7)], 4),
        ("nvidia-cufft", "12.0.0.61", [("libcufft.so.12", 290), ("libcufftw.so.12", 1)], 10),
        ("nvidia-curand", "10.4.0.35", [("libcurand.so.10", 95)], 12),
        ("nvidia-cusolver", "12.0.4.66", [("libcusolver.so.12", 265), ("libcusolverMg.so.12", 120)], 8),
        ("nvidia-cusparse", "12.6.3.3", [("libcusparse.so.12", 300)], 4),
        ("nvidia-nvjitlink", "13.0.88", [("libnvJitLink.so.13", 95)], 2),
        ("nvidia-cuda-cupti", "13.0.85", [("libcupti.so.13", 8), ("libnvperf_host.so", 30), ("libpcsamplingutil.so", 0.1)], 50),
        ("nvidia-nvtx", "13.0.85", [], 30),
        ("nvidia-cufile", "1.15.1.6", [("libcufile.so.0", 3), ("libcufile_rdma.so.1", 0.05)], 2),
    ]
    cu12 = [
        ("nvidia-cublas-cu12", "12.8.4.1", "cublas", [("libcublas.so.12", 100), ("libcublasLt.so.12", 500), ("libnvblas.so.12", 0.8)], 20),
        ("nvidia-cuda-runtime-cu12", "12.8.90", "cuda_runtime", [("libcudart.so.12", 0.7)], 90),
        ("nvidia-cuda-nvrtc-cu12", "12.8.93", "cuda_nvrtc", [("libnvrtc.so.12", 90), ("libnvrtc-builtins.so.12.8", 6)], 4),
        ("nvidia-cufft-cu12", "11.3.3.83", "cufft", [("libcufft.so.11", 280), ("libcufftw.so.11", 1)], 10),
        ("nvidia-curand-cu12", "10.3.9.90", "curand", [("libcurand.so.10", 90)], 12),
        ("nvidia-cusolver-cu12", "11.7.3.90", "cusolver", [("libcusolver.so.11", 255), ("libcusolverMg.so.11", 115)], 8),
        ("nvidia-cusparse-cu12", "12.5.8.93", "cusparse", [("libcusparse.so.12", 285)], 4),
        ("nvidia-nvjitlink-cu12", "12.8.93", "nvjitlink", [("libnvJitLink.so.12", 80)], 2),
        ("nvidia-cuda-cupti-cu12", "12.8.90", "cuda_cupti", [("libcupti.so.12", 8), ("libnvperf_host.so", 28), ("libpcsamplingutil.so", 0.1)], 50),
        ("nvidia-nvtx-cu12", "12.8.90", "nvtx", [("libnvToolsExt.so.1", 0.05)], 30),
        ("nvidia-cufile-cu12", "1.13.1.3", "cufile", [("libcufile.so.0", 3), ("libcufile_rdma.so.1", 0.05)], 2),
    ]
    nv_src, nv_dst = [], []
    for name, ver, libs, nh in cu13:
        dd = Dist(name, ver)
        r = random.Random(sd(name))
        dd.add("nvidia/cu13/__init__.py", 0, ("raw", b""), cls="s")
        for lib, mb in libs:
            rel = f"nvidia/cu13/lib/{lib}"
            dd.add(rel, binsize(mb), ("bin", "s", sd("b", rel)), 0o755, cls="s")
        short = name[len("nvidia-"):].replace("-", "_")
        for p in tree(r, "X", scaled(nh, f), (".h", ".h", ".hpp")):
            head, _, base = p[2:].rpartition("/")
            p = f"nvidia/cu13/include/{head + '/' if head else ''}{short}_{base}"
            dd.add(p, log_size(r, 2 * KB, 120 * KB), ("text", "s", sd("t", p)), cls="s")
        nv_src.append(dd)
    for name, ver, sub, libs, nh in cu12:
        dd = Dist(name, ver)
        r = random.Random(sd(name))
        dd.add("nvidia/__init__.py", 0, ("raw", b""), cls="t")
        dd.add(f"nvidia/{sub}/__init__.py", 0, ("raw", b""), cls="t")
        for lib, mb in libs:
            rel = f"nvidia/{sub}/lib/{lib}"
            dd.add(rel, binsize(mb), ("bin", "t", sd("b", rel)), 0o755, cls="t")
        for p in tree(r, f"nvidia/{sub}/include", scaled(nh, f), (".h", ".h", ".hpp")):
            dd.add(p, log_size(r, 2 * KB, 120 * KB), ("text", "t", sd("t", p)), cls="t")
        nv_dst.append(dd)
    same_path = [  # (src name, src version, dst name, dst version, sub, [(lib, MB src, MB dst)], headers)
        ("nvidia-cudnn-cu13", "9.13.0.50", "nvidia-cudnn-cu12", "9.10.2.21", "cudnn",
         [("libcudnn_engines_precompiled.so.9", 640, 590), ("libcudnn_adv.so.9", 280, 260),
          ("libcudnn_ops.so.9", 120, 110), ("libcudnn_heuristic.so.9", 55, 50),
          ("libcudnn_engines_runtime_compiled.so.9", 30, 28), ("libcudnn_cnn.so.9", 3, 3),
          ("libcudnn_graph.so.9", 2.6, 2.5), ("libcudnn.so.9", 0.1, 0.1)], 30),
        ("nvidia-nccl-cu13", "2.27.7", "nvidia-nccl-cu12", "2.27.3", "nccl",
         [("libnccl.so.2", 285, 260)], 6),
        ("nvidia-cusparselt-cu13", "0.8.1", "nvidia-cusparselt-cu12", "0.7.1", "cusparselt",
         [("libcusparseLt.so.0", 240, 220)], 4),
        ("nvidia-nvshmem-cu13", "3.4.5", "nvidia-nvshmem-cu12", "3.3.20", "nvshmem",
         [("libnvshmem_host.so.3", 25, 22), ("nvshmem_bootstrap_uid.so.3", 0.1, 0.1),
          ("nvshmem_transport_ibrc.so.3", 0.2, 0.2), ("libnvshmem_device.bc", 10, 9)], 60),
    ]
    for sname, sver, dname, dver, sub, libs, nh in same_path:
        ds, dt = Dist(sname, sver), Dist(dname, dver)
        r = random.Random(sd(sub))
        for lib, a, b in libs:
            rel = f"nvidia/{sub}/lib/{lib}"
            ds.add(rel, binsize(a), ("bin", "s", sd("b", rel, "s")), 0o755, cls="s")
            dt.add(rel, binsize(b), ("bin", "t", sd("b", rel, "t")), 0o755, cls="t")
        for p in tree(r, f"nvidia/{sub}/include", scaled(nh, f), (".h",)):
            ds.add(p, log_size(r, 2 * KB, 120 * KB), ("text", "s", sd("t", p, "s")), cls="s")
            dt.add(p, log_size(r, 2 * KB, 120 * KB), ("text", "t", sd("t", p, "t")), cls="t")
        for rel in (f"nvidia/{sub}/__init__.py",):
            ds.add(rel, 0, ("raw", b""), cls="s")
            dt.add(rel, 0, ("raw", b""), cls="t")
        nv_src.append(ds)
        nv_dst.append(dt)
    S["src"] += nv_src
    S["dst"] += nv_dst
    # torch requires its CUDA wheels
    for s, nv in (("src", nv_src), ("dst", nv_dst)):
        torch[s].requires = [f"{x.name}=={x.version}; platform_system == \"Linux\"" for x in nv] + [
            "filelock", "typing-extensions>=4.10.0", "sympy>=1.13.3", "networkx>=2.5.1",
            "jinja2", f"triton==3.5.0; platform_system == \"Linux\""]
    return S


def hash_seed(seed, *parts):
    h = hashlib.blake2b(repr((seed,) + parts).encode(), digest_size=8).digest()
    return int.from_bytes(h, "little")


# --------------------------------------------------------------------------
# Writing
# --------------------------------------------------------------------------

def b64(digest):
    return base64.urlsafe_b64encode(digest).rstrip(b"=").decode()


def write_one(pools, targets, rel_abs, size, spec, mode, mtimes):
    """Write one content to every (venv dir) in targets; return (sha256 b64, size)."""
    pairs = dict(zip((os.path.normpath(os.path.join(t, rel_abs)) for t in targets), mtimes))
    paths, mtimes = list(pairs), list(pairs.values())
    for p in paths:
        os.makedirs(os.path.dirname(p), exist_ok=True)
    fds = [os.open(p, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode) for p in paths]
    h = hashlib.sha256()
    n = 0
    try:
        for c in chunks(pools, spec, size):
            h.update(c)
            n += len(c)
            for fd in fds:
                view = memoryview(c)
                while view:
                    w = os.write(fd, view)
                    view = view[w:]
    finally:
        for fd in fds:
            os.close(fd)
    for p, t in zip(paths, mtimes):
        os.chmod(p, mode)
        os.utime(p, ns=(t * 10**9, t * 10**9))
    return b64(h.digest()), n


def generate(out, scale=1.0, nfiles=BASE_FILES, mtimes="same", seed=1, threads=3, log=print):
    t0 = time.monotonic()
    out = os.path.abspath(out)
    venv = {s: os.path.join(out, s) for s in ("src", "dst")}
    for v in venv.values():
        if os.path.exists(v):
            shutil.rmtree(v)
    pools = Pools(seed, scale)
    layout = build_layout(scale, nfiles, seed)
    extra = layout.pop("src_extra")
    log(f"genvenv: pools and layout in {time.monotonic() - t0:.1f}s")

    def mtime_of(side, cls, rel):
        j = hash_seed(seed, "mt", rel) % 86400
        if mtimes == "install":
            return (T_SRC if side == "src" else T_DST) + j
        if cls == "c":
            return T_COMMON + j
        return (T_SRC if side == "src" else T_DST) + j

    # venv skeleton
    for s, v in venv.items():
        os.makedirs(os.path.join(v, SITE))
        os.makedirs(os.path.join(v, "bin"))
        os.makedirs(os.path.join(v, "include"))
        with open(os.path.join(v, "pyvenv.cfg"), "w") as f:
            f.write("home = /usr/bin\ninclude-system-site-packages = false\nversion = 3.11.2\n"
                    f"executable = /usr/bin/python3.11\ncommand = /usr/bin/python3 -m venv {VENV_AT}\n")
        os.symlink("/usr/bin/python3.11", os.path.join(v, "bin", "python"))
        os.symlink("python", os.path.join(v, "bin", "python3"))
        os.symlink("python", os.path.join(v, "bin", "python3.11"))

    # All files of both sides: identical (path, size, spec, mode) are written once to both.
    jobs = {}   # (rel, size, spec, mode) -> list of (side, cls)
    for s in ("src", "dst"):
        for d in layout[s]:
            for rel, size, spec, mode, cls in d.files:
                jobs.setdefault((rel, size, spec, mode), []).append((s, cls))
    for rel, size, spec in extra:
        jobs.setdefault((rel, size, spec, 0o644), []).append(("src", "s"))
    results = {}

    def run(key):
        rel, size, spec, mode = key
        sides = jobs[key]
        targets = [os.path.join(venv[s], SITE) for s, _ in sides]
        mts = [mtime_of(s, cls, rel) for s, cls in sides]
        return key, write_one(pools, targets, rel, size, spec, mode, mts)

    keys = sorted(jobs, key=lambda k: -k[1])  # big first: better balance
    with ThreadPoolExecutor(threads) as ex:
        for key, res in ex.map(run, keys, chunksize=64):
            results[key] = res
    log(f"genvenv: files written in {time.monotonic() - t0:.1f}s")

    # dist-info
    summary = {"scale": scale, "files": nfiles, "mtimes": mtimes, "seed": seed, "sides": {}}
    for s in ("src", "dst"):
        site = os.path.join(venv[s], SITE)
        nbytes = nf = nso = 0
        for d in layout[s]:
            dist = d.name.replace("-", "_")
            di = f"{dist}-{d.version}.dist-info"
            os.makedirs(os.path.join(site, di))
            lines = []
            for rel, size, spec, mode, cls in d.files:
                h, n = results[(rel, size, spec, mode)]
                lines.append(f"{rel},sha256={h},{n}")
                nbytes += n
                nf += 1
                nso += rel.endswith(".so") or ".so." in rel
            meta = [f"Metadata-Version: 2.1", f"Name: {d.name}", f"Version: {d.version}",
                    f"Summary: {d.name} (overlay benchmark stand-in)", "Requires-Python: >=3.10"]
            meta += [f"Requires-Dist: {x}" for x in d.requires]
            info = {
                "METADATA": ("\n".join(meta) + "\n\n").encode(),
                "INSTALLER": b"pip\n",
                "WHEEL": b"Wheel-Version: 1.0\nGenerator: bdist_wheel (0.45.1)\nRoot-Is-Purelib: false\n"
                         b"Tag: cp311-cp311-manylinux_2_28_x86_64\n\n",
            }
            for k, data in info.items():
                p = os.path.join(site, di, k)
                with open(p, "wb") as f:
                    f.write(data)
                cls = "c" if all(x[4] == "c" for x in d.files) else s[0]
                t = mtime_of(s, "c" if cls == "c" else "x", f"{di}/{k}")
                os.utime(p, ns=(t * 10**9,) * 2)
                lines.append(f"{di}/{k},sha256={b64(hashlib.sha256(data).digest())},{len(data)}")
                nf += 1
                nbytes += len(data)
            lines.append(f"{di}/RECORD,,")
            p = os.path.join(site, di, "RECORD")
            data = ("\n".join(lines) + "\n").encode()
            with open(p, "wb") as f:
                f.write(data)
            t = mtime_of(s, "c" if all(x[4] == "c" for x in d.files) else "x", f"{di}/RECORD")
            os.utime(p, ns=(t * 10**9,) * 2)
            nf += 1
            nbytes += len(data)
        summary["sides"][s] = {"dists": len(layout[s]), "files": nf, "bytes": nbytes, "so": nso}
    # extra unowned file
    summary["sides"]["src"]["unowned"] = [e[0] for e in extra]
    # what differs (for the report): bytes of src files not identical on dst
    diff_bytes = diff_files = 0
    for key, sides in jobs.items():
        if {s for s, _ in sides} == {"src"}:
            diff_files += 1
            diff_bytes += key[1]
    summary["src_files_not_on_dst_identical"] = diff_files
    summary["src_bytes_not_on_dst_identical"] = diff_bytes
    summary["seconds"] = round(time.monotonic() - t0, 1)
    with open(os.path.join(out, "summary.json"), "w") as f:
        json.dump(summary, f, indent=1)
    log(f"genvenv: done in {summary['seconds']}s: "
        + ", ".join(f"{s} {v['files']} files {v['bytes'] / 1e9:.2f} GB ({v['so']} .so)"
                    for s, v in summary["sides"].items())
        + f"; {diff_files} source files ({diff_bytes / 1e9:.2f} GB) differ or are missing on the target")
    return summary


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("outdir")
    p.add_argument("--scale", type=float, default=1.0, help="size factor of binaries (1 = full, ~6.5 GB)")
    p.add_argument("--files", type=int, default=BASE_FILES, help="approximate number of files per venv")
    p.add_argument("--mtimes", choices=("same", "install"), default="same")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--threads", type=int, default=3)
    a = p.parse_args()
    generate(a.outdir, a.scale, a.files, a.mtimes, a.seed, a.threads,
             log=lambda m: print(m, file=sys.stderr))


if __name__ == "__main__":
    main()
