"""The targets table (targets.toml beside this file) and `dsaops targets`."""
from __future__ import annotations

import json
import tomllib
from dataclasses import asdict, dataclass, field
from functools import cache
from pathlib import Path

from dsaops import pins
from dsaops.errors import UserError

TABLE = Path(__file__).with_name("targets.toml")


class UnknownTarget(UserError):
    """A target name that is not in the table; the message lists the valid ones."""


@dataclass(frozen=True)
class Target:
    name: str
    description: str
    vendor: str
    platform: str
    base_image: str
    base_carries_sglang: bool
    image_python: str
    torch_cuda_arch_list: str
    gpu_arch: str
    compute_capability: str
    smem_per_block_bytes: int
    fp8_dtype: str
    unified_memory: bool
    reserved_memory_gib: float
    features: tuple[str, ...]
    dsaops_decode: str      # "default", "selftest" or "never" (dsaops.kernels.route reads it)
    decode_evidence: str    # the measurement behind dsaops_decode, said in the server's log
    chunked_prefill_size: int       # most tokens a prefill chunk takes; 0: SGLang's own choice
    # environment the server container gets on this target; out of the hash (a dict has none), which
    # the decode's kernel caches key on
    server_env: dict[str, str] = field(hash=False)
    image_uid: int                  # the serving image's user: 0 (root) or dsaops' own

    def has(self, feature: str) -> bool:
        return feature in self.features

    @property
    def tilelang_target(self) -> dict:
        """The TileLang/TVM target dict for compiling this target's kernels."""
        kind = "cuda" if self.vendor == "nvidia" else "hip"
        return {"kind": kind, "arch" if kind == "cuda" else "mcpu": self.gpu_arch}

    @property
    def warp_lanes(self) -> int:
        """Threads of a warp: 32 on NVIDIA, 64 in an AMD CDNA wavefront."""
        return 32 if self.vendor == "nvidia" else 64


@cache
def table() -> dict[str, Target]:
    raw = tomllib.loads(TABLE.read_text())
    return {name: Target(name=name, **{**row, "base_image": row["base_image"].format(sglang=pins.SGLANG),
                                       "features": tuple(row["features"])})
            for name, row in raw.items()}


def get(name: str) -> Target:
    try:
        return table()[name]
    except KeyError:
        raise UnknownTarget(f"unknown target {name!r}; valid targets: {', '.join(table())}") from None


def by_compute_capability(cc: str) -> Target | None:
    """The NVIDIA target whose compute capability nvidia-smi reports as `cc` (e.g. '9.0')."""
    return next((t for t in table().values() if t.compute_capability and t.compute_capability == cc.strip()), None)


def for_gpu(props, hip: bool) -> Target | None:
    """The target of a GPU from its torch.cuda.get_device_properties(): by gcnArchName on ROCm
    (e.g. 'gfx942:sramecc+:xnack-'), by compute capability on CUDA; None where the table has none."""
    if hip:
        return table().get(props.gcnArchName.split(":")[0])
    return by_compute_capability(f"{props.major}.{props.minor}")


def as_json() -> str:
    return json.dumps({name: asdict(t) | {"tilelang_target": t.tilelang_target} for name, t in table().items()}, indent=2)


def add_parser(sub) -> None:
    p = sub.add_parser("targets", help="print the targets table (sm_90, sm_121, gfx942)")
    p.add_argument("name", nargs="?", help="one target only")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.add_argument("--field", help="print one field of NAME (for the Makefile)")
    p.set_defaults(func=run)


def run(args) -> int:
    if args.name is not None:  # "" is an unknown target, not the whole table
        target = get(args.name)
        if args.field is not None:
            value = asdict(target).get(args.field)
            if value is None:
                raise UnknownTarget(f"target {args.name} has no field {args.field!r}; fields: {', '.join(asdict(target))}")
            print(" ".join(value) if isinstance(value, tuple) else value)
        else:
            print(json.dumps(asdict(target), indent=2) if args.json else _row(target))
        return 0
    if args.field is not None:
        raise UnknownTarget("--field needs a target name, e.g. `dsaops targets sm_121 --field platform`")
    print(as_json() if args.json else "\n".join(_row(t) for t in table().values()))
    return 0


def _row(t: Target) -> str:
    feats = ",".join(t.features) or "-"
    return (f"{t.name:<7} {t.platform:<12} {t.gpu_arch:<8} smem/block {t.smem_per_block_bytes:>6} B  "
            f"{t.fp8_dtype:<16} features {feats:<20} {t.description}\n        base {t.base_image}")
