"""Run a function out of a (patched) SGLang source file without importing its module.

Importing the patched SGLang modules on CPU costs ~30-55 packages (and a torchvision
stub) per module, more than this area's CI budget; the patched logic is plain Python,
so the tests compile the real function definitions from the patched file and run them
with the names they use supplied explicitly. Anything a test does not supply raises
NameError, so a harness cannot silently stand in for more than it declares.
"""
from __future__ import annotations
import __future__

import ast
from pathlib import Path


def _node(tree: ast.Module, dotted: str, path: Path) -> ast.stmt:
    body, node = tree.body, None
    for part in dotted.split("."):
        node = next((n for n in body if getattr(n, "name", None) == part
                     or (isinstance(n, ast.Assign) and any(getattr(t, "id", None) == part for t in n.targets))),
                    None)
        if node is None:
            raise LookupError(f"{dotted} not found in {path}")
        body = getattr(node, "body", [])
    return node


def lift(path: Path, names: list[str], namespace: dict | None = None) -> dict:
    """Compile top-level functions/assignments or `Class.method` from `path` into `namespace`.

    Decorators are dropped (they register, they do not change the logic under test);
    a method is bound to the name after its dot.
    """
    namespace = {} if namespace is None else namespace
    namespace.setdefault("__name__", "lifted")
    tree = ast.parse(path.read_text(), str(path))
    for dotted in names:
        node = _node(tree, dotted, path)
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            node.decorator_list = []
        module = ast.Module(body=[node], type_ignores=[])
        # Postponed annotations, as in SGLang's modules: type names need not be supplied.
        code = compile(module, str(path), "exec", flags=__future__.annotations.compiler_flag, dont_inherit=True)
        exec(code, namespace)  # noqa: S102 - the file under test
    return namespace


def statements(path: Path, dotted: str, keep) -> list[ast.stmt]:
    """The statements of function `dotted` for which keep(stmt) is true (e.g. some Gauge assignments)."""
    return [s for s in _node(ast.parse(path.read_text(), str(path)), dotted, path).body if keep(s)]
