"""The one validation every certificate reader uses (verify, gate, fleet ingest and report): a strict
JSON loader and the JSON Schema in ``certificate.schema.json``.

The schema is checked by the small validator below, which implements exactly the keywords the
schema file uses (``SUPPORTED``; a test fails if the file uses any other). It is not the
``jsonschema`` package because the GPU image does not necessarily have it and ``kdactl gate``
must start in well under a second; the tests check that ``jsonschema`` agrees with it.

JSON Schema cannot say "finite number", "at most this deep" or "no duplicate keys", and Python's
``json`` accepts NaN, Infinity and 1e400 (as inf), so the loader and ``structure_problems`` add
those rules. Every problem names its JSON path (``node.hostname``, ``gpus[0].uuid``).

Stdlib only, as certificate.py.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Iterator, Mapping
from functools import lru_cache
from pathlib import Path
from typing import Any

SCHEMA_FILE = Path(__file__).with_name("certificate.schema.json")
MAX_BYTES = 16 << 20  # a real 8-GPU certificate of 1,041 results is about 230 KB
MAX_DEPTH = 16  # levels of objects and arrays; the deepest a certificate needs is 5
MAX_PROBLEMS = 20  # listed; the rest are counted
SUPPORTED = frozenset({
    "$schema", "$id", "$defs", "$ref", "title", "description", "type", "const", "enum", "properties", "required",
    "additionalProperties", "minProperties", "maxProperties", "items", "minItems", "maxItems", "minLength",
    "maxLength", "pattern", "minimum",
})  # fmt: skip

_KINDS = {dict: "an object", list: "a list", str: "a string", type(None): "null", bool: "a boolean",
          int: "an integer", float: "a number"}  # fmt: skip
_TYPE_NAMES = {"object": "an object", "array": "a list", "string": "a string", "null": "null", "boolean": "a boolean",
               "integer": "an integer", "number": "a number"}  # fmt: skip


class _Refused(ValueError):
    """A JSON text the strict loader will not turn into a document."""


@lru_cache(maxsize=1)
def certificate_schema() -> dict[str, Any]:
    return json.loads(SCHEMA_FILE.read_text(encoding="utf-8"))


def load_certificate_bytes(data: bytes) -> tuple[dict[str, Any] | None, list[str]]:
    """(document, []) or (None, [why]) for the bytes of a certificate file: valid UTF-8, at most
    MAX_BYTES, JSON with finite numbers only, no duplicate keys, nesting at most MAX_DEPTH, an
    object. The document is not checked against the schema here (certificate_problems does)."""
    if len(data) > MAX_BYTES:
        return None, [f"document is {len(data):,} bytes, more than the {MAX_BYTES:,} a certificate may have"]
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as err:
        return None, [f"not valid JSON (not UTF-8 at byte {err.start}): corrupt or tampered"]
    try:
        doc = json.loads(
            text, parse_constant=_refuse_constant, parse_float=_finite_float, object_pairs_hook=_unique_keys
        )
    except RecursionError:
        return None, [f"nesting is deeper than {MAX_DEPTH} levels"]
    except _Refused as err:
        return None, [str(err)]
    except json.JSONDecodeError as err:
        return None, [f"not valid JSON ({err}): corrupt or tampered"]
    if not isinstance(doc, dict):
        return None, [f"the document is {kind(doc)}, expected an object"]
    problems = structure_problems(doc)
    return (None, problems) if problems else (doc, [])


def _refuse_constant(name: str) -> Any:
    raise _Refused(f"{name} is not a JSON number: certificates hold finite numbers only")


def _finite_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise _Refused(f"number {text[:40]} overflows to infinity: certificates hold finite numbers only")
    return value


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out = dict(pairs)
    if len(out) != len(pairs):
        seen: set[str] = set()
        dup = next(k for k, _ in pairs if k in seen or seen.add(k))  # type: ignore[func-returns-value]
        raise _Refused(f"key {dup[:80]!r} appears twice in one object: readers would disagree on its value")
    return out


def structure_problems(doc: Any) -> list[str]:
    """What JSON Schema cannot say, for a document however it was obtained (parsed here, read from a
    store, built in memory): nesting at most MAX_DEPTH, numbers finite, text encodable as UTF-8."""
    stack: list[tuple[Any, str, int]] = [(doc, "", 1)]
    while stack:
        value, path, depth = stack.pop()
        if isinstance(value, (dict, list)):
            if depth > MAX_DEPTH:
                return [f"{_at(path)}: nesting is deeper than {MAX_DEPTH} levels"]
            items = value.items() if isinstance(value, dict) else enumerate(value)
            for k, v in items:
                if isinstance(k, str) and not _utf8(k):
                    return [f"{_at(path)}: a key is not valid Unicode (a lone surrogate)"]
                stack.append((v, _join(path, k), depth + 1))
        elif isinstance(value, float) and not math.isfinite(value):
            return [f"{_at(path)} is {value}: certificates hold finite numbers only"]
        elif isinstance(value, str) and not _utf8(value):
            return [f"{_at(path)} is not valid Unicode (a lone surrogate)"]
    return []


def _utf8(text: str) -> bool:
    if text.isascii():
        return True
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def certificate_problems(doc: Any) -> list[str]:
    """Every way ``doc`` breaks the certificate schema or the structure rules; [] when valid. Each
    problem names the JSON path and what is wrong; at most MAX_PROBLEMS are listed."""
    if not isinstance(doc, dict):
        return [f"the document is {kind(doc)}, expected an object"]
    problems = structure_problems(doc)
    if problems:
        return problems
    schema = certificate_schema()
    found = list(_validate(doc, schema, "", schema))
    if len(found) > MAX_PROBLEMS:
        found = found[:MAX_PROBLEMS] + [f"... and {len(found) - MAX_PROBLEMS} more problems"]
    return found


def kind(value: Any) -> str:
    return _KINDS.get(type(value), f"a {type(value).__name__}")


def _at(path: str) -> str:
    return path or "the document"


def _join(path: str, key: Any) -> str:
    if isinstance(key, int):
        return f"{path}[{key}]"
    if re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", key):
        return f"{path}.{key}" if path else key
    return f"{path}[{json.dumps(key)[:80]}]"


def _show(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _is_type(value: Any, name: str) -> bool:
    if name == "integer":
        return isinstance(value, int) and not isinstance(value, bool)
    if name == "number":
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    return {"object": dict, "array": list, "string": str, "boolean": bool, "null": type(None)}[name] is type(value)


def _validate(value: Any, schema: Mapping[str, Any], path: str, root: Mapping[str, Any]) -> Iterator[str]:
    """The problems of ``value`` against ``schema`` (JSON Schema semantics: a keyword about one type
    says nothing about a value of another); the first type mismatch stops the descent."""
    if "$ref" in schema:
        yield from _validate(value, _resolve(schema["$ref"], root), path, root)
        return
    where = _at(path)
    if "const" in schema and value != schema["const"]:
        yield f"{where} is {_show(value)}, expected {_show(schema['const'])}"
        return
    if "enum" in schema and not any(value == e and type(value) is type(e) for e in schema["enum"]):
        yield f"{where} {_show(value)} is not one of {', '.join(_show(e) for e in schema['enum'])}"
        return
    if "type" in schema:
        names = [schema["type"]] if isinstance(schema["type"], str) else schema["type"]
        if not any(_is_type(value, n) for n in names):
            yield f"{where} is {kind(value)}, expected {' or '.join(_TYPE_NAMES[n] for n in names)}"
            return
    if isinstance(value, str):
        yield from _string_problems(value, schema, where)
    elif _is_type(value, "number") and "minimum" in schema and value < schema["minimum"]:
        yield f"{where} is {value}, less than {schema['minimum']}"
    elif isinstance(value, dict):
        yield from _object_problems(value, schema, path, root)
    elif isinstance(value, list):
        if len(value) > schema.get("maxItems", len(value)) or len(value) < schema.get("minItems", 0):
            yield f"{where} has {len(value)} items, expected {schema.get('minItems', 0)} to {schema.get('maxItems', 'any number of')}"
        elif "items" in schema:
            for i, item in enumerate(value):
                yield from _validate(item, schema["items"], f"{path}[{i}]", root)


def _string_problems(value: str, schema: Mapping[str, Any], where: str) -> Iterator[str]:
    if len(value) < schema.get("minLength", 0):
        yield f"{where} is {_show(value)}, shorter than {schema['minLength']} characters"
    elif len(value) > schema.get("maxLength", len(value)):
        yield f"{where} is {len(value):,} characters long, more than {schema['maxLength']:,}"
    elif "pattern" in schema and not re.search(schema["pattern"], value):
        yield f"{where} {_show(value)} does not match {schema['pattern']}"


def _object_problems(value: dict, schema: Mapping[str, Any], path: str, root: Mapping[str, Any]) -> Iterator[str]:
    where = _at(path)
    missing = [k for k in schema.get("required", ()) if k not in value]
    if missing:
        yield f"{'certificate' if not path else where} lacks {', '.join(missing)}"
    n = len(value)
    if n < schema.get("minProperties", 0) or n > schema.get("maxProperties", n):
        yield f"{where} has {n} fields, expected {schema.get('minProperties', 0)} to {schema.get('maxProperties', 'any number of')}"
        return
    props = schema.get("properties", {})
    extra = schema.get("additionalProperties", True)
    for k, v in value.items():
        if k in props:
            yield from _validate(v, props[k], _join(path, k), root)
        elif extra is False:
            yield f"{_join(path, k)} is not a field of {where if path else 'a certificate'}"
        elif isinstance(extra, dict):
            yield from _validate(v, extra, _join(path, k), root)


def _resolve(ref: str, root: Mapping[str, Any]) -> Mapping[str, Any]:
    if not ref.startswith("#/"):
        raise ValueError(f"certificate schema: only local references are supported, got {ref!r}")
    node: Any = root
    for part in ref[2:].split("/"):
        node = node[part]
    return node
