"""The SQLite store's file on disk: created private, and told apart from a replacement.

Sessions are users' conversations: the file is created 0600 before SQLite opens it
(SQLite gives its -wal and -shm the file's mode) and each directory made for it 0700,
whatever the umask. `file_state` changes when anyone rewrites or replaces the file.
"""
from __future__ import annotations

import contextlib
import os
from pathlib import Path


def file_state(path: Path) -> tuple | None:
    """(device, inode, size, mtime): changes when the file is rewritten or replaced;
    None when there is no file."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return None
    return st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns


def remove_if_same(files: dict[Path, tuple]) -> None:
    """Remove each file that is still the one (st_dev, st_ino) names."""
    for path, identity in files.items():
        state = file_state(path)
        if state is not None and state[:2] == identity:
            path.unlink(missing_ok=True)


def create_private(path: Path) -> None:
    """Create the file 0600, and each missing directory above it 0700, whatever the
    umask; a file or directory that already exists keeps its mode."""
    missing = [d for d in (path.parent, *path.parent.parents) if not d.exists()]
    for directory in reversed(missing):
        with contextlib.suppress(FileExistsError):
            directory.mkdir(mode=0o700)
            os.chmod(directory, 0o700)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        return
    try:
        os.fchmod(fd, 0o600)
    finally:
        os.close(fd)
