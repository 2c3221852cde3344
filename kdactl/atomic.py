"""The one atomic writer: a file (or several, all or none) appears whole or not at all.

Each file is written to a temporary file beside it, flushed and fsynced, then renamed over the old
one (os.replace); the directory is fsynced after, and a temporary file left by an error or an
interrupt is removed. Readers see the old file or the new one, never half of one.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any


def write_text_atomic(path: Path, text: str, mode: int = 0o644) -> None:
    """Temp file in the same directory, fsync, os.replace: readers see the old file or the new one."""
    write_texts_atomic({Path(path): text}, mode)


def write_texts_atomic(files: Mapping[Path, str], mode: int = 0o644) -> None:
    """Every file or none: all temp files are written and synced before the first rename, so a
    failure while writing (disk full, a bad directory) leaves every old file as it was. The renames
    go in the given order: put the file that others act on (the certificate) last."""
    staged: list[tuple[str, Path]] = []
    try:
        for path, text in files.items():
            staged.append((_stage(Path(path), text, mode), Path(path)))
        while staged:
            os.replace(staged[0][0], staged[0][1])
            staged.pop(0)
    finally:
        for tmp, _ in staged:  # what was not published (an error or an interrupt on the way)
            Path(tmp).unlink(missing_ok=True)
    for directory in dict.fromkeys(Path(p).parent for p in files):
        _fsync_dir(directory)


def _stage(path: Path, text: str, mode: int) -> str:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, mode)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return tmp


def _fsync_dir(directory: Path) -> None:
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass  # some filesystems refuse to fsync a directory; the rename is done either way
    finally:
        os.close(fd)


def write_json_atomic(path: Path, data: Any, mode: int = 0o644) -> None:
    write_text_atomic(path, json.dumps(data, indent=2, sort_keys=True) + "\n", mode)
