"""Packaging: every subpackage ships, and the asset folders are found from a checkout."""

import subprocess
import sys
import tomllib
from pathlib import Path

from kdactl import assets

ROOT = Path(__file__).resolve().parents[1]


def test_every_subpackage_is_listed_in_pyproject():
    listed = set(tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])
    found = {".".join(p.parent.relative_to(ROOT).parts) for p in (ROOT / "kdactl").rglob("__init__.py")}
    assert found - listed == set(), f"add to [tool.setuptools] packages: {sorted(found - listed)}"


def test_assets_found_in_checkout():
    assert (assets.csrc_dir() / "kdactl_api.h").is_file()
    assert assets.checks_dir().is_dir() and assets.fleet_dir().is_dir()


def test_import_kdactl_is_light():
    code = "import sys, kdactl; print(any(m == 'torch' or m.startswith('torch.') for m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False"


def test_python_m_kdactl_help():
    proc = subprocess.run([sys.executable, "-m", "kdactl", "--help"], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0 and "detect" in proc.stdout


def test_test_extra_declares_what_a_fresh_venv_needs():
    """Without numpy torch prints a warning on import, which breaks the one-line-on-stderr tests
    (bench without a GPU) in a fresh venv; PyYAML reads the Kubernetes manifests."""
    extra = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]["test"]
    names = {d.split(">")[0].split("=")[0].split("[")[0].strip().lower() for d in extra}
    assert {"pytest", "pytest-timeout", "pyyaml", "numpy"} <= names


def test_spec_travels_with_the_repository():
    """The README's contract link resolves in a clone (the SPEC is not outside the repo)."""
    readme = (ROOT / "README.md").read_text()
    assert "../shared/" not in readme and "(SPEC.md)" in readme and (ROOT / "SPEC.md").is_file()


def test_every_data_file_of_the_package_ships():
    """A file kdactl reads at run time (the certificate schema) is in the wheel only when a
    package-data pattern of its package names it."""
    from fnmatch import fnmatch

    data = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]
    files = [p for p in (ROOT / "kdactl").rglob("*") if p.is_file() and p.suffix not in (".py", ".pyc")]
    assert any(p.name == "certificate.schema.json" for p in files)
    unshipped = [str(p.relative_to(ROOT)) for p in files
                 if not any(fnmatch(p.name, pat) for pat in data.get(".".join(p.parent.relative_to(ROOT).parts), []))]
    assert unshipped == [], f"add to [tool.setuptools.package-data]: {unshipped}"
