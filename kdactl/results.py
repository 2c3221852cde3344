"""Check results and the SPEC verdict: plain data and pure functions shared by checks, sanitize,
bench's gate and certify."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

from kdactl.errors import EXIT_INCONCLUSIVE, EXIT_NOT_CERTIFIED, EXIT_PASS

STATUSES = ("pass", "fail", "warn", "skip", "error")
_FIELDS = ("check", "status", "message", "duration_s", "gpu", "required")
VERDICT_EXIT = {"certified": EXIT_PASS, "not_certified": EXIT_NOT_CERTIFIED, "inconclusive": EXIT_INCONCLUSIVE}


@dataclass(frozen=True)
class CheckResult:
    check: str  # e.g. "route_smoke[direct-B1-T4096-H8]", "sanitize.memcheck"
    status: str  # pass | fail | warn | skip | error
    message: str = ""
    duration_s: float = 0.0
    gpu: int | None = None  # GPU index; None for node-level checks
    required: bool = True  # a required check that did not pass makes the node not certified
    perf: dict[str, Any] = field(default_factory=dict)  # measured, baseline, threshold, unit

    def __post_init__(self) -> None:
        if self.status not in STATUSES:
            raise ValueError(f"CheckResult.status must be one of {STATUSES}, got {self.status!r}")
        if self.status == "skip" and not self.message:
            raise ValueError(f"CheckResult {self.check!r}: a skip needs a reason")

    def to_json(self) -> dict[str, Any]:
        """The one JSON form (worker result files, the suite plugin, the certificate): the fields,
        with the perf facts flattened beside them."""
        out = asdict(self)
        perf = out.pop("perf")
        out.update(perf)
        return out

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> CheckResult:
        """to_json's inverse; KeyError / ValueError / TypeError on a malformed entry."""
        perf = {k: v for k, v in data.items() if k not in _FIELDS}
        return cls(check=str(data["check"]), status=str(data["status"]), message=str(data.get("message") or ""),
                   duration_s=float(data.get("duration_s") or 0.0), gpu=data.get("gpu"),
                   required=bool(data.get("required", True)), perf=perf)  # fmt: skip


def verdict(
    results: Iterable[CheckResult], required: Iterable[str] = (), fail_on_warn: bool = False
) -> tuple[str, str]:
    """(verdict, reason). Any fail -> not_certified; else any error, or a required check missing or
    skipped -> inconclusive; else certified. ``warn`` fails only with ``fail_on_warn``."""
    results = list(results)
    failed, errors, skipped_required = _deciders(results, fail_on_warn)
    if failed:
        return "not_certified", "; ".join(f"{_where(r)}: {r.message or r.status}" for r in failed)
    ran = {r.check for r in results if r.status in ("pass", "warn")}
    missing = [name for name in required if name not in ran]
    if errors or missing or skipped_required:
        parts = [f"{_where(r)}: {r.message or 'error'}" for r in errors]
        parts += [f"{name}: required check did not run" for name in missing]
        parts += [f"{_where(r)}: required check skipped ({r.message})" for r in skipped_required]
        return "inconclusive", "; ".join(parts)
    if not results:
        return "inconclusive", "no checks ran"
    return "certified", f"{len(results)} checks, none failed"


def deciding(results: Iterable[CheckResult], fail_on_warn: bool = False) -> list[CheckResult]:
    """The results that decide ``verdict``: its failures, else its errors and skipped required checks
    (a required check that never ran has no result)."""
    failed, errors, skipped_required = _deciders(list(results), fail_on_warn)
    return failed or errors + skipped_required


def _deciders(
    results: list[CheckResult], fail_on_warn: bool
) -> tuple[list[CheckResult], list[CheckResult], list[CheckResult]]:
    """(failures, errors, skipped required checks): the three kinds of result ``verdict`` judges by."""
    failed = [r for r in results if r.status == "fail" or (fail_on_warn and r.status == "warn")]
    errors = [r for r in results if r.status == "error"]
    return failed, errors, [r for r in results if r.status == "skip" and r.required]


def _where(r: CheckResult) -> str:
    return r.check if r.gpu is None else f"gpu{r.gpu}:{r.check}"
