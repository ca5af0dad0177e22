"""From free GPU memory to the mamba state pool and the KV pool of one rank.

SGLang 0.5.23 sizes both after the weights are loaded (srt/mem_cache/kv_cache_configurator.py
`KVCacheConfigurator._profile_available_bytes` -> `_handle_max_mamba_cache` -> the pool
configurator's `calculate_pool_sizes`); this replays that arithmetic ahead of launch.
Sizes in GiB are floats (SGLang's "GB" is GiB), byte counts are ints.
"""
from __future__ import annotations

from dataclasses import dataclass

GIB = 1 << 30
MAMBA_FULL_MEMORY_RATIO = 0.9        # fields/schedule.py mamba_full_memory_ratio fallback
VLM_CACHE_MB = 100                   # environ.py SGLANG_VLM_CACHE_SIZE_MB default
MM_FEATURE_CACHE_MB = 1024           # environ.py SGLANG_MM_FEATURE_CACHE_MB default: a GPU feature transport's pool
# arg_groups/memory_hook.py handle_gpu_memory_settings: SGLang's own estimate of the activations
# beside the pools, 512 MiB plus 1.5 MiB a prefill token, counting at least 2048 tokens.
ACTIVATION_BASE_MIB = 512
ACTIVATION_MIB_PER_TOKEN = 1.5
ACTIVATION_MIN_TOKENS = 2048


class NotEnoughMemory(ValueError):
    """SGLang would refuse to start: the message carries its advice."""


def rest_memory_gib(*, pre_load_free_gib: float, free_after_weights_gib: float, mem_fraction_static: float,
                    multimodal: bool, mm_feature_transport: str = "cpu") -> float:
    """_profile_available_bytes: free memory after weights, less the runtime slack
    pre_model_load_memory * (1 - mem_fraction_static) and the multimodal reservation.
    MLA models never take the post-capture sizing path (post_capture_kv_sizing_planned)."""
    slack = pre_load_free_gib * (1 - mem_fraction_static)
    return free_after_weights_gib - slack - mm_reservation_gib(multimodal=multimodal,
                                                                mm_feature_transport=mm_feature_transport)


def mm_reservation_gib(*, multimodal: bool, mm_feature_transport: str) -> float:
    """mm_runtime_reservation_gb: the VLM cache, plus the feature pool of a GPU transport
    (--mm-feature-transport cuda_ipc or cuda_vmm), for a multimodal model only."""
    if not multimodal:
        return 0.0
    return (VLM_CACHE_MB + (MM_FEATURE_CACHE_MB if mm_feature_transport in ("cuda_ipc", "cuda_vmm") else 0)) / 1024


@dataclass(frozen=True)
class MambaPool:
    slots_per_dp: int            # max_mamba_cache_size as each DP rank's scheduler sees it
    bytes: int                   # (slots + 1 padding slot) * bytes per slot + spec scratch, as SGLang budgets it
    source: str                  # auto | --max-mamba-cache-size | --max-running-requests
    unbudgeted: int = 0          # the spec scratch the pool keeps beyond that budget (more scratch draft tokens)


def mamba_pool(rest_gib: float, *, slot_bytes: int, attn_dp_size: int, slots_per_request: int,
               max_mamba_cache_size: int | None, max_running_requests: int | None,
               disable_radix_cache: bool, full_memory_ratio: float, draft_tokens: int | None,
               scratch_tokens: int | None = None) -> MambaPool:
    """_handle_max_mamba_cache (no PP, no ReplaySSM, no fused draft state): the spec scratch budgeted for the
    `draft_tokens` SGLang starts with. The pool keeps it for max_speculative_num_draft_tokens (`scratch_tokens`,
    more under --speculative-adaptive); `unbudgeted` prices the difference as the budget prices a draft token."""
    scratch_requests = 0   # the requests (+1 padding) the spec scratch is budgeted for
    per_dp_requests = max(1, max_running_requests // attn_dp_size) if max_running_requests else None
    if max_mamba_cache_size is not None:
        slots, source = max_mamba_cache_size // attn_dp_size, "--max-mamba-cache-size"
        if draft_tokens:
            scratch_requests = min(per_dp_requests, slots // slots_per_request) + 1
    elif disable_radix_cache and max_running_requests is not None:
        slots, source = per_dp_requests, "--max-running-requests"
        if draft_tokens:
            scratch_requests = slots + 1
    else:
        source = "auto"
        budget = rest_gib * full_memory_ratio / (1 + full_memory_ratio) * GIB
        if draft_tokens:  # joint solve of the states and their per-draft-token intermediates
            slots = int((budget - slot_bytes * (1 + draft_tokens)) // (slot_bytes * (1 + draft_tokens / slots_per_request)))
            scratch_requests = min(per_dp_requests, slots // slots_per_request) + 1
        else:
            slots = int((budget - slot_bytes) // slot_bytes)
    if slots <= 0:
        raise NotEnoughMemory(
            f"not enough GPU memory for the mamba state cache (max_mamba_cache_size={slots}, "
            f"{slot_bytes / (1 << 20):.2f} MB per slot): reduce --max-running-requests, raise "
            "--mem-fraction-static, reduce --speculative-num-draft-tokens or use GPUs with more memory")
    spec_bytes = slot_bytes * scratch_requests * (draft_tokens or 0)
    unbudgeted = slot_bytes * scratch_requests * max(0, (scratch_tokens or 0) - (draft_tokens or 0))
    return MambaPool(slots, (slots + 1) * slot_bytes + spec_bytes, source, unbudgeted)


def kv_pool_tokens(kv_bytes: float, *, cell_bytes: int, page_tokens: int) -> int:
    """DefaultPoolConfigurator.calculate_pool_sizes: whole pages of available // cell_size."""
    tokens = int(kv_bytes) // cell_bytes // page_tokens * page_tokens
    if tokens <= 0:
        raise NotEnoughMemory("not enough memory for the KV cache: raise --mem-fraction-static "
                              "(SGLang: 'Not enough memory. Please try to increase --mem-fraction-static.')")
    return tokens


def activation_gib(prefill_tokens: int) -> float:
    """SGLang's estimate of the activation memory a prefill chunk of this many tokens needs."""
    return (ACTIVATION_BASE_MIB + ACTIVATION_MIB_PER_TOKEN * max(prefill_tokens, ACTIVATION_MIN_TOKENS)) / 1024


def prefill_chunk(limit: int, slack_gib: float) -> int:
    """The prefill chunk for a target whose table bounds it at `limit` tokens: halved until SGLang's
    activation estimate fits in the memory outside the pools (`slack_gib`), down to 2048 at least."""
    chunk = limit
    while chunk > ACTIVATION_MIN_TOKENS and activation_gib(chunk) > slack_gib:
        chunk //= 2
    return chunk
