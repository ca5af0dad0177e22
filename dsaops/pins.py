"""The pinned versions (pins.toml beside this file): SGLang, TileLang, sgl-flash-mla.

`python -m dsaops.pins NAME` prints one version, with `--requirement` as `NAME==VERSION`
(for pip, make and shell scripts); without NAME, all of them as one JSON object. Stdlib only.
"""
from __future__ import annotations

import argparse
import json
import tomllib
from pathlib import Path

TABLE = Path(__file__).with_name("pins.toml")
PINS: dict[str, str] = tomllib.loads(TABLE.read_text())

SGLANG = PINS["sglang"]
TILELANG = PINS["tilelang"]
FLASH_MLA = PINS["sgl-flash-mla"]


def requirement(name: str) -> str:
    """`name==version` for pip."""
    return f"{name}=={PINS[name]}"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m dsaops.pins", description=__doc__.splitlines()[0])
    p.add_argument("name", nargs="?", choices=sorted(PINS), help="one pin only")
    p.add_argument("--requirement", action="store_true", help="print NAME==VERSION")
    args = p.parse_args(argv)
    if not args.name:
        print(json.dumps(PINS, indent=2))
    else:
        print(requirement(args.name) if args.requirement else PINS[args.name])
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
