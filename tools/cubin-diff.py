#!/usr/bin/env python3
"""Which kernels of two kernel caches hold the same machine code: per role, how many configs'
.text sections are byte-identical. For deciding which tuning rows a template change leaves
measured (db/README.md): the rows of roles whose code did not change keep their times with the
new template hash (tools/retune-part.py), the others are tuned again. Runs here, without the GPU
machine's cuobjdump; the other ELF sections (symbol names, the source hash) differ anyway.

  MOEJIT_CACHE_DIR=/tmp/kc-a build/a/tools/moejit/moejit compile --arch sm_90a
  MOEJIT_CACHE_DIR=/tmp/kc-b build/release/tools/moejit/moejit compile --arch sm_90a
  tools/cubin-diff.py /tmp/kc-a /tmp/kc-b
"""

import collections
import pathlib
import re
import struct
import sys


def cubin_of(path):
    """The cubin inside a cache file: magic[8] | u64 meta_len | u64 cubin_len | u64 checksum | meta | cubin
    (src/jit/disk_cache.cpp)."""
    raw = path.read_bytes()
    meta_len, cubin_len = struct.unpack_from("<QQ", raw, 8)
    return raw[32 + meta_len:32 + meta_len + cubin_len]


def text_sections(elf):
    """The .text* sections of a 64-bit little-endian ELF, by name."""
    shoff = struct.unpack_from("<Q", elf, 0x28)[0]
    shentsize, shnum, shstrndx = struct.unpack_from("<HHH", elf, 0x3A)
    headers = [struct.unpack_from("<IIQQQQ", elf, shoff + i * shentsize) for i in range(shnum)]
    names_at = headers[shstrndx][4]
    out = {}
    for name, _type, _flags, _addr, offset, size in headers:
        label = elf[names_at + name:elf.index(b"\0", names_at + name)].decode()
        if label.startswith(".text"):
            out[label] = elf[offset:offset + size]
    return out


def load(folder):
    """Config name (the file name without its key hash) -> its .text sections."""
    kernels = {}
    for path in pathlib.Path(folder).rglob("*.cubin"):  # in each build's subfolder
        name = re.sub(r"\.[0-9a-f]{16}\.cubin$", "", path.name)
        kernels[name] = text_sections(cubin_of(path))
    return kernels


def main():
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    a, b = load(sys.argv[1]), load(sys.argv[2])
    same, differ, alone = collections.Counter(), collections.Counter(), collections.Counter()
    for name in sorted(set(a) | set(b)):
        role = name.split(".")[0]
        if name not in a or name not in b:
            alone[role] += 1
        elif a[name] == b[name]:
            same[role] += 1
        else:
            differ[role] += 1
    for role in sorted(set(same) | set(differ) | set(alone)):
        print(f"{role:12} same {same[role]:4}  differ {differ[role]:4}  in one cache only {alone[role]:4}")


if __name__ == "__main__":
    main()
