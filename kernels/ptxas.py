"""What ptxas says of a TileLang kernel's CUDA source: registers, spills, and whether it serialized
the kernel's wgmma instructions.

ptxas serializes every wgmma of a kernel (each product waits for the previous one to finish) when
anything reads an accumulator while a product into it may still be in flight (info C7514: TileLang
emits an operand fence after every asynchronous `T.wgmma_gemm`, so a product left in flight across
a loop's back edge is enough) or when the pipeline's registers do not fit (C7511: a tile near 255
registers given one more branch around its products), and nothing but ptxas's info line says so.
The check compiles the source once more with `--ptxas-options=-v` (TileLang's own compile keeps
that output to itself), so it runs where it is asked for: `dsaops kernels compile --ptxas` and the
CI tests.
"""
from __future__ import annotations

import re
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

_REGISTERS = re.compile(r"Used (\d+) registers")
_SPILLS = re.compile(r"(\d+) bytes spill stores")
_SERIALIZED = re.compile(r"\(C\d+\) Potential Performance Loss: wgmma\.mma_async instructions are serialized")


@dataclass(frozen=True)
class PtxasReport:
    registers: int
    spill_bytes: int
    wgmma_serialized: bool


def report(cuda_source: str, arch: str) -> PtxasReport:
    """Compile `cuda_source` (a TileLang kernel's device source) for `arch` (e.g. sm_90a) with the
    compiler and include paths TileLang uses, and read ptxas's verdict."""
    from tilelang.contrib import nvcc

    with tempfile.TemporaryDirectory() as tmp:
        src = Path(tmp, "kernel.cu")
        src.write_text(cuda_source)
        cmd = [nvcc.get_nvcc_compiler(), "--cubin", "-O3", f"-arch={arch}", *nvcc.default_compile_options(),
               "--ptxas-options=-v", "-o", str(Path(tmp, "kernel.cubin")), str(src)]
        done = subprocess.run(cmd, check=False, capture_output=True, text=True)
    text = done.stdout + done.stderr
    registers = _REGISTERS.findall(text)
    if done.returncode != 0 or not registers:
        raise RuntimeError(f"ptxas gave no report for {arch} (exit {done.returncode}):\n{text[-2000:]}")
    return PtxasReport(registers=max(map(int, registers)), spill_bytes=sum(map(int, _SPILLS.findall(text))),
                       wgmma_serialized=serialized(text))


def serialized(ptxas_output: str) -> bool:
    """Whether ptxas's -v output says it serialized a kernel's wgmma, for any of its reasons."""
    return _SERIALIZED.search(ptxas_output) is not None
