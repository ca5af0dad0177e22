"""Run a module's Triton kernels under the CPU interpreter, with exact fp8 casts.

The interpreter's own float8 rounding is wrong (triton 3.7-3.9: ties away from zero, a lost carry
halves the value, no saturation), so an exactness test would fail for its reason rather than the
kernel's. `interpreted(module, monkeypatch)` routes its fp8 conversions through torch's cast (the
definition the kernels are held to) and swaps the module's @triton.jit functions for interpreted
ones (and triton.language's own jit functions, the reductions), whatever TRITON_INTERPRET was when
the module was first imported (another test may have imported it earlier). Everything is restored
when the test ends.
"""
from __future__ import annotations

import numpy as np
import torch
import triton.language as tl
from triton.runtime import interpreter
from triton.runtime.jit import JITFunction

_TORCH_FP8 = {
    tl.float8e4nv: torch.float8_e4m3fn,
    tl.float8e4b8: torch.float8_e4m3fnuz,
    tl.float8e5: torch.float8_e5m2,
    tl.float8e5b16: torch.float8_e5m2fnuz,
}


def _as_float32(data: np.ndarray, dtype) -> torch.Tensor:
    if dtype == tl.bfloat16:  # the interpreter stores bf16 as its uint16 bits
        return torch.from_numpy((data.astype(np.uint32) << 16).view(np.float32))
    return torch.from_numpy(np.ascontiguousarray(data).astype(np.float32))


def _exact_convert(original):
    def convert(data, input_dtype, output_dtype, rounding_mode):
        target = _TORCH_FP8.get(output_dtype)
        if target is None or input_dtype in _TORCH_FP8:
            return original(data, input_dtype, output_dtype, rounding_mode)
        # float32 holds bf16/fp16 exactly, so one torch cast from it is the same as torch's direct cast.
        return _as_float32(data, input_dtype).to(target).view(torch.uint8).numpy()

    return convert


def interpreted(module, monkeypatch, exact_fp8: bool = True) -> None:
    """exact_fp8=False leaves the interpreter's own fp8 rounding (the test that shows it is wrong)."""
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    if exact_fp8:
        monkeypatch.setattr(interpreter, "_convert_float", _exact_convert(interpreter._convert_float))
    # tl.max and the other reductions are @triton.jit functions of triton.language.standard: they too
    # must be interpreted ones when triton was imported without TRITON_INTERPRET
    for namespace in (module, tl, tl.standard):
        for name, value in list(vars(namespace).items()):
            if isinstance(value, JITFunction):
                monkeypatch.setattr(namespace, name, interpreter.InterpretedFunction(value.fn))
