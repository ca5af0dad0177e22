"""Which KV layout the DSA backends imply, and which pairings SGLang refuses at startup.

Follows SGLang 0.5.23 srt/arg_groups/overrides.py (`_dsa_split_backend_resolution`,
`_check_dsa_backend_constraints`) and srt/mem_cache/kv_cache_configurator.py
(`calculate_mla_kv_cache_dim`), plus the one pairing the dsaops patch series adds
(sglang_patches/0004, `is_q8_raw_fp8_nope_layout`): flashmla_sparse_q8 prefill with tilelang
decode over the raw fp8 pool, for NoPE MLA (kv_lora_rank 512, no RoPE dims) on SM90 only.
"""
from __future__ import annotations

import difflib
from dataclasses import dataclass

# _check_dsa_backend_constraints: the refusal for fp8 KV with tilelang on one side only.
# tests/dsaops checks this text against the pinned source; `dsaops verify boot-gate` expects it.
MIXED_TILELANG_REFUSAL = ("CUDA TileLang FP8 KV requires both DSA backends to be tilelang; "
                          "raw and scaled FP8 KV layouts cannot be mixed.")
ROCM_ONLY_REFUSAL = ("The triton DSA backend is only supported on ROCm/HIP. Pick an alternative DSA backend for CUDA "
                     "(flashmla_kv on Hopper, trtllm on Blackwell).")
Q8_PREFILL = "flashmla_sparse_q8"
# The choices of --dsa-prefill-backend and --dsa-decode-backend (srt/arg_groups/fields/exec_.py);
# tests/dsaops compares them with the pinned source.
PREFILL_BACKENDS = ("flashmla_sparse", "flashmla_sparse_q8", "flashmla_kv", "flashmla_auto", "flashinfer_sparse_mla",
                    "triton_sparse_mla", "fa3", "tilelang", "triton", "aiter", "trtllm", "intel_xpu")
DECODE_BACKENDS = tuple(b for b in PREFILL_BACKENDS if b != "triton_sparse_mla")
_HIP_RAW_BACKENDS = ("tilelang", "triton", "aiter")
# _dsa_split_backend_resolution (is_glm_sm12_fp8): this architecture's fp8 KV on SM12x (GB10) defaults to
# flashinfer_sparse_mla on both sides, a scaled layout
_GLM_SM12_FP8_ARCH = "GlmMoeDsaForCausalLM"


class BackendRefused(ValueError):
    """SGLang (or the patched image) would refuse this combination at startup."""


@dataclass(frozen=True)
class Backends:
    prefill: str
    decode: str
    defaulted: bool          # SGLang picked them (no --dsa-*-backend given)


def normalize_kv_dtype(kv_cache_dtype: str) -> str:
    """bf16 | fp8_e4m3 (overrides.py accepts bf16/bfloat16 and fp8_e4m3 for DSA)."""
    if kv_cache_dtype in ("bf16", "bfloat16"):
        return "bf16"
    if kv_cache_dtype == "fp8_e4m3":
        return kv_cache_dtype
    raise ValueError(f"DSA models take --kv-cache-dtype bf16 or fp8_e4m3, not {kv_cache_dtype!r}")


def check_backend_names(prefill: str | None, decode: str | None) -> None:
    """Refuse a backend name SGLang does not define, as its argument parser would at launch."""
    for flag, name, known in (("--dsa-prefill-backend", prefill, PREFILL_BACKENDS),
                              ("--dsa-decode-backend", decode, DECODE_BACKENDS)):
        if name is not None and name not in known:
            close = difflib.get_close_matches(name, known, n=1)
            hint = f" (did you mean {close[0]}?)" if close else ""
            raise BackendRefused(f"{flag} {name!r} is not a DSA backend{hint}; SGLang takes {', '.join(known)}")


def resolve_backends(kv_dtype: str, prefill: str | None, decode: str | None, *, hip: bool, sm_major: int,
                     architecture: str = "") -> Backends:
    """_dsa_split_backend_resolution's defaults for the sides the user left unset."""
    if hip:
        default_prefill = default_decode = "triton"
    elif skips_backend_check(kv_dtype, hip=hip, sm_major=sm_major, architecture=architecture):
        default_prefill = default_decode = "flashinfer_sparse_mla"
    elif kv_dtype == "fp8_e4m3":
        default_prefill = default_decode = "trtllm" if sm_major >= 10 else "flashmla_kv"
    else:
        default_prefill, default_decode = "flashmla_sparse", ("trtllm" if sm_major >= 10 else "fa3")
    return Backends(prefill or default_prefill, decode or default_decode, defaulted=not (prefill and decode))


def skips_backend_check(kv_dtype: str, *, hip: bool, sm_major: int, architecture: str) -> bool:
    """is_glm_sm12_fp8: _dsa_split_backend_resolution returns before _check_dsa_backend_constraints."""
    return architecture == _GLM_SM12_FP8_ARCH and sm_major == 12 and kv_dtype == "fp8_e4m3" and not hip


def q8_raw_nope(b: Backends, *, kv_lora_rank: int, qk_rope_head_dim: int) -> bool:
    """The patched `is_q8_raw_fp8_nope_layout`: q8 prefill and tilelang decode share raw NoPE rows."""
    return kv_lora_rank == 512 and qk_rope_head_dim == 0 and (b.prefill, b.decode) == (Q8_PREFILL, "tilelang")


def check_backends(kv_dtype: str, b: Backends, *, hip: bool, q8_prefill: bool, nope_q8: bool,
                   skipped: bool) -> None:
    """_check_dsa_backend_constraints, with the dsaops q8 pairing admitted where the target has
    q8_prefill and the model is NoPE MLA (`nope_q8`: q8_raw_nope for this model). `skipped`
    (skips_backend_check): only the q8 rule, which the patched backend also checks at startup."""
    chosen = {b.prefill, b.decode}
    if Q8_PREFILL in chosen and (b.prefill != Q8_PREFILL or not q8_prefill):
        where = "as the prefill backend" if b.prefill == Q8_PREFILL else "as a prefill backend only"
        raise BackendRefused(f"{Q8_PREFILL} runs on SM90 targets only, {where} (targets with the q8_prefill feature)")
    if skipped:
        return
    if not hip and "triton" in chosen:
        raise BackendRefused(ROCM_ONLY_REFUSAL)
    if hip or kv_dtype != "fp8_e4m3" or "tilelang" not in chosen:
        return
    if not nope_q8 and (b.prefill != "tilelang" or b.decode != "tilelang"):
        raise BackendRefused(MIXED_TILELANG_REFUSAL)


def kv_layout(kv_dtype: str, b: Backends, *, hip: bool, nope_q8: bool, fp8_dtype: str) -> str:
    """calculate_mla_kv_cache_dim (patched): bf16 | raw_fp8 (unscaled rows) | scaled_fp8 (+ per-128 scales).
    `fp8_dtype`: the torch dtype fp8_e4m3 stores as on the target (targets.toml fp8_dtype)."""
    if kv_dtype == "bf16":
        return "bf16"
    if fp8_dtype != "float8_e4m3fn":  # SGLang scales float8_e4m3fn rows only: gfx942's e4m3fnuz stays raw
        return "raw_fp8"
    chosen = {b.prefill, b.decode}
    if "trtllm" in chosen:
        return "raw_fp8"
    if hip and chosen & set(_HIP_RAW_BACKENDS):
        return "raw_fp8"
    if (b.prefill, b.decode) == ("tilelang", "tilelang") or nope_q8:
        return "raw_fp8"
    return "scaled_fp8"


def check_rows(b: Backends, layout: str) -> None:
    """dsaops' own refusal: TileLang reads raw fp8 rows only (the patched _validate_raw_fp8_kv_rows
    refuses scaled ones at the first request); SGLang's boot check stops this pairing first except
    where skips_backend_check."""
    if layout == "scaled_fp8" and "tilelang" in (b.prefill, b.decode):
        raise BackendRefused(f"SGLang starts prefill={b.prefill} decode={b.decode} here (GLM-5 fp8 KV on SM12x "
                             "skips its backend check) but pools scaled fp8 rows the tilelang side cannot read; set "
                             "--dsa-prefill-backend tilelang --dsa-decode-backend tilelang, or use --kv-cache-dtype bf16")
