"""Exceptions, each carrying the SPEC exit code it maps to."""

from __future__ import annotations

EXIT_PASS = 0
EXIT_NOT_CERTIFIED = 1
EXIT_USAGE = 2
EXIT_INCONCLUSIVE = 3


class KdactlError(Exception):
    """Base of every error kdactl raises on purpose; ``exit_code`` is what the CLI returns."""

    exit_code = EXIT_INCONCLUSIVE


class UsageError(KdactlError):
    """Bad flags or configuration: says nothing about the node."""

    exit_code = EXIT_USAGE


class Inconclusive(KdactlError):
    """The node could not be judged: no GPU, a tool missing, output that cannot be read."""

    exit_code = EXIT_INCONCLUSIVE


class UnsupportedTarget(Inconclusive):
    """No kernel target exists for this compute capability and CUDA toolkit."""


class NoGpu(Inconclusive):
    """No NVIDIA driver or no GPU visible."""


class ToolMissing(Inconclusive):
    """An external program (nvcc, compute-sanitizer, ...) is not installed."""


class BuildError(Inconclusive):
    """The kernel library could not be built or loaded."""


class UnsafeCache(UsageError):
    """The cache directory is writable by other users, or cannot be created."""
