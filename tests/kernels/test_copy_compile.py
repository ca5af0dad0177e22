"""write_kv_fp8 and gather_kv_rows compile for every target in the targets table, with no GPU: Triton's own
ptxas (sm_90, sm_121) and its AMD backend (gfx942), the row-scaled writer included. The generated code
is checked for what the speed target rests on: the raw cast is the hardware's (one cvt, no software
rounding), every row moves in 16-byte accesses, and nothing spills to local memory."""
import re

import pytest
import torch
from dsaops.kernels import kv_gather, kv_write, reference

from dsaops import targets

TRITON_FP8 = {torch.float8_e4m3fn: "fp8e4nv", torch.float8_e4m3fnuz: "fp8e4b8"}


def gpu_target(t):
    # Triton's compiler internals are imported here, not at collection: a GPU run (`pytest -m gpu`, another
    # Triton) collects this module without running it.
    from triton.backends.compiler import GPUTarget

    if t.vendor == "nvidia":
        return GPUTarget("cuda", int(t.compute_capability.replace(".", "")), 32)
    return GPUTarget("hip", t.gpu_arch, 64)


def build(fn, target, signature, constexprs, aligned):
    """Compile as the runtime would for 16-byte aligned pointers and strides divisible by 16 (512/576-wide rows)."""
    from triton.compiler import ASTSource, compile, make_backend

    attrs = {(fn.arg_names.index(name),): make_backend(target).parse_attr("D") for name in aligned}
    signature = signature | dict.fromkeys(constexprs, "constexpr")
    kernel = compile(ASTSource(fn=fn, signature=signature, constexprs=constexprs, attrs=attrs), target=target)
    return kernel.asm.get("ptx") or kernel.asm["amdgcn"]


def write_asm(t, with_rope, row_scaled=False):
    fp8 = getattr(torch, t.fp8_dtype)
    over_bits, over_byte, nan_byte, signed = kv_write.special_bytes(fp8)
    ints = ["pool_stride", "n_slots", "n_rows", "skip_index", "nope_stride", "d_nope", "rope_stride", "d_rope"]
    signature = {"pool_ptr": f"*{TRITON_FP8[fp8]}", "loc_ptr": "*i64", "nope_ptr": "*bf16", "rope_ptr": "*bf16",
                 "scale_ptr": "*fp32"}
    signature |= dict.fromkeys(ints, "i32")
    constexprs = {"HAS_SKIP": True, "HAS_ROPE": with_rope, "NOPE_P2": 512, "ROPE_P2": 64, "OVER_BITS": over_bits,
                  "OVER_BYTE": over_byte, "NAN_BYTE": nan_byte, "SIGNED": signed, "BLOCK_M": kv_write.BLOCK_M,
                  "ROW_SCALED": row_scaled, "FMAX": torch.finfo(fp8).max, "TINY_AMAX": reference.TINY_AMAX}
    return build(kv_write._write_kv_fp8_kernel, gpu_target(t), signature, constexprs,
                 ["pool_ptr", "pool_stride", "loc_ptr", "nope_ptr", "nope_stride", "d_nope", "rope_ptr", "rope_stride"])


def gather_asm(t):
    signature = {"pool_ptr": "*u8", "ids_ptr": "*i32", "out_ptr": "*u8", "out_ids_ptr": "*i32"}
    signature |= dict.fromkeys(["pool_stride", "n_slots", "n_ids", "out_stride", "n_out", "width"], "i32")
    return build(kv_gather._gather_kernel, gpu_target(t), signature, {"WIDTH_P2": 512, "BLOCK_M": kv_gather.BLOCK_M},
                 ["pool_ptr", "pool_stride", "ids_ptr", "out_ptr", "out_stride", "out_ids_ptr", "width"])


@pytest.mark.parametrize("name", list(targets.table()))
def test_kernels_compile_for_target(name):
    t = targets.get(name)
    kernels = {"write nope": write_asm(t, False), "write nope+rope": write_asm(t, True), "gather": gather_asm(t),
               "write row-scaled": write_asm(t, True, row_scaled=True)}
    for kernel, asm in kernels.items():
        if t.vendor == "nvidia":
            assert re.search(r"ld\.global(\.\w+)*\.v4\.b32", asm) and re.search(r"st\.global(\.\w+)*\.v4\.b32", asm), kernel
            assert ".local" not in asm, f"{kernel} spills to local memory"
        else:
            assert "global_load_dwordx4" in asm and "global_store_dwordx4" in asm, kernel
    if t.vendor == "nvidia":
        assert "cvt.rn.satfinite.e4m3x2.f32" in kernels["write nope"]
