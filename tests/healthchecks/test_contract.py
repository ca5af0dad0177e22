"""The SGLang side of the contract, pinned to the wheel: every format string the log parser
depends on, every /server_info key the exporter reads, the scheduler process title, and how
the request log escapes a client's text.
An SGLang bump that changes one fails here, loudly, naming it."""
from __future__ import annotations

import dataclasses
import io
import json
import logging
import re
import uuid
from datetime import datetime

import pytest
from dsaops.healthchecks import logparse, server_info

from benchmarks.sglang_standin import log_lines
from tests.support.sglang_definitions import lift
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


# --log-requests writes requests into the server log. A string holding a newline and a line in SGLang's shape,
# written raw, would be read as the server's own line: a clean stop and a crash.
FORGED = "\n" + log_lines.line(log_lines.sigterm()) + log_lines.line(log_lines.crashed("scheduler_0", 4242, -9), ("TP0",))
# The watermark redaction replaces secret fields' values and passes everything else through.
NO_SECRETS = {"_redact_field": lambda name, value: value, "_maybe_redact_watermark_secrets": lambda data: data}


@dataclasses.dataclass
class Request:
    """The shapes GenerateReqInput's fields take: strings, lists of strings, dicts."""
    text: object
    rid: object
    sampling_params: dict


def request_log(wheel, write) -> str:
    """What the request logger's stdout target (log_utils' own handler setup and format) writes for
    `write(logger, ns)`, `ns` holding the wheel's `log_json`."""
    stream = io.StringIO()
    ns = lift(wheel / "srt/utils/log_utils.py", ["_create_logger_with_handler", "log_json"],
              {"logging": logging, "json": json, "datetime": datetime})
    write(ns["_create_logger_with_handler"](f"dsaops.tests.{uuid.uuid4().hex}", logging.StreamHandler(stream)), ns)
    return stream.getvalue()


def text_format(wheel, escape=repr):
    """`_dataclass_to_string_truncated` from the wheel, with `escape` as its `repr`."""
    return lift(wheel / "srt/utils/request_logger.py", ["_dataclass_to_string_truncated"],
                {"dataclasses": dataclasses, "repr": escape, **NO_SECRETS})["_dataclass_to_string_truncated"]


def learnt(log: str) -> logparse.LogState:
    state = logparse.LogState()
    for line in log.split("\n"):
        state.feed(line)
    return state


def teaches_nothing(state: logparse.LogState) -> bool:
    return state.events["sigterm"] == 0 and not state.shutdowns and state.exit_of(4242, since=0) is None


@pytest.mark.parametrize("max_length", [2048, 8])  # strings whole, and cut (each half escaped)
def test_the_request_log_writes_a_requests_strings_escaped(wheel, max_length):
    render = text_format(wheel)
    req = Request(text=FORGED, rid=[FORGED, FORGED], sampling_params={"stop": FORGED, "stop_token_ids": [FORGED]})
    log = request_log(wheel, lambda logger, _: logger.info(f"Receive: obj={render(req, max_length)}"))
    assert log.count("\n") == 1 and teaches_nothing(learnt(log))


def test_the_json_request_log_writes_a_request_on_one_line(wheel):
    transform = lift(wheel / "srt/utils/request_logger.py", ["_transform_data_for_logging"],
                     {"dataclasses": dataclasses, **NO_SECRETS})["_transform_data_for_logging"]
    req = Request(text=FORGED, rid=FORGED, sampling_params={FORGED: [FORGED]})
    log = request_log(wheel, lambda logger, ns: ns["log_json"](logger, "request.received", {"obj": transform(req)}))
    assert log.count("\n") == 1 and teaches_nothing(learnt(log))


def test_the_request_log_writes_dict_keys_raw(wheel):
    """The limit healthchecks/README.md states: the text format writes a request dict's keys
    (custom_labels, sampling_params) as they came."""
    req = Request(text="hi", rid="r", sampling_params={FORGED: 1})
    log = request_log(wheel, lambda logger, _: logger.info(f"Receive: obj={text_format(wheel)(req)}"))
    assert learnt(log).events["sigterm"] == 1


def test_negative_control_a_string_written_raw_forges_lines(wheel):
    req = Request(text=FORGED, rid="r", sampling_params={})
    log = request_log(wheel, lambda logger, _: logger.info(f"Receive: obj={text_format(wheel, escape=str)(req)}"))
    state = learnt(log)
    assert state.events["sigterm"] == 1 and state.exit_of(4242, since=0) == (-9, True)


# Where SGLang 0.5.23 logs a client's text raw (healthchecks/README.md, "Lines a client can write").
RAW_CLIENT_TEXT = {
    "srt/entrypoints/http_server.py": ['logger.error(f"[http_server] Error: {e}")'],
    "srt/managers/tokenizer_manager.py": ['raise ValueError(f"Duplicate request ID detected: {rid}")',
                                          'f"LoRA adapter \'{first_adapter}\' was requested, but LoRA is not enabled. "'],
}


@pytest.mark.parametrize("path,piece", [(p, s) for p, pieces in RAW_CLIENT_TEXT.items() for s in pieces])
def test_the_raw_client_text_paths_are_in_the_wheel(wheel, path, piece):
    assert piece in (wheel / path).read_text(), f"sglang 0.5.23 {path} no longer says {piece!r}: update the README"
