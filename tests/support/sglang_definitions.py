"""Run definitions out of the pinned (or a patched) SGLang source without importing its modules.

Importing SGLang modules on CPU costs ~30-55 packages each; the logic under test (validators,
sizing formulas, routing) is plain Python. A test compiles just the definitions it needs from
the real file and supplies the names they use; anything not supplied raises NameError, so a
harness cannot silently stand in for more than it declares. A test fails when the pinned
source's definition changes or disappears.
"""
from __future__ import annotations
import __future__

import argparse
import ast
import copy
import importlib.util
import sys
import types
from functools import lru_cache
from pathlib import Path

from tests.support.sglang_cli import cli_flags
from tests.support.sglang_wheel import sglang_source


def source_file(rel: str, root: Path | None = None) -> Path:
    """<root>/sglang/<rel>; root defaults to the unpacked pinned wheel."""
    return (root or sglang_source()) / "sglang" / rel


@lru_cache(maxsize=64)
def _parse(path: str, mtime_ns: int) -> ast.Module:
    return ast.parse(Path(path).read_text(), path)


def _tree(path: Path) -> ast.Module:
    return _parse(str(path), path.stat().st_mtime_ns)


def _node(path: Path, dotted: str) -> ast.stmt:
    body, node = _tree(path).body, None
    for part in dotted.split("."):
        node = next((n for n in body if getattr(n, "name", None) == part
                     or (isinstance(n, ast.Assign) and any(getattr(t, "id", None) == part for t in n.targets))
                     or (isinstance(n, ast.AnnAssign) and getattr(n.target, "id", None) == part)),
                    None)
        if node is None:
            raise LookupError(f"{dotted} is gone from {path}")
        body = getattr(node, "body", [])
    return node


def lift(path: Path, names: list[str], namespace: dict | None = None) -> dict:
    """Compile top-level functions, classes, assignments or `Class.method` from `path` into
    `namespace` and return it. Function decorators are dropped (they register, they do not
    change the logic under test); a method is bound to the name after its dot."""
    namespace = {} if namespace is None else namespace
    # A module that exists: dataclasses and typing look classes' modules up in sys.modules.
    namespace.setdefault("__name__", __name__)
    for dotted in names:
        node = _node(path, dotted)
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            node = copy.copy(node)
            node.decorator_list = []
        module = ast.fix_missing_locations(ast.Module(body=[node], type_ignores=[]))
        # Postponed annotations, as in SGLang's modules: type names need not be supplied.
        code = compile(module, f"{path}:{dotted}", "exec", flags=__future__.annotations.compiler_flag, dont_inherit=True)
        exec(code, namespace)  # noqa: S102 - the SGLang file under test, compiled on purpose
    return namespace


def define(rel: str, qualname: str, namespace: dict, *, root: Path | None = None):
    """`qualname` from <root>/sglang/<rel>, defined in `namespace` and returned."""
    return lift(source_file(rel, root), [qualname], namespace)[qualname.rsplit(".", 1)[-1]]


def value(rel: str, name: str, namespace: dict | None = None):
    """A module-level (NAME = ...) or class-level ("Class.NAME") assignment, evaluated."""
    node = _node(source_file(rel), name)
    if not isinstance(node, ast.Assign):
        raise TypeError(f"{name} in sglang/{rel} is not an assignment")
    return eval(compile(ast.Expression(node.value), rel, "eval"), dict(namespace or {}))


def statements(path: Path, dotted: str, keep) -> list[ast.stmt]:
    """The statements of function `dotted` for which keep(stmt) is true (e.g. some Gauge assignments)."""
    return [s for s in _node(path, dotted).body if keep(s)]


def fake_modules(monkeypatch, modules: dict[str, dict]) -> None:
    """Make `from sglang.x.y import name` inside lifted code find these names."""
    for dotted, names in modules.items():
        monkeypatch.setitem(sys.modules, dotted, types.SimpleNamespace(**names))


def sglang_module(rel: str, root: Path | None = None):
    """A self-contained file of the pinned wheel (its imports are stdlib or installed here), loaded as a
    module of its own."""
    spec = importlib.util.spec_from_file_location(f"pinned_{rel.replace('/', '_')[:-3]}", source_file(rel, root))
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module        # dataclasses look their class's module up there
    spec.loader.exec_module(module)
    return module


def parse_server_args(argv: list[str], flags=("--model-path", "--api-key", "--admin-api-key", "--port")):
    """SGLang's prepare_server_args up to argparse: a --config file merged by SGLang's own merger
    (srt/utils/server_args_config_parser.py) into an argparse parser holding `flags`, each checked to be a
    flag of the pinned SGLang. Returns (parsed namespace, the merged argument list)."""
    known = cli_flags()
    parser = argparse.ArgumentParser(prog="sglang serve")
    for flag in flags:
        assert flag in known, f"{flag} is not a flag of the pinned SGLang"
        parser.add_argument(flag)
    parser.add_argument("--config")
    merger = sglang_module("srt/utils/server_args_config_parser.py").ConfigArgumentMerger(parser)
    merged = merger.merge_config_with_args(argv)
    return parser.parse_args(merged), merged
