"""The CUDA toolkit on this machine, as nvcc reports it."""

from __future__ import annotations

import re
import shutil
import subprocess
from collections.abc import Callable
from dataclasses import dataclass

from kdactl.errors import Inconclusive, ToolMissing

_RELEASE = re.compile(r"release (\d+)\.(\d+)")

Runner = Callable[..., subprocess.CompletedProcess]


def parse_nvcc_version(text: str) -> tuple[int, int]:
    """'Cuda compilation tools, release 13.0, V13.0.88' -> (13, 0)."""
    m = _RELEASE.search(text)
    if not m:
        raise Inconclusive(f"cannot read the CUDA release from nvcc --version output: {text.strip()[:120]!r}")
    return int(m.group(1)), int(m.group(2))


@dataclass(frozen=True)
class Toolkit:
    nvcc: str  # absolute path
    version: tuple[int, int]
    banner: str  # the last line of nvcc --version, e.g. "Build cuda_13.0.r13.0/compiler.36424714_0"

    @property
    def version_str(self) -> str:
        return f"{self.version[0]}.{self.version[1]}"


def find_toolkit(nvcc: str = "nvcc", run: Runner = subprocess.run) -> Toolkit:
    """Locate nvcc and read its version; ToolMissing when there is none."""
    path = shutil.which(nvcc)
    if path is None:
        raise ToolMissing(f"nvcc not found (looked for {nvcc!r} on PATH; set KDACTL_NVCC or install the CUDA toolkit)")
    proc = run([path, "--version"], capture_output=True, text=True, timeout=60)
    if proc.returncode != 0:
        raise Inconclusive(f"{path} --version exited {proc.returncode}: {proc.stderr.strip()[:200]}")
    lines = [ln for ln in proc.stdout.splitlines() if ln.strip()]
    return Toolkit(nvcc=path, version=parse_nvcc_version(proc.stdout), banner=lines[-1] if lines else "")
