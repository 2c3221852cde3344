"""The target table is kdactl.targets; the copies that cannot be generated from it are read here and
compared with it: the C library's (csrc/common.cuh names each target's define, architecture and name;
csrc/library.cu's kdactl_check_device says which compute capabilities each build runs on) and the
tables of SPEC.md and README.md. fleet/skus.toml is compared in test_skus."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from kdactl.errors import UnsupportedTarget
from kdactl.targets import RUNS_ON, TARGETS, Version, select_target

ROOT = Path(__file__).resolve().parents[1]
CUDAS: list[Version] = [(11, 8)] + [(12, m) for m in range(10)] + [(13, m) for m in range(10)]
CCS: list[Version] = [(major, minor) for major in range(7, 14) for minor in range(10)]


def policy(cc: Version, cuda: Version) -> str | None:
    try:
        return select_target(cc, cuda)
    except UnsupportedTarget:
        return None


def _shown(target: str | None) -> str:
    return target or "unsupported"


# ---------------------------------------------------------------------------------------------
# Python's own table: RUNS_ON and min_cuda say what the policy does


def test_runs_on_holds_exactly_the_devices_the_policy_picks_each_target_for():
    picked: dict[str, set[Version]] = {t: set() for t in TARGETS}
    for cc in CCS:
        for cuda in CUDAS:
            if (t := policy(cc, cuda)) is not None:
                picked[t].add(cc)
    differ = [f"{t}: RUNS_ON {sorted(RUNS_ON.get(t, ()))}, the policy picks it for {sorted(ccs)}"
              for t, ccs in picked.items() if set(RUNS_ON.get(t, ())) != ccs]  # fmt: skip
    assert not differ, "\n".join(differ)


def test_min_cuda_is_the_oldest_toolkit_the_policy_picks_each_target_with():
    oldest = {t: min((cuda for cc in CCS for cuda in CUDAS if policy(cc, cuda) == t), default=None) for t in TARGETS}
    differ = [f"{t}: min_cuda {TARGETS[t].min_cuda}, the policy first picks it with CUDA {v}"
              for t, v in oldest.items() if v != TARGETS[t].min_cuda]  # fmt: skip
    assert not differ, "\n".join(differ)


# ---------------------------------------------------------------------------------------------
# The C library


def c_targets(text: str) -> dict[str, tuple[int, str]]:
    """csrc/common.cuh: KDACTL_TARGET_* define -> (KDACTL_EXPECTED_ARCH, KDACTL_TARGET_NAME)."""
    rows = re.findall(
        r'#(?:el)?if defined\((KDACTL_TARGET_\w+)\)\s*#define KDACTL_EXPECTED_ARCH (\d+)\s*#define KDACTL_TARGET_NAME "(\w+)"',
        text,
    )
    if not rows:
        raise AssertionError("csrc/common.cuh: found no '#if defined(KDACTL_TARGET_*)' block with its arch and name")
    return {define: (int(arch), name) for define, arch, name in rows}


def c_runs_on(text: str, define: str, expected_arch: int) -> set[Version]:
    """The compute capabilities csrc/library.cu's kdactl_check_device accepts in the build with ``define``:
    its #if/#elif/#else chain evaluated for that build, then its ``ok`` expression for each cc."""
    body = re.search(r"int kdactl_check_device\(void\) \{(.*?)\n\}", text, re.S)
    if body is None:
        raise AssertionError("csrc/library.cu: kdactl_check_device not found")
    chain = re.findall(r"#(if|elif|else)\b *(.*?)\n\s*const bool ok = \((.*?)\);", body.group(1))
    if not chain:
        raise AssertionError("csrc/library.cu: kdactl_check_device has no '#if ... const bool ok = (...);' chain")
    env = {"KDACTL_EXPECTED_ARCH": expected_arch}
    for kind, cond, expr in chain:
        if kind == "else" or _c_eval(re.sub(r"defined\((\w+)\)", lambda m: str(m.group(1) == define), cond), env):
            return {cc for cc in CCS if _c_eval(expr, {**env, "cc": cc[0] * 10 + cc[1]})}
    return set()


def _c_eval(expr: str, env: dict[str, int]) -> bool:
    """A C condition of names, integers, ==, *, ||, &&, !, parentheses."""
    if not re.fullmatch(r"[\w\s()=*|&!]*", expr) or re.search(r"(?<![=!])=(?!=)", expr.replace("==", "")):
        raise AssertionError(f"csrc/library.cu: cannot read the condition {expr!r}")
    py = expr.replace("||", " or ").replace("&&", " and ").replace("!", " not ").replace(" not =", "!=")
    names = set(re.findall(r"[A-Za-z_]\w*", py)) - {"or", "and", "not", "True", "False"}
    if names - env.keys():
        raise AssertionError(f"csrc/library.cu: the condition {expr!r} uses {sorted(names - env.keys())}")
    return bool(eval(py, {"__builtins__": {}}, dict(env)))  # checked above: names, integers and operators only


def test_c_library_names_each_target_as_python_does():
    theirs = c_targets((ROOT / "csrc" / "common.cuh").read_text())
    ours = {t.define: (t.arch * 10, t.name) for t in TARGETS.values()}
    differ = [f"{d}: csrc/common.cuh has {theirs.get(d)}, kdactl.targets has {ours.get(d)} (arch x 10, name)"
              for d in sorted(ours.keys() | theirs.keys()) if theirs.get(d) != ours.get(d)]  # fmt: skip
    assert not differ, "\n".join(differ)


@pytest.mark.parametrize("target", list(TARGETS))
def test_c_library_runs_each_target_on_the_devices_python_says(target):
    t = TARGETS[target]
    theirs = c_runs_on((ROOT / "csrc" / "library.cu").read_text(), t.define, t.arch * 10)
    ours = set(RUNS_ON[target])
    assert theirs == ours, (
        f"{target}: csrc/library.cu kdactl_check_device accepts cc {_ccs(theirs)}, kdactl.targets.RUNS_ON "
        f"says {_ccs(ours)} (only in C: {_ccs(theirs - ours)}; only in Python: {_ccs(ours - theirs)})"
    )


def _ccs(ccs: set[Version]) -> str:
    return ", ".join(f"{a}.{b}" for a, b in sorted(ccs)) or "none"


def test_the_c_reader_sees_a_wrong_device_list():
    text = (
        (ROOT / "csrc" / "library.cu").read_text().replace("cc == 80 || cc == 86 || cc == 89", "cc == 80 || cc == 86")
    )
    assert c_runs_on(text, "KDACTL_TARGET_SM80", 800) == {(8, 0), (8, 6)}
    assert c_runs_on(text, "KDACTL_TARGET_SM100F", 1000) == {(10, 0), (10, 3)}
    assert c_runs_on(text, "KDACTL_TARGET_SM120A", 1200) == {(12, 0)}


# ---------------------------------------------------------------------------------------------
# SPEC.md and README.md


def doc_table(text: str, heading: str) -> list[tuple[str, str, str]]:
    """The (compute capability, CUDA toolkit, target) rows of the first table under ``heading``."""
    section = re.search(rf"^#+ {re.escape(heading)}\n(.*?)(?=^#|\Z)", text, re.S | re.M)
    if section is None:
        raise AssertionError(f"no section {heading!r}")
    rows = [[c.strip() for c in line.strip().strip("|").split("|")]
            for line in section.group(1).splitlines() if line.startswith("|")]  # fmt: skip
    if len(rows) < 3 or rows[0] != ["compute capability", "CUDA toolkit", "target"]:
        raise AssertionError(f"{heading!r}: expected a '| compute capability | CUDA toolkit | target |' table")
    return [(cc, cuda, target) for cc, cuda, target in rows[2:]]


def doc_policy(rows: list[tuple[str, str, str]]) -> dict[tuple[Version, Version], set[str | None]]:
    """What the table says for each (cc, cuda) of the grid: every target of the rows that match (a
    cell "12.8 / >= 12.9" with "`a` / `b`" is two rows; no row is unsupported)."""
    said: dict[tuple[Version, Version], set[str | None]] = {}
    for cc_cell, cuda_cell, target_cell in rows:
        ccs = {(int(a), int(b)) for a, b in re.findall(r"(\d+)\.(\d+)", cc_cell)}
        anything = cc_cell.startswith("anything else")
        targets = [t.strip() for t in target_cell.split(" / ")]
        conds = [c.strip() for c in cuda_cell.split(" / ")] if cuda_cell else [""] * len(targets)
        if len(conds) != len(targets) or not (ccs or anything):
            raise AssertionError(f"cannot read the row | {cc_cell} | {cuda_cell} | {target_cell} |")
        for cond, target_text in zip(conds, targets):
            m = re.match(r"`(\w+)`", target_text)
            if not m and not target_text.startswith("unsupported"):
                raise AssertionError(f"cannot read the target {target_text!r}")
            target = m.group(1) if m else None
            for cc in CCS:
                for cuda in CUDAS:
                    if (cc in ccs or (anything and not any(cc in s for s in _named(rows)))) and _holds(cond, cuda):
                        said.setdefault((cc, cuda), set()).add(target)
    return said


def _named(rows: list[tuple[str, str, str]]) -> list[set[Version]]:
    return [{(int(a), int(b)) for a, b in re.findall(r"(\d+)\.(\d+)", cc)} for cc, _, _ in rows]


def _holds(cond: str, cuda: Version) -> bool:
    m = re.fullmatch(r"(>=|<|)\s*(\d+)\.(\d+)", cond)
    if cond == "":
        return True
    if m is None:
        raise AssertionError(f"cannot read the CUDA condition {cond!r}")
    v = (int(m.group(2)), int(m.group(3)))
    return {">=": cuda >= v, "<": cuda < v, "": cuda == v}[m.group(1)]


def doc_differences(rows: list[tuple[str, str, str]]) -> list[str]:
    said = doc_policy(rows)
    out = []
    for cc in CCS:
        for cuda in CUDAS:
            doc = said.get((cc, cuda), {None})
            want = policy(cc, cuda)
            if doc != {want}:
                shown = " and ".join(sorted(_shown(t) for t in doc))
                out.append(f"cc {cc[0]}.{cc[1]} with CUDA {cuda[0]}.{cuda[1]}: the table says {shown}, "
                           f"kdactl.targets.select_target {_shown(want)}")  # fmt: skip
    for _, _, target_cell in rows:
        for name in re.findall(r"`(\w+)`", target_cell):
            if name in TARGETS and TARGETS[name].portable_only != ("portable routes" in target_cell):
                out.append(f"{name}: portable_only is {TARGETS[name].portable_only}, the row says {target_cell!r}")
    return out


@pytest.mark.parametrize("doc, heading", [("SPEC.md", "Target policy"), ("README.md", "Kernel targets")])
def test_doc_table_says_what_the_policy_does(doc, heading):
    differ = doc_differences(doc_table((ROOT / doc).read_text(), heading))
    assert not differ, f"{doc} '{heading}' differs from kdactl.targets:\n" + "\n".join(differ[:20])


def test_the_doc_reader_sees_a_wrong_row():
    rows = doc_table((ROOT / "SPEC.md").read_text(), "Target policy")
    assert doc_differences(rows) == []
    wrong = [(cc, ">= 12.8" if t == "`sm_100a`" else cuda, t) for cc, cuda, t in rows]
    assert "cc 10.0 with CUDA 12.9: the table says sm_100a and sm_100f, kdactl.targets.select_target sm_100f" in (
        doc_differences(wrong)
    )
    dropped = [r for r in rows if r[2] != "`sm_90a`"]
    assert "cc 9.0 with CUDA 12.0: the table says unsupported, kdactl.targets.select_target sm_90a" in (
        doc_differences(dropped)
    )
