"""Compile the decode kernels for a target with no GPU, and measure each one's shared memory.

`build` compiles (tile, d_tail) kernels in parallel processes and returns one `Built` each:
the compiler's own shared-memory figure (`shared_memory_bytes`, read from the generated host
and device source) against the target's budget, whether the device code uses wgmma and waits
for the previous launch (PDL), and on request ptxas's report (kernels/ptxas.py). Compiling for
sm_121a succeeds even for a kernel that could never launch there, so the budget check reads the
compiler's figure, not an estimate. Top-level imports stay stdlib-only.
"""
from __future__ import annotations

import os
import re
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass

_SMEM_ARG = re.compile(r"v_int64\) = \(\(int64_t\)(\d+)\);")
_STATIC_SHARED = re.compile(r"__shared__\s+(?:__align__\(\d+\)\s+)?([\w ]+?)\s+\w+\[(\d+)\];")
PDL_WAIT = "cudaGridDependencySynchronize"  # TileLang's device code for T.pdl_sync (programmatic dependent launch)
_TYPE_BYTES = {"signed char": 1, "char": 1, "uchar": 1, "bool": 1, "half_t": 2, "bfloat16_t": 2,
               "float": 4, "int": 4, "uint": 4, "double": 8, "uint64_t": 8}  # uint64_t: mbarriers


@dataclass(frozen=True)
class Built:
    target: str
    tile: object        # tiles.Tile, or tiles.Combine for a split merge kernel
    d_tail: int | None
    smem_bytes: int     # dynamic + static shared memory of the compiled kernel
    budget: int
    uses_wgmma: bool    # Hopper tensor-core instructions in the device code
    overlaps_launches: bool  # waits for the kernel before it in the device code (programmatic dependent launch)
    ptxas: object = None  # ptxas.PtxasReport when asked for
    row_scaled: bool = False  # the kernel for the row-scaled KV layout

    @property
    def fits(self) -> bool:
        return self.smem_bytes <= self.budget

    @property
    def kernel(self) -> str:
        from dsaops.kernels.tiles import Combine

        if isinstance(self.tile, Combine):
            return self.tile.name
        return f"decode {self.tile.name} d_tail={self.d_tail}" + (" row-scaled" if self.row_scaled else "")


def shared_memory_bytes(host_source: str, device_source: str, name: str) -> int:
    """Dynamic shared memory (the last launch argument pushed before `name`'s kernel call in the
    host source) plus the static `__shared__` arrays of the device source."""
    call = host_source.find(f"if ({name}_kernel_packed == NULL)")
    if call < 0:
        raise RuntimeError(f"no launch of {name}_kernel in the host source: TileLang's codegen changed")
    # the launch pushes a dynamic-shared-memory size only when the kernel declares `extern __shared__`
    dynamic = int(_SMEM_ARG.findall(host_source[:call])[-1]) if "extern __shared__" in device_source else 0
    static = 0
    for ctype, count in _STATIC_SHARED.findall(device_source):
        if ctype not in _TYPE_BYTES:
            raise RuntimeError(f"unknown shared array type {ctype!r} in {name}_kernel")
        static += _TYPE_BYTES[ctype] * int(count)
    return dynamic + static


def _build(job) -> tuple:
    target_name, tile, d_tail, cache_dir, with_ptxas, row_scaled = job
    if cache_dir:
        os.environ["TILELANG_CACHE_DIR"] = cache_dir
    from dsaops.kernels.decode import compile_kernel, kernel_target
    from dsaops.kernels.tiles import Combine

    target = kernel_target(target_name)
    try:
        kernel = compile_kernel(target, tile, d_tail, row_scaled=row_scaled)
    except Exception as e:  # noqa: BLE001 - TVM errors do not pickle back to the parent process
        raise RuntimeError(f"{target_name} {tile} d_tail={d_tail}: {type(e).__name__}: {e}") from None
    name = "combine" if isinstance(tile, Combine) else "decode"
    device = kernel.get_kernel_source()
    report = None
    if with_ptxas:
        from dsaops.kernels import ptxas

        report = ptxas.report(device, target.gpu_arch)
    return (tile, d_tail, shared_memory_bytes(kernel.get_host_source(), device, name), "wgmma" in device,
            PDL_WAIT in device, report)


def kernel_jobs(target, row_scaled: bool = False, merges: bool = True) -> list[tuple]:
    """(tile, d_tail) of every decode kernel the dispatch can choose on `target` (a Target), for the
    raw or the row-scaled layout, in a stable order; with `merges`, then each split merge (d_tail None)."""
    from dsaops.kernels import tiles

    jobs = sorted({(tile, dt) for _, dt, tile in tiles.configurations(target, row_scaled=row_scaled)}, key=str)
    return jobs + ([(c, None) for c in tiles.COMBINES] if merges else [])


def build(target_name: str, jobs: list[tuple] | None = None, cache_dir: str | None = None,
          workers: int | None = None, ptxas: bool = False, row_scaled: bool = False) -> list[Built]:
    """Compile (tile, d_tail) kernels for a target in parallel processes; default: every one the
    dispatch can choose, plus the split merges. Returns one Built per kernel; with `ptxas`, each
    carries ptxas's report (one more nvcc run a kernel); with `row_scaled`, the decode kernels are
    the row-scaled layout's."""
    from dsaops.kernels import tiles
    from dsaops.kernels.decode import kernel_target

    target = kernel_target(target_name)  # a table target, or TARGET@ARCH (sm_121@sm_90a: the proxy)
    if target.vendor != "nvidia":
        raise ValueError(f"{target_name}: kernels are compiled for NVIDIA targets only "
                         f"(gfx942 gets HIP source through `tilelang.lower`; see kernels/README.md)")
    if jobs is None:
        jobs = kernel_jobs(target, row_scaled=row_scaled)
    work = [(target_name, tile, dt, cache_dir, ptxas, row_scaled) for tile, dt in jobs]
    workers = workers or min(len(work), os.cpu_count() or 1)
    if workers == 1:
        done = [_build(w) for w in work]
    else:
        import multiprocessing

        with ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("spawn")) as pool:
            done = list(pool.map(_build, work))
    return [Built(target_name, tile, dt, smem, target.smem_per_block_bytes, wgmma, pdl, report,
                  row_scaled and isinstance(tile, tiles.Tile))
            for tile, dt, smem, wgmma, pdl, report in done]
