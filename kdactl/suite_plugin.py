"""The pytest plugin through which the validation suite reports: ``-p kdactl.suite_plugin
--kdactl-results FILE`` writes one CheckResult per test (``{"results": [...]}``) when the session ends.

Per test: passed -> pass; a failed call -> fail (the failure is evidence, whatever its teardown
did); a failed setup or teardown -> error; skipped -> skip with its reason, not required (a check
that cannot apply here, e.g. a route not eligible). A module that cannot be collected is one error.
"""

from __future__ import annotations

import json
from pathlib import Path

from kdactl.results import CheckResult

PREFIX = "suite"  # every check of the suite is named suite.<module>::<test>
_RANK = {"pass": 0, "skip": 1, "error": 2, "fail": 3}  # the worst phase of a test speaks for it


def check_name(nodeid: str) -> str:
    """'checks/test_routes.py::TestX::test_y[a]' -> 'suite.test_routes.TestX::test_y[a]'."""
    parts = nodeid.split("::")
    module = Path(parts[0]).stem
    return f"{PREFIX}.{'.'.join([module, *parts[1:-1]])}::{parts[-1]}" if len(parts) > 1 else f"{PREFIX}.{module}"


def _reason(report) -> str:
    longrepr = report.longrepr
    if isinstance(longrepr, tuple) and len(longrepr) == 3:  # a skip: (file, line, reason)
        return str(longrepr[2]).removeprefix("Skipped: ")
    crash = getattr(longrepr, "reprcrash", None)
    if crash is not None:
        return " ".join(crash.message.split())
    lines = [ln.strip() for ln in str(longrepr or "").splitlines() if ln.strip()]
    errors = [ln.removeprefix("E").strip() for ln in lines if ln.startswith("E ")]  # a collection traceback's cause
    return (errors or lines or [""])[-1]


class ResultsPlugin:
    def __init__(self, path: Path) -> None:
        self.path = path
        self.results: dict[str, CheckResult] = {}

    def _record(self, nodeid: str, status: str, message: str, duration: float) -> None:
        name = check_name(nodeid)
        old = self.results.get(name)
        total = duration + (old.duration_s if old else 0.0)
        if old is not None and _RANK[old.status] >= _RANK[status]:
            status, message = old.status, old.message
        self.results[name] = CheckResult(name, status, message or status, total, required=status != "skip")

    def pytest_runtest_logreport(self, report) -> None:
        if report.passed:
            status = "pass"
        elif report.skipped:
            status = "skip"
        else:
            status = "fail" if report.when == "call" else "error"
        message = "" if status == "pass" else _reason(report)
        if status == "skip":
            message = message or "skipped (no reason given)"
        self._record(report.nodeid, status, message, float(getattr(report, "duration", 0.0) or 0.0))

    def pytest_collectreport(self, report) -> None:
        if report.failed:
            self._record(report.nodeid or "collection", "error", f"collection failure: {_reason(report)}", 0.0)

    def pytest_sessionfinish(self, session) -> None:
        from kdactl.atomic import write_text_atomic

        doc = {"results": [r.to_json() for r in self.results.values()]}
        write_text_atomic(self.path, json.dumps(doc))


def pytest_addoption(parser) -> None:
    parser.addoption("--kdactl-results", default=None, help="write the suite's CheckResults (JSON) to this file")


def pytest_configure(config) -> None:
    path = config.getoption("--kdactl-results")
    if path:
        config.pluginmanager.register(ResultsPlugin(Path(path)), "kdactl-results")
