"""The pinned versions (pins.toml beside this file): SGLang, TileLang, sgl-flash-mla, and the sha256
of each of their wheel files dsaops uses and of the other wheels the offline GPU bundle carries.

`python -m dsaops.pins NAME` prints one version, with `--requirement` as `NAME==VERSION`
(for pip, make and shell scripts); without NAME, all of them as one JSON object. `--bundle`
prints the offline GPU bundle's other packages, a `NAME==VERSION` a line.
`python -m dsaops.pins --check-wheel FILE... [--downloaded]` checks wheel files against their
pinned sha256 (check_wheel): silent when they match, else one line and exit 2. Stdlib only.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import sys
import tomllib
from pathlib import Path

from dsaops.errors import UserError

TABLE = Path(__file__).with_name("pins.toml")
PINS: dict[str, str] = tomllib.loads(TABLE.read_text())
# wheel file name -> sha256: not a version, so kept out of PINS (and out of `python -m dsaops.pins`)
SHA256: dict[str, str] = PINS.pop("sha256")
# what the offline GPU bundle (kernels/offline-bundle.sh) carries beside TileLang: name -> version
BUNDLE: dict[str, str] = PINS.pop("offline-bundle")

SGLANG = PINS["sglang"]
TILELANG = PINS["tilelang"]
FLASH_MLA = PINS["sgl-flash-mla"]


def requirement(name: str) -> str:
    """`name==version` for pip."""
    return f"{name}=={PINS[name]}"


def sha256(path: Path) -> str:
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def check_wheel(path: Path, *, downloaded: bool = False) -> Path:
    """`path`, when its sha256 is the one pins.toml lists for its file name; else a UserError saying
    what to do. `downloaded`: pip's download (the index served it), not a file the cache kept.
    Only the pinned distributions' files and the offline bundle's are listed: the caller passes no other."""
    expected = SHA256.get(path.name)
    if expected is None:
        raise UserError(f"{path.name}: dsaops/pins.toml lists no sha256 for this wheel file; add the one PyPI "
                        "lists for it (checked against the downloaded file) or use a platform it lists")
    actual = sha256(path)
    if actual != expected:
        if downloaded:
            raise UserError(f"{path.name} as downloaded has sha256 {actual}, dsaops/pins.toml pins {expected}: "
                            "the package index (PIP_INDEX_URL) served another file; use one that serves PyPI's")
        raise UserError(f"{path} has sha256 {actual}, dsaops/pins.toml pins {expected}: a damaged or replaced "
                        "file; delete it and run again to download it")
    return path


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m dsaops.pins", description=__doc__.splitlines()[0])
    p.add_argument("name", nargs="?", choices=sorted(PINS), help="one pin only")
    p.add_argument("--requirement", action="store_true", help="print NAME==VERSION")
    p.add_argument("--check-wheel", nargs="+", type=Path, metavar="FILE", help="check wheel files' sha256")
    p.add_argument("--downloaded", action="store_true", help="the files are pip's download, not the cache's")
    p.add_argument("--bundle", action="store_true", help="print the offline bundle's other packages as NAME==VERSION")
    args = p.parse_args(argv)
    if args.check_wheel:
        try:
            for path in args.check_wheel:
                check_wheel(path, downloaded=args.downloaded)
        except (UserError, OSError) as e:
            print(f"dsaops.pins: {e}", file=sys.stderr)
            return 2
    elif args.bundle:
        print("\n".join(f"{name}=={version}" for name, version in BUNDLE.items()))
    elif not args.name:
        print(json.dumps(PINS, indent=2))
    else:
        print(requirement(args.name) if args.requirement else PINS[args.name])
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
