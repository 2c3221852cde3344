"""Builds csrc's kernel library for the CPU emulator (tests/emu/emu.h says what it models): a copy of
csrc with ptx.cuh replaced by the emulator's, launches and __shared__ variables rewritten, compiled
with the host C++ compiler against the CUDA toolkit's headers into one shared library that exports
the same C ABI as the real one (kdactl_kda_<route>, kdactl_kda_workspace_bytes, ...) plus
kdactl_emu_configure(sms, schedule, smem_optin)."""

from __future__ import annotations

import hashlib
import os
import re
import shlex
import shutil
import subprocess
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

EMU_DIR = Path(__file__).resolve().parent
TARGET_DEFINE = "-DKDACTL_TARGET_SM90A"  # the emulated device is an H200
# -fno-strict-aliasing: the kernels reinterpret words as element pairs (CUDA code does; nvcc allows it)
FLAGS = ["-std=c++17", "-O2", "-fno-strict-aliasing", "-fPIC", "-Wno-attributes", TARGET_DEFINE]

# `kernel<T><<<grid, block, smem, stream>>>(` -> `::emu::launch(kernel<T>, grid, block, smem, stream)(`
_LAUNCH = re.compile(r"(\b[\w:]+(?:<[^;{}<>]*>)?)\s*<<<(.*?)>>>\s*\(", re.S)
# `extern __shared__ __align__(16) T name[];` -> a pointer to the block's dynamic shared memory
_DYNAMIC_SMEM = re.compile(r"extern\s+__shared__\s+(?:__align__\(\d+\)\s+)?([\w:]+(?:\s+[\w:]+)*?)\s+(\w+)\[\];")


def emulated_source(text: str) -> str:
    """One csrc file as the emulator compiles it: launches through emu::launch, dynamic shared memory
    from emu::dynamic_smem, and every other __shared__ variable a static (blocks run one at a time,
    so one copy serves the running block's threads)."""
    text = _LAUNCH.sub(lambda m: f"::emu::launch({m.group(1)}, {m.group(2).strip()})(", text)
    text = _DYNAMIC_SMEM.sub(lambda m: f"{m.group(1)}* {m.group(2)} = static_cast<{m.group(1)}*>(::emu::dynamic_smem());",
                             text)  # fmt: skip
    return re.sub(r"\b__shared__\b", "static", text)


def _inputs(csrc: Path, extra: tuple[Path, ...] = ()) -> list[Path]:
    """The files the library is built from: csrc's kernel sources and headers (not its host
    extension or fault harness), ``extra`` kernel sources that include them (tools/fused_probe.cu),
    then the emulator's."""
    ours = sorted(p for p in csrc.iterdir() if p.suffix in (".cu", ".cuh", ".h"))
    return ours + list(extra) + [EMU_DIR / name for name in ("emu.h", "ptx.cuh", "runtime.cpp")]


def cuda_includes(nvcc: str) -> list[str]:
    """The include flags nvcc passes its host compiler (`nvcc --dryrun` prints them): the toolkit's
    headers, wherever this installation keeps them."""
    out = subprocess.run([nvcc, "--dryrun", "-x", "cu", "-c", os.devnull, "-o", os.devnull], capture_output=True,
                         text=True, check=True)  # fmt: skip
    flags: list[str] = []
    for line in out.stderr.splitlines():
        for name in ("INCLUDES", "SYSTEM_INCLUDES"):
            if line.startswith(f"#$ {name}="):
                flags += shlex.split(line.split("=", 1)[1])
    if not flags:
        raise RuntimeError(f"{nvcc} --dryrun names no include directory")
    return flags


def _key(csrc: Path, includes: list[str], extra: tuple[Path, ...] = ()) -> str:
    h = hashlib.sha256(" ".join([*FLAGS, *includes]).encode())
    for p in _inputs(csrc, extra):
        h.update(p.name.encode() + b"\0" + p.read_bytes())
    return h.hexdigest()[:16]


def build(csrc: Path, includes: list[str], out_dir: Path, cxx: str = "c++", extra: tuple[Path, ...] = ()) -> Path:
    """The emulated library for ``csrc`` (and the ``extra`` kernel sources, emulated alike) under
    ``out_dir``, compiled with the toolkit's ``includes`` (cuda_includes), built once per content: a
    second call with the same sources returns the same file. Raises RuntimeError with the compiler's
    output when a file does not compile."""
    lib = out_dir / f"libkdactl_emu-{_key(csrc, includes, extra)}.so"
    if lib.exists():
        return lib
    work = out_dir / f"{lib.stem}.src"
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    for p in _inputs(csrc, extra):
        if p.parent == csrc and p.name == "ptx.cuh":
            continue  # the emulator's takes its place
        text = p.read_text()
        (work / p.name).write_text(emulated_source(text) if p.parent != EMU_DIR else text)
    units = sorted(work.glob("*.cu")) + [work / "runtime.cpp"]

    def compile_one(src: Path) -> Path:
        obj = src.with_suffix(".o")
        cmd = [cxx, *FLAGS, "-include", str(work / "emu.h"), *includes, f"-I{work}",
               "-x", "c++", "-c", str(src), "-o", str(obj)]  # fmt: skip
        done = subprocess.run(cmd, capture_output=True, text=True)
        if done.returncode:
            raise RuntimeError(f"{src.name} does not compile for the emulator:\n{done.stderr[-8000:]}")
        return obj

    with ThreadPoolExecutor(max_workers=os.cpu_count() or 2) as pool:
        objects = list(pool.map(compile_one, units))
    tmp = lib.with_suffix(".so.tmp")
    subprocess.run([cxx, "-shared", "-o", str(tmp), *map(str, objects)], check=True, capture_output=True, text=True)
    tmp.rename(lib)
    return lib
