"""The SGLang side of the contract, pinned to the wheel: every format string the log parser
depends on, every /server_info key the exporter reads, and the scheduler process title.
An SGLang bump that changes one fails here, loudly, naming it."""
from __future__ import annotations

import re

import pytest
from dsaops.healthchecks import logparse, server_info

from benchmarks.sglang_standin import log_lines
from tests.support.sglang_wheel import sglang_source

# Where each /server_info key is produced in 0.5.23.
SERVER_INFO_KEYS = {
    "max_running_requests": ("srt/arg_groups/fields/schedule.py", "    max_running_requests: A["),
    "attn_dp_size": ("srt/arg_groups/fields/parallel.py", "    attn_dp_size: A["),
    "context_length": ("srt/arg_groups/fields/model.py", "    context_length: A["),
    "kv_cache_dtype": ("srt/arg_groups/fields/model.py", "    kv_cache_dtype: A["),
    "dsa_prefill_backend": ("srt/arg_groups/fields/exec_.py", "    dsa_prefill_backend: A["),
    "dsa_decode_backend": ("srt/arg_groups/fields/exec_.py", "    dsa_decode_backend: A["),
    "max_total_num_tokens": ("srt/managers/scheduler.py", '"max_total_num_tokens": self.max_total_num_tokens'),
    "internal_states": ("srt/entrypoints/http_server.py", '"internal_states": internal_states'),
    "effective_max_running_requests_per_dp": ("srt/managers/scheduler_components/internal_state.py",
                                              'state["effective_max_running_requests_per_dp"] = '),
    "memory_usage": ("srt/managers/scheduler_components/internal_state.py", 'state["memory_usage"] = build_memory_usage('),
    "token_capacity": ("srt/managers/scheduler_components/memory_usage.py", '"token_capacity": int(token_capacity)'),
    "kvcache": ("srt/managers/scheduler_components/memory_usage.py", '"kvcache": round(kv_cache_gb, 3)'),
}


@pytest.fixture(scope="module")
def wheel():
    return sglang_source() / "sglang"


@pytest.mark.parametrize("path,piece", [(p, s) for p, pieces in logparse.FORMAT_STRINGS.items() for s in pieces])
def test_log_format_string_is_in_the_wheel(wheel, path, piece):
    assert piece in (wheel / path).read_text(), f"sglang 0.5.23 {path} no longer says {piece!r}: update logparse"


def _fragments(piece: str) -> list[str]:
    """The literal text of a format-string piece, split at its placeholders."""
    text = piece.replace("'}", "").replace('f"', "").replace('"', "").replace("\\'", "'")
    return [f for f in re.split(r"\{[^}]*\}|%d", text) if len(f.strip()) >= 4]


@pytest.mark.parametrize("path", [p for p in logparse.FORMAT_STRINGS if p not in (
    "srt/utils/common.py", "srt/managers/scheduler.py")])  # those two are the prefix and title, not messages
def test_fixture_lines_are_rendered_from_the_format_strings(path):
    """The log fixtures say what the wheel's format strings say, fragment by fragment."""
    corpus = "\n".join(log_lines.every_message())
    for piece in logparse.FORMAT_STRINGS[path]:
        for fragment in _fragments(piece):
            assert fragment in corpus, f"no fixture renders {fragment!r} of {path}"


def test_every_key_read_is_pinned():
    assert set(SERVER_INFO_KEYS) == set(server_info.TOP_KEYS) | set(server_info.STATE_KEYS)


@pytest.mark.parametrize("key", sorted(SERVER_INFO_KEYS))
def test_server_info_key_is_in_the_wheel(wheel, key):
    path, needle = SERVER_INFO_KEYS[key]
    assert needle in (wheel / path).read_text(), f"sglang 0.5.23 {path} no longer produces /server_info {key!r}"


def test_server_info_args_are_flat_fields(wheel):
    """resolved_dict() puts every argument at the top level (a test kit reads server_info["disable_radix_cache"])."""
    assert "field.name: _plain(resolution_result(self, field.name))" in (wheel / "srt/server_args.py").read_text()


def test_patch_keys_are_absent_from_pristine(wheel):
    """The observability patch's fields: pristine 0.5.23 lacks them, so the exporter falls back to logs."""
    text = (wheel / "srt/managers/scheduler_components/internal_state.py").read_text()
    for key in server_info.PATCH_KEYS:
        assert f'state["{key}"]' not in text


def test_negative_control_a_changed_string_is_caught(wheel):
    assert "KV Cache is allocated. dtype: {self.dtype}, #tokens" not in (wheel / "srt/mem_cache/memory_pool.py").read_text()
