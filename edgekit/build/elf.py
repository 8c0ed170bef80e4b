"""Just enough ELF and CUDA fatbin reading to check what a build produced, with no tools needed.

Only 64-bit little-endian files are read: every target edgekit builds (x86_64, aarch64) is one.
"""

from __future__ import annotations

import re
import struct
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

ELF_MAGIC = b"\x7fELF"
MACHINES = {62: "x86_64", 183: "aarch64", 40: "arm", 3: "x86", 243: "riscv"}
ELF_TYPES = {1: "relocatable", 2: "executable", 3: "shared"}
FATBIN_MAGIC = 0xBA55ED50
FATBIN_KINDS = {1: "ptx", 2: "cubin"}


@dataclass(frozen=True)
class ElfHeader:
    machine: str
    elf_type: str
    bits: int


def is_elf(path: Path) -> bool:
    try:
        with open(path, "rb") as fh:
            return fh.read(4) == ELF_MAGIC
    except OSError:
        return False


def read_header(path: Path) -> ElfHeader:
    with open(path, "rb") as fh:
        ident = fh.read(64)
    if ident[:4] != ELF_MAGIC:
        raise ValueError(f"{path} is not an ELF file")
    bits = {1: 32, 2: 64}.get(ident[4], 0)
    endian = "<" if ident[5] == 1 else ">"
    e_type, e_machine = struct.unpack_from(endian + "HH", ident, 16)
    return ElfHeader(MACHINES.get(e_machine, f"em{e_machine}"), ELF_TYPES.get(e_type, f"type{e_type}"), bits)


def sections(path: Path) -> dict[str, tuple[int, int]]:
    """Section name → (file offset, size), for a 64-bit little-endian ELF file."""
    with open(path, "rb") as fh:
        head = fh.read(64)
        if head[:4] != ELF_MAGIC or head[4] != 2 or head[5] != 1:
            raise ValueError(f"{path} is not a 64-bit little-endian ELF file")
        shoff, = struct.unpack_from("<Q", head, 0x28)
        shentsize, shnum, shstrndx = struct.unpack_from("<HHH", head, 0x3A)
        fh.seek(shoff)
        table = fh.read(shentsize * shnum)
        entries = [struct.unpack_from("<IIQQQQ", table, i * shentsize) for i in range(shnum)]
        _, _, _, _, str_off, str_size = entries[shstrndx]
        fh.seek(str_off)
        names = fh.read(str_size)
    out = {}
    for name_off, sh_type, _flags, _addr, offset, size in entries:
        name = names[name_off:names.index(b"\0", name_off)].decode(errors="replace")
        out[name] = (offset, 0 if sh_type == 8 else size)  # SHT_NOBITS has no bytes in the file
    return out


def section_bytes(path: Path, name: str) -> bytes:
    offset, size = sections(path).get(name, (0, 0))
    if not size:
        return b""
    with open(path, "rb") as fh:
        fh.seek(offset)
        return fh.read(size)


def glibc_needed(path: Path) -> tuple[int, int] | None:
    """The newest GLIBC_x.y symbol version the file asks for (None: it asks for none)."""
    found = [(int(a), int(b)) for a, b in re.findall(rb"GLIBC_(\d+)\.(\d+)", section_bytes(path, ".dynstr"))]
    return max(found) if found else None


def fatbin_entries(data: bytes) -> list[tuple[str, int]]:
    """(kind, sm) of every entry of the concatenated fatbins in a .nv_fatbin section."""
    out: list[tuple[str, int]] = []
    pos = 0
    while pos + 16 <= len(data):
        magic, _version, header_size, fat_size = struct.unpack_from("<IHHQ", data, pos)
        if magic != FATBIN_MAGIC:
            pos += 8  # fatbins are 8-byte aligned; skip padding
            continue
        entry = pos + header_size
        end = entry + fat_size
        while entry + 0x20 <= end:
            kind, _flags, e_header, payload = struct.unpack_from("<HHIQ", data, entry)
            arch, = struct.unpack_from("<I", data, entry + 0x1C)
            if e_header == 0:
                break
            out.append((FATBIN_KINDS.get(kind, f"kind{kind}"), arch))
            entry += e_header + payload
        pos = end
    return out


def cubin_archs(path: Path) -> Counter[int]:
    """How many cubins per SM architecture a file's fatbin holds (sm_87 → 87)."""
    entries = fatbin_entries(section_bytes(path, ".nv_fatbin"))
    return Counter(arch for kind, arch in entries if kind == "cubin")
