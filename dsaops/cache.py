"""The one folder for what later runs may reuse (wheels, a debootstrapped base, compiled kernels).

$DSAOPS_CACHE, else ${XDG_CACHE_HOME:-~/.cache}/dsaops. Nothing requires it to be warm:
a fresh machine fills it.
"""
import fcntl
import os
from pathlib import Path


def cache_dir(*parts: str) -> Path:
    root = os.environ.get("DSAOPS_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "dsaops")
    return Path(root, *parts)


def locked(*parts: str):
    """The cache file `parts` (made with its folder if missing), open and flock'ed until the caller's
    `with` ends: one process at a time fills what it guards."""
    path = cache_dir(*parts)
    path.parent.mkdir(parents=True, exist_ok=True)
    lock = open(path, "w")  # noqa: SIM115 (held until the caller's `with` ends)
    fcntl.flock(lock, fcntl.LOCK_EX)
    return lock
