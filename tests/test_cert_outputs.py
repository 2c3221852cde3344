"""JUnit XML, the node_exporter textfile, the summary table, and --json."""

import json
import re

import pytest
import xml.etree.ElementTree as ET

from rich.console import Console

from kdactl.certify.command import CertifyOptions, certify_command
from kdactl.certify.outputs import junit_xml, prom_text, render_summary
from kdactl.results import CheckResult
from tests import certify_fakes as cf
from tests.tools import require_module


def cert(tmp_path, n=3, runner=None, **opts):
    s = cf.settings(tmp_path)
    return certify_command(s, CertifyOptions(**opts), cf.deps(cf.node(n), runner)).cert


def mixed_runner():
    return cf.FakeRunner({
        ("suite", 1): lambda j: [CheckResult("route_smoke[direct]", "fail", 'ratio 0.2 > 5e-3 <&"x">'),
                                 CheckResult("graph", "pass", "ok", 0.5)],
        ("sanitize", 2): lambda j: [CheckResult("sanitize.racecheck", "error", "timed out")],
        ("perf", None): lambda j: [CheckResult("perf[B1-T4096-H8-D128]", "pass", "measured 1.2 ms", 3.0,
                                               perf={"shape": "B1-T4096-H8-D128", "measured": 1.2, "baseline": 1.1,
                                                     "threshold": 1.21, "unit": "ms"})],
    })  # fmt: skip


def test_junit_one_testcase_per_check_per_gpu(tmp_path):
    doc = cert(tmp_path, runner=mixed_runner(), expect_gpus=3)
    root = ET.fromstring(junit_xml(doc).split("\n", 1)[1])
    suites = {s.get("name"): s for s in root.findall("testsuite")}
    assert set(suites) == {"node-a.node", "node-a.gpu0", "node-a.gpu1", "node-a.gpu2"}
    assert {s.get("hostname") for s in suites.values()} == {"node-a"}
    assert {s.get("timestamp") for s in suites.values()} == {"2026-05-01T12:00:00Z"}
    cases = [(c.get("classname"), c.get("name")) for c in root.iter("testcase")]
    assert len(cases) == len(doc["results"]) == len(set(cases))
    assert ("kdactl.node-a.gpu1", "route_smoke[direct]") in cases
    assert suites["node-a.gpu1"].get("failures") == "1" and suites["node-a.gpu2"].get("errors") == "1"
    assert root.get("tests") == str(len(cases)) and root.get("failures") == "1" and root.get("errors") == "1"
    fail = suites["node-a.gpu1"].find("testcase[@name='route_smoke[direct]']/failure")
    assert fail.get("message") == 'ratio 0.2 > 5e-3 <&"x">'
    prop = suites["node-a.gpu0"].find("properties/property[@name='gpu_uuid']")
    assert prop.get("value") == cf.uuid(0)


def every_status_runner():
    """Every status, a message with a terminal colour code and a NUL (not XML 1.0 text)."""
    return cf.FakeRunner({
        ("suite", 0): lambda j: [CheckResult("route_smoke[direct]", "fail", "ratio 0.2 \x1b[31mred\x1b[0m \x00"),
                                 CheckResult("graph", "skip", "no graph support in this driver"),
                                 CheckResult("streams", "pass", "ok", 0.5)],
        ("sanitize", 1): lambda j: [CheckResult("sanitize.racecheck", "error", "timed out")],
        ("perf", None): lambda j: [CheckResult("perf.throttle", "warn", "power cap")],
    })  # fmt: skip


def jenkins_schema():
    xmlschema = require_module("xmlschema", "the test extra: pip install -e '.[test]'")
    return xmlschema.XMLSchema(str(cf.ROOT / "tests" / "data" / "jenkins-junit.xsd"))


@pytest.mark.parametrize("fail_on", [None, "warn"])
def test_junit_validates_against_the_jenkins_schema(tmp_path, fail_on):
    doc = cert(tmp_path, runner=every_status_runner(), fail_on=fail_on)
    assert {r["status"] for r in doc["results"]} == {"pass", "fail", "warn", "skip", "error"}
    jenkins_schema().validate(junit_xml(doc))  # raises, naming the element, when it does not


def test_junit_of_a_run_without_results_validates(tmp_path):
    doc = cert(tmp_path, n=1)
    doc["results"] = []
    jenkins_schema().validate(junit_xml(doc))


def test_junit_files_of_many_hosts_do_not_collide(tmp_path):
    """CI merges the files of many nodes: suites and classnames carry the host (dots kept out of the
    classname, where Jenkins would read them as packages)."""
    a = cert(tmp_path / "a", n=2)
    b = cert(tmp_path / "b", n=2)
    b["node"]["hostname"] = "gpu-b.example.com"
    trees = [ET.fromstring(junit_xml(d).split("\n", 1)[1]) for d in (a, b)]
    names = [{s.get("name") for s in t.findall("testsuite")} for t in trees]
    classes = [{c.get("classname") for c in t.iter("testcase")} for t in trees]
    assert not names[0] & names[1] and not classes[0] & classes[1]
    assert "kdactl.gpu-b_example_com.gpu0" in classes[1] and "gpu-b.example.com.gpu0" in names[1]


def test_junit_warning_is_visible_and_fails_under_fail_on_warn(tmp_path):
    root = ET.fromstring(junit_xml(cert(tmp_path / "w", runner=every_status_runner())).split("\n", 1)[1])
    suite = root.find("testsuite[@name='node-a.gpu0']")
    case = suite.find("testcase[@name='perf.throttle']")
    assert case.get("status") == "warn" and case.find("failure") is None
    assert case.find("system-out").text == "WARNING: power cap"
    assert suite.find("properties/property[@name='warnings']").get("value") == "1"
    assert suite.find("properties/property[@name='warning']").get("value") == "perf.throttle: power cap"
    assert "WARNING perf.throttle: power cap" in suite.find("system-out").text
    assert suite.find("testcase[@name='graph']/skipped").text == "no graph support in this driver"
    strict = ET.fromstring(junit_xml(cert(tmp_path / "s", runner=every_status_runner(), fail_on="warn")).split("\n", 1)[1])
    failure = strict.find("testsuite[@name='node-a.gpu0']/testcase[@name='perf.throttle']/failure")
    assert failure.get("type") == "warn" and failure.get("message") == "power cap"


_SAMPLE = re.compile(r'^[a-zA-Z_:][a-zA-Z0-9_:]*(\{([a-zA-Z_][a-zA-Z0-9_]*="([^"\\\n]|\\["\\n])*",?)*\})? (-?[0-9.e+-]+|NaN|[+-]Inf)$')


def test_prom_lines_are_valid_textfile_format(tmp_path):
    doc = cert(tmp_path, runner=mixed_runner())
    text = prom_text(doc)
    assert text.endswith("\n")
    seen_type, families = {}, []
    for line in text.rstrip("\n").split("\n"):
        if line.startswith("# HELP "):
            continue
        if line.startswith("# TYPE "):
            _, _, name, kind = line.split(" ")
            assert kind == "gauge" and name not in seen_type
            seen_type[name] = True
            families.append(name)
            continue
        assert _SAMPLE.match(line), line
        assert line.split("{")[0].split(" ")[0] == families[-1], f"{line} outside its family"
    assert 'kdactl_certified{node="node-a"} 0' in text
    assert f'kdactl_check_status{{node="node-a",check="route_smoke[direct]",gpu_uuid="{cf.uuid(1)}",status="fail"}} 1' in text
    assert f'kdactl_perf_measured_seconds{{node="node-a",gpu_uuid="{cf.uuid(0)}",shape="B1-T4096-H8-D128"}} 0.0012' in text
    assert 'kdactl_check_results{node="node-a",status="error"} 1' in text
    assert 'check="graph"' not in text  # a pass is counted, not given a series
    assert re.search(r'^kdactl_cert_expiry_timestamp_seconds\{node="node-a"\} 1778241600$', text, re.M)


def test_prom_escapes_label_values(tmp_path):
    doc = cert(tmp_path, n=1)
    doc["results"].append({"check": 'we"ird\\name\nx', "gpu": None, "status": "fail", "duration_s": 0.0, "message": ""})
    line = next(ln for ln in prom_text(doc).splitlines() if "we" in ln and "status" in ln)
    assert 'check="we\\"ird\\\\name\\nx"' in line and _SAMPLE.match(line)


def test_certified_gauge_is_1_when_certified(tmp_path):
    assert 'kdactl_certified{node="node-a"} 1' in prom_text(cert(tmp_path))


def test_summary_table_renders_statuses_and_verdict(tmp_path):
    doc = cert(tmp_path, runner=mixed_runner())
    console = Console(record=True, width=200)
    render_summary(console, doc, doc["reason"], {"certificate": "/x/cert.json", "junit": None})
    text = console.export_text()
    assert "route_smoke[direct]" in text and "NOT_CERTIFIED" in text and "/x/cert.json" in text


def test_json_is_one_document(tmp_path, monkeypatch, capsys):
    from kdactl.emit import emit

    s = cf.settings(tmp_path)
    rep = certify_command(s, CertifyOptions(as_json=True), cf.deps(cf.node(2)))
    emit(rep, True)
    out = capsys.readouterr().out
    doc = json.loads(out)
    assert doc["verdict"] == "certified" and doc["exit_code"] == 0 and doc["certificate"]["schema"] == "kdactl.cert/v1"
