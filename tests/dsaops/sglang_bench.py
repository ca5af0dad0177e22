"""The pinned wheel's load generator, importable without the engine.

`sglang.benchmark.serving` runs on aiohttp, numpy and a tokenizer, but its package path imports
SGLang's whole engine (`sglang/__init__.py`, `sglang.srt.utils`: torch, CUDA kernels): about
6 GB of packages, and torch 2.14.1 where the test environment keeps its own. This lays out the
wheel's real `benchmark/` package and `srt/utils/network.py` under empty package markers, with
the one constant it takes from `srt/disaggregation/utils.py` lifted from the wheel. In the
serving image the same module runs from SGLang's full install.
"""
from __future__ import annotations

import shutil
from pathlib import Path

from tests.support.sglang_definitions import lift, source_file
from tests.support.sglang_wheel import sglang_source


def lay_out(dest: Path) -> Path:
    """dest/sglang/...; returns dest, for PYTHONPATH."""
    wheel = sglang_source() / "sglang"
    pkg = dest / "sglang"
    shutil.copytree(wheel / "benchmark", pkg / "benchmark")
    for marker in ("__init__.py", "srt/__init__.py", "srt/utils/__init__.py", "srt/disaggregation/__init__.py"):
        (pkg / marker).parent.mkdir(parents=True, exist_ok=True)
        (pkg / marker).touch()
    shutil.copy(wheel / "srt/utils/network.py", pkg / "srt/utils/network.py")
    host = lift(source_file("srt/disaggregation/utils.py"), ["FAKE_BOOTSTRAP_HOST"])["FAKE_BOOTSTRAP_HOST"]
    (pkg / "srt/disaggregation/utils.py").write_text(f"FAKE_BOOTSTRAP_HOST = {host!r}\n")
    return dest
