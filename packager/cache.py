"""The packager's cache folder (built runtimes, fetched headers) and a cross-process lock."""
from __future__ import annotations

import fcntl
import os
from contextlib import contextmanager
from pathlib import Path


def cache_dir() -> Path:
    """~/.cache/packager, or $PACKAGER_CACHE_DIR."""
    return Path(os.environ.get("PACKAGER_CACHE_DIR", Path.home() / ".cache" / "packager")).expanduser()


@contextmanager
def locked(path: Path):
    """Hold an exclusive lock on `path` (so parallel builds fill a cache entry only once)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)
