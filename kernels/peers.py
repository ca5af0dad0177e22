"""The decode kernels dsaops is measured against, called as SGLang 0.5.23 calls them.

- load_sglang: SGLang's TileLang sparse-MLA kernels (`tilelang_sparse_fwd`, bf16 or raw fp8 pool)
  from the one file of the pinned wheel that holds them, loaded as a baseline, never copied.
- FlashMLADecode: FlashMLA's sparse fp8 decode over its V32_NO_ROPE pool (the `sgl-flash-mla`
  wheel), as SGLang's DSA backend calls it for an fp8 KV cache (`flashmla_kv`).

torch, TileLang and flash_mla are imported on use.
"""
from __future__ import annotations

import importlib.util
import os
import sys
import types

SGLANG_KERNEL = ("sglang", "kernels", "ops", "attention", "dsa", "tilelang_kernel.py")
SGLANG_KERNEL_MODULE = ".".join(SGLANG_KERNEL).removesuffix(".py")  # as the installed sglang imports it
FLASHMLA_FORMAT = "V32_NO_ROPE"


def load_sglang(root):
    """SGLang's tilelang_kernel.py under `root` (the folder that holds sglang/), with stand-ins
    for the SGLang helpers it imports (`is_fp8_fnuz`, `is_hip`, `is_gfx95_supported`), answering
    as on CUDA; so that one file is all a GPU machine needs of the wheel."""
    stand_ins = {
        "sglang": {}, "sglang.kernels": {}, "sglang.kernels.ops": {}, "sglang.kernels.ops.quantization": {},
        "sglang.kernels.ops.quantization.fp8_kernel": {"is_fp8_fnuz": lambda: False},
        "sglang.srt": {}, "sglang.srt.utils": {"is_hip": lambda: False, "is_gfx95_supported": lambda: False},
    }
    saved = {name: sys.modules.get(name) for name in stand_ins}
    try:
        for name, attrs in stand_ins.items():
            mod = types.ModuleType(name)
            mod.__dict__.update(attrs)
            sys.modules[name] = mod
        spec = importlib.util.spec_from_file_location("sglang_baseline_tilelang", os.path.join(root, *SGLANG_KERNEL))
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return module
    finally:
        for name, old in saved.items():
            if old is None:
                sys.modules.pop(name, None)
            else:
                sys.modules[name] = old


def flashmla_heads(heads: int) -> int:
    """The head count FlashMLA's decode runs for `heads` q heads: 64 up to 64, 128 up to 128, else
    as many (SGLang's `flashmla_kv_num_q_heads`; the kernel has 64- and 128-head variants)."""
    return 64 if heads <= 64 else max(128, heads)


class FlashMLADecode:
    """FlashMLA's sparse fp8 decode for S queries of H heads over top-k rows, as SGLang 0.5.23's
    DSA backend makes it for an fp8 KV cache (`_forward_flashmla_kv`, `_compute_flashmla_metadata`):
    the tile-scheduler metadata computed once for the batch shape (cache lengths = top-k: contexts
    of at least top-k tokens), q [S, 1, Hpad, d] with its heads zero-padded to flashmla_heads(H),
    the pool as FlashMLA's V32_NO_ROPE pages (accuracy.flashmla_pages), an empty block table.

    pad(q) makes the padded q once (SGLang pads on every call: two small kernels not timed here);
    calling the object with it, the pages, indices [S, 1, topk] int32 and sm_scale returns out
    [S, H, d_v] bf16. `flash_mla` is the imported wheel module (imported here when None)."""

    def __init__(self, S: int, H: int, topk: int, device, d_v: int = 512, flash_mla=None):
        import torch

        if flash_mla is None:
            import flash_mla
        self.flash_mla = flash_mla
        self.S, self.H, self.d_v = S, H, d_v
        self.heads = flashmla_heads(H)
        self.cache_seqlens = torch.full((S,), topk, dtype=torch.int32, device=device)
        self.block_table = torch.empty((S, 0), dtype=torch.int32, device=device)
        # SGLang's get_mla_metadata(cache_seqlens, seq_len_q * heads, num_heads_k=1, heads, True, topk),
        # which asks the wheel's legacy scheduler
        self.tile_scheduler_metadata, self.num_splits = flash_mla.get_mla_decoding_metadata(
            self.cache_seqlens, self.heads, 1, self.heads, True, topk, use_legacy=True)

    def pad(self, q):
        """q [S, H, d] bf16 as FlashMLA reads it: [S, 1, heads, d], heads past H zero."""
        import torch

        padded = torch.zeros((self.S, 1, self.heads, q.shape[2]), dtype=q.dtype, device=q.device)
        padded[:, 0, :self.H] = q
        return padded

    def __call__(self, q_padded, k_pages, indices, sm_scale):
        meta = self.flash_mla.flash_mla_interface.FlashMLASchedMeta(
            tile_scheduler_metadata=self.tile_scheduler_metadata, num_splits=self.num_splits)
        out, _ = self.flash_mla.flash_mla_with_kvcache(
            q=q_padded, k_cache=k_pages, block_table=self.block_table, cache_seqlens=self.cache_seqlens,
            head_dim_v=self.d_v, tile_scheduler_metadata=meta, softmax_scale=sm_scale, is_fp8_kvcache=True,
            indices=indices, use_legacy=True, kv_format=FLASHMLA_FORMAT)
        return out[:, 0, :self.H]
