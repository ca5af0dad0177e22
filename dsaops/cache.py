"""The one folder for what later runs may reuse (wheels, a debootstrapped base, compiled kernels).

$DSAOPS_CACHE, else ${XDG_CACHE_HOME:-~/.cache}/dsaops. Nothing requires it to be warm:
a fresh machine fills it.
"""
import os
from pathlib import Path


def cache_dir(*parts: str) -> Path:
    root = os.environ.get("DSAOPS_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "dsaops")
    return Path(root, *parts)
