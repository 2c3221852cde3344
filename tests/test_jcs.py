"""RFC 8785 (JCS): the RFC's own vectors, and agreement with implementations that are not kdactl's:
the PyPI package ``rfc8785`` (Trail of Bits) on real certificates and random doubles, and
ECMAScript itself (node's JSON.stringify is Number::toString) on random doubles."""

import hashlib
import json
import random
import struct
import subprocess
from pathlib import Path

import pytest

from kdactl.certify import certificate as cm
from kdactl.certify.jcs import NotCanonicalizable, canonicalize, number_text
from tests import certify_fakes as cf
from tests import fleet_fakes as ff
from tests.tools import require_module, require_tool

# RFC 8785 Appendix B: IEEE 754 bit patterns and their ECMAScript form
RFC_NUMBERS = [
    (0x0000000000000000, "0"), (0x8000000000000000, "0"), (0x0000000000000001, "5e-324"),
    (0x8000000000000001, "-5e-324"), (0x7FEFFFFFFFFFFFFF, "1.7976931348623157e+308"),
    (0xFFEFFFFFFFFFFFFF, "-1.7976931348623157e+308"), (0x4340000000000000, "9007199254740992"),
    (0xC340000000000000, "-9007199254740992"), (0x4430000000000000, "295147905179352830000"),
    (0x44B52D02C7E14AF5, "9.999999999999997e+22"), (0x44B52D02C7E14AF6, "1e+23"),
    (0x44B52D02C7E14AF7, "1.0000000000000001e+23"), (0x444B1AE4D6E2EF4E, "999999999999999700000"),
    (0x444B1AE4D6E2EF4F, "999999999999999900000"), (0x444B1AE4D6E2EF50, "1e+21"),
    (0x3EB0C6F7A0B5ED8C, "9.999999999999997e-7"), (0x3EB0C6F7A0B5ED8D, "0.000001"),
    (0x41B3DE4355555553, "333333333.3333332"), (0x41B3DE4355555554, "333333333.33333325"),
    (0x41B3DE4355555555, "333333333.3333333"), (0x41B3DE4355555556, "333333333.3333334"),
    (0x41B3DE4355555557, "333333333.33333343"), (0xBECBF647612F3696, "-0.0000033333333333333333"),
    (0x43143FF3C1CB0959, "1424953923781206.2"),
]  # fmt: skip
# where Python's repr and ECMAScript part ways: exponent thresholds and how an exponent is written
MORE_NUMBERS = [(0.0, "0"), (-0.0, "0"), (1.0, "1"), (100.0, "100"), (1e-7, "1e-7"), (1e-6, "0.000001"),
                (1.5e16, "15000000000000000"), (1e21, "1e+21"), (1e20, "100000000000000000000"), (0.5, "0.5"),
                (-1.25e-10, "-1.25e-10"), (123456.789, "123456.789")]  # fmt: skip


def bits(pattern: int) -> float:
    return struct.unpack(">d", struct.pack(">Q", pattern))[0]


@pytest.mark.parametrize("pattern,want", RFC_NUMBERS, ids=[w for _, w in RFC_NUMBERS])
def test_rfc_number_vectors(pattern, want):
    assert number_text(bits(pattern)) == want
    assert canonicalize([bits(pattern)]) == f"[{want}]".encode()


@pytest.mark.parametrize("value,want", MORE_NUMBERS, ids=[w for _, w in MORE_NUMBERS])
def test_ecmascript_thresholds(value, want):
    assert number_text(value) == want


def test_rfc_example_document():
    """RFC 8785 section 3.2.2: numbers, string escapes and literals."""
    text = r'{"numbers": [333333333.33333329, 1E30, 4.50, 2e-3, 0.000000000000000000000000001], "string": "\u20ac$\u000F\u000aA' + "'" + r'\u0042\u0022\u005c\\\"\/", "literals": [null, true, false]}'
    want = '{"literals":[null,true,false],"numbers":[333333333.3333333,1e+30,4.5,0.002,1e-27],"string":"€$\\u000f\\nA\'B\\"\\\\\\\\\\"/"}'
    assert canonicalize(json.loads(text)) == want.encode()


def test_keys_sort_by_utf16_code_units():
    """RFC 8785 section 3.2.3: U+1F600 (surrogates D83D DE00) sorts before U+FB33, unlike by code point."""
    doc = {"\u20ac": "Euro Sign", "\r": "Carriage Return", "\ufb33": "Hebrew Letter Dalet With Dagesh", "1": "One",
           "\U0001F600": "Emoji: Grinning Face", "\u0080": "Control", "\u00f6": "Latin Small Letter O With Diaeresis"}  # fmt: skip
    order = list(json.loads(canonicalize(doc)).values())
    assert order == ["Carriage Return", "One", "Control", "Latin Small Letter O With Diaeresis", "Euro Sign",
                     "Emoji: Grinning Face", "Hebrew Letter Dalet With Dagesh"]  # fmt: skip


@pytest.mark.parametrize("value,where", [
    ({"a": [1, 2**53]}, "a[1] is 9007199254740992"), ({"a": float("nan")}, "a is nan"), ({"a": float("-inf")}, "a is -inf"),
    ({"a": {1: 2}}, "a has a key that is not a string"), ({"a": {1, 2}}, "a is a set"),
])  # fmt: skip
def test_refused_values_name_their_path(value, where):
    with pytest.raises(NotCanonicalizable, match=where.replace("[", r"\[").replace("]", r"\]")):
        canonicalize(value)


def random_doubles(n: int, seed: int) -> list[float]:
    """Uniform bit patterns (every exponent) and decimal-looking values (the ones certificates hold)."""
    rng = random.Random(seed)
    out = []
    while len(out) < n:
        x = bits(rng.getrandbits(64)) if len(out) % 2 else round(rng.uniform(-1, 1) * 10 ** rng.randint(-9, 22), rng.randint(0, 17))
        if x == x and abs(x) != float("inf"):
            out.append(x)
    return out


def test_numbers_agree_with_the_rfc8785_package():
    rfc8785 = require_module("rfc8785", "pip install rfc8785 (the test extra)")
    for pattern, want in RFC_NUMBERS:
        assert rfc8785.dumps(bits(pattern)).decode() == want  # the reference reads the vectors as we do
    values = random_doubles(20_000, seed=8785)
    assert canonicalize(values) == rfc8785.dumps(values)


def test_numbers_agree_with_ecmascript():
    node = require_tool("node", "apt-get install nodejs")
    values = random_doubles(5_000, seed=262)
    script = "const xs = JSON.parse(require('fs').readFileSync(0, 'utf8')); process.stdout.write(JSON.stringify(xs));"
    # the input is Python's repr, which reads back to the same doubles in any correct parser
    proc = subprocess.run([node, "-e", script], input=json.dumps(values), capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    theirs = proc.stdout[1:-1].split(",")
    mismatches = [(v, number_text(v), t) for v, t in zip(values, theirs) if number_text(v) != t]
    assert len(theirs) == len(values) and mismatches == []


def real_certificates(tmp_path: Path) -> list[Path]:
    """Certificates from the builder (certify_command over fakes: perf results with measured
    floats, a not-certified one, an injected fault) and the recorded ones of tests/data/certs."""
    made = [ff.make_cert(tmp_path, "node-a"), ff.make_cert(tmp_path, "node-b", times={"B1-T4096-H8": 1.7, "B8-T2048-H32": 0.1}),
            ff.make_cert(tmp_path, "node-c", fault="sanitizer")]  # fmt: skip
    return made + sorted((cf.ROOT / "tests" / "data" / "certs").glob("*.json"))


def test_certificates_agree_with_the_rfc8785_package(tmp_path):
    rfc8785 = require_module("rfc8785", "pip install rfc8785 (the test extra)")
    paths = real_certificates(tmp_path)
    for path in paths:
        doc = json.loads(path.read_text())
        body = {k: v for k, v in doc.items() if k != "integrity"}
        assert canonicalize(body) == rfc8785.dumps(body), path.name
        assert cm.canonical_bytes(doc) == rfc8785.dumps(body)
    for path in paths[:3]:  # sealed now: the digest is sha256 of the reference's bytes
        doc = json.loads(path.read_text())
        body = {k: v for k, v in doc.items() if k != "integrity"}
        assert doc["integrity"]["canonical"] == "rfc8785"
        assert doc["integrity"]["sha256"] == hashlib.sha256(rfc8785.dumps(body)).hexdigest()


def test_a_whole_float_digests_as_ecmascript_writes_it(tmp_path):
    """0.0 is 0 in every other language: the digest of a certificate holding 0.0 and 1.0 must be
    the one a verifier outside Python computes (json.dumps writes 0.0 and 1.0)."""
    path = ff.make_cert(tmp_path, "node-a", times={"B1-T4096-H8": 1.0, "B8-T2048-H32": 0.0})
    doc = json.loads(path.read_text())
    body = {k: v for k, v in doc.items() if k != "integrity"}
    text = canonicalize(body).decode()
    assert '"measured":0,' in text and '"measured":1,' in text and '"measured":0.0' not in text
    assert doc["integrity"]["sha256"] == hashlib.sha256(text.encode()).hexdigest()
