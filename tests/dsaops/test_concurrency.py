import pytest

from dsaops.concurrency import mamba_slots_per_request, resolve


def test_mamba_ratio_follows_sglang_rules():
    assert mamba_slots_per_request() == 5                                   # extra buffer + overlap: GLM-5.3-Flash
    assert mamba_slots_per_request(overlap=False) == 4
    assert mamba_slots_per_request(lazy=True) == 4
    assert mamba_slots_per_request(extra_buffer=False) == 3
    assert mamba_slots_per_request(disable_radix_cache=True) == 1
    assert mamba_slots_per_request(skip_decode_lock=True) == 4
    assert mamba_slots_per_request(extra_buffer=False, skip_decode_lock=True) == 3
    with pytest.raises(ValueError, match="overlap"):
        mamba_slots_per_request(lazy=True, overlap=False)


def test_dp_split_eight_by_eight_is_one():
    c = resolve(requested=8, attn_dp_size=8, token_capacity=600_000, context_len=131072)
    assert (c.effective_per_dp, c.binding) == (1, "dp_split")


def test_request_binds_when_nothing_cuts_it():
    c = resolve(requested=64, attn_dp_size=1, token_capacity=600_000, context_len=131072,
                max_mamba_cache_size=400, mamba_slots=5)
    assert (c.effective_per_dp, c.binding, c.mamba_cap) == (64, "request", 80)


def test_mamba_cap_binds_issue_36889():
    c = resolve(requested=48, attn_dp_size=1, token_capacity=600_000, context_len=131072,
                max_mamba_cache_size=40, mamba_slots=5)
    assert (c.effective_per_dp, c.binding) == (8, "mamba")


def test_kv_cap_binds_when_the_pool_is_small():
    c = resolve(requested=4096, attn_dp_size=1, token_capacity=1000, context_len=131072)
    assert (c.effective_per_dp, c.binding) == (500, "kv")


def test_default_request_is_sglangs_estimate():
    # int(tokens / context_len * 512) clamped to [2048, 4096]
    big = resolve(requested=None, attn_dp_size=1, token_capacity=4_922_240, context_len=202752)
    small = resolve(requested=None, attn_dp_size=1, token_capacity=161_600, context_len=202752)
    assert (big.requested_per_dp, small.requested_per_dp) == (4096, 2048)
    assert big.binding == small.binding == "request"
