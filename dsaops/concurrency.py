"""What binds concurrency: one vocabulary for the planner and the exporter.

Mirrors SGLang 0.5.23 `srt/mem_cache/kv_cache_configurator.py`:
`ModelRunnerKVCacheMixin.resolve_max_num_reqs` (the per-DP split, the KV cap
`token_capacity // 2`, the mamba cap) and `_calculate_mamba_ratio` (state slots per
request), with `srt/mem_cache/allocation_sizing.py::get_mamba_tracking_slots`.

The binding limit is one of:
  request   nothing cut the requested (or SGLang's default) value
  dp_split  the request divided by the attention-DP size (8 // 8 = 1 per rank)
  kv        the KV pool's capacity (token_capacity // 2)
  mamba     the mamba state cache (max_mamba_cache_size // slots per request)
"""
from __future__ import annotations

from dataclasses import dataclass

BINDING_LIMITS = ("request", "dp_split", "kv", "mamba")
# arg_groups/speculative_hook.py _handle_eagle_family: --max-running-requests when speculative
# decoding (EAGLE, which MTP runs as) leaves it unset; per deployment like the flag
SPEC_DEFAULT_RUNNING_REQUESTS = 48

# kv_cache_configurator.py: MAMBA_CACHE_SIZE_MAX_RUNNING_REQUESTS_RATIO and friends
_MAMBA_BASE_RATIO = 3
_MAMBA_BASE_DROP_ON_SKIP = 1
_MAMBA_NO_BUFFER_ADDITIONAL_ON_SKIP = 1


def mamba_slots_per_request(*, disable_radix_cache: bool = False, extra_buffer: bool = True,
                            overlap: bool = True, lazy: bool = False, skip_decode_lock: bool = False) -> int:
    """`_calculate_mamba_ratio`: 1 without the radix cache; else a base of 3 (2 with
    SGLANG_OPT_MAMBA_SKIP_DECODE_LOCK) plus the extra buffer's tracking slots (2 with overlap
    scheduling, 1 without or in lazy mode), or plus 1 with the skip and no extra buffer."""
    if disable_radix_cache:
        return 1
    base = _MAMBA_BASE_RATIO - (_MAMBA_BASE_DROP_ON_SKIP if skip_decode_lock else 0)
    if extra_buffer:
        if lazy and not overlap:
            raise ValueError("the lazy mamba extra buffer needs overlap scheduling (drop --disable-overlap-schedule)")
        additional = 1 if lazy else (2 if overlap else 1)
    else:
        additional = _MAMBA_NO_BUFFER_ADDITIONAL_ON_SKIP if skip_decode_lock else 0
    return base + additional


@dataclass(frozen=True)
class Concurrency:
    requested: int | None          # --max-running-requests as given (None: SGLang's default)
    requested_per_dp: int          # after the attention-DP split (or SGLang's estimate)
    kv_cap: int                    # token_capacity // 2
    mamba_cap: int | None          # max_mamba_cache_size // slots per request
    effective_per_dp: int          # what each DP rank's scheduler runs at most
    binding: str                   # one of BINDING_LIMITS


def resolve(*, requested: int | None, attn_dp_size: int, token_capacity: int, context_len: int,
            max_mamba_cache_size: int | None = None, mamba_slots: int | None = None) -> Concurrency:
    """`resolve_max_num_reqs` with the reason attached. `token_capacity` is the pool in
    tokens per rank; `max_mamba_cache_size` is per DP rank (None for a model without mamba state)."""
    if attn_dp_size < 1:
        raise ValueError("attention-DP size must be at least 1")
    kv_cap = token_capacity // 2
    if requested is not None:
        per_dp = max(1, requested // attn_dp_size)
    else:  # SGLang's estimate when the flag is absent
        per_dp = max(min(int(token_capacity / context_len * 512), 4096), 2048)
    effective, binding = per_dp, "request"
    if requested is not None and attn_dp_size > 1 and per_dp < requested:
        binding = "dp_split"
    if kv_cap < effective:
        effective, binding = kv_cap, "kv"
    mamba_cap = None
    if max_mamba_cache_size is not None:
        if not mamba_slots:
            raise ValueError("mamba_slots (state slots per request) is needed with max_mamba_cache_size")
        mamba_cap = max_mamba_cache_size // mamba_slots
        if mamba_cap < effective:
            effective, binding = mamba_cap, "mamba"
    return Concurrency(requested, per_dp, kv_cap, mamba_cap, effective, binding)
