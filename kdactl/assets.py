"""Where csrc/, checks/ and fleet/ are: the checkout's top level, or kdactl/_assets when installed."""

from __future__ import annotations

from pathlib import Path

_PACKAGE = Path(__file__).resolve().parent


def asset_dir(name: str) -> Path:
    """csrc, checks or fleet. A checkout wins over an installed copy (editable installs map both)."""
    checkout = _PACKAGE.parent / name
    if checkout.is_dir() and (_PACKAGE.parent / "pyproject.toml").is_file():
        return checkout
    installed = _PACKAGE / "_assets" / name
    if installed.is_dir():
        return installed
    raise FileNotFoundError(f"kdactl asset folder {name!r} not found next to {_PACKAGE}")


def csrc_dir() -> Path:
    return asset_dir("csrc")


def checks_dir() -> Path:
    return asset_dir("checks")


def fleet_dir() -> Path:
    return asset_dir("fleet")
