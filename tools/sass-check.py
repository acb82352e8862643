#!/usr/bin/env python3
"""Counts the matrix and copy instructions in kernels of the moejit disk cache, to show which
MMA a config compiled to (HGMMA: Hopper wgmma; HMMA: mma.sync) and how it copies (UTMALDG /
UTMASTG: TMA loads and stores; LDGSTS: cp.async). Needs cuobjdump and nvdisasm: the GPU
machine's toolkit has them; elsewhere they come from PyPI's nvidia-cuda-cuobjdump and
nvidia-cuda-nvdisasm wheels, installed once into build/sass-tools. Static, so it runs on a
machine without a GPU. Usage: tools/sass-check.py CACHE_FILE...

Disk cache layout (src/jit/disk_cache.cpp): magic[8] | u64 meta_len | u64 cubin_len | u64 sum | meta | cubin.
"""
import collections
import os
import pathlib
import re
import shutil
import subprocess
import sys
import tempfile

PATTERN = re.compile(r"\b(HGMMA\.[\w.]+|HMMA\.[\w.]+|LDSM[\w.]*|LDGSTS[\w.]*|UTMALDG[\w.]*|UTMASTG[\w.]*)")
WHEELS = pathlib.Path(__file__).resolve().parents[1] / "build" / "sass-tools"


def tool_env():
    """An environment whose PATH has cuobjdump and nvdisasm, installing the wheels if needed."""
    env = dict(os.environ)
    if shutil.which("cuobjdump") and shutil.which("nvdisasm"):
        return env
    bin_dir = WHEELS / "nvidia" / "cu13" / "bin"
    if not (bin_dir / "cuobjdump").exists():
        subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", str(WHEELS),
                        "nvidia-cuda-cuobjdump", "nvidia-cuda-nvdisasm"], check=True)
    for tool in ("cuobjdump", "nvdisasm"):
        (bin_dir / tool).chmod(0o755)
    env["PATH"] = f"{bin_dir}{os.pathsep}{env.get('PATH', '')}"
    return env


ENV = tool_env()

for path in sys.argv[1:]:
    data = open(path, "rb").read()
    meta_len, cubin_len = (int.from_bytes(data[o:o + 8], "little") for o in (8, 16))
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(data[32 + meta_len:32 + meta_len + cubin_len])
        f.flush()
        sass = subprocess.run(["cuobjdump", "-sass", f.name], capture_output=True, text=True, check=True,
                              env=ENV).stdout
    ops = collections.Counter(m.group(0) for m in PATTERN.finditer(sass))
    # A pipelined wgmma loop keeps a group in flight (DEPBAR.LE gsb0, 0x1) and drains once; a
    # serialized one (ptxas C7510/C7512/C7515) waits for zero groups after every HGMMA.
    hgmma = sum(n for op, n in ops.items() if op.startswith("HGMMA"))
    drains = sass.count("DEPBAR.LE gsb0, 0x0")
    serialized = " SERIALIZED" if hgmma > 1 and drains >= hgmma else ""
    # R2UR per HGMMA in the first k tile's wgmma sequence (first HGMMA to the one that ends the
    # group, gsb0): about 1.5 when the loop's descriptors live in uniform registers; a branch that
    # ptxas takes as divergent moves them to vector registers and doubles it (session 14).
    lines = [line for line in sass.splitlines() if re.search(r"/\*[0-9a-f]{4}\*/\s+\S", line)]
    at = [i for i, line in enumerate(lines) if "HGMMA" in line]
    ends = [i for i in at if "gsb0" in lines[i]]
    uniform = ""
    if ends:
        first = lines[at[0]:ends[0] + 1]
        uniform = f" r2ur/hgmma {sum('R2UR' in x for x in first) / sum('HGMMA' in x for x in first):.1f}"
    print(path.rsplit("/", 1)[-1], dict(sorted(ops.items())), f"wait-all {drains}{serialized}{uniform}")
