"""Private files: everything under the data dir is readable by the service's own user only.

The data dir holds tenants' models and results, the job records and the key hashes; on a shared
host other local users must not read them. Directories are made 0700 and files 0600 explicitly
(not left to the umask), and an existing data dir created looser by an older version is tightened
when a process starts. `serve` and `worker` also set the umask to 077, so that files created by
libraries (SQLite's WAL, the kernel cache, the embedded broker's messages) are private too.
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

DIR_MODE = 0o700
FILE_MODE = 0o600


def private_dir(path: Path) -> Path:
    """Create `path` (and missing parents) as 0700; tighten it if it exists and is ours."""
    path = Path(path)
    missing = [p for p in (path, *path.parents) if not p.exists()]
    for folder in reversed(missing):  # `mkdir(parents=True)` would give the parents the umask's mode
        with contextlib.suppress(FileExistsError):
            folder.mkdir(mode=DIR_MODE)
    _tighten(path, DIR_MODE)
    return path


def private_file(path: Path) -> Path:
    """Create `path` empty as 0600 unless it exists; tighten it if it exists and is ours."""
    path = Path(path)
    with contextlib.suppress(FileExistsError):
        os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, FILE_MODE))
    _tighten(path, FILE_MODE)
    return path


def _tighten(path: Path, mode: int) -> None:
    with contextlib.suppress(OSError):  # not ours (a mounted volume): leave it to its owner
        info = path.stat()
        if info.st_uid == os.getuid() and info.st_mode & 0o777 & ~mode:
            path.chmod(mode)


def private_umask() -> None:
    """Make every file this process creates from now on private to its user (umask 077)."""
    os.umask(0o077)
