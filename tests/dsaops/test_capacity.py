"""The running-request cap from /server_info (0.5.23's shape), from the real exporter's
exposition, and from a plan."""
from __future__ import annotations

import json

import pytest
from dsaops.healthchecks import server_info
from dsaops.healthchecks.logparse import LogState
from dsaops.healthchecks.metrics import ErrorCounts, Families
from dsaops.healthchecks.server_info import ServerInfoCollector
from prometheus_client import CollectorRegistry, generate_latest

from dsaops.bench import capacity
from dsaops.errors import UserError


def info(*, requested=16, dp=2, effective=8, tokens=400_000, **state_extra) -> dict:
    state = {"effective_max_running_requests_per_dp": effective, "memory_usage": {"token_capacity": tokens},
             **state_extra}
    return {"max_running_requests": requested, "attn_dp_size": dp, "context_length": 32768,
            "max_total_num_tokens": tokens, "internal_states": [dict(state) for _ in range(dp)]}


def test_dp_split():
    cap = capacity.from_server_info(info(requested=8, dp=8, effective=1))
    assert (cap.total, cap.binding, cap.per_dp) == (8, "dp_split", [1] * 8)


def test_kv():
    cap = capacity.from_server_info(info(requested=None, dp=1, effective=1000, tokens=2000))
    assert (cap.total, cap.binding) == (1000, "kv")


def test_mamba_inferred_when_pristine():
    cap = capacity.from_server_info(info(effective=2))
    assert (cap.total, cap.binding) == (4, "mamba") and "inferred" in cap.source


def test_mamba_from_the_patched_fields():
    cap = capacity.from_server_info(info(effective=2, max_mamba_cache_size=10, mamba_state_slots_per_request=5))
    assert (cap.total, cap.binding) == (4, "mamba") and "inferred" not in cap.source


def test_request_binds_control():
    cap = capacity.from_server_info(info(requested=16, dp=1, effective=16))
    assert (cap.total, cap.binding) == (16, "request")


def test_not_the_shape():
    with pytest.raises((ValueError, KeyError, TypeError)):
        capacity.from_server_info({"internal_states": [{"memory_usage": {}}]})


class _Poller:
    up = True

    def __init__(self, payload):
        self.info, self.errors = server_info.parse(payload)[0], ErrorCounts()


def exposition(payload: dict, log: LogState | None = None) -> str:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(ServerInfoCollector(_Poller(payload), log, Families("n1")))
    return generate_latest(registry).decode()


def test_the_exporters_series():
    log = LogState()
    log.feed("[2026-12-01 10:00:00 TP0] Mamba Cache is allocated. max_mamba_cache_size: 10, conv_state size: 0.14GB, "
             "ssm_state size: 4.00GB ")
    log.feed("[2026-12-01 10:00:00 TP0] max_running_requests is capped to 2 by the mamba state cache "
             "(max_mamba_cache_size=10, 5 state slots per request). To raise it: increase --mamba-full-memory-ratio "
             "or --max-mamba-cache-size, or halve the state size with --mamba-ssm-dtype bfloat16.")
    cap = capacity.from_exporter_metrics(exposition(info(effective=2), log))
    assert (cap.total, cap.per_dp, cap.binding) == (4, [2, 2], "mamba")
    control = capacity.from_exporter_metrics(exposition(info(requested=8, dp=8, effective=1)))
    assert (control.total, control.binding) == (8, "dp_split")


def test_a_worker_nodes_exporter_has_no_cap():
    assert capacity.from_exporter_metrics('dsa_server_up{node="w1"} 1.0\n') is None


def test_plan(tmp_path):
    path = tmp_path / "plan.json"
    path.write_text(json.dumps({"max_running_requests_per_dp": 4, "binding_limit": "mamba",
                                "parallel": {"attn_dp_size": 8, "dp_size": 2}}))
    cap = capacity.from_plan(str(path))
    assert (cap.total, cap.binding) == (64, "mamba")


@pytest.mark.parametrize("body", ['{"max_running_requests_per_dp": 4}', "not json",
                                  '{"max_running_requests_per_dp": 0, "binding_limit": "kv"}',
                                  '{"max_running_requests_per_dp": 4, "binding_limit": "weather"}'])
def test_a_bad_plan_is_a_user_error(tmp_path, body):
    path = tmp_path / "plan.json"
    path.write_text(body)
    with pytest.raises(UserError, match="--plan"):
        capacity.from_plan(str(path))
