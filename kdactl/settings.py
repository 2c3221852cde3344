"""One Settings value, built once by the CLI from the environment and passed down."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path


def _user_dir(env: Mapping[str, str], xdg_var: str, fallback: str) -> Path:
    base = env.get(xdg_var) or str(Path(env.get("HOME") or Path.home()) / fallback)
    return Path(base) / "kdactl"


@dataclass(frozen=True)
class Settings:
    cache_dir: Path  # JIT build cache (KDACTL_CACHE_DIR)
    data_dir: Path  # certificates, fleet store
    aot_dir: Path | None = None  # prebuilt bundle to prefer (KDACTL_AOT_DIR)
    cuda_arch: str | None = None  # target override (KDACTL_CUDA_ARCH)
    nvcc: str = "nvcc"  # KDACTL_NVCC
    env: Mapping[str, str] = field(default_factory=dict, repr=False)

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> Settings:
        env = dict(os.environ if env is None else env)
        cache = env.get("KDACTL_CACHE_DIR")
        aot = env.get("KDACTL_AOT_DIR")
        return cls(
            cache_dir=Path(cache) if cache else _user_dir(env, "XDG_CACHE_HOME", ".cache"),
            data_dir=Path(env["KDACTL_DATA_DIR"])
            if env.get("KDACTL_DATA_DIR")
            else _user_dir(env, "XDG_DATA_HOME", ".local/share"),
            aot_dir=Path(aot) if aot else None,
            cuda_arch=env.get("KDACTL_CUDA_ARCH") or None,
            nvcc=env.get("KDACTL_NVCC") or "nvcc",
            env=env,
        )
