"""The packager's cache folder (built runtimes, fetched headers), a cross-process lock, and
filling an entry so that a failure leaves no partial entry behind."""
from __future__ import annotations

import fcntl
import os
import shutil
from contextlib import contextmanager
from pathlib import Path

from .errors import write_failure


def cache_dir() -> Path:
    """~/.cache/packager, or $PACKAGER_CACHE_DIR."""
    return Path(os.environ.get("PACKAGER_CACHE_DIR", Path.home() / ".cache" / "packager")).expanduser()


@contextmanager
def locked(path: Path):
    """Hold an exclusive lock on `path` (so parallel builds fill a cache entry only once)."""
    with filling():
        path.parent.mkdir(parents=True, exist_ok=True)
        fh = open(path, "w")
    with fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


@contextmanager
def filling(*partial: Path, folder: Path | None = None):
    """Write into the cache (or another `folder` of the packager's, like a tuning database): on
    any failure remove the `partial` files and folders (a cache entry counts only once its
    .complete marker or final name exists), and report a full or read-only disk as a UserError."""
    try:
        yield
    except BaseException as e:
        where = folder or cache_dir()
        hint = ("free space there, or point PACKAGER_CACHE_DIR at another folder" if folder is None
                else "free space there or choose another folder")
        # before the clean-up: removing the partial entry frees the space that was missing
        error = write_failure(e, where, f"to {'the packager cache ' if folder is None else ''}{where}", hint)
        for p in partial:
            if p.is_dir() and not p.is_symlink():
                shutil.rmtree(p, ignore_errors=True)
            else:
                p.unlink(missing_ok=True)
        if error is not None:
            raise error from e
        raise
