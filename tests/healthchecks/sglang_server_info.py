"""/server_info's `internal_states[]` entries as the pinned wheel builds them, without importing SGLang.

`SchedulerInternalStateController.get_internal_state` and its contributors, `build_memory_usage`,
`RuntimeContext.resolved_server_args_dict` and `ServerArgs.resolved_dict` are lifted out of the
wheel (or a patched copy of it) and run over a scheduler stood in by plain values. The server
arguments are every field the wheel declares in `srt/arg_groups/fields/*.py`: as on a real
server, each of them (`max_mamba_cache_size` included) lands in every entry.
"""
from __future__ import annotations

import ast
import copy
import functools
from pathlib import Path
from types import SimpleNamespace

from tests.support.sglang_definitions import lift
from tests.support.sglang_wheel import sglang_source

INTERNAL_STATE = "sglang/srt/managers/scheduler_components/internal_state.py"
CONTRIBUTORS = ("_add_topology", "_add_memory_usage", "_add_mamba_caps", "_add_disaggregation", "_add_elastic_ep",
                "_add_speculative", "_add_step_times", "_add_rust_server", "_add_env_vars")


def server_arg_names(root: Path) -> list[str]:
    names = []
    for path in sorted((root / "sglang/srt/arg_groups/fields").glob("*.py")):
        for node in ast.parse(path.read_text()).body:
            for item in getattr(node, "body", []):
                if isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name):
                    names.append(item.target.id)
    return names


def resolved_dict(args: dict) -> dict:
    """ServerArgs.resolved_dict over `args` (every other declared argument None)."""
    root = sglang_source()
    fields = [SimpleNamespace(name=n) for n in server_arg_names(root)]
    ns = lift(root / "sglang/srt/server_args.py", ["_plain", "ServerArgs.resolved_dict"], {
        "copy": copy, "is_record": lambda value: False, "record_fields": lambda cls: fields,
        "resolution_result": lambda self, name: self.values.get(name),
        "resolving_view": lambda self: SimpleNamespace(attn_dp_size=self.values.get("attn_dp_size") or 1)})
    return ns["resolved_dict"](SimpleNamespace(values=args))


def internal_state(args: dict, scheduler: dict, patched: Path | None = None) -> dict:
    """One DP rank's `internal_states` entry, by the pinned wheel's internal_state.py or the one
    under `patched`. `scheduler`: max_running_requests, token_capacity, kvcache_gb, and mamba_caps
    (what the patched scheduler reports)."""
    root = sglang_source()
    path = (patched or root) / INTERNAL_STATE
    present = [c for c in CONTRIBUTORS if f"def {c}(" in path.read_text()]
    context = SimpleNamespace(server_args=SimpleNamespace(resolved_dict=lambda: resolved_dict(args)),
                              _overrides_log=[])
    ctx = lift(root / "sglang/srt/runtime_context.py", ["RuntimeContext.resolved_server_args_dict"])
    context.resolved_server_args_dict = functools.partial(ctx["resolved_server_args_dict"], context)
    usage = lift(root / "sglang/srt/managers/scheduler_components/memory_usage.py", ["build_memory_usage"], {
        "combine_graph_memory_usage": lambda target, draft: dict(target or {})})
    world = lift(root / "sglang/srt/server_args.py", ["compute_world_size"])
    ns = lift(path, ["SchedulerInternalStateController.get_internal_state",
                     *(f"SchedulerInternalStateController.{c}" for c in present)], {
        "get_context": lambda: context, "msgspec_to_builtins": lambda state: state,
        "GetInternalStateReqOutput": lambda internal_state: internal_state,
        "build_memory_usage": usage["build_memory_usage"], "compute_world_size": world["compute_world_size"],
        "get_parallel": lambda: SimpleNamespace(dp_size=1, tp_size=args.get("tp_size") or 1, pp_size=1),
        "get_exec": lambda: SimpleNamespace(moe=SimpleNamespace(elastic_ep_backend=None)),
        "envs": SimpleNamespace(SGLANG_EXPOSE_OWN_ENV_VARS=SimpleNamespace(get=lambda: False))})
    sched = SimpleNamespace(
        max_running_requests=scheduler["max_running_requests"], startup_time=1764410000.0,
        metrics_reporter=SimpleNamespace(last_gen_throughput=0.0),
        tp_worker=SimpleNamespace(model_runner=SimpleNamespace(weight_load_mem_usage=51.2), graph_memory_usage={}),
        token_to_kv_pool_allocator=SimpleNamespace(
            get_kvcache=lambda: SimpleNamespace(mem_usage=scheduler["kvcache_gb"])),
        startup_available_gpu_memory_gb=120.0, max_total_num_tokens=scheduler["token_capacity"],
        swa_tokens_per_layer=None, draft_worker=None, disaggregation_mode=None, rust_server=None,
        spec_algorithm=SimpleNamespace(is_none=lambda: True),
        mamba_caps=lambda: scheduler.get("mamba_caps"))
    controller = SimpleNamespace(scheduler=sched, record_step_time=False)
    for name in present:
        setattr(controller, name, functools.partial(ns[name], controller))
    return ns["get_internal_state"](controller, None)


def server_info(args: dict, schedulers: list[dict], patched: Path | None = None) -> dict:
    """/server_info: the resolved arguments, the scheduler's info and one entry per DP rank."""
    return {**resolved_dict(args), "max_total_num_tokens": schedulers[0]["token_capacity"],
            "internal_states": [internal_state(args, s, patched) for s in schedulers]}
