"""The planner's formulas against SGLang 0.5.23's own code, lifted from the pinned wheel."""
import itertools
import logging
import sys
from dataclasses import dataclass, field
from types import SimpleNamespace as NS

import numpy as np
import pytest
import torch

from dsaops import concurrency, kv_budget, kv_layout, model_geometry
from tests.support.sglang_definitions import define, fake_modules, value

KVC = "srt/mem_cache/kv_cache_configurator.py"
POOL = "srt/model_executor/pool_configurator.py"
MAMBA = "srt/configs/mamba_utils.py"
GLM = model_geometry.load_preset("glm-5.3-flash")


def _ratio_fn():
    """kv_cache_configurator.py _calculate_mamba_ratio with its constants and
    allocation_sizing.py get_mamba_tracking_slots, as pinned."""
    ns = {name: value(KVC, name) for name in ("MAMBA_CACHE_SIZE_MAX_RUNNING_REQUESTS_RATIO",
                                              "MAMBA_CACHE_BASE_RATIO_DROP_ON_SKIP",
                                              "MAMBA_CACHE_V2_ADDITIONAL_RATIO_NO_BUFFER")}
    define("srt/mem_cache/allocation_sizing.py", "get_mamba_tracking_slots", ns)
    return ns, define(KVC, "KVCacheConfigurator._calculate_mamba_ratio", ns)


def _set_mamba_flags(ns, *, radix_off, extra, overlap, lazy, skip):
    ns["get_memory"] = lambda: NS(disable_radix_cache=radix_off)
    ns["get_exec"] = lambda: NS(mamba=NS(enable_mamba_extra_buffer=extra, enable_mamba_extra_buffer_lazy=lazy))
    ns["get_schedule"] = lambda: NS(disable_overlap_schedule=not overlap)
    ns["envs"] = NS(SGLANG_OPT_MAMBA_SKIP_DECODE_LOCK=NS(get=lambda: skip))


def test_mamba_slots_per_request_match_calculate_mamba_ratio():
    ns, ratio = _ratio_fn()
    seen = set()
    for radix_off, extra, overlap, lazy, skip in itertools.product((False, True), repeat=5):
        if lazy and not extra:
            continue  # lazy is a flavour of the extra buffer
        _set_mamba_flags(ns, radix_off=radix_off, extra=extra, overlap=overlap, lazy=lazy, skip=skip)
        kwargs = {"disable_radix_cache": radix_off, "extra_buffer": extra, "overlap": overlap, "lazy": lazy,
                  "skip_decode_lock": skip}
        if lazy and not overlap and not radix_off:
            with pytest.raises(AssertionError):
                ratio(None)
            with pytest.raises(ValueError):
                concurrency.mamba_slots_per_request(**kwargs)
            continue
        assert concurrency.mamba_slots_per_request(**kwargs) == ratio(None), kwargs
        seen.add(ratio(None))
    assert seen == {1, 3, 4, 5}   # the grid reaches every rule: no radix, base, +1, +2


def test_resolve_matches_resolve_max_num_reqs():
    """The effective per-DP limit equals SGLang's, over requests, DP sizes, pools and mamba caches."""
    ns, ratio = _ratio_fn()
    _set_mamba_flags(ns, radix_off=False, extra=True, overlap=True, lazy=False, skip=False)
    ns["logger"] = logging.getLogger("sglang-lifted")
    resolve_max = define(KVC, "KVCacheConfigurator.resolve_max_num_reqs", ns)
    for requested, dp, tokens, mamba in itertools.product((None, 1, 8, 48, 256, 5000), (1, 2, 8),
                                                          (1000, 161_600, 4_922_240), (None, 40, 211, 5000)):
        schedule = NS(max_running_requests=requested, max_mamba_cache_size=mamba, disable_overlap_schedule=False)
        ns["get_schedule"] = lambda s=schedule: s
        kvc = NS(model_config=NS(context_len=202752), attn_dp_size=dp,
                 mambaish_config=object() if mamba is not None else None, _calculate_mamba_ratio=lambda: ratio(None))
        ours = concurrency.resolve(requested=requested, attn_dp_size=dp, token_capacity=tokens, context_len=202752,
                                   max_mamba_cache_size=mamba, mamba_slots=5 if mamba is not None else None)
        if mamba is not None and mamba // 5 <= 0:
            continue
        assert ours.effective_per_dp == resolve_max(kvc, tokens), (requested, dp, tokens, mamba)


@pytest.mark.parametrize("hip, fp8", [(False, torch.float8_e4m3fn), (True, torch.float8_e4m3fn),
                                       (True, torch.float8_e4m3fnuz)], ids=["cuda", "gfx950", "gfx942"])
def test_kv_layout_matches_calculate_mla_kv_cache_dim(hip, fp8):
    """Row widths per backend pair; fp8_e4m3 stores as gfx942's float8_e4m3fnuz on ROCm (kv_cache_dtype.py)."""
    pool = {"DSATokenToKVPool": NS(**{k: value("srt/mem_cache/memory_pool.py", f"DSATokenToKVPool.{k}", {"torch": torch})
                                      for k in ("quant_block_size", "rope_storage_dtype")})}
    ns = {"is_deepseek_dsa": lambda _: True, "get_disagg": lambda: NS(disaggregation_mode="null"),
          "_is_hip": hip, "torch": torch, **pool}
    dim_of = define(KVC, "calculate_mla_kv_cache_dim", ns)
    model = NS(hf_config=None, kv_lora_rank=GLM.kv_lora_rank, qk_rope_head_dim=GLM.qk_rope_head_dim)
    backends = ("tilelang", "flashmla_sparse", "flashmla_kv", "fa3", "trtllm", "triton", "aiter")
    for kv, (prefill, decode) in itertools.product(("bf16", "fp8_e4m3"), itertools.product(backends, repeat=2)):
        ns["get_exec"] = lambda p=prefill, d=decode: NS(kernel=NS(dsa_prefill_backend=p, dsa_decode_backend=d))
        dtype = torch.bfloat16 if kv == "bf16" else fp8
        sglang_bytes = dim_of(model_config=model, kv_cache_dtype=dtype) * dtype.itemsize
        layout = kv_layout.kv_layout(kv, kv_layout.Backends(prefill, decode, False), hip=hip, nope_q8=False,
                                     fp8_dtype=str(fp8).removeprefix("torch."))
        assert GLM.attention_bytes_per_layer(layout) == sglang_bytes, (kv, prefill, decode)


@pytest.mark.parametrize("hip", [False, True])
def test_refusals_match_check_dsa_backend_constraints(hip, monkeypatch):
    check = define("srt/arg_groups/overrides.py", "_check_dsa_backend_constraints", {})
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda *a: (9, 0))   # an H20, as upstream reported
    backends = ("tilelang", "flashmla_sparse", "flashmla_kv", "trtllm", "triton", "aiter")
    refused = 0
    for kv, (prefill, decode) in itertools.product(("bfloat16", "fp8_e4m3"), itertools.product(backends, repeat=2)):
        try:
            check(kv, prefill, decode, hip=hip)
            sglang = None
        except ValueError as e:
            sglang = str(e)
        try:
            kv_layout.check_backends(kv_layout.normalize_kv_dtype(kv), kv_layout.Backends(prefill, decode, False),
                                     hip=hip, q8_prefill=True, nope_q8=False, skipped=False)
            ours = None
        except kv_layout.BackendRefused as e:
            ours = str(e)
        assert ours == sglang, (kv, prefill, decode)
        refused += sglang is not None
    assert refused > 0 or hip


@pytest.mark.parametrize("arch", ["Glm5NextForConditionalGeneration", "GlmMoeDsaForCausalLM", "DeepseekV32ForCausalLM"])
def test_default_backends_match_dsa_split_backend_resolution(arch, monkeypatch):
    """The backends SGLang picks for the sides left unset, per architecture, SM major and KV dtype
    (GLM-5 fp8 on SM12x gets flashinfer_sparse_mla, a scaled layout), and where it skips its backend check."""
    ov = "srt/arg_groups/overrides.py"
    fake_modules(monkeypatch, {"sglang.srt.configs.model_config": {"is_deepseek_dsa": lambda c: True}})
    checked = []
    ns = {"logger": logging.getLogger("sglang-lifted"), "_DEEPSEEK_FAMILY_ARCHS": value(ov, "_DEEPSEEK_FAMILY_ARCHS"),
          "_check_dsa_backend_constraints": lambda *a, **k: checked.append(a),   # refusals: test_refusals_match_...
          "model_config_of": lambda view: NS(hf_config=NS(architectures=[arch])),
          "get_platform": lambda: NS(is_npu=False, is_xpu=False, is_hip=False)}
    pick = define(ov, "_dsa_split_backend_resolution", ns)
    for major, kv, (prefill, decode) in itertools.product((9, 10, 12), ("bfloat16", "fp8_e4m3"),
                                                          ((None, None), ("tilelang", None), (None, "tilelang"))):
        monkeypatch.setattr(torch.cuda, "get_device_capability", lambda *a, m=major: (m, 0))
        view = NS(kv_cache_dtype=kv, dsa_prefill_backend=prefill, dsa_decode_backend=decode, enable_hisparse=False)
        checked.clear()
        sglang = {"dsa_prefill_backend": prefill, "dsa_decode_backend": decode, **pick(view)}
        ours = kv_layout.resolve_backends(kv_layout.normalize_kv_dtype(kv), prefill, decode, hip=False,
                                          sm_major=major, architecture=arch)
        assert (ours.prefill, ours.decode) == (sglang["dsa_prefill_backend"], sglang["dsa_decode_backend"]), (major, kv)
        skipped = kv_layout.skips_backend_check(kv_layout.normalize_kv_dtype(kv), hip=False, sm_major=major,
                                                architecture=arch)
        assert skipped == (not checked), (major, kv)


def patched_check(root, monkeypatch):
    """_check_dsa_backend_constraints after the series, with the q8 predicate it imports."""
    q8 = define("srt/configs/model_config.py", "is_q8_raw_fp8_nope_layout", {}, root=root)
    fake_modules(monkeypatch, {"sglang.srt.configs.model_config": {"is_q8_raw_fp8_nope_layout": q8}})
    return define("srt/arg_groups/overrides.py", "_check_dsa_backend_constraints",
                {"logger": logging.getLogger("sglang-lifted")}, root=root)


@pytest.mark.parametrize("rope", [0, 64])
def test_patched_refusals_and_layouts_match(patched_root, rope, monkeypatch):
    """The series admits q8 prefill + tilelang decode over the raw pool for NoPE MLA only; the plan
    agrees on what is refused (its text leads SGLang's) and on the row width (patched calculate_mla_kv_cache_dim)."""
    check = patched_check(patched_root, monkeypatch)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda *a: (9, 0))
    q8 = sys.modules["sglang.srt.configs.model_config"].is_q8_raw_fp8_nope_layout
    ns = {"is_deepseek_dsa": lambda _: True, "get_disagg": lambda: NS(disaggregation_mode="null"), "_is_hip": False,
          "torch": torch, "is_q8_raw_fp8_nope_layout": q8,
          "DSATokenToKVPool": NS(quant_block_size=128, rope_storage_dtype=torch.bfloat16)}
    dim_of = define(KVC, "calculate_mla_kv_cache_dim", ns, root=patched_root)
    geometry = model_geometry.from_config({**json_preset(), "qk_rope_head_dim": rope}, name="t")
    model = NS(hf_config=None, kv_lora_rank=512, qk_rope_head_dim=rope)
    prefills = ("tilelang", "flashmla_sparse_q8", "flashmla_sparse", "flashmla_kv", "trtllm")
    decodes = ("tilelang", "flashmla_sparse", "flashmla_kv", "trtllm")
    admitted_q8 = 0
    for prefill, decode in itertools.product(prefills, decodes):
        b = kv_layout.Backends(prefill, decode, False)
        nope_q8 = kv_layout.q8_raw_nope(b, kv_lora_rank=512, qk_rope_head_dim=rope)
        try:
            check("fp8_e4m3", prefill, decode, hip=False, kv_lora_rank=512, qk_rope_head_dim=rope)
            sglang = None
        except ValueError as e:
            sglang = str(e)
        try:
            kv_layout.check_backends("fp8_e4m3", b, hip=False, q8_prefill=True, nope_q8=nope_q8, skipped=False)
            ours = None
        except kv_layout.BackendRefused as e:
            ours = str(e)
        assert (ours is None) == (sglang is None), (prefill, decode, sglang)
        assert sglang is None or sglang.startswith(ours), (prefill, decode)
        if sglang is None:
            ns["get_exec"] = lambda p=prefill, d=decode: NS(kernel=NS(dsa_prefill_backend=p, dsa_decode_backend=d))
            layout = kv_layout.kv_layout("fp8_e4m3", b, hip=False, nope_q8=nope_q8, fp8_dtype="float8_e4m3fn")
            assert geometry.attention_bytes_per_layer(layout) == dim_of(model_config=model,
                                                                        kv_cache_dtype=torch.float8_e4m3fn)
            admitted_q8 += prefill == "flashmla_sparse_q8" and decode == "tilelang"
    assert admitted_q8 == (1 if rope == 0 else 0)


def test_boot_gate_message_is_sglangs(monkeypatch):
    """The pairing the boot gate launches is refused with exactly the text verify waits for."""
    check = define("srt/arg_groups/overrides.py", "_check_dsa_backend_constraints", {})
    with pytest.raises(ValueError) as refusal:
        check("fp8_e4m3", "tilelang", "flashmla_sparse", hip=False)
    assert str(refusal.value) == kv_layout.MIXED_TILELANG_REFUSAL


def test_indexer_bytes_match_compute_dsa_indexer_cell_size(monkeypatch):
    """_compute_dsa_indexer_cell_size with the pinned skip-top-k rule (dsa_layer_skips_topk)."""
    ns = {"torch": torch, "_is_npu": False, "get_memory": lambda: NS(enable_hisparse=False),
          "DSATokenToKVPool": NS(quant_block_size=value("srt/mem_cache/memory_pool.py", "DSATokenToKVPool.quant_block_size"),
                                 index_k_with_scale_buffer_dtype=torch.uint8),
          "get_dsa_index_head_dim": lambda c: c.index_head_dim,
          "get_dsa_index_kpool": lambda c: getattr(c, "index_kpool", 1),
          "is_deepseek_dsa": lambda c: True}
    define("srt/utils/common.py", "ceil_div", ns)
    skips = define("srt/configs/model_config.py", "dsa_layer_skips_topk", ns)
    define(POOL, "_get_dsa_cache_layer_ids", ns)
    cell = define(POOL, "DefaultPoolConfigurator._compute_dsa_indexer_cell_size", ns)
    fake_modules(monkeypatch, {
        "sglang.srt.mem_cache.kv_cache_configurator": {"_should_elide_dsa_index_k": lambda **_: True},
        "sglang.srt.layers.cp.utils": {"get_glm_dsa_cp_layer_shard_info": lambda kvc: (None, 1),
                                       "get_layer_shard_range": None},   # only used with CP layer split
        "sglang.srt.configs.model_config": {"dsa_layer_skips_topk": skips}})
    for extra in ({}, {"index_topk_freq": 2}, {"index_topk_pattern": "FFFSFFFSFFFSFFFSFFFSFFFSFFFSFFFSFFFSFFFSFFFSF"}):
        raw = {**json_preset(), **extra}
        geometry = model_geometry.from_config(raw, name="t")
        hf = NS(**{k: v for k, v in raw.items() if not k.startswith("_")})
        kvc = NS(model_config=NS(hf_config=hf), is_draft_worker=False, server_args=NS(enable_hisparse=False),
                 mambaish_config=NS(full_attention_layer_ids=list(geometry.full_attention_layers)),
                 layer_info=NS(start_layer=0, end_layer=geometry.num_layers))
        n = len(geometry.full_attention_layers)
        assert cell(None, kvc=kvc, num_layers=n) == geometry.kv_bytes_per_token("raw_fp8")["indexer"], extra
    assert geometry.kv_bytes_per_token("raw_fp8")["indexer_layers"] < 11   # the pattern skipped some


def json_preset() -> dict:
    import json

    return json.loads((model_geometry.MODELS_DIR / "glm-5.3-flash.json").read_text())


def test_preset_and_layers_match_glm5_next_config_defaults():
    """Glm5NextTextConfig (pinned) builds the same layer split and defaults as the preset."""
    class PretrainedConfig:
        def __init__(self, **kwargs):
            for k, v in kwargs.items():
                setattr(self, k, v)
    ns = {"PretrainedConfig": PretrainedConfig}
    cfg = define("srt/configs/glm5_next.py", "Glm5NextTextConfig", ns)(index_head_dim=128, index_topk=2048)
    assert GLM.full_attention_layers == tuple(cfg.full_attention_layer_ids)
    assert GLM.linear_layers == tuple(cfg.linear_layer_ids)
    assert (len(GLM.full_attention_layers), len(GLM.linear_layers)) == (11, 34)
    for key in ("num_hidden_layers", "kv_lora_rank", "qk_rope_head_dim", "max_position_embeddings"):
        assert json_preset()[key] == getattr(cfg, key), key
    lin = cfg.linear_attn_config
    assert (GLM.linear_num_heads, GLM.linear_head_dim, GLM.linear_conv_kernel) == (
        lin["num_heads"], lin["head_dim"], lin["short_conv_kernel_size"])


@pytest.mark.parametrize("tp", [1, 2, 4, 8])
@pytest.mark.parametrize("ssm", [torch.float32, torch.bfloat16])
def test_mamba_slot_bytes_match_mamba_cache_per_req(tp, ssm):
    ns = {"dataclass": dataclass, "field": field, "np": np, "torch": torch, "ABC": object, "mamba2_state_dtype": None}
    define("srt/distributed/utils.py", "ensure_divisibility", ns)
    define("srt/distributed/utils.py", "divide", ns)
    for cls in ("Mamba2StateDType", "BaseLinearStateParams", "KimiLinearStateShape", "KimiLinearCacheParams"):
        define(MAMBA, cls, ns)
    shape = ns["KimiLinearStateShape"].create(tp_world_size=tp, num_heads=GLM.linear_num_heads,
                                              head_dim=GLM.linear_head_dim, conv_kernel_size=GLM.linear_conv_kernel)
    params = ns["KimiLinearCacheParams"](shape=shape, layers=list(GLM.linear_layers),
                                         dtype=ns["Mamba2StateDType"](conv=torch.bfloat16, temporal=ssm))
    assert GLM.mamba_slot_bytes(tp, ssm_bytes=ssm.itemsize)["total"] == params.mamba_cache_per_req


def test_pool_tokens_match_calculate_pool_sizes():
    ns = {"dataclass": dataclass}
    config_cls = define(POOL, "MemoryPoolConfig", ns)
    sizes = define(POOL, "DefaultPoolConfigurator.calculate_pool_sizes", {"MemoryPoolConfig": config_cls})
    for cell, budget in itertools.product((12716, 7084, 7260), (1 << 30, 32.47 * (1 << 30), 123_456_789_012)):
        me = NS(_fixed_overhead_bytes=0, _cell_size=cell, _zero_kv_max_tokens=0)
        expected = sizes(me, int(budget), GLM.page_tokens).max_total_num_tokens
        assert kv_budget.kv_pool_tokens(budget, cell_bytes=cell, page_tokens=GLM.page_tokens) == expected


def test_mamba_pool_matches_handle_max_mamba_cache():
    """_handle_max_mamba_cache (pinned) over budgets, DP sizes, explicit sizes, radix off and speculative
    decoding: the same slot count and the same memory left for the KV pool."""
    ns, ratio = _ratio_fn()
    _set_mamba_flags(ns, radix_off=False, extra=True, overlap=True, lazy=False, skip=False)
    ns.update(_pd_prefill_skips_mamba_spec_state=lambda: False)
    handle = define(KVC, "KVCacheConfigurator._handle_max_mamba_cache", ns)
    slot = GLM.mamba_slot_bytes(1)["total"]
    grid = itertools.product((2.24, 61.6), (1, 8), (None, 40, 300), (None, 6), (False, True), (None, 12, 256))
    checked = 0
    for rest, dp, size, draft, radix_off, running in grid:
        if draft and running is None:
            continue   # SGLang asserts max_running_requests with speculative decoding (its hook defaults it)
        schedule = NS(max_running_requests=running, max_mamba_cache_size=size, mamba_full_memory_ratio=0.9,
                      disable_overlap_schedule=False)
        ns["get_schedule"] = lambda s=schedule: s
        ns["get_memory"] = lambda r=radix_off: NS(disable_radix_cache=r)
        ns["get_spec"] = lambda d=draft: NS(speculative_num_draft_tokens=d)
        ns["get_exec"] = lambda: NS(mamba=NS(enable_linear_replayssm_spec=False, enable_mamba_extra_buffer=True,
                                             enable_mamba_extra_buffer_lazy=False))
        ns["get_context"] = lambda s=schedule: NS(override=lambda name, max_mamba_cache_size: setattr(
            s, "max_mamba_cache_size", max_mamba_cache_size))
        kvc = NS(mambaish_config=NS(mamba2_cache_params=NS(layers=list(GLM.linear_layers), mamba_cache_per_req=slot)),
                 pp_size=1, fused_entry_bytes=lambda name: None, spec_algorithm=NS(is_none=lambda d=draft: not d),
                 hybrid_gdn_config=None, hybrid_kda_config=object(), extra_mamba_cache_bytes_per_req=0,
                 attn_dp_size=dp, _calculate_mamba_ratio=lambda: ratio(None))
        try:
            sglang_rest = handle(kvc, rest)
        except RuntimeError:
            with pytest.raises(kv_budget.NotEnoughMemory):
                _our_mamba(rest, slot, dp, size, running, radix_off, draft)
            continue
        ours = _our_mamba(rest, slot, dp, size, running, radix_off, draft)
        assert ours.slots_per_dp == schedule.max_mamba_cache_size
        assert rest - ours.bytes / kv_budget.GIB == pytest.approx(sglang_rest, abs=1e-9)
        checked += 1
    assert checked > 100


def _our_mamba(rest, slot, dp, size, running, radix_off, draft):
    slots_per_request = 1 if radix_off else 5   # _calculate_mamba_ratio, as the lifted code sees it
    return kv_budget.mamba_pool(rest, slot_bytes=slot, attn_dp_size=dp, slots_per_request=slots_per_request,
                                max_mamba_cache_size=size,
                                max_running_requests=running, disable_radix_cache=radix_off, full_memory_ratio=0.9,
                                draft_tokens=draft)


def test_adaptive_pools_are_budgeted_for_the_start_and_keep_scratch_for_the_largest(monkeypatch):
    """Under --speculative-adaptive the mamba budget (pinned _handle_max_mamba_cache) reads the draft tokens SGLang
    starts with, while the hybrid pool takes max_speculative_num_draft_tokens() for its verify scratch: the largest
    candidate step + 1 (resolve_max_speculative_num_draft_tokens, run). What the budget would reserve for that many,
    less what it reserves, is the plan's unbudgeted scratch, on both branches that fix the slot count."""
    import ast
    import json

    from dsaops import plan
    from tests.support.sglang_definitions import lift, source_file

    def function(rel, name, within=None):
        scope = ast.parse(source_file(rel).read_text())
        if within:
            scope = next(n for n in ast.walk(scope) if isinstance(n, ast.ClassDef) and n.name == within)
        return next(n for n in ast.walk(scope) if isinstance(n, ast.FunctionDef) and n.name == name)

    budget = ast.unparse(function(KVC, "_handle_max_mamba_cache"))
    assert "D = get_spec().speculative_num_draft_tokens" in budget and "max_speculative_num_draft_tokens" not in budget
    pool = next(n for n in ast.walk(function(KVC, "_build_hybrid_req_pool"))
                if isinstance(n, ast.Call) and getattr(n.func, "id", "") == "HybridReqToTokenPool")
    scratch = next(k.value for k in pool.keywords if k.arg == "speculative_num_draft_tokens")
    assert "max_speculative_num_draft_tokens()" in ast.unparse(scratch)
    assert "size=(num_mamba_layers, spec_state_size + 1, speculative_num_draft_tokens, temporal_state_shape[0]" in \
        ast.unparse(function("srt/mem_cache/memory_pool.py", "__init__", within="MambaPool"))

    config = lift(source_file("srt/speculative/adaptive_spec_params.py"),
                  ["DEFAULT_ADAPTIVE_CONFIG", "_load_adaptive_config", "resolve_candidate_steps_from_config"],
                  {"json": json})
    fake_modules(monkeypatch, {"sglang.srt.speculative.adaptive_spec_params": config,
                               "sglang.srt.arg_groups.overrides": {"resolving_view": lambda args: args}})
    largest = define("srt/speculative/spec_info.py", "SpeculativeAlgorithm.resolve_max_speculative_num_draft_tokens", {})
    for adaptive, start in ((True, 4), (True, 2), (False, 4)):
        args = NS(speculative_num_draft_tokens=start, speculative_adaptive=adaptive, speculative_adaptive_config=None)
        assert largest(None, args) == (max(plan.ADAPTIVE_STEPS) + 1 if adaptive else start)

    ns, ratio = _ratio_fn()
    _set_mamba_flags(ns, radix_off=False, extra=True, overlap=True, lazy=False, skip=False)
    ns.update(_pd_prefill_skips_mamba_spec_state=lambda: False)
    handle = define(KVC, "KVCacheConfigurator._handle_max_mamba_cache", ns)
    slot = GLM.mamba_slot_bytes(1)["total"]

    def rest_after(draft, size, radix_off, dp, running):
        schedule = NS(max_running_requests=running, max_mamba_cache_size=size, mamba_full_memory_ratio=0.9,
                      disable_overlap_schedule=False)
        ns.update(get_schedule=lambda: schedule, get_memory=lambda: NS(disable_radix_cache=radix_off),
                  get_spec=lambda: NS(speculative_num_draft_tokens=draft),
                  get_exec=lambda: NS(mamba=NS(enable_linear_replayssm_spec=False, enable_mamba_extra_buffer=True,
                                               enable_mamba_extra_buffer_lazy=False)),
                  get_context=lambda: NS(override=lambda name, max_mamba_cache_size: setattr(
                      schedule, "max_mamba_cache_size", max_mamba_cache_size)))
        kvc = NS(mambaish_config=NS(mamba2_cache_params=NS(layers=list(GLM.linear_layers), mamba_cache_per_req=slot)),
                 pp_size=1, fused_entry_bytes=lambda name: None, spec_algorithm=NS(is_none=lambda: False),
                 hybrid_gdn_config=None, hybrid_kda_config=object(), extra_mamba_cache_bytes_per_req=0,
                 attn_dp_size=dp, _calculate_mamba_ratio=lambda: ratio(None))
        return handle(kvc, 61.6)

    for size, radix_off, dp, running in itertools.product((40, 300, None), (False, True), (1, 8), (12, 256)):
        if size is None and not radix_off:
            continue   # the auto branch solves the slot count for the draft tokens: no like-for-like difference
        sglang = rest_after(4, size, radix_off, dp, running) - rest_after(8, size, radix_off, dp, running)
        ours = kv_budget.mamba_pool(61.6, slot_bytes=slot, attn_dp_size=dp, slots_per_request=1 if radix_off else 5,
                                    max_mamba_cache_size=size, max_running_requests=running, disable_radix_cache=radix_off,
                                    full_memory_ratio=0.9, draft_tokens=4, scratch_tokens=8)
        assert ours.unbudgeted / kv_budget.GIB == pytest.approx(sglang, abs=1e-9)
        assert ours.unbudgeted > 0
    static = kv_budget.mamba_pool(61.6, slot_bytes=slot, attn_dp_size=1, slots_per_request=5, max_mamba_cache_size=None,
                                  max_running_requests=48, disable_radix_cache=False, full_memory_ratio=0.9,
                                  draft_tokens=4)
    assert static.unbudgeted == 0   # negative control: no switch, the pool keeps what the budget reserves

def test_speculative_running_requests_default_is_handle_eagle_familys():
    """MTP runs as EAGLE: with --max-running-requests unset, _handle_eagle_family declares the plan's default."""
    import ast

    from tests.support.sglang_definitions import source_file

    fn = next(n for n in ast.walk(ast.parse(source_file("srt/arg_groups/speculative_hook.py").read_text()))
              if isinstance(n, ast.FunctionDef) and n.name == "_handle_eagle_family")
    declared = [ast.literal_eval(k.value) for n in ast.walk(fn) if isinstance(n, ast.Call)
                and getattr(n.func, "id", "") == "declare_resolution" for k in n.keywords
                if k.arg == "max_running_requests"]
    assert declared == [concurrency.SPEC_DEFAULT_RUNNING_REQUESTS]


def test_activation_estimate_is_handle_gpu_memory_settings():
    """The prefill bound fits SGLang's own activation estimate (memory_hook.py), statement for statement."""
    import ast

    from tests.support.sglang_definitions import source_file

    fn = next(n for n in ast.walk(ast.parse(source_file("srt/arg_groups/memory_hook.py").read_text()))
              if isinstance(n, ast.FunctionDef) and n.name == "handle_gpu_memory_settings")
    code = {ast.unparse(n) for n in ast.walk(fn) if isinstance(n, (ast.Assign, ast.AugAssign))}
    assert f"reserved_mem = {kv_budget.ACTIVATION_BASE_MIB}" in code
    assert f"reserved_mem += activation_tokens * {kv_budget.ACTIVATION_MIB_PER_TOKEN}" in code
    assert f"activation_tokens = max(cfg.chunked_prefill_size, {kv_budget.ACTIVATION_MIN_TOKENS})" in code
    assert kv_budget.activation_gib(4096) == (512 + 1.5 * 4096) / 1024
    assert kv_budget.activation_gib(1024) == kv_budget.activation_gib(2048)   # SGLang counts at least 2048


def test_deprecated_dp_attention_resolves_as_handle_deprecated_dp_attention():
    """`--dp-size N --enable-dp-attention`, with `--attn-dp-size` unset, 1 or wider: the plan's
    attention-DP groups and replicas, and node_ranks' rank count, are what the pinned hook resolves."""
    from dsaops import node_ranks, plan

    def declare(args, _name, **fields):
        vars(args).update(fields)

    ns = {"resolving_view": lambda args: args, "declare_resolution": declare}
    resolve = define("srt/arg_groups/parallel_hook.py", "handle_deprecated_dp_attention", ns)
    for dp, attn, enabled in itertools.product((1, 2, 8), (None, 1, 2, 8), (False, True)):
        sglang = NS(dp_size=dp, attn_dp_size=attn or 1, enable_dp_attention=enabled)
        resolve(sglang)
        if 8 % sglang.attn_dp_size:
            continue
        req = plan.PlanRequest(target="sm_90", nodes=1, gpus_per_node=8 * sglang.dp_size, tp_size=8,
                               kv_cache_dtype="bf16", mem_fraction_static=0.8, gpu_memory_gib=140, dp_size=dp,
                               enable_dp_attention=enabled, attn_dp_size=attn)
        par = plan._parallelism(req)
        assert (par.attn_dp_size, par.dp_size) == (sglang.attn_dp_size, sglang.dp_size), (dp, attn, enabled)
        argv = ["--tp-size", "8", "--dp-size", str(dp), *(["--attn-dp-size", str(attn)] if attn else []),
                *(["--enable-dp-attention"] if enabled else [])]
        assert node_ranks.ranks_per_node(argv) == 8 * sglang.dp_size, argv


def test_multimodal_dsa_architectures_are_sglangs():
    """Among the architectures is_deepseek_dsa names, the ones is_multimodal_model (pinned) counts as
    multimodal, whose memory reservation SGLang takes out of the KV budget with or without a vision_config."""
    import ast

    from tests.support.sglang_definitions import source_file

    mc = "srt/configs/model_config.py"
    fn = next(n for n in ast.walk(ast.parse(source_file(mc).read_text()))
              if isinstance(n, ast.FunctionDef) and n.name == "is_deepseek_dsa")
    dsa = {c.value for n in ast.walk(fn) if isinstance(n, ast.Tuple) for c in n.elts if isinstance(c, ast.Constant)}
    ns = {"multimodal_model_archs": value(mc, "multimodal_model_archs",
                                          {"MIMO_V2_MULTIMODAL_ARCHS": value(mc, "MIMO_V2_MULTIMODAL_ARCHS")})}
    is_multimodal = define(mc, "is_multimodal_model", ns)
    assert "GlmMoeDsaForCausalLM" in dsa
    raw = {k: v for k, v in json_preset().items() if k != "_dsaops"}
    for arch in sorted(dsa):
        geometry = model_geometry.from_config({**raw, "architectures": [arch]}, name="t")
        assert geometry.multimodal == is_multimodal([arch]), arch


def test_multimodal_reservation_is_mm_runtime_reservation_gb():
    """The reservation the plan takes out of the KV budget is the pinned mm_runtime_reservation_gb, with
    environ.py's defaults, for each feature transport and with or without a multimodal model."""
    env = {name: value("srt/environ.py", f"Envs.{name}", {"EnvInt": int})
           for name in ("SGLANG_VLM_CACHE_SIZE_MB", "SGLANG_MM_FEATURE_CACHE_MB")}
    envs = NS(**{name: NS(get=lambda mb=mb: mb) for name, mb in env.items()})
    reservation = define(KVC, "mm_runtime_reservation_gb", {"envs": envs, "logger": logging.getLogger(__name__)})
    for multimodal, transport in itertools.product((False, True), ("cpu", "cuda_ipc", "cuda_vmm")):
        assert kv_budget.mm_reservation_gib(multimodal=multimodal, mm_feature_transport=transport) == reservation(
            is_multimodal=multimodal, mm_feature_transport=transport), (multimodal, transport)


def test_feature_transports_are_sglangs_less_cuda_vmm_which_no_dsa_model_supports():
    """--mm-feature-transport takes SGLang's choices but cuda_vmm: the tokenizer manager refuses it for a
    model class without supports_cuda_vmm_feature_transport, and no DSA architecture's class (or base) has it."""
    import ast

    from dsaops import plan_input
    from tests.support.sglang_definitions import source_file

    field = next(n for n in ast.walk(ast.parse(source_file("srt/arg_groups/fields/mm.py").read_text()))
                 if isinstance(n, ast.AnnAssign) and getattr(n.target, "id", "") == "mm_feature_transport")
    literal = next(n for n in ast.walk(field.annotation) if isinstance(n, ast.Subscript)
                   and getattr(n.value, "id", "") == "Literal")
    assert {*plan_input.MM_FEATURE_TRANSPORTS, "cuda_vmm"} == set(ast.literal_eval(literal.slice))
    assert "is not supported by model class" in source_file("srt/managers/tokenizer_manager.py").read_text()
    classes = [n for path in source_file("srt/models").glob("*.py") for n in ast.walk(ast.parse(path.read_text()))
               if isinstance(n, ast.ClassDef)]
    vmm = {c.name for c in classes if any(isinstance(s, ast.Assign) and "supports_cuda_vmm_feature_transport"
                                          in ast.unparse(s) and ast.unparse(s.value) == "True" for s in c.body)}
    while grown := {c.name for c in classes if c.name not in vmm and {getattr(b, "id", "") for b in c.bases} & vmm}:
        vmm |= grown
    fn = next(n for n in ast.walk(ast.parse(source_file("srt/configs/model_config.py").read_text()))
              if isinstance(n, ast.FunctionDef) and n.name == "is_deepseek_dsa")
    dsa = {c.value for n in ast.walk(fn) if isinstance(n, ast.Tuple) for c in n.elts if isinstance(c, ast.Constant)}
    assert "DeepseekV4ForCausalLM" in vmm and not vmm & dsa


def test_no_launch_flag_turns_a_dsa_models_multimodality_off():
    """is_multimodal needs enable_multimodal and not language_model_only: --language-model-only is refused for
    every DSA architecture, and enable_multimodal left unset resolves on for them (--enable-multimodal only
    sets it), so only the config's own language_model_only key (model_geometry) drops the reservation."""
    import ast

    from tests.support.sglang_definitions import source_file

    mc = "srt/configs/model_config.py"
    tree = ast.parse(source_file(mc).read_text())
    fn = next(n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef) and n.name == "is_deepseek_dsa")
    dsa = {c.value for n in ast.walk(fn) if isinstance(n, ast.Tuple) for c in n.elts if isinstance(c, ast.Constant)}
    disabled = next(ast.literal_eval(n.value) for n in ast.walk(tree) if isinstance(n, ast.Assign)
                    and getattr(n.targets[0], "id", "") == "mm_disabled_models")
    lm_only = value("srt/server_args.py", "ServerArgs.LANGUAGE_MODEL_ONLY_ARCHITECTURES")
    assert "DeepseekV4ForCausalLM" in lm_only and "Gemma3ForConditionalGeneration" in disabled
    assert not dsa & {*lm_only, *disabled, *value(mc, "MIMO_V2_MULTIMODAL_ARCHS")}
    formula = next(ast.unparse(n.value) for n in ast.walk(tree)
                   if isinstance(n, ast.Assign) and getattr(n.targets[0], "attr", "") == "is_multimodal")
    assert formula.startswith("enable_multimodal and (not self.is_lm_only) and (is_multimodal_model(")
