"""/server_info in 0.5.23's shape -> metrics: capacity, max_running_requests, what binds
concurrency (dsaops.concurrency's vocabulary), mamba from the patch's fields or the log."""
from __future__ import annotations

import json

import pytest
from dsaops.healthchecks.logparse import LogState
from dsaops.healthchecks.metrics import ErrorCounts, Families
from dsaops.healthchecks.server_info import ServerInfoCollector, ServerInfoPoller, layout_of, read_plan
from prometheus_client import CollectorRegistry, generate_latest

from benchmarks.sglang_standin import log_lines as L
from dsaops.errors import UserError
from tests.healthchecks.prometheus_text import exposition


def metrics(fake_server, log: LogState | None = None, planned=None):
    errors = ErrorCounts()
    poller = ServerInfoPoller(fake_server.url, errors, timeout=2)
    poller.poll()
    registry = CollectorRegistry(auto_describe=False)
    registry.register(ServerInfoCollector(poller, log, Families("n1"), planned))
    return exposition(generate_latest(registry).decode()), errors


def capped(out, dp="0"):
    return {k.split('by="')[1].split('"')[0] for k, v in out.items()
            if k.startswith("dsa_concurrency_capped") and f'dp_rank="{dp}"' in k and v == 1}


def test_pristine_dp_split(fake_server):
    out, errors = metrics(fake_server)
    assert out['dsa_server_up{node="n1"}'] == 1
    assert capped(out) == {"dp_split"}  # 8 requested over 8 attention-DP ranks: 1 each
    assert out['dsa_max_running_requests{dp_rank="3",node="n1",scope="requested"}'] == 1
    assert out['dsa_max_running_requests{dp_rank="3",node="n1",scope="effective"}'] == 1
    assert out['dsa_kv_token_capacity{dp_rank="7",node="n1"}'] == 4922240
    assert out['dsa_kv_cache_info{dtype="fp8_e4m3",layout="raw_fp8",node="n1"}'] == 1
    assert errors.counts()["server_info"] == 0


def test_mamba_cap_from_the_log_when_pristine(fake_server):
    fake_server.info.update(attn_dp_size=1, max_running_requests=48)
    for s in fake_server.info["internal_states"]:
        s["effective_max_running_requests_per_dp"] = 8
    log = LogState()
    log.feed(L.line(L.mamba_allocated(40), ("TP0",)).strip())
    log.feed(L.line(L.mamba_capped(8, 40, 5), ("TP0",)).strip())
    out, _ = metrics(fake_server, log)
    assert capped(out) == {"mamba"}
    assert out['dsa_mamba_running_requests_cap{dp_rank="",node="n1",rank="TP0"}'] == 8
    assert out['dsa_mamba_slots_per_request{dp_rank="",node="n1",rank="TP0"}'] == 5


def test_patched_fields_are_preferred(fake_server):
    fake_server.info.update(attn_dp_size=1, max_running_requests=48)
    for s in fake_server.info["internal_states"]:
        s.update(max_mamba_cache_size=100, mamba_state_slots_per_request=5, mamba_running_requests_cap=20)
    log = LogState()
    log.feed(L.line(L.mamba_capped(8, 40, 5), ("TP0",)).strip())  # an older run's figure: ignored
    out, _ = metrics(fake_server, log)
    assert capped(out) == {"mamba"}
    assert out['dsa_mamba_running_requests_cap{dp_rank="0",node="n1",rank=""}'] == 20
    assert out['dsa_mamba_cache_slots{dp_rank="0",node="n1",rank=""}'] == 100
    assert not any('rank="TP0"' in k for k in out)


def test_kv_binds(fake_server):
    fake_server.info.update(attn_dp_size=1, max_running_requests=4096)
    for s in fake_server.info["internal_states"]:
        s["memory_usage"]["token_capacity"] = 1000
    out, _ = metrics(fake_server)
    assert capped(out) == {"kv"}


def test_nothing_binds(fake_server):
    fake_server.info.update(attn_dp_size=1, max_running_requests=16)
    out, _ = metrics(fake_server)
    assert capped(out) == {"none"}


def test_worker_node_404_falls_back_to_health(fake_server):
    fake_server.info = None
    out, errors = metrics(fake_server)
    assert out['dsa_server_up{node="n1"}'] == 1 and errors.counts()["server_info"] == 0
    assert not any(k.startswith("dsa_concurrency_capped") for k in out)
    fake_server.health_status = 503
    out, errors = metrics(fake_server)
    assert out['dsa_server_up{node="n1"}'] == 0 and errors.counts()["server_info"] == 1


def test_foreign_json_is_down_and_counted(fake_server):
    fake_server.raw = b'{"status": "ok"}'
    out, errors = metrics(fake_server)
    assert out['dsa_server_up{node="n1"}'] == 0 and errors.counts()["server_info"] == 1


def test_garbage_inside_the_right_outline_is_counted(fake_server):
    fake_server.info["internal_states"] = [{"memory_usage": "oops"}]
    out, errors = metrics(fake_server)
    assert out['dsa_server_up{node="n1"}'] == 1 and errors.counts()["server_info"] == 1


def test_layouts():
    assert layout_of("torch.float8_e4m3fn", "tilelang", "tilelang") == "raw_fp8"
    assert layout_of("fp8_e4m3", "flashmla_sparse_q8", "tilelang") == "raw_fp8"
    assert layout_of("fp8_e4m3", "flashmla_sparse", "flashmla_kv") == "scaled_fp8"
    assert layout_of("fp8_e4m3", "trtllm", "trtllm") == "raw_fp8"
    assert layout_of("torch.float8_e4m3fnuz", "aiter", "aiter") == "raw_fp8"
    assert layout_of("fp8_e4m3", "triton", "triton") == "raw_fp8"  # /server_info alone on ROCm
    assert layout_of("torch.bfloat16", None, None) == "bf16"
    assert layout_of("torch.float8_e4m3fn", None, None) == "unknown"
    assert layout_of("torch.float16", "tilelang", "tilelang") == "other"


def test_plan(tmp_path):
    good = tmp_path / "plan.json"
    good.write_text(json.dumps({"kv_layout": "raw_fp8", "kv_pool_tokens_per_rank": 4922240}))
    assert read_plan(str(good)) == 4922240
    bad = tmp_path / "bad.json"
    bad.write_text('{"kv_layout": "raw_fp8"')
    with pytest.raises(UserError, match="kv_pool_tokens_per_rank"):
        read_plan(str(bad))
    bad.write_text('{"kv_pool_tokens_per_rank": -1}')
    with pytest.raises(UserError, match="positive integer"):
        read_plan(str(bad))
