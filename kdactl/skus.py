"""The SKU matrix (fleet/skus.toml): what each GPU model should look like, its kernel target per CUDA
toolkit, and the route each shape class is expected to take there.

Loading validates every entry and names the offending key; a broken matrix is a configuration error
(exit 2). A GPU whose SKU is not in the matrix is a warning for detect and certify, not a failure.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType
from typing import Any

from kdactl.errors import UsageError
from kdactl.kernel_abi import ROUTES  # the expected routes must be routes of this build
from kdactl.targets import TARGETS

Version = tuple[int, int]

# Every SKU classify_sku can return, besides "unknown" (SPEC order).
SKU_NAMES = ("H100-SXM", "H100-PCIe", "H200", "B200", "GB200", "B300", "GB300", "A100", "L40S", "RTX-PRO-6000")
# Shape classes: decode_like (T < 16, under one chunk), serving (many heads), small_bh (few heads, long T).
SHAPE_CLASSES = ("decode_like", "serving", "small_bh")
_VERSION = re.compile(r"^(\d+)\.(\d+)$")
_FIELDS = {"cc", "sm_count", "memory_gib", "l2_mib", "form", "note", "targets", "routes"}


# ---------------------------------------------------------------------------------------------
# Classification: the SKU of one GPU from its NVML name, compute capability and SM count

# (SKU, tokens the name must contain, compute capability). Names are split into upper-case tokens
# on spaces, '-' and '_', so "H200" never matches "H20", nor "GH200", nor "H200" inside "GB200".
_RULES: tuple[tuple[str, frozenset[str], Version], ...] = (
    ("GB300", frozenset({"GB300"}), (10, 3)),
    ("B300", frozenset({"B300"}), (10, 3)),
    ("GB200", frozenset({"GB200"}), (10, 0)),
    ("B200", frozenset({"B200"}), (10, 0)),
    ("H200", frozenset({"H200"}), (9, 0)),
    ("H100", frozenset({"H100"}), (9, 0)),  # split into SXM / PCIe below
    ("A100", frozenset({"A100"}), (8, 0)),
    ("L40S", frozenset({"L40S"}), (8, 9)),
    ("RTX-PRO-6000", frozenset({"RTX", "PRO", "6000"}), (12, 0)),
)
_H100_SMS = {132: "H100-SXM", 114: "H100-PCIe"}


def classify_sku(name: str, cc: tuple[int, int], sm_count: int) -> str:
    """The fleet SKU of one GPU, or "unknown". Pure.

    The name picks the family and the compute capability must match it ("NVIDIA H200" at cc 8.0 is
    unknown). SM count only separates H100 SXM (132) from PCIe (114) when the name does not say.
    Decisions: "NVIDIA H200 NVL" is H200 (same 132 SMs, 141 GB, 4.8 TB/s; lower power cap);
    "NVIDIA H100 NVL" is unknown: 132 SMs with 94 GB at 3.9 TB/s match neither H100 row, and borrowing
    either row's baselines would judge it against another part. Every A100 variant is A100, every
    RTX PRO 6000 Blackwell edition is RTX-PRO-6000.
    """
    tokens = {t.upper() for t in re.split(r"[\s\-_]+", name) if t}
    for sku, needed, want_cc in _RULES:
        if needed <= tokens:
            if tuple(cc) != want_cc:
                return "unknown"
            return _h100(tokens, sm_count) if sku == "H100" else sku
    return "unknown"


def _h100(tokens: set[str], sm_count: int) -> str:
    if "NVL" in tokens:
        return "unknown"
    if "PCIE" in tokens:
        return "H100-PCIe"
    if tokens & {"HBM3", "SXM", "SXM5"}:
        return "H100-SXM"
    return _H100_SMS.get(sm_count, "unknown")


class SkuMatrixError(UsageError):
    """fleet/skus.toml is missing or malformed."""


@dataclass(frozen=True)
class SkuSpec:
    name: str
    cc: Version
    sm_count: int
    memory_gib: tuple[float, ...]  # the variants sold, as NVML reports the total (GiB); informative
    l2_mib: float  # as torch reports L2_cache_size; informative
    targets: tuple[tuple[Version, str], ...]  # (oldest CUDA toolkit, target), ascending
    routes: Mapping[str, str]  # shape class -> expected route

    def target_for(self, cuda: Version) -> str | None:
        """The target for this toolkit: the entry with the newest minimum <= cuda; None if too old."""
        chosen = None
        for minimum, target in self.targets:
            if tuple(cuda) >= minimum:
                chosen = target
        return chosen


def skus_path() -> Path:
    from kdactl.assets import fleet_dir

    return fleet_dir() / "skus.toml"


def load_skus(path: Path | None = None) -> dict[str, SkuSpec]:
    """Read and validate fleet/skus.toml (or ``path``)."""
    import tomllib

    try:
        path = path or skus_path()
        with open(path, "rb") as f:
            data = tomllib.load(f)
    except FileNotFoundError as err:
        raise SkuMatrixError(f"SKU matrix not found: {err}") from None
    except (OSError, tomllib.TOMLDecodeError) as err:
        raise SkuMatrixError(f"cannot read the SKU matrix {path}: {err}") from None
    return parse_skus(data, source=str(path))


def parse_skus(data: Mapping[str, Any], source: str = "skus.toml") -> dict[str, SkuSpec]:
    out = {}
    for name, entry in data.items():
        if name not in SKU_NAMES:
            raise SkuMatrixError(f"{source}: [{name}] is not a SKU kdactl knows; known: {', '.join(SKU_NAMES)}")
        if not isinstance(entry, Mapping):
            raise SkuMatrixError(f"{source}: {name} must be a table, got {entry!r}")
        out[name] = _parse_entry(name, entry, source)
    return out


def _parse_entry(name: str, e: Mapping[str, Any], source: str) -> SkuSpec:
    def bad(key: str, want: str) -> SkuMatrixError:
        return SkuMatrixError(f"{source}: [{name}] {key} must be {want}, got {e.get(key)!r}")

    unknown = set(e) - _FIELDS
    if unknown:
        raise SkuMatrixError(f"{source}: [{name}] has unknown keys {sorted(unknown)}; allowed: {sorted(_FIELDS)}")
    cc = _version(e.get("cc"))
    if cc is None:
        raise bad("cc", 'a "major.minor" string')
    sm = e.get("sm_count")
    if not isinstance(sm, int) or isinstance(sm, bool) or sm <= 0:
        raise bad("sm_count", "a positive integer")
    mem = e.get("memory_gib")
    if not isinstance(mem, list) or not mem or not all(_positive(m) for m in mem):
        raise bad("memory_gib", "a non-empty list of positive numbers")
    if not _positive(e.get("l2_mib")):
        raise bad("l2_mib", "a positive number")
    return SkuSpec(
        name=name,
        cc=cc,
        sm_count=sm,
        memory_gib=tuple(float(m) for m in mem),
        l2_mib=float(e["l2_mib"]),
        targets=_targets(name, e.get("targets"), source),
        routes=_routes(name, e.get("routes"), source),
    )


def _targets(name: str, table: Any, source: str) -> tuple[tuple[Version, str], ...]:
    if not isinstance(table, Mapping) or not table:
        raise SkuMatrixError(f'{source}: [{name}.targets] must map CUDA versions ("12.9") to targets, got {table!r}')
    out = []
    for key, target in table.items():
        v = _version(key)
        if v is None:
            raise SkuMatrixError(f'{source}: [{name}.targets] key {key!r} is not a CUDA version like "12.9"')
        if target not in TARGETS:
            raise SkuMatrixError(
                f"{source}: [{name}.targets] {key} = {target!r} is not a target; known: {', '.join(TARGETS)}"
            )
        out.append((v, target))
    return tuple(sorted(out))


def _routes(name: str, table: Any, source: str) -> Mapping[str, str]:
    if not isinstance(table, Mapping) or set(table) != set(SHAPE_CLASSES):
        got = sorted(table) if isinstance(table, Mapping) else table
        raise SkuMatrixError(
            f"{source}: [{name}.routes] must name exactly the shape classes {list(SHAPE_CLASSES)}, got {got!r}"
        )
    for shape, route in table.items():
        if route not in ROUTES:
            raise SkuMatrixError(
                f"{source}: [{name}.routes] {shape} = {route!r} is not a route; known: {', '.join(ROUTES)}"
            )
    return MappingProxyType(dict(table))


def _version(value: Any) -> Version | None:
    m = _VERSION.match(value) if isinstance(value, str) else None
    return (int(m.group(1)), int(m.group(2))) if m else None


def _positive(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and value > 0
