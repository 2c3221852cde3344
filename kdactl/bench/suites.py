"""The benchmark shapes: the named suites, and parsing of ``--shape`` / ``--varlen``.

A shape is plain data. Fixed batches are ``B,T,H[,K,V]``; a varlen batch is B = 1 with the
sequence lengths packed along T (``cu_seqlens``). Labels spell the shape (``B1-T8192-H64-D128``).
A shape also names its configuration (kdactl.bench.configs): its ``key``, the label prefixed by a
configuration other than plain, keys results and the per-SKU baselines, so plain shapes keep the
keys they always had.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from kdactl.bench.configs import (
    CONFIGS,
    DEFAULT_GATE_PARAMS,
    GATE_PARAMS,
    LOWER_BOUND,
    PLAIN,
    SOFTPLUS,
    config_named,
    gate_params_named,
)
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
    config: str = PLAIN.name  # a name in kdactl.bench.configs.CONFIGS
    gate_params: str = DEFAULT_GATE_PARAMS  # a name in GATE_PARAMS: how a fused gate's A_log, dt_bias are drawn

    def __post_init__(self) -> None:
        if self.config not in CONFIGS:
            raise ValueError(f"unknown bench configuration {self.config!r}; known: {', '.join(CONFIGS)}")
        if self.gate_params not in GATE_PARAMS:
            raise ValueError(f"unknown gate parameters {self.gate_params!r}; known: {', '.join(GATE_PARAMS)}")
        if self.gate_params != DEFAULT_GATE_PARAMS and not CONFIGS[self.config].fused:
            raise ValueError(f"configuration {self.config!r} takes g as given: it has no gate parameters to draw")

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
    def config_key(self) -> str:
        """The configuration, with its gate parameters unless they are the default: lower-bound[flashkda]."""
        return self.config if self.gate_params == DEFAULT_GATE_PARAMS else f"{self.config}[{self.gate_params}]"

    @property
    def key(self) -> str:
        """The label, prefixed by config_key unless it is plain: what results and baselines key on."""
        return self.label if self.config == PLAIN.name else f"{self.config_key}:{self.label}"

    @property
    def tokens(self) -> int:
        return self.batch * self.seqlen

    def to_json(self) -> dict:
        return {"label": self.label, "key": self.key, "config": self.config, "gate_params": self.gate_params, "batch": self.batch, "seqlen": self.seqlen, "heads": self.heads,
                "key_dim": self.key_dim, "value_dim": self.value_dim,
                "seqlens": list(self.seqlens) if self.seqlens is not None else None}  # fmt: skip


def fixed(batch: int, seqlen: int, heads: int, key_dim: int = DEFAULT_DIM, value_dim: int = DEFAULT_DIM) -> Shape:
    return Shape(batch, seqlen, heads, key_dim, value_dim)


def varlen(lengths, heads: int, key_dim: int = DEFAULT_DIM, value_dim: int = DEFAULT_DIM) -> Shape:
    lengths = tuple(int(n) for n in lengths)
    return Shape(1, sum(lengths), heads, key_dim, value_dim, lengths)


def _in(config, shapes) -> tuple[Shape, ...]:
    return tuple(dataclasses.replace(s, config=config.name) for s in shapes)


SERVING_VARLEN = (1300, 547, 2048, 963, 271, 3063)
# One long sequence among short ones: a batch a sequence-parallel split must balance by tokens.
MIXED_VARLEN = (16384, 512, 300, 1200, 64)
SERVING = (fixed(1, 8192, 64), fixed(1, 8192, 96), fixed(2, 16384, 64), fixed(8, 4096, 12),
           varlen(SERVING_VARLEN, 96))  # fmt: skip
PRODUCTION_HEADS, PRODUCTION_SEQLENS = (12, 16, 24), (4096, 8192, 16384, 32768)  # per-rank heads of serving TP
KIMI_LINEAR_HEADS, KIMI_LINEAR_SEQLENS = (4, 8, 16, 32), (8192, 32768)  # Kimi-Linear: 32 KDA heads of 128

SUITES: dict[str, tuple[Shape, ...]] = {
    # Seconds on a GPU: the perf gate that certify runs.
    "smoke": (fixed(1, 4096, 8), fixed(2, 1024, 16), varlen((17, 300, 1000), 4)),
    # Few heads, long sequences.
    "small-bh": (fixed(1, 65536, 8), fixed(1, 65536, 4), fixed(1, 131072, 1), fixed(1, 1048576, 1)),
    # Serving prefill.
    "serving": SERVING,
    # What serving engines run (FlashKDA's math): the serving shapes and per-rank head counts.
    "production": _in(
        LOWER_BOUND,
        (
            *SERVING,
            *(fixed(1, t, h) for h in PRODUCTION_HEADS for t in PRODUCTION_SEQLENS),
            varlen(SERVING_VARLEN, 16),
            varlen(SERVING_VARLEN, 24),
            varlen(MIXED_VARLEN, 16),
        ),
    ),
    # Kimi-Linear's call of fla's chunk_kda (softplus gate), at its per-rank head counts.
    "kimi-linear": _in(
        SOFTPLUS,
        (*(fixed(1, t, h) for h in KIMI_LINEAR_HEADS for t in KIMI_LINEAR_SEQLENS), varlen(SERVING_VARLEN, 16)),
    ),
}
SUITE_NAMES = (*SUITES, "all")
# What --host measures when no shape is named: a decode-sized prefill, where the host's cost of
# issuing the call, not the GPU's time, is what a serving engine waits on.
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
                   default: tuple[Shape, ...] | None = None, config: str | None = None,
                   gate_params: str | None = None) -> list[Shape]:  # fmt: skip
    """The shapes to run: the suite's (``default``, else smoke, when nothing is named), then --shape,
    then --varlen, each in its own configuration (a suite's, else plain) unless ``config`` names one
    for all, and with ``gate_params`` for every fused one; duplicates dropped, order kept."""
    picked: list[Shape] = []
    if suite is not None:
        picked.extend(suite_shapes(suite))
    elif not (shapes or varlens):
        picked.extend(default if default is not None else suite_shapes("smoke"))
    picked.extend(parse_shape(s) for s in shapes)
    picked.extend(parse_varlen(v, heads) for v in varlens)
    if heads is not None and not varlens:
        raise UsageError("--heads only applies to --varlen")
    if config is not None:
        picked = [dataclasses.replace(s, config=config_named(config).name) for s in picked]
    if gate_params is not None:
        gate_params_named(gate_params)
        if not any(CONFIGS[s.config].fused for s in picked):
            raise UsageError(
                "--gate-params draws the parameters of a gate computed from raw logits: none of the "
                "shapes has one (add --config lower-bound or softplus, or a suite that has them)"
            )
        picked = [dataclasses.replace(s, gate_params=gate_params) if CONFIGS[s.config].fused else s for s in picked]
    seen: set[str] = set()
    unique = []
    for s in picked:
        if s.key not in seen:
            seen.add(s.key)
            unique.append(s)
    return unique
