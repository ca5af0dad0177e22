"""dsaops.kernels: raw-fp8 sparse-MLA kernels (TileLang decode, Triton KV write and gather).

Importing this package is cheap: torch, TileLang and Triton load on first use of a kernel.
"""
import importlib

_EXPORTS = {
    "sparse_mla_decode_fp8": "dsaops.kernels.decode",
    "decode_supported": "dsaops.kernels.decode",
    "decode_preferred": "dsaops.kernels.decode",
    "write_kv_fp8": "dsaops.kernels.kv_write",
    "gather_kv_rows": "dsaops.kernels.kv_gather",
}
__all__ = ["decode_preferred", "decode_supported", "gather_kv_rows", "sparse_mla_decode_fp8", "write_kv_fp8"]


def __getattr__(name):
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'dsaops.kernels' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # later look-ups skip this function
    return value
