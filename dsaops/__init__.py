"""dsaops: build, deploy and watch SGLang serving of DSA models with a raw fp8 KV cache.

The project's folders are one package: `dsaops.kernels` is kernels/, `dsaops.healthchecks`
is healthchecks/, `dsaops.sglang_patches` is sglang_patches/. An installed wheel maps them
with setuptools' package-dir; in a source checkout (e.g. `PYTHONPATH=.` on a GPU machine
with nothing installed) the repository root joins this package's search path instead.
None of these names is a top-level module, so nothing clashes with PyPI's `kernels`.
"""
import os

__version__ = "0.1.0"

_root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if os.path.isfile(os.path.join(_root, "pyproject.toml")) and os.path.isdir(os.path.join(_root, "sglang_patches")):
    __path__.append(_root)
