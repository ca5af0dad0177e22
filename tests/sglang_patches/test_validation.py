"""The patched validation logic (patches 0002-0004), run out of the patched files of the real wheel.

Each function runs as compiled from the patched file (sglang_definitions); the names it uses are
supplied here, torch is the real CPU torch with only the device capability set. Where it
matters, the same call on the pristine function is a control showing the patch is what
changes the outcome.
"""
import logging
import sys
import types
from types import SimpleNamespace

import pytest
import torch

from tests.support.sglang_definitions import lift

OVERRIDES = "sglang/srt/arg_groups/overrides.py"
MODEL_CONFIG = "sglang/srt/configs/model_config.py"
DSA_BACKEND = "sglang/srt/layers/attention/dsa_backend.py"
KV_CONFIGURATOR = "sglang/srt/mem_cache/kv_cache_configurator.py"

BOOT_GATE = "CUDA TileLang FP8 KV requires both DSA backends to be tilelang"
RAW_WARNING = "stored as raw fp8 without per-tile scales"


@pytest.fixture
def model_config(patched_root, monkeypatch):
    """The patched model_config's DSA predicates, importable under their real module name."""
    module = types.ModuleType("sglang.srt.configs.model_config")
    lift(patched_root / MODEL_CONFIG, ["_hf_arch", "_hf_attr", "is_deepseek_dsa", "is_q8_raw_fp8_nope_layout"],
         module.__dict__)
    monkeypatch.setitem(sys.modules, module.__name__, module)
    return module


@pytest.fixture
def sm(monkeypatch):
    def set_capability(major, minor):
        monkeypatch.setattr(torch.cuda, "get_device_capability", lambda *_: (major, minor))
    return set_capability


def overrides(root):
    return lift(root / OVERRIDES, ["_DEEPSEEK_FAMILY_ARCHS", "_check_dsa_backend_constraints",
                                   "_dsa_split_backend_resolution"], {
        "logger": logging.getLogger("sglang.srt.arg_groups.overrides"),
        "model_config_of": lambda view: view.model_config,
        "get_platform": lambda: SimpleNamespace(is_npu=False, is_xpu=False, is_hip=False),
    })


def glm_view(prefill, decode, *, kv="fp8_e4m3", rope=0, dcp=1, attn_cp=1, hisparse=False):
    """The resolving view of a GLM-5.3-Flash launch (NoPE MLA, kv_lora_rank 512) with the DSA flags set."""
    hf_config = SimpleNamespace(architectures=["Glm5NextForConditionalGeneration"], index_topk=2048)
    return SimpleNamespace(kv_cache_dtype=kv, dsa_prefill_backend=prefill, dsa_decode_backend=decode,
                           enable_hisparse=hisparse, dcp_size=dcp, attn_cp_size=attn_cp,
                           model_config=SimpleNamespace(hf_config=hf_config, kv_lora_rank=512,
                                                        qk_rope_head_dim=rope))


def resolve(root, view):
    return overrides(root)["_dsa_split_backend_resolution"](view)


# --- argument validation (overrides.py) ---------------------------------------------------

def test_boot_gate_refuses_fp8_with_tilelang_prefill_and_flashmla_sparse_decode(patched_root, model_config, sm):
    sm(9, 0)
    with pytest.raises(ValueError, match=BOOT_GATE) as e:
        resolve(patched_root, glm_view("tilelang", "flashmla_sparse"))
    assert "--dsa-prefill-backend tilelang --dsa-decode-backend tilelang" in str(e.value)
    assert "--kv-cache-dtype bfloat16" in str(e.value)


def test_q8_prefill_with_tilelang_decode_over_raw_nope_is_accepted_on_sm90(patched_root, model_config, sm, caplog):
    sm(9, 0)
    with caplog.at_level(logging.WARNING):
        assert resolve(patched_root, glm_view("flashmla_sparse_q8", "tilelang")) == {}
    assert RAW_WARNING in caplog.text


def test_q8_raw_nope_is_refused_on_sm121(patched_root, model_config, sm):
    sm(12, 1)
    with pytest.raises(ValueError, match="SM90-only; got sm_121. Use --dsa-prefill-backend tilelang"):
        resolve(patched_root, glm_view("flashmla_sparse_q8", "tilelang"))


def test_q8_with_tilelang_is_refused_with_rope(patched_root, model_config, sm):
    sm(9, 0)
    with pytest.raises(ValueError, match=BOOT_GATE):
        resolve(patched_root, glm_view("flashmla_sparse_q8", "tilelang", rope=64))


def test_pristine_refuses_q8_with_tilelang_on_sm90(pristine_root, model_config, sm):
    """Control: the same launch is refused without the series."""
    sm(9, 0)
    with pytest.raises(ValueError, match=BOOT_GATE):
        resolve(pristine_root, glm_view("flashmla_sparse_q8", "tilelang"))


def test_attention_context_parallelism_is_refused_with_the_raw_layout(patched_root, model_config, sm):
    sm(9, 0)
    with pytest.raises(ValueError, match=r"attention context parallelism \(attn_cp_size=2\); use --attn-cp-size 1"):
        resolve(patched_root, glm_view("tilelang", "tilelang", attn_cp=2))
    with pytest.raises(ValueError, match="use --dcp-size 1"):
        resolve(patched_root, glm_view("tilelang", "tilelang", dcp=2))
    assert resolve(patched_root, glm_view("tilelang", "tilelang", kv="bfloat16", attn_cp=2)) == {}


def test_hisparse_stays_refused_for_q8_over_raw_fp8(patched_root, model_config, sm, monkeypatch):
    sm(9, 0)
    hook = types.ModuleType("sglang.srt.arg_groups.hisparse_hook")
    hook._hisparse_default_backend = lambda kv_cache_dtype: "flashmla_sparse"  # used only for unset flags
    monkeypatch.setitem(sys.modules, hook.__name__, hook)
    with pytest.raises(ValueError, match="does not support HiSparse"):
        resolve(patched_root, glm_view("flashmla_sparse_q8", "tilelang", hisparse=True))


def test_raw_fp8_warning_only_when_the_raw_layout_is_enabled(patched_root, model_config, sm, caplog):
    sm(12, 1)
    with caplog.at_level(logging.WARNING):
        resolve(patched_root, glm_view("tilelang", "tilelang"))
    assert RAW_WARNING in caplog.text
    caplog.clear()
    with caplog.at_level(logging.WARNING):
        resolve(patched_root, glm_view("tilelang", "tilelang", kv="bfloat16"))
    assert RAW_WARNING not in caplog.text


# --- backend validation (dsa_backend.py) ----------------------------------------------------

def q8_validator(root, model_config):
    return lift(root / DSA_BACKEND, ["_validate_flashmla_sparse_q8_backend"], {
        "torch": torch, "is_q8_raw_fp8_nope_layout": model_config.is_q8_raw_fp8_nope_layout,
    })["_validate_flashmla_sparse_q8_backend"]


RAW_NOPE = {"prefill_impl": "flashmla_sparse_q8", "decode_impl": "tilelang", "kv_cache_dtype": torch.float8_e4m3fn,
            "kv_cache_store_fp8": False, "kv_lora_rank": 512, "qk_rope_head_dim": 0, "device_sm_major": 9}


def test_backend_accepts_q8_over_the_raw_nope_pool_on_sm90(patched_root, model_config):
    q8_validator(patched_root, model_config)(**RAW_NOPE)


@pytest.mark.parametrize("change, message", [
    ({"device_sm_major": 12}, "SM90-only"),
    ({"device_sm_major": 10}, "SM90-only"),
    ({"qk_rope_head_dim": 64}, "raw fp8_e4m3 NoPE pool"),
    ({"kv_lora_rank": 256}, "raw fp8_e4m3 NoPE pool"),
    ({"decode_impl": "flashmla_kv"}, "raw fp8_e4m3 NoPE pool"),
    ({"kv_cache_store_fp8": True}, "packed fp8_e4m3 KV cache for NoPE"),
    ({"hisparse_enabled": True}, "HiSparse"),
    ({"mixed_chunk_enabled": True}, "--enable-mixed-chunk"),
])
def test_backend_keeps_refusing_the_rest(patched_root, model_config, change, message):
    with pytest.raises(ValueError, match=message):
        q8_validator(patched_root, model_config)(**{**RAW_NOPE, **change})


def test_pristine_backend_refuses_q8_over_the_raw_nope_pool(pristine_root, model_config):
    pristine = q8_validator(pristine_root, model_config)
    with pytest.raises(ValueError, match="unpacked fp8_e4m3 pool"):
        pristine(**{k: v for k, v in RAW_NOPE.items() if k != "kv_lora_rank"})


# --- dispatch validation (dsa_backend.py, _forward_tilelang) -------------------------------

@pytest.fixture
def tilelang_calls(monkeypatch):
    """SGLang's TileLang kernel module replaced by a recorder: the tests check what reaches it."""
    calls = []
    module = types.ModuleType("sglang.kernels.ops.attention.dsa.tilelang_kernel")
    module.tilelang_sparse_fwd = lambda **kw: calls.append(kw) or torch.zeros(1, kw["q"].shape[0], 1)
    monkeypatch.setitem(sys.modules, module.__name__, module)
    return calls


def forward_tilelang(root, hip=False):
    ns = lift(root / DSA_BACKEND, ["_validate_raw_fp8_kv_rows", "DeepseekSparseAttnBackend._forward_tilelang"],
              {"torch": torch, "_is_hip": hip})
    return lambda q, kv: ns["_forward_tilelang"](SimpleNamespace(), q, kv, 512, torch.zeros(2, 2048,
                                                 dtype=torch.int32), 0.1)


def rows(width, dtype, n=2):
    return torch.zeros(n, 1 if dtype != torch.bfloat16 else 16, width, dtype=dtype)


def test_fp8_rows_as_wide_as_the_query_reach_the_kernel(patched_root, tilelang_calls):
    forward_tilelang(patched_root)(rows(576, torch.bfloat16), rows(576, torch.float8_e4m3fn, 8))
    forward_tilelang(patched_root, hip=True)(rows(576, torch.bfloat16), rows(576, torch.float8_e4m3fnuz, 8))
    forward_tilelang(patched_root)(rows(576, torch.bfloat16), rows(512, torch.bfloat16, 8))  # not fp8: not checked
    assert len(tilelang_calls) == 3


def test_packed_fp8_rows_are_refused_before_dispatch(patched_root, tilelang_calls):
    with pytest.raises(ValueError, match="rows are 656 wide but the query is 576.*--dsa-decode-backend tilelang"):
        forward_tilelang(patched_root)(rows(576, torch.bfloat16), rows(656, torch.float8_e4m3fn, 8))
    assert tilelang_calls == []


def test_e4m3fnuz_is_refused_on_cuda_before_dispatch(patched_root, tilelang_calls):
    with pytest.raises(ValueError, match="float8_e4m3fnuz.*--kv-cache-dtype fp8_e4m3"):
        forward_tilelang(patched_root)(rows(576, torch.bfloat16), rows(576, torch.float8_e4m3fnuz, 8))
    assert tilelang_calls == []


def test_pristine_dispatches_packed_rows_unchecked(pristine_root, tilelang_calls):
    """Control: without the series the mismatched pool reaches the kernel."""
    ns = lift(pristine_root / DSA_BACKEND, ["DeepseekSparseAttnBackend._forward_tilelang"], {"torch": torch})
    ns["_forward_tilelang"](SimpleNamespace(), rows(576, torch.bfloat16), rows(656, torch.float8_e4m3fn, 8), 512,
                            torch.zeros(2, 2048, dtype=torch.int32), 0.1)
    assert len(tilelang_calls) == 1


# --- pool allocation (kv_cache_configurator.py) --------------------------------------------

def kv_cache_dim(root, model_config, prefill, decode, rope=0):
    ns = lift(root / KV_CONFIGURATOR, ["calculate_mla_kv_cache_dim"], {
        "torch": torch, "_is_hip": False,
        "is_deepseek_dsa": lambda hf_config: True,
        "is_q8_raw_fp8_nope_layout": getattr(model_config, "is_q8_raw_fp8_nope_layout", None),
        "get_disagg": lambda: SimpleNamespace(disaggregation_mode="null"),
        "get_exec": lambda: SimpleNamespace(kernel=SimpleNamespace(dsa_prefill_backend=prefill,
                                                                   dsa_decode_backend=decode)),
        "DSATokenToKVPool": SimpleNamespace(quant_block_size=128, rope_storage_dtype=torch.bfloat16),
    })
    config = SimpleNamespace(hf_config=None, kv_lora_rank=512, qk_rope_head_dim=rope)
    return ns["calculate_mla_kv_cache_dim"](model_config=config, kv_cache_dtype=torch.float8_e4m3fn)


def test_q8_with_tilelang_allocates_the_raw_512_byte_rows(patched_root, pristine_root, model_config):
    assert kv_cache_dim(patched_root, model_config, "flashmla_sparse_q8", "tilelang") == 512
    assert kv_cache_dim(patched_root, model_config, "tilelang", "tilelang") == 512
    # scaled (packed) rows elsewhere: 512 fp8 + 4 scales of 4 bytes
    assert kv_cache_dim(patched_root, model_config, "flashmla_sparse_q8", "flashmla_kv") == 528
    assert kv_cache_dim(patched_root, model_config, "flashmla_sparse_q8", "tilelang", rope=64) == 528 + 128
    assert kv_cache_dim(pristine_root, model_config, "flashmla_sparse_q8", "tilelang") == 528  # control
