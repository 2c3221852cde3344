"""The certificate schema and the strict loader: every certificate kdactl writes is valid, each
kind of bad document is refused with its JSON path named, and the jsonschema package agrees with
kdactl's own validator."""

import copy
import json
from pathlib import Path

import pytest

from kdactl.certify import certificate as cm
from kdactl.certify import schema as sc
from kdactl.certify.command import CertifyOptions, certify_command
from kdactl.results import STATUSES
from tests import certify_fakes as cf
from tests import fleet_fakes as ff

DATA = Path(__file__).resolve().parent / "data" / "certs"


@pytest.fixture
def jsonschema():
    """The jsonschema package: the [test] extra has it; a GPU node installed as the README says
    (--no-deps) may not, and the rest of this module runs there without it."""
    return pytest.importorskip("jsonschema")


def built(tmp_path, facts=None, runner=None, key=None, **opts):
    """A certificate from the real certify pipeline (fake node and stage runner), sealed."""
    s = cf.settings(tmp_path, **({"KDACTL_CERT_KEY": key} if key else {}))
    return certify_command(s, CertifyOptions(**opts), cf.deps(facts or cf.node(8), runner, quick=opts.get("quick", False))).cert


def perf_runner():
    runner = cf.fault_runner()
    runner.behaviours[("perf", None)] = ff.perf_stage({"B1-T4096-H8": 0.9, "B8-T2048-H32": 2.5})
    return runner


def no_target_node():
    return cf.node(gpus=[cf.gpu(0), cf.gpu(1, name="Tesla T4", sku="unknown", target=None, health=None)])


def written_by_kdactl(tmp_path):
    """Certificates the current code writes: certified 8-GPU with perf and health facts, not
    certified, inconclusive without a GPU, a GPU without a kernel target, quick, signed, faulted,
    and the ones recorded on a real machine."""
    docs = {
        "8-gpu certified": built(tmp_path / "a"),
        "8-gpu perf not certified": built(tmp_path / "b", runner=perf_runner()),
        "no GPU inconclusive": built(tmp_path / "c", facts=cf.no_gpu_node()),
        "GPU without target": built(tmp_path / "d", facts=no_target_node(), expect_gpus=2, expect_sku="H200"),
        "quick": built(tmp_path / "e", quick=True),
        "signed": built(tmp_path / "f", key="k"),
        "fault, fail_on warn": built(tmp_path / "g", runner=cf.fault_runner(), fail_on="warn", gpus="0,3"),
    }
    docs.update({p.name: json.loads(p.read_text()) for p in sorted(DATA.glob("*.json"))})
    return docs


def test_every_certificate_kdactl_writes_is_valid(tmp_path, jsonschema):
    docs = written_by_kdactl(tmp_path)
    assert docs["8-gpu certified"]["verdict"] == "certified" and len(docs["8-gpu certified"]["gpus"]) == 8
    assert {d["verdict"] for d in docs.values()} == {"certified", "not_certified", "inconclusive"}
    assert any(r.get("measured") for r in docs["8-gpu perf not certified"]["results"])
    assert any("facts" in r for r in docs["8-gpu certified"]["results"])
    for name, doc in docs.items():
        assert sc.certificate_problems(doc) == [], name
        jsonschema.validate(doc, sc.certificate_schema(), cls=jsonschema.Draft202012Validator)
        again, problems = sc.load_certificate_bytes(cm.certificate_text(doc).encode())
        assert problems == [] and again == doc, name


def test_the_schema_uses_only_keywords_the_validator_implements(jsonschema):
    jsonschema.Draft202012Validator.check_schema(sc.certificate_schema())
    used = set()

    def walk(node):
        if isinstance(node, dict):
            for k, v in node.items():
                used.add(k)
                if k in ("properties", "$defs"):
                    for sub in v.values():
                        walk(sub)
                elif k not in ("const", "enum", "required", "type"):
                    walk(v)

    walk(sc.certificate_schema())
    assert used - sc.SUPPORTED == set()


def test_the_schema_names_kdactls_own_constants():
    props = sc.certificate_schema()["properties"]
    assert props["schema"]["const"] == cm.SCHEMA
    assert tuple(props["verdict"]["enum"]) == cm.VERDICTS
    assert tuple(sc.certificate_schema()["$defs"]["result"]["properties"]["status"]["enum"]) == STATUSES
    assert props["integrity"]["properties"]["canonical"]["enum"] == [cm.CANONICAL, cm.LEGACY_CANONICAL]


def _changed(doc, path, value):
    out = copy.deepcopy(doc)
    node = out
    for part in path[:-1]:
        node = node[part]
    if value is _DELETE:
        del node[path[-1]]
    else:
        node[path[-1]] = value
    return out


_DELETE = object()

# (where, new value, the problem named): the wrong types below the top level that a digest alone let through
WRONG_SHAPES = [
    (("node", "hostname"), {"name": "node-a"}, "node.hostname is an object, expected a string"),
    (("node", "hostname"), ["node-a"], "node.hostname is a list, expected a string"),
    (("scope",), ["full"], "scope ['full'] is not one of 'full', 'quick'"),
    (("gpus", 0, "uuid"), [cf.uuid(0)], "gpus[0].uuid is a list, expected a string"),
    (("gpus", 0, "index"), "0", "gpus[0].index is a string, expected an integer"),
    (("gpus", 0, "sku"), 5, "gpus[0].sku is an integer, expected a string"),
    (("gpus", 0, "artifact_sha256"), 7, "gpus[0].artifact_sha256 is an integer, expected a string or null"),
    (("node", "fingerprint"), "ab" * 32, "node.fingerprint is a string, expected an object"),
    (("node", "fingerprint", "gpu_uuids"), cf.uuid(0), "node.fingerprint.gpu_uuids is a string, expected a list"),
    (("versions",), {}, "versions lacks kdactl"),
    (("versions", "driver"), 580, "versions.driver is an integer, expected a string or null"),
    (("results", 0, "duration_s"), "1.5", "results[0].duration_s is a string, expected a number"),
    (("results", 0, "duration_s"), -1, "results[0].duration_s is -1, less than 0"),
    (("results", 0, "gpu"), True, "results[0].gpu is a boolean, expected an integer or null"),
    (("results", 0, "required"), "yes", "results[0].required is a string, expected a boolean"),
    (("issued_at",), 1777636800, "issued_at is an integer, expected a string"),
    (("node", "warnings"), [[[[[[[[[[[[[[[[["deep"]]]]]]]]]]]]]]]]],
     "node.warnings[0][0][0][0][0][0][0][0][0][0][0][0][0][0]: nesting is deeper than 16 levels"),
    (("integrity", "signature"), {"algorithm": "hmac-sha256", "key_id": "x", "value": "ab" * 32},
     "integrity.signature.key_id 'x' does not match ^[0-9a-f]{16}$"),
    (("integrity", "extra"), 1, "integrity.extra is not a field of integrity"),
    (("integrity", "canonical"), "json", "integrity.canonical 'json' is not one of 'rfc8785', 'json-sorted-keys-no-whitespace-utf8'"),
    (("integrity", "node_signature"), {"algorithm": "ed448", "key_id": "ab" * 8, "value": "A" * 86 + "=="},
     "integrity.node_signature.algorithm is 'ed448', expected 'ed25519'"),
    (("integrity", "node_signature"), {"algorithm": "ed25519", "key_id": "ab" * 8, "value": "ab" * 64},
     "integrity.node_signature.value 'abababababababababababababababababababababababababababab... does not match ^[A-Za-z0-9+/]{86}==$"),
    (("integrity", "node_signature"), None, "integrity.node_signature is null, expected an object"),
    (("surprise",), 1, "surprise is not a field of a certificate"),
    (("node", "hostname"), _DELETE, "node lacks hostname"),
]  # fmt: skip


@pytest.mark.parametrize("where, value, problem", WRONG_SHAPES)
def test_a_wrong_type_anywhere_is_named(tmp_path, where, value, problem):
    assert problem in sc.certificate_problems(_changed(built(tmp_path), where, value))


@pytest.mark.parametrize("where, value, problem", WRONG_SHAPES)
def test_jsonschema_refuses_each_wrong_type_too(tmp_path, where, value, problem, jsonschema):
    bad = _changed(built(tmp_path), where, value)
    assert not jsonschema.Draft202012Validator(sc.certificate_schema()).is_valid(bad) or "nesting" in problem


def test_perf_fields_are_numbers_or_null(tmp_path):
    doc = built(tmp_path, runner=perf_runner())
    i = next(i for i, r in enumerate(doc["results"]) if "measured" in r)
    assert sc.certificate_problems(_changed(doc, ("results", i, "measured"), "0.9 ms")) == [
        f"results[{i}].measured is a string, expected a number or null"]
    assert sc.certificate_problems(_changed(doc, ("results", i, "baseline"), None)) == []


def test_problems_are_bounded(tmp_path):
    doc = built(tmp_path)
    for r in doc["results"]:
        r["status"] = "ok"
    problems = sc.certificate_problems(doc)
    assert len(problems) == sc.MAX_PROBLEMS + 1 and problems[-1].startswith("... and ")


@pytest.mark.parametrize("text, problem", [
    ('{"a": NaN}', "NaN is not a JSON number"),
    ('{"a": Infinity}', "Infinity is not a JSON number"),
    ('{"a": -Infinity}', "-Infinity is not a JSON number"),
    ('{"a": 1e400}', "number 1e400 overflows to infinity"),
    ('{"a": -1e400}', "number -1e400 overflows to infinity"),
    ('{"a": ' + "[" * 100_000 + "]" * 100_000 + "}", "nesting is deeper than 16 levels"),
    ('{"a": ' + "[" * 17 + "]" * 17 + "}", "a[0][0][0][0][0][0][0][0][0][0][0][0][0][0][0]: nesting is deeper than 16 levels"),
    ('{"a": 1, "a": 2}', "key 'a' appears twice in one object"),
    ('{"a": "\\ud800"}', "a is not valid Unicode (a lone surrogate)"),
    ('["not", "an", "object"]', "the document is a list, expected an object"),
    ('{"a": 1', "not valid JSON"),
])  # fmt: skip
def test_the_loader_refuses_what_python_json_would_let_through(text, problem):
    doc, problems = sc.load_certificate_bytes(text.encode())
    assert doc is None and len(problems) == 1 and problem in problems[0], problems


def test_the_loader_bounds_the_size():
    doc, problems = sc.load_certificate_bytes(b" " * (sc.MAX_BYTES + 1))
    assert doc is None and f"more than the {sc.MAX_BYTES:,} a certificate may have" in problems[0]


def test_structure_rules_hold_for_documents_not_read_from_bytes(tmp_path):
    doc = built(tmp_path)
    assert "results[0].duration_s is inf" in sc.certificate_problems(_changed(doc, ("results", 0, "duration_s"), float("inf")))[0]
    assert "is nan" in sc.certificate_problems(_changed(doc, ("results", 0, "duration_s"), float("nan")))[0]
    assert sc.certificate_problems(None) == ["the document is null, expected an object"]


def test_fleet_fakes_certificates_are_valid(tmp_path):
    """The fleet tests' certificates (two GPUs, chosen perf times and hostnames) are valid too."""
    path = ff.make_cert(tmp_path, "gpu-a", times={"B1-T4096-H8": 1.5, "B8-T2048-H32": 2.0}, fault="sanitizer")
    doc, problems = sc.load_certificate_bytes(path.read_bytes())
    assert problems == [] and sc.certificate_problems(doc) == []
