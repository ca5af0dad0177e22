"""Selftest verdicts as `dsaops kernels selftest` writes them, for the routing tests (no GPU)."""
from __future__ import annotations

from pathlib import Path

from dsaops.kernels import route, selftest


def rows(speedups: dict[int, float], correct: bool = True) -> list[selftest.Row]:
    """Measurements with these speedups (SGLang's time / dsaops'); incorrect ones read the wrong rows."""
    kernel_err, vs_bf16 = (0.002, 0.0083) if correct else (0.9, 0.9)
    return [selftest.Row(b, dsaops_us=10.0, sglang_us=round(10.0 * s, 3), kernel_err=kernel_err, err_vs_bf16=vs_bf16,
                         raw_kv_floor=0.008) for b, s in speedups.items()]


def write_verdict(path: Path, target: str, gpu: dict, heads: int, speedups: dict[int, float], correct: bool = True,
                  kernels: str | None = None) -> dict:
    verdict = selftest.make_verdict(gpu, target, heads, rows(speedups, correct), kernels=kernels or route.kernel_hash())
    selftest.write_verdict(verdict, path)
    return verdict
