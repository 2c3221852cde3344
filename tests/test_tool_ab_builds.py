"""tools/ab_builds.py's logic on the CPU: its arms, the mirrored order, the table from bench JSON (a
failed run and a failed shape reported, not dropped), and the trees it makes from git."""

from __future__ import annotations

import argparse
import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def ab():
    spec = importlib.util.spec_from_file_location("ab_builds", ROOT / "tools" / "ab_builds.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # (its dataclasses look their module up there)
    spec.loader.exec_module(module)
    return module


@pytest.fixture
def in_git_root(monkeypatch):
    """The repository root as the working directory, as the tool runs (its trees come from git)."""
    if subprocess.run(["git", "-C", str(ROOT), "rev-parse", "HEAD"], capture_output=True).returncode:
        pytest.skip("not a git checkout")
    monkeypatch.chdir(ROOT)


def report(*rows):
    """A kdactl bench --json report: rows of (shape key, median ms or None, error)."""
    shapes = []
    for key, ms, error in rows:
        timing = {"median_ms": ms} if ms is not None else None
        status = "ok" if ms is not None else "failed"
        candidates = [{"name": "auto", "status": status, "reason": None if ms else "check failed", "timing": timing}]
        shapes.append({"shape": {"key": key}, "error": error, "candidates": [] if error else candidates})
    return {"schema": "kdactl.bench/v1", "shapes": shapes}


def test_arms_and_order(ab):
    assert ab.parse_arm("base=main") == ab.Arm("base", "main")
    assert ab.parse_arm("try=.").rev == ab.CHECKOUT
    for bad in ("main", "=main", "base="):
        with pytest.raises(argparse.ArgumentTypeError, match="NAME=REV"):
            ab.parse_arm(bad)
    assert ab.mirrored_order(["a", "b", "c"]) == ["a", "b", "c", "c", "b", "a"]


def test_table_gives_every_run_and_the_ratio_to_the_first_arm(ab):
    runs = [
        ("base", report(("s1", 0.2, None), ("s2", 1.0, None)), None),
        ("try", report(("s1", 0.1, None), ("s2", None, None)), None),
        ("try", None, "bench exit 3: illegal instruction"),
        ("base", report(("s1", 0.2, None), ("s2", None, "out of memory")), None),
    ]
    text = ab.table(["base", "try"], runs)
    assert "| s1 | 0.200, 0.200 | 0.100 (0.500x) |" in text
    assert "| s2 | 1.000 | - |" in text
    assert "- try: bench exit 3: illegal instruction" in text
    assert "- try, s2: check failed" in text and "- base, s2: out of memory" in text


def test_make_tree_holds_what_kdactl_runs_from(ab, tmp_path, in_git_root):
    tree = tmp_path / "trees" / "t"
    ab.make_tree("HEAD", tree)
    assert (tree / "pyproject.toml").is_file() and (tree / "fleet").is_dir()
    assert (tree / "csrc" / "kdactl_api.h").is_file() and (tree / "kdactl" / "assets.py").is_file()
    env = ab.arm_env(ab.Arm("t", "HEAD"), tmp_path)
    assert env["PYTHONPATH"].split(os.pathsep)[0] == str(tree)
    assert env["KDACTL_CACHE_DIR"] == str(tmp_path / "cache" / "t")
    assert ab.arm_env(ab.Arm("here", ab.CHECKOUT), tmp_path).get("PYTHONPATH") == os.environ.get("PYTHONPATH")
    # from the repository root too, the arm's kdactl is the tree's, not the checkout's
    assert ab.csrc_of(ab.Arm("t", "HEAD"), tmp_path) == str(tree / "csrc")
    # a tree made elsewhere, named by its folder (a GPU node whose git lacks the revision)
    assert ab.csrc_of(ab.Arm("u", str(tree)), tmp_path / "other") == str(tree / "csrc")


def test_an_arm_that_is_neither_a_revision_nor_a_tree_is_refused_by_name(ab, tmp_path, in_git_root, capsys):
    with pytest.raises(SystemExit) as exit_:
        ab.main(["--arm", "try=no-such-revision", "--work", str(tmp_path), "--trees-only"])
    assert exit_.value.code == 2 and "--arm try=no-such-revision: neither a folder" in capsys.readouterr().err
    assert ab.main(["--arm", "here=HEAD", "--work", str(tmp_path), "--trees-only"]) == 0
    assert (tmp_path / "trees" / "here" / "csrc").is_dir()


def test_a_tree_named_by_its_folder_under_work_is_used_as_it_is(ab, tmp_path, in_git_root):
    # made with --trees-only, carried, and named where --work would put it: no git revision is looked up
    assert ab.main(["--arm", "t=HEAD", "--work", str(tmp_path), "--trees-only"]) == 0
    tree = tmp_path / "trees" / "t"
    (tree / "marker").write_text("kept")
    arm = ab.Arm("t", str(tree))
    assert not arm.from_git and arm.tree(tmp_path) == tree
    assert ab.main(["--arm", f"t={tree}", "--work", str(tmp_path), "--trees-only"]) == 0
    assert (tree / "marker").read_text() == "kept"
