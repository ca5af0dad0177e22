"""Which raw-fp8 DSA decode kernel a server runs, dsaops' or SGLang's, and why: one decision for
the routing patch (sglang_patches/0006, at CUDA graph capture), `dsaops kernels route` (no GPU) and
`dsaops kernels selftest` (which writes the verdict read here).

The evidence, strongest first:
1. DSAOPS_DECODE=sglang (or DSAOPS_FORCE_SGLANG_DECODE=1, its older spelling): SGLang's kernel.
2. Where dsaops has no kernel: HIP, a GPU the targets table does not name, a geometry the kernel
   does not take (geometry_supported): SGLang's kernel, whatever else says.
3. A selftest verdict for this GPU, this kernel build (kernel_hash) and this head count: its
   decision. A verdict whose correctness check failed keeps SGLang's kernel even under
   DSAOPS_DECODE=dsaops.
4. DSAOPS_DECODE=dsaops: dsaops for every batch size.
5. The targets table (dsaops_decode, decode_evidence): "default" runs dsaops where decode_preferred
   measured it at least as fast (a batch threshold); "selftest" waits for a verdict; "never" has no
   kernels.

Stdlib only at import (torch is imported by `for_server`, which runs inside SGLang).
"""
from __future__ import annotations

import ast
import hashlib
import itertools
import os
from dataclasses import dataclass, replace
from pathlib import Path

from dsaops.kernels import tiles

from dsaops import plan_input
from dsaops.cache import cache_dir

HEADS_MOST = 1024  # q heads a rank, as the CLI takes them: 8 x DeepSeek-V3.2's 128, the most of any DSA model
KERNEL_FP8 = "float8_e4m3fn"  # the only pool dtype dsaops' decode is built for (no e4m3fnuz: no HIP kernels)
VERDICT_FILE = "decode-verdict.json"
LINE_PREFIX = "DSA decode kernel: "
SETTING = "DSAOPS_DECODE"
SETTING_ALIAS = "DSAOPS_FORCE_SGLANG_DECODE"
CHOICES = ("auto", "dsaops", "sglang")
# the `reason` label of the log line and of dsa_decode_kernel_info (a bounded set)
REASONS = ("setting", "bad_setting", "no_hip_kernels", "unknown_gpu", "unsupported_geometry", "measured",
           "not_measured", "selftest_passed", "selftest_slower", "selftest_incorrect", "not_installed")
_NOT_KERNEL = {"route"}  # decode.py asks this module about geometry: the routing, not the kernel


class BadSetting(ValueError):
    """DSAOPS_DECODE holds a value other than auto, dsaops or sglang."""


@dataclass(frozen=True)
class Decision:
    kernel: str          # "dsaops" or "sglang"
    reason: str          # one of REASONS
    detail: str          # the evidence, in words
    min_batch: int = 1   # with kernel "dsaops": the smallest batch it runs; smaller ones keep SGLang's
    target: str = ""
    heads: int | None = None

    def runs_dsaops(self, batch: int) -> bool:
        return self.kernel == "dsaops" and batch >= self.min_batch

    @property
    def batches(self) -> str:
        if self.kernel == "dsaops" and self.min_batch > 1:
            return f"dsaops for batch sizes >= {self.min_batch}, sglang below"
        return f"{self.kernel} for every batch size"

    @property
    def line(self) -> str:
        """The one startup log line (healthchecks/decode_kernel.py parses it back)."""
        where = " ".join(f"{k}={v}" for k, v in (("target", self.target), ("heads", self.heads)) if v)
        return f"{LINE_PREFIX}{self.batches}; reason={self.reason}: {self.detail}" + (f"; {where}" if where else "")


def geometry_unsupported(num_heads: int, d_qk: int, d_v: int, topk: int, kv_dtype) -> list[str]:
    """What keeps sparse_mla_decode_fp8 from this geometry, one phrase each with what it takes (empty:
    supported): d_v 512, d_tail 0 or 64, a raw e4m3fn pool, 1 to tiles.MAX_TOPK rows a query."""
    kv_name = str(kv_dtype).removeprefix("torch.")
    checks = ((num_heads >= 1, f"heads {num_heads} (at least 1)"),
              (d_v == tiles.D_V, f"d_v {d_v} ({tiles.D_V})"),
              (d_qk - d_v in tiles.D_TAILS,
               f"d_tail = d_qk - d_v = {d_qk - d_v} ({' or '.join(map(str, tiles.D_TAILS))})"),
              (1 <= topk <= tiles.MAX_TOPK, f"top-k {topk} (1 to {tiles.MAX_TOPK})"),
              (kv_name == KERNEL_FP8, f"kv dtype {kv_name} (a raw {KERNEL_FP8} pool; e4m3fnuz has no HIP kernels)"))
    return [why for ok, why in checks if not ok]


def geometry_supported(num_heads: int, d_qk: int, d_v: int, topk: int, kv_dtype) -> bool:
    """Whether sparse_mla_decode_fp8 takes this geometry (decode.decode_supported is this)."""
    return not geometry_unsupported(num_heads, d_qk, d_v, topk, kv_dtype)


def kernel_sources(package: Path | None = None) -> list[Path]:
    """The decode's sources in the installed package (in an image: as built into it): decode.py, every
    dsaops.kernels module it imports, transitively, and the CUDA headers (*.cuh) they include."""
    package = package or Path(__file__).parent
    todo, seen = ["decode"], set()
    while todo:
        name = todo.pop()
        path = package / f"{name}.py"
        if name in seen or name in _NOT_KERNEL or not path.is_file():
            continue
        seen.add(name)
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module == "dsaops.kernels":
                todo += [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("dsaops.kernels."):
                todo.append(node.module.split(".")[2])
    if not seen:
        raise FileNotFoundError(f"no decode.py under {package}")
    return sorted([package / f"{name}.py" for name in seen] + list(package.glob("*.cuh")), key=lambda f: f.name)


def kernel_hash(package: Path | None = None) -> str:
    """sha256 of kernel_sources (names and bytes): a verdict holds for the kernels it measured only; a
    patch-series hash would miss a kernel change."""
    files = kernel_sources(package)
    h = hashlib.sha256()
    for f in files:
        h.update(f.name.encode() + b"\0" + f.read_bytes() + b"\0")
    return h.hexdigest()


def verdict_path() -> Path:
    """decode-verdict.json in the dsaops cache folder (in the image: the node's, mounted)."""
    return cache_dir(VERDICT_FILE)


def setting(env=None) -> str:
    """auto, dsaops or sglang from DSAOPS_DECODE, with DSAOPS_FORCE_SGLANG_DECODE=1 as sglang."""
    env = os.environ if env is None else env
    value = env.get(SETTING, "").strip().lower() or "auto"
    if value not in CHOICES:
        raise BadSetting(f"{SETTING}={env.get(SETTING)!r}: set it to auto, dsaops or sglang (or unset it)")
    if env.get(SETTING_ALIAS) == "1" and value == "auto":
        return "sglang"
    return value


def preferred_min_batch(heads: int) -> int:
    """The smallest batch decode_preferred runs dsaops for (its H200 measurements)."""
    from dsaops.kernels.decode import decode_preferred

    return next(s for s in itertools.count(1) if decode_preferred(s, heads))


def verdict_decision(correct: bool, speedups: dict[int, float]) -> dict:
    """What a selftest's measurements decide: SGLang's kernel if dsaops was incorrect or slower at
    the largest batch; else dsaops from the smallest batch size from which every larger one measured
    at least as fast (speedup = SGLang's time / dsaops')."""
    if not correct:
        return {"kernel": "sglang", "min_batch": None, "reason": "selftest_incorrect"}
    min_batch = None
    for batch in sorted(speedups, reverse=True):
        if speedups[batch] < 1.0:
            break
        min_batch = batch
    if min_batch is None:
        return {"kernel": "sglang", "min_batch": None, "reason": "selftest_slower"}
    return {"kernel": "dsaops", "min_batch": min_batch, "reason": "selftest_passed"}


_VERDICT_KEYS = {"gpu": dict, "target": str, "kernels": str, "heads": int, "batch_sizes": list, "correct": bool,
                 "speedup": dict, "decision": dict}


def read_verdict(path: Path) -> dict:
    """A selftest verdict, checked for the fields routing reads; ValueError says what is wrong."""
    verdict = plan_input.read_json(path, "selftest verdict", fix="run `dsaops kernels selftest` again", error=ValueError)
    bad = [k for k, kind in _VERDICT_KEYS.items() if not isinstance(verdict.get(k), kind)]
    decision = verdict.get("decision") if isinstance(verdict.get("decision"), dict) else {}
    if decision.get("kernel") not in ("dsaops", "sglang") or decision.get("reason") not in REASONS:
        bad.append("decision")
    elif decision["kernel"] == "dsaops" and not (isinstance(decision.get("min_batch"), int)
                                                and decision["min_batch"] >= 1):
        bad.append("decision.min_batch")
    if bad:
        raise ValueError(f"{path}: missing or malformed {', '.join(dict.fromkeys(bad))}; run `dsaops kernels selftest` "
                         "again")
    return verdict


def verdict_mismatch(verdict: dict, target: str, heads: int | None, gpu: dict | None, kernels: str) -> str:
    """Why a verdict does not hold for this target, head count, GPU ({name, compute_capability}; None:
    not known, as without a GPU) and kernel build ('' when it does)."""
    if verdict["target"] != target:
        return f"it was measured on {verdict['target']}"
    if verdict["kernels"] != kernels:
        return "it measured another build of the kernels"
    if heads is not None and verdict["heads"] != heads:
        return f"it measured {verdict['heads']} heads, this server runs {heads}"
    if gpu is not None and (verdict["gpu"].get("name"), verdict["gpu"].get("compute_capability")) != (
            gpu.get("name"), gpu.get("compute_capability")):
        return f"it was measured on a {verdict['gpu'].get('name')}"
    return ""


def decide(target, heads: int | None = None, *, env=None, verdict: dict | None = None, gpu: dict | None = None,
           geometry_ok: bool = True, kernels: str | None = None, hip: bool = False, gpu_label: str = "") -> Decision:
    """The decision for a server of `heads` heads a rank on `target` (a dsaops.targets.Target, or None
    for a GPU the table does not name: gpu_label says which). `verdict`: a read_verdict() result or
    None; `gpu`: {name, compute_capability} of this GPU when known (a verdict must match it);
    `kernels`: kernel_hash() (computed when None); raises BadSetting for a bad DSAOPS_DECODE."""
    choice = setting(env)
    name = target.name if target is not None else ""

    def made(kernel, reason, detail, min_batch=1):
        return Decision(kernel, reason, detail, min_batch, name, heads)

    if choice == "sglang":
        env = os.environ if env is None else env
        said = f"{SETTING}=sglang" if env.get(SETTING, "").strip() else f"{SETTING_ALIAS}=1"
        return made("sglang", "setting", said)
    if hip or (target is not None and target.dsaops_decode == "never"):
        return made("sglang", "no_hip_kernels", target.decode_evidence if target is not None else
                    f"no HIP kernels for {gpu_label or 'this GPU'}; SGLang's own HIP decode serves")
    if target is None:
        return made("sglang", "unknown_gpu", f"no dsaops target for {gpu_label or 'this GPU'} (`dsaops targets`)")
    if not geometry_ok:
        return made("sglang", "unsupported_geometry", "dsaops' decode does not take this geometry")
    note = ""
    if verdict is not None:
        why_not = verdict_mismatch(verdict, name, heads, gpu, kernels or kernel_hash())
        if not why_not:
            decision = verdict["decision"]
            said = (f"selftest on {verdict['gpu'].get('name', 'this GPU')}, {verdict['heads']} heads: "
                    + {"selftest_incorrect": "dsaops' output was wrong",
                       "selftest_slower": "dsaops was slower at every measured batch size",
                       "selftest_passed": f"dsaops correct and at least as fast from batch {decision.get('min_batch')}"
                       }.get(decision["reason"], decision["reason"]))
            if decision["reason"] == "selftest_incorrect" or choice != "dsaops":
                return made(decision["kernel"], decision["reason"], said, decision.get("min_batch") or 1)
        else:
            note = f" (the selftest verdict does not hold: {why_not})"
    if choice == "dsaops":
        return made("dsaops", "setting", f"{SETTING}=dsaops" + note)
    if target.dsaops_decode == "default":
        return made("dsaops", "measured", target.decode_evidence + note, preferred_min_batch(heads or 1))
    return made("sglang", "not_measured", target.decode_evidence + note)  # "selftest": no verdict holds yet


def load_verdict_quietly(path: Path) -> tuple[dict | None, str]:
    """(verdict or None, why it was not read) for the server, which must start whatever the file holds."""
    if not path.is_file():
        return None, ""
    try:
        return read_verdict(path), ""
    except ValueError as e:
        return None, str(e)


def gpu_identity(props, hip: bool) -> dict:
    """{name, compute_capability} of a torch device's properties (gcnArchName on ROCm)."""
    cc = props.gcnArchName.split(":")[0] if hip else f"{props.major}.{props.minor}"
    return {"name": props.name, "compute_capability": cc}


def current_gpu() -> tuple:
    """(torch's device properties, whether it is ROCm, gpu_identity, dsaops target or None) of torch's
    current GPU."""
    import torch

    from dsaops import targets

    hip = bool(torch.version.hip)
    props = torch.cuda.get_device_properties(torch.cuda.current_device())
    return props, hip, gpu_identity(props, hip), targets.for_gpu(props, hip)


def for_server(num_heads: int, d_qk: int, d_v: int, topk: int, kv_dtype) -> Decision:
    """The decision inside SGLang, on its current GPU, for one decode geometry (patch 0006). A bad
    DSAOPS_DECODE or an unreadable verdict keeps SGLang's kernel and says so: the server starts."""
    _, hip, gpu, target = current_gpu()
    verdict, unread = load_verdict_quietly(verdict_path())
    try:
        decision = decide(target, num_heads, verdict=verdict, gpu=gpu, hip=hip,
                          geometry_ok=geometry_supported(num_heads, d_qk, d_v, topk, kv_dtype),
                          gpu_label=f"{gpu['name']} ({gpu['compute_capability']})")
    except BadSetting as e:
        decision = Decision("sglang", "bad_setting", str(e), 1, target.name if target else "", num_heads)
    if unread:
        decision = replace(decision, detail=f"{decision.detail} (verdict ignored: {unread})")
    return decision
