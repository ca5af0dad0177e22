"""Patches 0001 and 0004's gather: which writer a KV write takes, and what reaches the kernel launch.

The functions run as compiled from the patched wheel (sglang_definitions); Triton kernels are
replaced by recorders (a launch cannot run without a GPU), so these tests pin the glue
the patches change: the choice of writer by layout, the missing-RoPE handling and the
dtype the NoPE prefix gather accepts. Pristine controls show the patch makes the difference.
"""
from types import SimpleNamespace

import pytest
import torch

from tests.support.sglang_definitions import lift

MEMORY_POOL = "sglang/srt/mem_cache/memory_pool.py"
MLA_BUFFER = "sglang/kernels/ops/kvcache/mla_buffer.py"
DEQUANT = "sglang/kernels/ops/attention/dsa/dequant_k_cache.py"
FP8 = torch.float8_e4m3fn


class Launches:
    """Stands in for a Triton kernel (`kernel[grid](*args, **kw)`) or a plain writer function."""

    def __init__(self):
        self.calls = []

    def __getitem__(self, grid):
        return lambda *args, **kw: self.calls.append((grid, args, kw))

    def __call__(self, *args, **kw):
        self.calls.append((None, args, kw))
        return args[:2]


def pool_write(root, *, dtype, packed, dcp_span=1):
    """Run MLATokenToKVPool._write_mla_kv_buffer on a DSA pool; returns which writer got the rows."""
    fused, scatter, quantize = Launches(), Launches(), Launches()
    ns = lift(root / MEMORY_POOL, ["MLATokenToKVPool._write_mla_kv_buffer"], {
        "_is_hip": False, "fp8_dtype": FP8, "set_mla_kv_buffer_triton_fp8_quant": fused,
        "quantize_k_cache_separate": quantize})
    pool = SimpleNamespace(use_dsa=True, dtype=dtype, store_dtype=torch.uint8 if dtype == FP8 else dtype,
                           dsa_kv_cache_store_fp8=packed, write_loc_is_dcp_resolved=False,
                           _write_loc_dcp_span=dcp_span,
                           _scatter_mla_rows=lambda buf, loc, nope, rope: scatter.calls.append((nope, rope)))
    nope = torch.randn(4, 1, 512, dtype=torch.bfloat16)
    ns["_write_mla_kv_buffer"](pool, torch.zeros(9, 1, 512, dtype=torch.uint8), torch.arange(1, 5), nope, None)
    return {"fused": fused.calls, "scatter": scatter.calls, "quantize": quantize.calls}


def test_cuda_raw_fp8_takes_the_fused_writer_without_a_rope_tensor(patched_root):
    calls = pool_write(patched_root, dtype=FP8, packed=False)
    assert calls["scatter"] == [] and calls["quantize"] == []
    (_, (_, _, nope, rope, fp8_dtype), _), = calls["fused"]
    assert rope is None and fp8_dtype == FP8 and nope.dtype == torch.bfloat16  # cast happens in the kernel


def test_pristine_cuda_raw_fp8_casts_then_scatters(pristine_root):
    """Control: 0.5.23 keys the fused writer on _is_hip; CUDA takes the two-kernel path."""
    calls = pool_write(pristine_root, dtype=FP8, packed=False)
    assert calls["fused"] == []
    (nope, rope), = calls["scatter"]
    assert nope.dtype == torch.uint8 and rope is None  # cast to fp8, viewed as the uint8 store


@pytest.mark.parametrize("case, kwargs, writer", [
    ("scaled (packed) fp8 layout", {"dtype": FP8, "packed": True}, "quantize"),
    ("raw fp8 under DCP (widened locs)", {"dtype": FP8, "packed": False, "dcp_span": 2}, "scatter"),
    ("bf16 pool", {"dtype": torch.bfloat16, "packed": False}, "scatter"),
])
def test_other_layouts_keep_their_writer(patched_root, case, kwargs, writer):
    calls = pool_write(patched_root, **kwargs)
    assert calls[writer] and calls["fused"] == [], case


def fused_writer(root):
    kernel = Launches()
    ns = lift(root / MLA_BUFFER, ["set_mla_kv_buffer_triton_fp8_quant"], {
        "triton": SimpleNamespace(cdiv=lambda a, b: -(-a // b)), "is_arch_support_pdl": lambda: False,
        "set_mla_kv_buffer_fp8_quant_kernel": kernel})
    return ns["set_mla_kv_buffer_triton_fp8_quant"], kernel


def test_fused_writer_accepts_a_missing_rope_tensor(patched_root):
    write, kernel = fused_writer(patched_root)
    nope = torch.randn(4, 1, 512, dtype=torch.bfloat16)
    write(torch.zeros(9, 1, 512, dtype=torch.uint8), torch.arange(1, 5), nope, None, FP8)
    (grid, args, _), = kernel.calls
    buffer, k_nope, k_rope, *_, nope_dim, rope_dim = args
    assert grid == (4, 4) and (nope_dim, rope_dim) == (512, 0)  # 512 columns in blocks of 128: RoPE never read
    assert buffer.dtype == FP8 and k_nope is nope
    assert k_rope.data_ptr() == nope.data_ptr() != 0  # a real pointer, never read (a zero-width view's is 0)


def test_pristine_fused_writer_fails_without_rope(pristine_root):
    write, _ = fused_writer(pristine_root)
    with pytest.raises(AttributeError):
        write(torch.zeros(9, 1, 512, dtype=torch.uint8), torch.arange(1, 5),
              torch.randn(4, 1, 512, dtype=torch.bfloat16), None, FP8)


def prefix_gather(root):
    kernel = Launches()
    ns = lift(root / DEQUANT, ["_GATHER_TOKENS_PER_PROG", "gather_cast_kv_fp8_pad_paged"], {
        "torch": torch, "triton": SimpleNamespace(cdiv=lambda a, b: -(-a // b)),
        "_gather_cast_kv_bf16_paged_vec_kernel": kernel})
    return ns["gather_cast_kv_fp8_pad_paged"], kernel


def test_q8_prefix_gather_copies_raw_fp8_nope_rows(patched_root):
    gather, kernel = prefix_gather(patched_root)
    pool = torch.randn(64, 1, 512).to(FP8)
    out = torch.empty(10 + 128, 512, dtype=FP8)
    assert gather(out, pool, torch.arange(10, dtype=torch.int32), nope_dim=512) is out
    (_, args, _), = kernel.calls
    assert args[0] is pool and args[1] is out  # the fp8 rows go to the copy as they are, no conversion


def test_q8_prefix_gather_refuses_fp8_rows_with_rope_and_pristine_refuses_fp8(patched_root, pristine_root):
    gather, _ = prefix_gather(patched_root)
    with pytest.raises(AssertionError, match="raw fp8 NoPE rows"):
        gather(torch.empty(138, 576, dtype=FP8), torch.randn(64, 1, 576).to(FP8),
               torch.arange(10, dtype=torch.int32), nope_dim=512)
    pristine_gather, _ = prefix_gather(pristine_root)
    with pytest.raises(AssertionError):
        pristine_gather(torch.empty(138, 512, dtype=FP8), torch.randn(64, 1, 512).to(FP8),
                        torch.arange(10, dtype=torch.int32), nope_dim=512)
