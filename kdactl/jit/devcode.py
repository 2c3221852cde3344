"""Which GPU architectures a built library holds device code (cubins) for: from ``cuobjdump
--list-elf`` when the toolkit has it, else by reading the CUDA ELF images embedded in the fatbin.

Pure parsers plus one subprocess call; tests feed recorded bytes and text.
"""

from __future__ import annotations

import re
import shutil
import struct
import subprocess
from pathlib import Path

EM_CUDA = 190
ELFOSABI_CUDA_V1 = 0x33  # older CUDA ELF: e_flags & 0xff is the SM number
ELFOSABI_CUDA_V2 = 0x41  # CUDA 13 ELF: (e_flags >> 8) & 0xff is the SM number
_ELF_NAME = re.compile(r"\bsm_(\d+[a-z]?)\b")


def embedded_sms(data: bytes) -> set[int]:
    """SM numbers (90 for sm_90a) of every uncompressed CUDA ELF image inside ``data``."""
    found: set[int] = set()
    pos = data.find(b"\x7fELF")
    while pos >= 0:
        if pos + 52 <= len(data) and data[pos + 4] == 2:  # 64-bit ELF header
            machine = struct.unpack_from("<H", data, pos + 18)[0]
            flags = struct.unpack_from("<I", data, pos + 48)[0]
            osabi = data[pos + 7]
            if machine == EM_CUDA:
                sm = (flags >> 8) & 0xFF if osabi == ELFOSABI_CUDA_V2 else flags & 0xFF
                if sm:
                    found.add(sm)
        pos = data.find(b"\x7fELF", pos + 1)
    return found


def parse_list_elf(text: str) -> set[str]:
    """Arch names ("sm_90a") in ``cuobjdump --list-elf`` output (lines like
    'ELF file    1: libkdactl.1.sm_90a.cubin')."""
    return {"sm_" + m.group(1) for line in text.splitlines() if "ELF file" in line for m in _ELF_NAME.finditer(line)}


def find_cuobjdump(nvcc: str | None = None) -> str | None:
    """cuobjdump on PATH, else next to nvcc."""
    found = shutil.which("cuobjdump")
    if found:
        return found
    if nvcc:
        nvcc_path = shutil.which(nvcc) or nvcc
        sibling = Path(nvcc_path).resolve().parent / "cuobjdump"
        if sibling.is_file():
            return str(sibling)
    return None


def list_elf(library: Path, cuobjdump: str, timeout_s: float = 60.0) -> set[str]:
    """Run cuobjdump --list-elf; RuntimeError when it fails."""
    proc = subprocess.run([cuobjdump, "--list-elf", str(library)], capture_output=True, text=True, timeout=timeout_s)
    if proc.returncode != 0:
        raise RuntimeError(f"{cuobjdump} --list-elf {library} exited {proc.returncode}: {proc.stderr.strip()[:200]}")
    return parse_list_elf(proc.stdout)
