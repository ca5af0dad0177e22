"""`dsaops kernels compile|supports`: build every decode kernel the dispatch can choose for a target,
with no GPU, and report each one's shared memory against the target's budget (and with --ptxas,
its registers, spills and whether ptxas serialized its wgmma instructions: kernels/ptxas.py).

Compiling for sm_121a succeeds even when a kernel could never launch there (it asks for more
shared memory than GB10 has), so the budget check reads the compiler's figure, not an estimate.
Top-level imports stay stdlib-only (`dsaops --help` must not load torch or TileLang).
"""
from __future__ import annotations

import os
import re
import sys
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass

from dsaops import pins
from dsaops.errors import UserError

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
    from dsaops.kernels.decode import compile_kernel
    from dsaops.kernels.tiles import Combine

    from dsaops import targets

    target = targets.get(target_name)
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


def build(target_name: str, jobs: list[tuple] | None = None, cache_dir: str | None = None,
          workers: int | None = None, ptxas: bool = False, row_scaled: bool = False) -> list[Built]:
    """Compile (tile, d_tail) kernels for a target in parallel processes; default: every one the
    dispatch can choose, plus the split merges. Returns one Built per kernel; with `ptxas`, each
    carries ptxas's report (one more nvcc run a kernel); with `row_scaled`, the decode kernels are
    the row-scaled layout's."""
    from dsaops.kernels import tiles

    from dsaops import targets

    target = targets.get(target_name)
    if target.vendor != "nvidia":
        raise ValueError(f"{target_name}: kernels are compiled for NVIDIA targets only "
                         f"(gfx942 gets HIP source through `tilelang.lower`; see kernels/README.md)")
    if jobs is None:
        jobs = (sorted({(tile, dt) for _, dt, tile in tiles.configurations(target)}, key=str)
                + [(c, None) for c in tiles.COMBINES])
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


def add_parser(sub) -> None:
    p = sub.add_parser("kernels", help="compile the TileLang decode kernels for a target; query support")
    ksub = p.add_subparsers(dest="kernels_command", metavar="ACTION", required=True)
    c = ksub.add_parser("compile", help="compile every decode configuration the dispatch can choose (no GPU needed)")
    c.add_argument("--target", required=True, help="a name from `dsaops targets` (sm_90, sm_121)")
    c.add_argument("--cache-dir", help="TILELANG_CACHE_DIR for the compiled kernels "
                                       "(default $DSAOPS_CACHE/tilelang)")
    c.add_argument("--jobs", type=int, default=None, help="parallel compiler processes (default: CPU count)")
    c.add_argument("--ptxas", action="store_true",
                   help="also report registers, spills and serialized wgmma (one more nvcc run a kernel)")
    c.set_defaults(func=run_compile)
    s = ksub.add_parser("supports", help="exit 0 if sparse_mla_decode_fp8 handles this geometry, else 1")
    s.add_argument("--heads", type=int, required=True)
    s.add_argument("--d-qk", type=int, required=True, help="q/kv row width: d_v + d_tail")
    s.add_argument("--d-v", type=int, default=512)
    s.add_argument("--topk", type=int, required=True)
    s.add_argument("--kv-dtype", default="float8_e4m3fn")
    s.set_defaults(func=run_supports)


def run_compile(args) -> int:
    from dsaops.kernels import tiles

    from dsaops import targets

    target = targets.get(args.target)
    if target.vendor != "nvidia":
        raise UserError(f"{args.target} is not an NVIDIA target; `dsaops kernels compile` takes "
                        f"{', '.join(n for n, t in targets.table().items() if t.vendor == 'nvidia')}")
    try:
        import tilelang  # noqa: F401
    except ImportError:
        raise UserError(f"TileLang is not installed: pip install 'dsaops[kernels]' ({pins.requirement('tilelang')})") from None
    if args.jobs is not None and args.jobs < 1:
        raise UserError(f"--jobs must be >= 1, got {args.jobs}")
    cache_dir = os.path.abspath(args.cache_dir) if args.cache_dir else None
    built = {(b.tile, b.d_tail): b for b in build(args.target, cache_dir=cache_dir, workers=args.jobs,
                                                   ptxas=args.ptxas)}
    print(f"{'heads':>5} {'d_tail':>6}  {'tile':<18} {'shared memory':>14} {'budget':>8}  fits"
          + ("  registers  spills  wgmma" if args.ptxas else ""))
    rows = [(str(heads), str(d_tail), tile.name, built[(tile, d_tail)]) for heads, d_tail, tile in tiles.configurations(target)]
    rows += [("any", "-", c.name, built[(c, None)]) for c in tiles.COMBINES]
    for heads, d_tail, name, b in rows:
        line = f"{heads:>5} {d_tail:>6}  {name:<18} {b.smem_bytes:>14,} {b.budget:>8,}  {'yes' if b.fits else 'NO':<4}"
        if b.ptxas:
            wgmma = ("SERIALIZED" if b.ptxas.wgmma_serialized else "async") if b.uses_wgmma else "-"
            line += f"  {b.ptxas.registers:>9} {b.ptxas.spill_bytes:>7}  {wgmma}"
        print(line.rstrip())
    over = [b for b in built.values() if not b.fits]
    if over:
        print(f"{len(over)} kernel(s) exceed {args.target}'s shared memory: {', '.join(b.kernel for b in over)}",
              file=sys.stderr)
    serialized = [b for b in built.values() if b.ptxas and b.ptxas.wgmma_serialized]
    if serialized:
        print(f"ptxas serialized the wgmma of {', '.join(b.kernel for b in serialized)}: an accumulator is read "
              f"while a product into it may be in flight (kernels/ptxas.py)", file=sys.stderr)
    return 1 if over or serialized else 0


def run_supports(args) -> int:
    from dsaops.kernels.decode import decode_supported

    ok = decode_supported(args.heads, args.d_qk, args.d_v, args.topk, args.kv_dtype)
    print("supported" if ok else "not supported")
    return 0 if ok else 1
