"""`dsaops kernels compile|supports|route|selftest`: build every decode kernel the dispatch can choose
for a target, with no GPU, and report each one's shared memory against the target's budget (and with
--ptxas, its registers, spills and whether ptxas serialized its wgmma instructions: kernels/ptxas.py);
say which decode kernel a server runs and why (kernels/route.py); check and time it on the serving
GPU (kernels/selftest.py).

The build itself is kernels/build.py; this module parses arguments and prints the table.
Top-level imports stay stdlib-only (`dsaops --help` must not load torch or TileLang).
"""
from __future__ import annotations

import os
import sys
from pathlib import Path

from dsaops.kernels import route, selftest
from dsaops.kernels.build import build

from dsaops import pins
from dsaops.cli_args import can_write_in, whole_up_to
from dsaops.errors import UserError
from dsaops.plan_input import INT_MOST

JOBS_MOST = 256   # compiler processes: more than any host has cores


def add_parser(sub) -> None:
    p = sub.add_parser("kernels", help="compile the TileLang decode kernels for a target; query support")
    ksub = p.add_subparsers(dest="kernels_command", metavar="ACTION", required=True)
    c = ksub.add_parser("compile", help="compile every decode configuration the dispatch can choose (no GPU needed)")
    c.add_argument("--target", required=True, help="a name from `dsaops targets` (sm_90, sm_121)")
    c.add_argument("--cache-dir", help="TILELANG_CACHE_DIR for the compiled kernels "
                                       "(default $DSAOPS_CACHE/tilelang)")
    c.add_argument("--jobs", type=whole_up_to(JOBS_MOST), default=None,
                   help=f"parallel compiler processes, 1 to {JOBS_MOST} (default: CPU count)")
    c.add_argument("--ptxas", action="store_true",
                   help="also report registers, spills and serialized wgmma (one more nvcc run a kernel)")
    c.add_argument("--skip-unsupported", action="store_true",
                   help="on a target without dsaops kernels (ROCm), say so in one line and exit 0 (the image build)")
    c.set_defaults(func=run_compile)
    s = ksub.add_parser("supports", help="exit 0 if sparse_mla_decode_fp8 handles this geometry, else 1",
                        description="Say whether dsaops' fp8 decode kernel (sparse_mla_decode_fp8) handles a "
                                    "geometry: exit 0 and 'supported', or exit 1 and 'not supported:' with each "
                                    "value it cannot take and the values it can.")
    s.add_argument("--heads", type=whole_up_to(route.HEADS_MOST), required=True,
                   help=f"q heads a rank runs, 1 to {route.HEADS_MOST}")
    s.add_argument("--d-qk", type=whole_up_to(INT_MOST), required=True, help="q/kv row width: d_v + d_tail")
    s.add_argument("--d-v", type=whole_up_to(INT_MOST), default=512, help="value width (default 512)")
    s.add_argument("--topk", type=whole_up_to(INT_MOST), required=True, help="KV rows a query attends to")
    s.add_argument("--kv-dtype", default="float8_e4m3fn", help="the KV pool's torch dtype (default float8_e4m3fn)")
    s.set_defaults(func=run_supports)
    r = ksub.add_parser("route", help="which decode kernel a server on TARGET runs, for which batch sizes, and why "
                                      "(no GPU)",
                        description="Print the line a server on TARGET logs at startup: the raw-fp8 decode kernel it "
                                    "runs (dsaops' or SGLang's), for which batch sizes, and why (targets table, selftest "
                                    "verdict, DSAOPS_DECODE). Needs no GPU.")
    r.add_argument("--target", required=True, help="a name from `dsaops targets`")
    r.add_argument("--heads", type=whole_up_to(route.HEADS_MOST), default=64,
                   help=f"q heads a rank runs, 1 to {route.HEADS_MOST} (GLM-5.3-Flash: 64 / attention-TP size)")
    r.add_argument("--selftest", type=Path, metavar="FILE",
                   help=f"a selftest verdict (default: {route.VERDICT_FILE} in the dsaops cache, where present)")
    r.set_defaults(func=run_route)
    selftest.add_parser(ksub)


def run_compile(args) -> int:
    from dsaops.kernels import tiles
    from dsaops.kernels.decode import kernel_target

    from dsaops import targets

    target = kernel_target(args.target)  # a table target, or TARGET@ARCH (sm_121@sm_90a: GB10's tiles on a Hopper)
    if target.vendor != "nvidia" and args.skip_unsupported:
        print(f"dsaops kernels: nothing compiled for {target.name}: {target.decode_evidence}")
        return 0
    if target.vendor != "nvidia":
        raise UserError(f"{args.target} is not an NVIDIA target; `dsaops kernels compile` takes "
                        f"{', '.join(n for n, t in targets.table().items() if t.vendor == 'nvidia')}")
    # checked before compiling: TileLang would fail on it only after a first round of compiles
    if args.cache_dir == "":  # not the default cache, nor the working folder that Path("") names
        raise UserError("--cache-dir is empty; give a folder you may write to or create")
    if args.cache_dir and not can_write_in(Path(args.cache_dir)):
        raise UserError(f"--cache-dir {args.cache_dir} is not a folder you may write to or create; give one that is")
    try:
        import tilelang  # noqa: F401
    except ImportError:
        raise UserError(f"TileLang is not installed: pip install -e '.[kernels]' in the dsaops checkout "
                        f"({pins.requirement('tilelang')})") from None
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
    if not args.kv_dtype.strip():  # a missing value, not a dtype the kernel lacks
        raise UserError("--kv-dtype is empty; give the KV pool's torch dtype (float8_e4m3fn for dsaops' kernel)")
    unsupported = route.geometry_unsupported(args.heads, args.d_qk, args.d_v, args.topk, args.kv_dtype)
    print(f"not supported: {'; '.join(unsupported)}" if unsupported else "supported")
    return 1 if unsupported else 0


def run_route(args) -> int:
    from dsaops import targets

    target = targets.get(args.target)
    verdict, note = None, ""
    if args.selftest:
        try:
            verdict = route.read_verdict(args.selftest)
        except ValueError as e:
            raise UserError(str(e)) from None
    else:
        verdict, unread = route.load_verdict_quietly(route.verdict_path())
        note = f" (verdict ignored: {unread})" if unread else ""
    try:
        decision = route.decide(target, args.heads, verdict=verdict)
    except route.BadSetting as e:
        raise UserError(str(e)) from None
    print(decision.line + note)
    return 0
