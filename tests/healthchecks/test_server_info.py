"""/server_info in 0.5.23's shape -> metrics: capacity, max_running_requests, what binds
concurrency (dsaops.concurrency's vocabulary), mamba from the patch's fields or the log."""
from __future__ import annotations

import json

import pytest
from dsaops.healthchecks import server_info
from dsaops.healthchecks.logparse import LogState
from dsaops.healthchecks.metrics import ErrorCounts, Families
from dsaops.healthchecks.server_info import PlanFigures, ServerInfoCollector, ServerInfoPoller, layout_of, read_plan
from prometheus_client import CollectorRegistry, generate_latest

from benchmarks.sglang_standin import log_lines as L
from dsaops.errors import UserError
from tests.healthchecks.prometheus_text import exposition


def metrics(fake_server, log: LogState | None = None, plan=server_info.NO_PLAN, api_key=None):
    errors = ErrorCounts()
    poller = ServerInfoPoller(fake_server.url, errors, timeout=2, api_key=api_key)
    poller.poll()
    registry = CollectorRegistry(auto_describe=False)
    registry.register(ServerInfoCollector(poller, log, Families("n1"), plan))
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


def test_planned_binding_in_the_cap_vocabulary(fake_server):
    """The plan's binding beside the server's, labelled alike, so the alert can join them on `by`."""
    out, _ = metrics(fake_server, plan=PlanFigures(None, "dp_split"))
    assert capped(out) == {"dp_split"}
    assert {k: v for k, v in out.items() if k.startswith("dsa_concurrency_planned_binding")} == {
        f'dsa_concurrency_planned_binding{{by="{by}",node="n1"}}': float(by == "dp_split")
        for by in ("none", "dp_split", "kv", "mamba")}
    out, _ = metrics(fake_server, plan=PlanFigures(None, "request"))
    assert out['dsa_concurrency_planned_binding{by="none",node="n1"}'] == 1
    out, _ = metrics(fake_server)  # no --plan, or a plan without binding_limit: no series
    assert not any(k.startswith("dsa_concurrency_planned_binding") for k in out)


def test_worker_node_404_falls_back_to_health(fake_server):
    fake_server.info = None
    out, errors = metrics(fake_server)
    assert out['dsa_server_up{node="n1"}'] == 1 and errors.counts()["server_info"] == 0
    assert not any(k.startswith("dsa_concurrency_capped") for k in out)
    fake_server.health_status = 503
    out, errors = metrics(fake_server)
    assert out['dsa_server_up{node="n1"}'] == 0 and errors.counts()["server_info"] == 1


def test_a_server_with_an_api_key_needs_it_for_server_info(fake_server, capsys):
    fake_server.api_key = "k" * 32
    out, errors = metrics(fake_server)
    assert out['dsa_server_up{node="n1"}'] == 0 and errors.counts()["server_info"] == 1
    assert "answered 401: give the exporter the server's API key (--api-key-file)" in capsys.readouterr().err
    out, errors = metrics(fake_server, api_key="k" * 32)
    assert out['dsa_server_up{node="n1"}'] == 1 and errors.counts()["server_info"] == 0


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
    assert layout_of("torch.float8_e4m3fnuz", "flashmla_sparse", "flashmla_kv") == "raw_fp8"  # gfx942 never scales
    assert layout_of("fp8_e4m3", "triton", "triton") == "raw_fp8"  # /server_info alone on ROCm
    assert layout_of("torch.bfloat16", None, None) == "bf16"
    assert layout_of("torch.float8_e4m3fn", None, None) == "unknown"
    assert layout_of("torch.float16", "tilelang", "tilelang") == "other"


def test_plan(tmp_path):
    good = tmp_path / "plan.json"
    good.write_text(json.dumps({"kv_layout": "raw_fp8", "kv_pool_tokens_per_rank": 4922240}))
    assert read_plan(str(good)) == PlanFigures(4922240, None)  # no binding_limit: none exported
    good.write_text(json.dumps({"kv_pool_tokens_per_rank": 4922240, "binding_limit": "dp_split"}))
    assert read_plan(str(good)) == PlanFigures(4922240, "dp_split")
    bad = tmp_path / "bad.json"
    fix = r"give the output of `dsaops plan \.\.\. --json`$"
    with pytest.raises(UserError, match=rf"^cannot read --plan {bad}: No such file or directory; {fix}"):
        read_plan(str(bad))
    bad.write_text('{"kv_layout": "raw_fp8"')
    with pytest.raises(UserError, match=rf"^--plan {bad} is not JSON \(.*\): {fix}"):
        read_plan(str(bad))
    bad.write_text('{"kv_layout": "raw_fp8"}')
    with pytest.raises(UserError, match=rf"^--plan {bad}: no kv_pool_tokens_per_rank; {fix}"):
        read_plan(str(bad))
    for tokens in ("-1", "true"):
        bad.write_text(f'{{"kv_pool_tokens_per_rank": {tokens}}}')
        with pytest.raises(UserError, match="positive integer"):
            read_plan(str(bad))
    for binding in ("dp-split", None, ["kv"]):
        bad.write_text(json.dumps({"kv_pool_tokens_per_rank": 4922240, "binding_limit": binding}))
        with pytest.raises(UserError, match=r"^--plan .*: binding_limit must be one of request, dp_split, kv, mamba, "
                                            r"got .*; give the output of `dsaops plan \.\.\. --json`$"):
            read_plan(str(bad))


def test_a_plan_is_read_to_a_bound(tmp_path):
    """A --plan past 1 MiB (or /dev/zero) is refused, not read whole: json.load read it all first."""
    big = tmp_path / "plan.json"
    big.write_text('{"kv_pool_tokens_per_rank": 5' + " " * (2 << 20) + "}")
    with pytest.raises(UserError, match=r"^--plan .* is larger than 1 MiB: give the output"):
        read_plan(str(big))


# --- stock and patched SGLang, /server_info as the pinned wheel builds it --------------------

GLM_ARGS = {"attn_dp_size": 1, "tp_size": 1, "max_running_requests": 48, "context_length": 131072,
            "kv_cache_dtype": "fp8_e4m3", "dsa_prefill_backend": "tilelang", "dsa_decode_backend": "tilelang",
            "max_mamba_cache_size": 1688}  # the global argument: every internal_states entry carries it
SCHEDULER = {"max_running_requests": 8, "token_capacity": 4922240, "kvcache_gb": 32.48}


@pytest.fixture(scope="module")
def patched_tree(tmp_path_factory):
    from dsaops.sglang_patches import apply as tree
    from dsaops.sglang_patches.series import load

    from tests.support.sglang_wheel import sparse_copy

    series = load()
    root = sparse_copy(tmp_path_factory.mktemp("patched"), series)
    tree.apply(root, series)
    return root


def test_stock_internal_states_carry_max_mamba_cache_size_but_no_patch_marker():
    from tests.healthchecks.sglang_server_info import server_info as build

    state = build(GLM_ARGS, [SCHEDULER])["internal_states"][0]
    assert state["max_mamba_cache_size"] == 1688  # resolved_server_args_dict: every server argument
    assert not set(server_info.PATCH_MARKERS) & set(state)


def test_stock_server_takes_the_mamba_cap_from_the_log(fake_server):
    from tests.healthchecks.sglang_server_info import server_info as build

    fake_server.info = build(GLM_ARGS, [SCHEDULER])
    log = LogState()
    log.feed(L.line(L.mamba_allocated(40), ("TP0",)).strip())
    log.feed(L.line(L.mamba_capped(8, 40, 5), ("TP0",)).strip())
    out, errors = metrics(fake_server, log)
    assert errors.counts()["server_info"] == 0
    assert capped(out) == {"mamba"}  # 40 slots // 5 per request = 8 < 48
    assert out['dsa_mamba_running_requests_cap{dp_rank="",node="n1",rank="TP0"}'] == 8
    assert out['dsa_mamba_slots_per_request{dp_rank="",node="n1",rank="TP0"}'] == 5
    assert out['dsa_mamba_cache_slots{dp_rank="",node="n1",rank="TP0"}'] == 40  # not the global 1688
    assert not any(k.startswith("dsa_mamba") and 'dp_rank="0"' in k for k in out)


def test_negative_control_the_old_sign_drops_the_stock_cap(fake_server, monkeypatch):
    """Taking `max_mamba_cache_size` as the patch's sign (as the exporter once did) reads stock as
    patched: the cap and slots-per-request series are lost, which the test above would catch."""
    from tests.healthchecks.sglang_server_info import server_info as build

    monkeypatch.setattr(server_info, "PATCH_MARKERS", server_info.PATCH_KEYS)
    fake_server.info = build(GLM_ARGS, [SCHEDULER])
    log = LogState()
    log.feed(L.line(L.mamba_capped(8, 40, 5), ("TP0",)).strip())
    out, _ = metrics(fake_server, log)
    assert not any(k.startswith(("dsa_mamba_running_requests_cap", "dsa_mamba_slots_per_request")) for k in out)


def test_patched_server_gives_the_caps_per_dp_rank(fake_server, patched_tree):
    from tests.healthchecks.sglang_server_info import server_info as build

    caps = {"max_mamba_cache_size": 211, "mamba_state_slots_per_request": 5, "mamba_running_requests_cap": 42}
    fake_server.info = build(GLM_ARGS, [{**SCHEDULER, "mamba_caps": caps}] * 2, patched=patched_tree)
    assert fake_server.info["internal_states"][0]["max_mamba_cache_size"] == 211  # per rank, over the global 1688
    log = LogState()
    log.feed(L.line(L.mamba_capped(8, 40, 5), ("TP0",)).strip())  # an older run's figure: ignored
    out, errors = metrics(fake_server, log)
    assert errors.counts()["server_info"] == 0
    assert out['dsa_mamba_running_requests_cap{dp_rank="1",node="n1",rank=""}'] == 42
    assert out['dsa_mamba_cache_slots{dp_rank="0",node="n1",rank=""}'] == 211
    assert capped(out, "1") == {"mamba"}  # 42 < 48
    assert not any('rank="TP0"' in k for k in out)


def test_hybrid_free_model_on_a_patched_server_reads_as_stock(fake_server, patched_tree):
    from tests.healthchecks.sglang_server_info import server_info as build

    fake_server.info = build({**GLM_ARGS, "max_mamba_cache_size": None}, [SCHEDULER], patched=patched_tree)
    out, _ = metrics(fake_server, LogState())
    assert capped(out) == {"none"} and not any(k.startswith("dsa_mamba") for k in out)
