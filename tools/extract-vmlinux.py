#!/usr/bin/python3
"""Extracts the uncompressed kernel (an ELF `vmlinux`) from an x86 bzImage, for a direct PVH boot.

    tools/extract-vmlinux.py BZIMAGE CONFIG OUT

Why: booted from a bzImage, the guest first decompresses itself; under TCG that took about
0.85 s of a 3 s bare boot here (Debian's cloud kernel, LZ4). QEMU boots an ELF kernel that
carries a PVH entry point (XEN_ELFNOTE_PHYS32_ENTRY) directly, as Firecracker boots its
guests. The kernel then runs at its link address: no KASLR inside the guest
(docs/security.md, "microVM level").

Where the payload is: the x86 boot protocol (Documentation/arch/x86/boot.rst), header 2.08+:
`setup_sects` at 0x1f1, `payload_offset` and `payload_length` at 0x248/0x24c, the payload
counted from the end of the real-mode setup. Its compressor is the one CONFIG names
(CONFIG_KERNEL_<X>=y); its last four bytes hold the uncompressed size (little-endian), which
the result must match.

Exit status: 0 written; 3 the kernel has no PVH entry (boot it from the bzImage); 1 any other
failure (a message on stderr). OUT is written whole or not at all (a temporary name, then a
rename).
"""
import bz2
import gzip
import lzma
import os
import struct
import subprocess
import sys

XEN_ELFNOTE_PHYS32_ENTRY = 18


def fail(msg, status=1):
    print(f"extract-vmlinux: {msg}", file=sys.stderr)
    sys.exit(status)


def compressor(config_path):
    with open(config_path, encoding="utf-8", errors="replace") as f:
        for line in f:
            line = line.strip()
            if line.startswith("CONFIG_KERNEL_") and line.endswith("=y"):
                name = line[len("CONFIG_KERNEL_"):-2]
                if name in ("GZIP", "BZIP2", "LZMA", "XZ", "LZO", "LZ4", "ZSTD"):
                    return name
    fail(f"{config_path} names no kernel compressor (CONFIG_KERNEL_<X>=y)")


def decompress(kind, data):
    if kind == "GZIP":
        return gzip.decompress(data)
    if kind == "BZIP2":
        return bz2.decompress(data)
    if kind == "XZ":
        return lzma.LZMADecompressor(format=lzma.FORMAT_XZ).decompress(data)
    if kind == "LZMA":
        return lzma.LZMADecompressor(format=lzma.FORMAT_ALONE).decompress(data)
    # No module in Python's standard library: the tool of the same name (Debian packages lz4,
    # zstd, lzop; tools/setup.sh installs lz4, the compressor of Debian's cloud kernel). The
    # kernel's legacy-format LZ4 frames end at the size trailer, which the tool may call
    # trailing garbage: its exit status is not the judge, the size check below is.
    tool = {"LZ4": ["lz4", "-dc"], "ZSTD": ["zstd", "-dcq"], "LZO": ["lzop", "-dc"]}[kind]
    try:
        p = subprocess.run(tool, input=data, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                           check=False)
    except FileNotFoundError:
        fail(f"the kernel is {kind}-compressed and `{tool[0]}` is not installed")
    return p.stdout


def has_pvh_entry(elf):
    """True when the ELF64 x86-64 image has a PT_NOTE with a Xen note of type 18."""
    if elf[:4] != b"\x7fELF" or elf[4] != 2 or elf[5] != 1:
        fail("the payload is not a little-endian ELF64 image")
    (e_machine,) = struct.unpack_from("<H", elf, 18)
    if e_machine != 62:
        fail(f"the payload's ELF machine is {e_machine}, not x86-64")
    e_phoff, = struct.unpack_from("<Q", elf, 32)
    e_phentsize, e_phnum = struct.unpack_from("<HH", elf, 54)
    for i in range(e_phnum):
        p_type, _, p_offset, _, _, p_filesz = struct.unpack_from("<IIQQQQ", elf,
                                                                 e_phoff + i * e_phentsize)
        if p_type != 4:  # PT_NOTE
            continue
        at, end = p_offset, p_offset + p_filesz
        while at + 12 <= end:
            namesz, descsz, ntype = struct.unpack_from("<III", elf, at)
            name = elf[at + 12:at + 12 + namesz].rstrip(b"\0")
            if name == b"Xen" and ntype == XEN_ELFNOTE_PHYS32_ENTRY:
                return True
            at += 12 + ((namesz + 3) & ~3) + ((descsz + 3) & ~3)
    return False


def main():
    if len(sys.argv) != 4:
        fail("usage: extract-vmlinux.py BZIMAGE CONFIG OUT")
    bzimage, config, out = sys.argv[1:]
    with open(bzimage, "rb") as f:
        img = f.read()
    if len(img) < 0x250 or img[0x202:0x206] != b"HdrS":
        fail(f"{bzimage} is not an x86 bzImage (no HdrS header)")
    (version,) = struct.unpack_from("<H", img, 0x206)
    if version < 0x208:
        fail(f"{bzimage}: boot protocol {version:#x} has no payload fields (2.08+)")
    setup_sects = img[0x1F1] or 4
    payload_offset, payload_length = struct.unpack_from("<II", img, 0x248)
    start = (setup_sects + 1) * 512 + payload_offset
    payload = img[start:start + payload_length]
    if len(payload) != payload_length or payload_length < 8:
        fail(f"{bzimage}: the payload lies outside the file")
    kind = compressor(config)
    (size,) = struct.unpack_from("<I", payload, payload_length - 4)
    elf = decompress(kind, payload if kind == "GZIP" else payload[:-4])
    if len(elf) != size:
        fail(f"decompressing the {kind} payload gave {len(elf)} bytes, its trailer says {size}")
    if not has_pvh_entry(elf):
        fail("the kernel has no PVH entry point (XEN_ELFNOTE_PHYS32_ENTRY)", 3)
    tmp = f"{out}.tmp.{os.getpid()}"
    with open(tmp, "wb") as f:
        f.write(elf)
        f.flush()
        os.fsync(f.fileno())
    os.chmod(tmp, 0o644)
    os.rename(tmp, out)


if __name__ == "__main__":
    main()
