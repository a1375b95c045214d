"""Durable file writes, the one policy every room uses: a temp file in the same folder, fsync the
file, rename over the target, fsync the folder. A crash leaves the old file or the new one, never
a torn one; a reader never sees a partial write."""
from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import BinaryIO

PRIVATE = 0o600  # databases, journals, salts, keys: readable by the owner only
PUBLIC = 0o644
PRIVATE_DIR = 0o700


def fsync_dir(path: str | os.PathLike[str]) -> None:
    """Make a rename or a new entry in `path` durable."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


@contextlib.contextmanager
def atomic_writer(path: str | os.PathLike[str], *, mode: int = PUBLIC,
                  replace: bool = True) -> Iterator[BinaryIO]:
    """Yield a binary file; on a clean exit its bytes become `path` atomically, with permissions
    `mode`. With replace=False an existing `path` is never overwritten (FileExistsError), even by
    a concurrent writer. On an exception nothing changes and the temp file is removed."""
    p = Path(path)
    folder = p.parent if str(p.parent) else Path(".")
    folder.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{p.name}.", suffix=".tmp", dir=folder)
    try:
        os.fchmod(fd, mode)
        with os.fdopen(fd, "wb") as f:
            yield f
            f.flush()
            os.fsync(f.fileno())
        if replace:
            os.replace(tmp, p)
        else:
            os.link(tmp, p)  # fails if the target exists: no concurrent creator is overwritten
            os.unlink(tmp)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
    fsync_dir(folder)


def atomic_write_bytes(path: str | os.PathLike[str], data: bytes, *, mode: int = PUBLIC,
                       replace: bool = True) -> None:
    """Write `data` to `path` atomically and durably (see atomic_writer)."""
    with atomic_writer(path, mode=mode, replace=replace) as f:
        f.write(data)


def atomic_write_text(path: str | os.PathLike[str], text: str, *, mode: int = PUBLIC,
                      replace: bool = True) -> None:
    """Write UTF-8 `text` to `path` atomically and durably (see atomic_writer)."""
    atomic_write_bytes(path, text.encode("utf-8"), mode=mode, replace=replace)


def atomic_write_with(path: str | os.PathLike[str], write: Callable[[BinaryIO], object], *,
                      mode: int = PUBLIC) -> None:
    """Let `write(f)` stream the content into a temp file, then publish it atomically."""
    with atomic_writer(path, mode=mode) as f:
        write(f)


def publish(tmp: str | os.PathLike[str], path: str | os.PathLike[str]) -> None:
    """Make `tmp`, a finished file its writer filled itself (a resumable download), the file
    `path`: fsync it, rename it over `path`, fsync the folder. Both must be in one folder."""
    fd = os.open(tmp, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)
    fsync_dir(Path(path).parent)


def create_private(path: str | os.PathLike[str]) -> None:
    """Create `path` empty with mode 0600 if it does not exist, and narrow it to 0600 if it does:
    for files that another library opens (SQLite databases, journals) and that hold secrets."""
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(p, os.O_WRONLY | os.O_CREAT, PRIVATE)
    try:
        os.fchmod(fd, PRIVATE)
    finally:
        os.close(fd)


def make_private_dir(path: str | os.PathLike[str]) -> Path:
    """Create folder `path` (and missing parents) with mode 0700 if it does not exist; an existing
    folder keeps its mode, which is its owner's choice. Returns the path."""
    p = Path(path)
    if not p.is_dir():
        p.mkdir(mode=PRIVATE_DIR, parents=True, exist_ok=True)
        os.chmod(p, PRIVATE_DIR)  # mkdir's mode passes through the umask
    return p
