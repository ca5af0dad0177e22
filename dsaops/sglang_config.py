"""SGLang 0.5.23's launch arguments with its `--config FILE` merged in, as SGLang merges them.

SGLang (srt/server_args.py `prepare_server_args`, srt/utils/server_args_config_parser.py) reads
the YAML only when an argument is exactly `--config` (`--config=FILE` and abbreviations are parsed
and ignored), turns each key into `--KEY VALUE` and puts those before the command line, which
therefore wins. A file SGLang refuses (two `--config`, no file after it, not .yaml/.yml, missing,
unreadable, invalid, not a mapping) is left out here: SGLang says why when it starts.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Merged:
    args: list[str]          # what SGLang's argparse reads
    from_config: int = 0     # how many of them, first, come from the file
    config: str | None = None


def merged(argv: list[str]) -> Merged:
    """The arguments SGLang's argparse reads for the launch arguments argv."""
    if argv.count("--config") != 1 or argv[-1] == "--config":
        return Merged(list(argv))
    at = argv.index("--config")
    options = _options(argv[at + 1])
    if options is None:
        return Merged(list(argv))
    return Merged(options + argv[:at] + argv[at + 2:], len(options), argv[at + 1])


def unread_config(argv: list[str]) -> str | None:
    """The first argument SGLang's argparse takes for --config that its merger never reads
    (`--config=FILE`, an abbreviation such as `--conf FILE`), or None: that file's settings, API
    keys included, would silently not apply."""
    return next((arg for arg in argv if arg != "--config" and len(name := arg.partition("=")[0]) > 2
                 and "--config".startswith(name)), None)


def _options(path: str) -> list[str] | None:
    """The file's keys as SGLang's options, or None. A boolean becomes `--KEY true` or nothing: SGLang
    makes a store_true flag (--enable-dp-attention) bare or absent, any other `--KEY true|false`;
    no flag read here (host, port, parallel sizes) takes a boolean."""
    if Path(path).suffix.lower() not in (".yaml", ".yml"):
        return None
    try:
        import yaml  # SGLang's dependency: in the image, not in dsaops' own

        with open(path) as file:
            data = yaml.safe_load(file)
    except Exception:  # noqa: BLE001  whatever it is, SGLang reports it for this same file
        return None
    data = {} if data is None else data
    if not isinstance(data, dict) or not all(isinstance(key, str) for key in data):
        return None
    options = []
    for key, value in data.items():
        if isinstance(value, bool):
            options += [f"--{key}", "true"] if value else []
        elif isinstance(value, list):
            options += [f"--{key}", *map(str, value)] if value else []
        else:
            options += [f"--{key}", json.dumps(value) if isinstance(value, dict) else str(value)]
    return options
