"""Patch 0005: the mamba concurrency caps in /server_info internal_states and as sglang:* gauges.

Run out of the patched wheel (sglang_definitions) with real prometheus_client gauges; the recorded
caps are checked against dsaops.concurrency, the one function the planner and exporter use.
"""
import ast
import functools
import logging
from types import SimpleNamespace

import pytest
from prometheus_client import CollectorRegistry, Gauge, generate_latest

from dsaops import concurrency
from tests.support.sglang_definitions import lift, statements
from tests.support.sglang_wheel import sglang_source

KV_CONFIGURATOR = "sglang/srt/mem_cache/kv_cache_configurator.py"
ALLOCATION_SIZING = "sglang/srt/mem_cache/allocation_sizing.py"
INTERNAL_STATE = "sglang/srt/managers/scheduler_components/internal_state.py"
SCHEDULER = "sglang/srt/managers/scheduler.py"
METRICS = "sglang/srt/observability/metrics_collector.py"
CAP_NAMES = ("max_mamba_cache_size", "mamba_state_slots_per_request", "mamba_running_requests_cap")


def configurator(root, *, mamba_cache, requested, attn_dp, extra_buffer=True, overlap=True, lazy=False,
                 skip_decode_lock=False, radix=True, hybrid=True):
    """A KVCacheConfigurator whose resolve_max_num_reqs and _calculate_mamba_ratio are the patched ones."""
    ns = lift(sglang_source() / ALLOCATION_SIZING, ["get_mamba_tracking_slots"])  # not patched
    ns = lift(root / KV_CONFIGURATOR, [
        "MAMBA_CACHE_SIZE_MAX_RUNNING_REQUESTS_RATIO", "MAMBA_CACHE_BASE_RATIO_DROP_ON_SKIP",
        "MAMBA_CACHE_V2_ADDITIONAL_RATIO_NO_BUFFER",
        "KVCacheConfigurator._calculate_mamba_ratio", "KVCacheConfigurator.resolve_max_num_reqs"], {
        "get_mamba_tracking_slots": ns["get_mamba_tracking_slots"],
        "logger": logging.getLogger("kv_cache_configurator"),
        "envs": SimpleNamespace(SGLANG_OPT_MAMBA_SKIP_DECODE_LOCK=SimpleNamespace(get=lambda: skip_decode_lock)),
        "get_memory": lambda: SimpleNamespace(disable_radix_cache=not radix),
        "get_exec": lambda: SimpleNamespace(mamba=SimpleNamespace(enable_mamba_extra_buffer=extra_buffer,
                                                                  enable_mamba_extra_buffer_lazy=lazy)),
        "get_schedule": lambda: SimpleNamespace(max_running_requests=requested, max_mamba_cache_size=mamba_cache,
                                                disable_overlap_schedule=not overlap),
    })
    kvc = SimpleNamespace(model_config=SimpleNamespace(context_len=32768), attn_dp_size=attn_dp,
                          mambaish_config=object() if hybrid else None, mamba_caps=None)
    kvc._calculate_mamba_ratio = functools.partial(ns["_calculate_mamba_ratio"], kvc)
    kvc.resolve_max_num_reqs = functools.partial(ns["resolve_max_num_reqs"], kvc)
    return kvc


@pytest.mark.parametrize("flags", [
    {},                                              # GLM-5.3-Flash default: extra buffer + overlap = 5 slots
    {"overlap": False},
    {"lazy": True},
    {"extra_buffer": False},
    {"extra_buffer": False, "skip_decode_lock": True},
    {"radix": False},
])
@pytest.mark.parametrize("mamba_cache, requested, attn_dp", [(211, 256, 8), (211, 8, 8), (40, None, 1)])
def test_recorded_caps_agree_with_dsaops_concurrency(patched_root, flags, mamba_cache, requested, attn_dp):
    token_capacity = 4_922_240 // attn_dp
    kvc = configurator(patched_root, mamba_cache=mamba_cache, requested=requested, attn_dp=attn_dp, **flags)
    effective = kvc.resolve_max_num_reqs(token_capacity)
    slots = concurrency.mamba_slots_per_request(
        disable_radix_cache=not flags.get("radix", True), extra_buffer=flags.get("extra_buffer", True),
        overlap=flags.get("overlap", True), lazy=flags.get("lazy", False),
        skip_decode_lock=flags.get("skip_decode_lock", False))
    expected = concurrency.resolve(requested=requested, attn_dp_size=attn_dp, token_capacity=token_capacity,
                                   context_len=32768, max_mamba_cache_size=mamba_cache, mamba_slots=slots)
    assert kvc.mamba_caps == {"max_mamba_cache_size": mamba_cache, "mamba_state_slots_per_request": slots,
                              "mamba_running_requests_cap": expected.mamba_cap}
    assert effective == expected.effective_per_dp


def test_glm_flash_default_caps(patched_root):
    kvc = configurator(patched_root, mamba_cache=211, requested=256, attn_dp=8)
    assert kvc.resolve_max_num_reqs(615_280) == 32
    assert kvc.mamba_caps == {"max_mamba_cache_size": 211, "mamba_state_slots_per_request": 5,
                              "mamba_running_requests_cap": 42}


def test_no_caps_for_a_model_without_mamba_state(patched_root):
    kvc = configurator(patched_root, mamba_cache=None, requested=256, attn_dp=8, hybrid=False)
    kvc.resolve_max_num_reqs(615_280)
    assert kvc.mamba_caps is None


CAPS = {"max_mamba_cache_size": 211, "mamba_state_slots_per_request": 5, "mamba_running_requests_cap": 42}


def scheduler(root, caps, *, with_configurator=True):
    ns = lift(root / SCHEDULER, ["Scheduler.mamba_caps"])
    runner = SimpleNamespace(kv_cache_configurator=SimpleNamespace(mamba_caps=caps)) if with_configurator \
        else SimpleNamespace()
    sched = SimpleNamespace(tp_worker=SimpleNamespace(model_runner=runner))
    sched.mamba_caps = functools.partial(ns["mamba_caps"], sched)
    return sched


def internal_state(root, sched):
    """get_internal_state as patched, with the other contributors reduced to no-ops."""
    ns = lift(root / INTERNAL_STATE, ["SchedulerInternalStateController.get_internal_state",
                                      "SchedulerInternalStateController._add_mamba_caps"], {
        "get_context": lambda: SimpleNamespace(resolved_server_args_dict=lambda: {"max_mamba_cache_size": 1688}),
        "msgspec_to_builtins": lambda state: state,
        "GetInternalStateReqOutput": lambda internal_state: internal_state,
    })
    controller = SimpleNamespace(scheduler=sched)
    for name in ("_add_topology", "_add_memory_usage", "_add_disaggregation", "_add_elastic_ep",
                 "_add_speculative", "_add_step_times", "_add_rust_server", "_add_env_vars"):
        setattr(controller, name, lambda state: None)
    controller._add_mamba_caps = functools.partial(ns["_add_mamba_caps"], controller)
    return ns["get_internal_state"](controller, None)


def test_server_info_internal_state_carries_the_caps_per_dp_rank(patched_root):
    state = internal_state(patched_root, scheduler(patched_root, CAPS))
    assert {k: state[k] for k in CAP_NAMES} == CAPS  # per rank: replaces the global server arg (1688)


def test_server_info_without_mamba_state_is_unchanged(patched_root):
    assert internal_state(patched_root, scheduler(patched_root, None)) == {"max_mamba_cache_size": 1688}
    no_configurator = scheduler(patched_root, CAPS, with_configurator=False)
    assert internal_state(patched_root, no_configurator) == {"max_mamba_cache_size": 1688}


def collector(root, registry):
    """The patched SchedulerMetricsCollector's gauges, registered in `registry`, and its emit_constants."""
    ns = lift(root / METRICS, ["SchedulerMetricsCollector._log_gauge", "SchedulerMetricsCollector.emit_constants"])
    col = SimpleNamespace(labels={"model_name": "glm", "engine_type": "unified", "tp_rank": 0, "pp_rank": 0,
                                  "moe_ep_rank": 0, "dp_rank": 3})
    gauges = statements(root / METRICS, "SchedulerMetricsCollector.__init__",
                        lambda s: isinstance(s, ast.Assign) and isinstance(s.value, ast.Call)
                        and getattr(s.value.func, "id", None) == "Gauge")
    code = compile(ast.Module(body=gauges, type_ignores=[]), str(root / METRICS), "exec")
    exec(code, {"self": col, "labels": col.labels, "Gauge": functools.partial(Gauge, registry=registry)})  # noqa: S102
    col._log_gauge = functools.partial(ns["_log_gauge"], col)
    return functools.partial(ns["emit_constants"], col)


def emit(root, caps):
    registry = CollectorRegistry()
    collector(root, registry)(
        max_total_num_tokens=615_280, max_total_num_tokens_swa=None, weight_memory_usage_gb=40.0,
        kv_cache_memory_usage_gb=4.1, graph_memory_usage_gb={}, max_running_requests_under_SLO=None,
        page_size=64, num_pages=9613, context_len=32768, startup_available_gpu_memory_gb=90.0, mamba_caps=caps)
    return generate_latest(registry).decode()


def test_gauges_are_emitted_with_the_contract_names(patched_root):
    text = emit(patched_root, CAPS)
    labels = 'dp_rank="3",engine_type="unified",model_name="glm",moe_ep_rank="0",pp_rank="0",tp_rank="0"'
    for name, value in CAPS.items():
        assert f"sglang:{name}{{{labels}}} {float(value)}" in text
    assert f"sglang:max_total_num_tokens{{{labels}}} 615280.0" in text


def test_no_cap_samples_without_mamba_state(patched_root):
    text = emit(patched_root, None)
    assert "sglang:max_total_num_tokens{" in text
    for name in CAP_NAMES:
        assert f"sglang:{name}{{" not in text


def test_scheduler_hands_the_caps_to_the_metrics_collector(patched_root):
    sched = scheduler(patched_root, CAPS)
    ns = lift(patched_root / SCHEDULER, ["Scheduler.emit_metrics_constants"], {
        "get_observability": lambda: SimpleNamespace(enable_metrics=True),
        "combine_graph_memory_usage": lambda target, draft: {},
    })
    emitted = {}
    sched.__dict__.update(
        metrics_collector=SimpleNamespace(emit_constants=lambda **kw: emitted.update(kw)), max_total_num_tokens=1,
        swa_tokens_per_layer=None, draft_worker=None, page_size=1, model_config=SimpleNamespace(context_len=1),
        startup_available_gpu_memory_gb=1.0,
        token_to_kv_pool_allocator=SimpleNamespace(page_size=1, get_kvcache=lambda: SimpleNamespace(mem_usage=1)))
    sched.tp_worker.model_runner.weight_load_mem_usage = 1.0
    sched.tp_worker.graph_memory_usage = {}
    ns["emit_metrics_constants"](sched)
    assert emitted["mamba_caps"] == CAPS


def test_pristine_has_none_of_the_names(pristine_root):
    """Control: 0.5.23 exports none of the caps (consumers must treat them as optional)."""
    for rel in (INTERNAL_STATE, SCHEDULER, METRICS, KV_CONFIGURATOR):
        text = (pristine_root / rel).read_text()
        assert "mamba_state_slots_per_request" not in text and "mamba_running_requests_cap" not in text
