import pytest

from kdactl.results import CheckResult, verdict


def R(status, check="c", **kw):
    return CheckResult(check, status, message=kw.pop("message", "why"), **kw)


@pytest.mark.parametrize(
    "statuses,expect",
    [
        (["pass", "pass"], "certified"),
        (["pass", "warn"], "certified"),
        (["pass", "fail", "error"], "not_certified"),
        (["pass", "error"], "inconclusive"),
        ([], "inconclusive"),
    ],
)
def test_verdict_table(statuses, expect):
    results = [R(s, f"c{i}") for i, s in enumerate(statuses)]
    assert verdict(results)[0] == expect


def test_required_skip_or_missing_is_inconclusive():
    assert verdict([R("pass", "a"), R("skip", "b")])[0] == "inconclusive"
    assert verdict([R("pass", "a"), R("skip", "b", required=False)])[0] == "certified"
    v, reason = verdict([R("pass", "a")], required=["a", "perf"])
    assert v == "inconclusive" and "perf: required check did not run" in reason


def test_fail_on_warn():
    assert verdict([R("warn")], fail_on_warn=True)[0] == "not_certified"


def test_bad_status_and_silent_skip_rejected():
    with pytest.raises(ValueError, match="status must be one of"):
        CheckResult("x", "ok")
    with pytest.raises(ValueError, match="skip needs a reason"):
        CheckResult("x", "skip")


def test_json_flattens_perf():
    r = CheckResult("perf", "pass", "ok", 1.5, 0, perf={"measured": 1.0, "baseline": 1.1, "threshold": 1.2, "unit": "ms"})
    assert r.to_json()["measured"] == 1.0 and r.to_json()["gpu"] == 0
