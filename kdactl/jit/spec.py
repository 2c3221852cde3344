"""The kernel library described as data: sources, headers, flags, target, and the cache key.

Nothing here runs a compiler, so the whole description is testable on a CPU machine.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path

from kdactl import __version__
from kdactl.errors import BuildError
from kdactl.targets import Target

LIBRARY_NAME = "kdactl"
SO_NAME = "libkdactl.so"
FAULTS_NAME = "kdactl_faults"  # the sanitizer's positive controls: a library of their own
FAULTS_DIR = "faults"  # csrc/faults/: never part of the kernel library or its cache key
HOST_NAME = "kdactl_host"  # the eager prefill's planned path: a CPython extension over torch tensors
HOST_DIR = "host"  # csrc/host/: its C++ source (not CUDA; the kernel library never includes it)

_HEADER_SUFFIXES = frozenset({".cuh", ".h", ".hpp", ".inc", ".cu"})

# Flags every target shares; the target adds exactly one -gencode and one -D.
COMMON_CFLAGS: tuple[str, ...] = (
    "-O3",
    "-std=c++17",
    "--expt-relaxed-constexpr",
    "-Xcompiler",
    "-fPIC",
    "-lineinfo",
)
# cudart is linked statically so that the .so needs only the driver on the node (AOT bundles).
LDFLAGS: tuple[str, ...] = ("-shared", "-cudart=static")


@dataclass(frozen=True)
class JitSpec:
    """One build unit: compile every source for one target, link one shared library."""

    name: str
    target: Target
    root: Path  # the csrc folder; file names in the hash are relative to it
    sources: tuple[Path, ...]
    headers: tuple[Path, ...]
    cflags: tuple[str, ...]
    ldflags: tuple[str, ...]
    include_dirs: tuple[Path, ...]
    version: str = __version__
    device_code: bool = True  # False: host C++ only, linked without the target's -gencode

    @property
    def so_name(self) -> str:
        return f"lib{self.name}.so"

    def compile_flags(self) -> list[str]:
        """nvcc flags for one .cu -> .o, include dirs last (absolute paths stay out of the hash)."""
        return [*self.cflags, *(f"-I{d}" for d in self.include_dirs)]

    def link_flags(self) -> list[str]:
        return [self.target.gencode, *self.ldflags] if self.device_code else list(self.ldflags)

    def source_hash(self) -> str:
        """sha256 over file names and contents (sources and headers), flags and kdactl version."""
        h = hashlib.sha256()
        for label, value in (("name", self.name), ("target", self.target.name), ("version", self.version)):
            _feed(h, label, value.encode())
        for path in (*self.sources, *self.headers):
            _feed(h, "file:" + path.relative_to(self.root).as_posix(), path.read_bytes())
        _feed(h, "cflags", "\0".join(self.cflags).encode())
        _feed(h, "ldflags", "\0".join(self.link_flags()).encode())
        return h.hexdigest()

    def key_dir(self, cache_dir: Path, source_hash: str | None = None) -> Path:
        """<cache_dir>/<kdactl version>/<target>/<name>-<hash16>/"""
        digest = source_hash or self.source_hash()
        return Path(cache_dir) / self.version / self.target.name / f"{self.name}-{digest[:16]}"


def _feed(h: hashlib._Hash, label: str, data: bytes) -> None:
    """Length-prefixed so that no two different inputs feed the same byte stream."""
    for part in (label.encode(), data):
        h.update(len(part).to_bytes(8, "little"))
        h.update(part)


def kernel_library_spec(target: Target, csrc: Path | None = None) -> JitSpec:
    """Every csrc/*.cu is a source (new kernel files join automatically); every other C/C++ file
    under csrc (headers, and .cu files in subfolders, which can only be #included) is hashed."""
    if csrc is None:
        from kdactl.assets import csrc_dir

        csrc = csrc_dir()
    root = Path(csrc).resolve()
    sources = tuple(sorted(p for p in root.glob("*.cu") if p.is_file()))
    if not sources:
        raise BuildError(f"no *.cu kernel sources in {root}")
    headers = tuple(
        sorted(
            p
            for p in root.rglob("*")
            if p.suffix in _HEADER_SUFFIXES
            and p.is_file()
            and p not in sources
            and FAULTS_DIR not in p.relative_to(root).parts
        )
    )
    return _nvcc_spec(LIBRARY_NAME, target, root, sources, headers)


def faults_library_spec(target: Target, csrc: Path | None = None) -> JitSpec:
    """The positive-control kernels (csrc/faults/*.cu), deliberately faulty, built by the same builder
    into a separate small library so that they never ship inside the kernel library."""
    if csrc is None:
        from kdactl.assets import csrc_dir

        csrc = csrc_dir()
    root = Path(csrc).resolve() / FAULTS_DIR
    sources = tuple(sorted(p for p in root.glob("*.cu") if p.is_file()))
    if not sources:
        raise BuildError(f"no *.cu positive-control sources in {root}")
    headers = tuple(
        sorted(p for p in root.rglob("*") if p.suffix in _HEADER_SUFFIXES and p.is_file() and p not in sources)
    )
    return _nvcc_spec(FAULTS_NAME, target, root, sources, headers)


def _nvcc_spec(name: str, target: Target, root: Path, sources: tuple, headers: tuple) -> JitSpec:
    """Every library kdactl builds gets the same flags: one -gencode, the target define, ours."""
    return JitSpec(
        name=name,
        target=target,
        root=root,
        sources=sources,
        headers=headers,
        cflags=(target.gencode, f"-D{target.define}", *COMMON_CFLAGS),
        ldflags=LDFLAGS,
        include_dirs=(root,),
    )


def host_module_spec(target: Target, csrc: Path | None = None) -> JitSpec:
    """kdactl_host (csrc/host/kdactl_host.cpp): a CPython extension built against this process's
    torch and Python, by the same builder (nvcc hands .cpp files to the host compiler). Their
    versions are defines and torch's library folder is in the link flags, so that another torch,
    Python or install is another cache entry."""
    import sys
    import sysconfig

    import torch

    if csrc is None:
        from kdactl.assets import csrc_dir

        csrc = csrc_dir()
    root = Path(csrc).resolve()
    source = root / HOST_DIR / f"{HOST_NAME}.cpp"
    if not source.is_file():
        raise BuildError(f"no {HOST_NAME} source at {source}")
    torch_dir = Path(torch.__file__).resolve().parent
    abi = int(bool(getattr(torch._C, "_GLIBCXX_USE_CXX11_ABI", True)))
    return JitSpec(
        name=HOST_NAME,
        target=target,
        root=root,
        sources=(source,),
        headers=(root / "kdactl_api.h",),
        cflags=(
            "-O3",
            "-std=c++20",
            "-Xcompiler",
            "-fPIC",
            f"-D_GLIBCXX_USE_CXX11_ABI={abi}",
            f"-DKDACTL_TORCH_VERSION={torch.__version__}",
            f"-DKDACTL_PYTHON={sys.version_info[0]}{sys.version_info[1]}",
        ),  # fmt: skip
        ldflags=(
            "-shared",
            "-cudart=none",
            f"-L{torch_dir / 'lib'}",
            "-lc10",
            "-ltorch_cpu",
            "-ltorch_python",
            "-Xlinker",
            f"-rpath={torch_dir / 'lib'}",
        ),  # fmt: skip
        include_dirs=(
            root,
            torch_dir / "include",
            torch_dir / "include" / "torch" / "csrc" / "api" / "include",
            Path(sysconfig.get_paths()["include"]),
        ),  # fmt: skip
        device_code=False,
    )
