"""The benchmark shapes: the named suites, and parsing of ``--shape`` / ``--varlen``.

A shape is plain data. Fixed batches are ``B,T,H[,K,V]``; a varlen batch is B = 1 with the
sequence lengths packed along T (``cu_seqlens``). Labels spell the shape (``B1-T8192-H64-D128``)
and are the keys of the per-SKU baselines, so they must stay stable.
"""

from __future__ import annotations

from dataclasses import dataclass

from kdactl.errors import UsageError

DEFAULT_DIM = 128


@dataclass(frozen=True)
class Shape:
    batch: int
    seqlen: int  # T of the tensors (total tokens for varlen)
    heads: int
    key_dim: int = DEFAULT_DIM
    value_dim: int = DEFAULT_DIM
    seqlens: tuple[int, ...] | None = None  # varlen: the packed sequence lengths

    @property
    def varlen(self) -> bool:
        return self.seqlens is not None

    @property
    def label(self) -> str:
        dims = f"D{self.key_dim}" if self.key_dim == self.value_dim else f"K{self.key_dim}-V{self.value_dim}"
        if self.seqlens is not None:
            return f"varlen({','.join(map(str, self.seqlens))})-H{self.heads}-{dims}"
        return f"B{self.batch}-T{self.seqlen}-H{self.heads}-{dims}"

    @property
    def tokens(self) -> int:
        return self.batch * self.seqlen

    def to_json(self) -> dict:
        return {"label": self.label, "batch": self.batch, "seqlen": self.seqlen, "heads": self.heads,
                "key_dim": self.key_dim, "value_dim": self.value_dim,
                "seqlens": list(self.seqlens) if self.seqlens is not None else None}  # fmt: skip


def fixed(batch: int, seqlen: int, heads: int, key_dim: int = DEFAULT_DIM, value_dim: int = DEFAULT_DIM) -> Shape:
    return Shape(batch, seqlen, heads, key_dim, value_dim)


def varlen(lengths, heads: int, key_dim: int = DEFAULT_DIM, value_dim: int = DEFAULT_DIM) -> Shape:
    lengths = tuple(int(n) for n in lengths)
    return Shape(1, sum(lengths), heads, key_dim, value_dim, lengths)


SERVING_VARLEN = (1300, 547, 2048, 963, 271, 3063)

SUITES: dict[str, tuple[Shape, ...]] = {
    # Seconds on a GPU: the perf gate that certify runs.
    "smoke": (fixed(1, 4096, 8), fixed(2, 1024, 16), varlen((17, 300, 1000), 4)),
    # Few heads, long sequences (issue 5).
    "small-bh": (fixed(1, 65536, 8), fixed(1, 65536, 4), fixed(1, 131072, 1), fixed(1, 1048576, 1)),
    # Serving prefill (issue 4).
    "serving": (fixed(1, 8192, 64), fixed(1, 8192, 96), fixed(2, 16384, 64), fixed(8, 4096, 12),
                varlen(SERVING_VARLEN, 96)),  # fmt: skip
}
SUITE_NAMES = (*SUITES, "all")
# What --host measures when no shape is named: a decode-sized prefill, where the host's cost of
# issuing the call, not the GPU's time, is what a serving engine waits on (issue 16).
HOST_SHAPES = (fixed(1, 64, 4), varlen((16, 64, 32, 128), 4))


def suite_shapes(name: str) -> tuple[Shape, ...]:
    if name == "all":
        return tuple(s for key in SUITES for s in SUITES[key])
    if name not in SUITES:
        raise UsageError(f"--suite must be one of {', '.join(SUITE_NAMES)}, got {name!r}")
    return SUITES[name]


def _ints(text: str, option: str) -> list[int]:
    try:
        values = [int(part) for part in text.replace(" ", "").split(",") if part != ""]
    except ValueError:
        raise UsageError(f"{option} takes comma-separated integers, got {text!r}") from None
    return values


def parse_shape(text: str) -> Shape:
    """``B,T,H`` or ``B,T,H,K,V`` (K = V = 128 when left out)."""
    values = _ints(text, "--shape")
    if len(values) not in (3, 5):
        raise UsageError(f"--shape takes B,T,H or B,T,H,K,V, got {text!r}")
    if min(values) < 1:
        raise UsageError(f"--shape values must be positive, got {text!r}")
    return fixed(*values)


def parse_varlen(text: str, heads: int | None) -> Shape:
    """``L1,L2,...`` sequence lengths packed into one varlen batch of ``heads`` heads."""
    if heads is None:
        raise UsageError(f"--varlen {text!r} needs --heads H")
    if heads < 1:
        raise UsageError(f"--heads must be positive, got {heads}")
    lengths = _ints(text, "--varlen")
    if not lengths or min(lengths) < 0 or sum(lengths) == 0:
        raise UsageError(f"--varlen takes non-negative lengths with a positive total, got {text!r}")
    return varlen(lengths, heads)


def resolve_shapes(suite: str | None, shapes=(), varlens=(), heads: int | None = None,
                   default: tuple[Shape, ...] | None = None) -> list[Shape]:  # fmt: skip
    """The shapes to run: the suite's (``default``, else smoke, when nothing is named), then --shape,
    then --varlen; duplicates dropped, order kept."""
    picked: list[Shape] = []
    if suite is not None:
        picked.extend(suite_shapes(suite))
    elif not (shapes or varlens):
        picked.extend(default if default is not None else suite_shapes("smoke"))
    picked.extend(parse_shape(s) for s in shapes)
    picked.extend(parse_varlen(v, heads) for v in varlens)
    if heads is not None and not varlens:
        raise UsageError("--heads only applies to --varlen")
    seen: set[str] = set()
    return [s for s in picked if not (s.label in seen or seen.add(s.label))]
