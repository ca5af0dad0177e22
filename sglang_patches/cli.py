"""`dsaops patches list|check|apply|revert|status [--sglang-root DIR] [--series FILE]`.

Exit codes: 0 done (or nothing to do); 1 `status` found a foreign or interrupted tree;
2 bad input, a wrong SGLang version, a patch that does not apply exactly, a foreign
tree, a file that cannot be written, or another apply/revert running (nothing changed).
"""
from __future__ import annotations

import importlib.util
from pathlib import Path

from dsaops import pins
from dsaops.errors import UserError


def add_parser(sub) -> None:
    p = sub.add_parser("patches", help=f"the SGLang {pins.SGLANG} patch series: list, check, apply, revert, status",
                       description=__doc__.splitlines()[0])
    p.set_defaults(func=lambda args: p.print_help() or 2)
    actions = p.add_subparsers(dest="action", metavar="ACTION")
    for action, text in (
        ("list", "print the series: each patch, its subject and the files it touches"),
        ("check", "the SGLang version equals the pin and every patch applies exactly; changes nothing"),
        ("apply", "apply the whole series (all or nothing) and write the marker"),
        ("revert", "restore every patched file byte for byte and remove the marker"),
        ("status", "say pristine, applied (series hash), interrupted or foreign"),
    ):
        a = actions.add_parser(action, help=text, description=text)
        a.add_argument("--series", type=Path, help="series file (default: the one shipped with dsaops)")
        if action != "list":
            a.add_argument("--sglang-root", type=Path, metavar="DIR",
                           help="folder that holds the sglang/ package (default: where `import sglang` resolves)")
        a.set_defaults(func=run)


def default_root() -> Path:
    # find_spec locates the package without running sglang/__init__.py (which imports torch and more).
    spec = importlib.util.find_spec("sglang")
    if spec is None or not spec.submodule_search_locations:
        raise UserError("sglang is not importable here; pass --sglang-root DIR (the folder that holds sglang/)")
    return Path(next(iter(spec.submodule_search_locations))).parent


def run(args) -> int:
    import sys

    from dsaops.sglang_patches import apply as tree
    from dsaops.sglang_patches.atomic_files import WriteError
    from dsaops.sglang_patches.series import DEFAULT_SERIES, load
    from dsaops.sglang_patches.unidiff import PatchError

    try:
        series = load(args.series or DEFAULT_SERIES)
        if args.action == "list":
            print(f"series {series.path} (sha256 {series.sha256}), for sglang=={pins.SGLANG}, strip level 1")
            for patch in series.patches:
                print(f"{patch.name}: {patch.subject}")
                for fp in patch.files:
                    print(f"    {fp.path} ({len(fp.hunks)} hunks)")
            return 0
        root = args.sglang_root or default_root()
        if args.action == "status":
            tree.check_version(root)
            st = tree.state(root, series)
            print(f"{st.kind}: {st.detail}")
            return 0 if st.kind in ("pristine", "applied") else 1
        print(getattr(tree, args.action)(root, series))
        return 0
    except (PatchError, tree.TreeError, WriteError) as e:
        print(f"dsaops patches {args.action}: {e}", file=sys.stderr)
        return 2
    except BrokenPipeError:  # stdout's reader stopped early: dsaops' main says nothing of it
        raise
    except OSError as e:  # reading: writes come back as WriteError
        print(f"dsaops patches {args.action}: cannot read {e.filename}: {e.strerror}; nothing was changed",
              file=sys.stderr)
        return 2
