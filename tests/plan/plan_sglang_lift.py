"""Lift single functions and classes out of the pinned SGLang source with `ast`.

Importing SGLang on a CPU machine pulls in dozens of packages; the sizing formulas are
plain arithmetic. Each test compiles just the definition it needs from the unpacked
sglang==0.5.23 wheel, supplies the names it reads, and runs it, so a test fails when
the pinned source's formula changes.
"""
import __future__

import ast
import sys
import types
from functools import cache
from pathlib import Path

from sglang_wheel import sglang_source


@cache
def _tree(rel: str, root: Path | None = None) -> ast.Module:
    return ast.parse(((root or sglang_source()) / "sglang" / rel).read_text())


def _find(body, names):
    for node in body:
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)) and node.name == names[0]:
            return node if len(names) == 1 else _find(node.body, names[1:])
    raise LookupError(f"{'.'.join(names)} is gone from the pinned source")


def lift(rel: str, qualname: str, namespace: dict, *, root: Path | None = None):
    """Define `qualname` ("func", "Class" or "Class.method") from <root>/sglang/<rel> (root: the
    pinned wheel, or a patched copy of it) in `namespace` and return it. Methods come out as
    plain functions (decorators dropped); classes keep theirs."""
    node = _find(_tree(rel, root).body, qualname.split("."))
    if isinstance(node, ast.FunctionDef):
        node = ast.FunctionDef(**{**{f: getattr(node, f) for f in node._fields}, "decorator_list": []})
    module = ast.fix_missing_locations(ast.Module(body=[node], type_ignores=[]))
    # Annotations stay strings: they name types the test does not supply.
    code = compile(module, f"<sglang/{rel}:{qualname}>", "exec", flags=__future__.annotations.compiler_flag)
    exec(code, namespace)  # noqa: S102 - the pinned SGLang source, compiled on purpose
    return namespace[node.name]


def value(rel: str, name: str, namespace: dict | None = None):
    """A module-level (NAME = ...) or class-level ("Class.NAME") assignment, evaluated."""
    *owner, attr = name.split(".")
    body = _find(_tree(rel).body, owner).body if owner else _tree(rel).body
    for node in body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == attr for t in node.targets):
            return eval(compile(ast.Expression(node.value), rel, "eval"), dict(namespace or {}))
    raise LookupError(f"{name} is gone from sglang/{rel}")


def fake_modules(monkeypatch, modules: dict[str, dict]) -> None:
    """Make `from sglang.x.y import name` inside lifted code find these names."""
    for dotted, names in modules.items():
        monkeypatch.setitem(sys.modules, dotted, types.SimpleNamespace(**names))
