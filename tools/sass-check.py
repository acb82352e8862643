#!/usr/bin/env python3
"""Counts the matrix and copy instructions in kernels of the moejit disk cache, to show which
MMA a config compiled to (HGMMA: Hopper wgmma; HMMA: mma.sync). Needs cuobjdump (the GPU
machine's toolkit has it). Usage: tools/sass-check.py CACHE_FILE...

Disk cache layout (src/jit/disk_cache.cpp): magic[8] | u64 meta_len | u64 cubin_len | u64 sum | meta | cubin.
"""
import collections
import re
import subprocess
import sys
import tempfile

PATTERN = re.compile(r"\b(HGMMA\.[\w.]+|HMMA\.[\w.]+|LDSM[\w.]*|LDGSTS[\w.]*|UTMALDG[\w.]*)")

for path in sys.argv[1:]:
    data = open(path, "rb").read()
    meta_len, cubin_len = (int.from_bytes(data[o:o + 8], "little") for o in (8, 16))
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(data[32 + meta_len:32 + meta_len + cubin_len])
        f.flush()
        sass = subprocess.run(["cuobjdump", "-sass", f.name], capture_output=True, text=True, check=True).stdout
    ops = collections.Counter(m.group(0) for m in PATTERN.finditer(sass))
    print(path.rsplit("/", 1)[-1], dict(sorted(ops.items())))
