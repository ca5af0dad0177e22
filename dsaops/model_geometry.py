"""What one token and one request cost in memory for a DSA model, from its config.

Every formula follows SGLang 0.5.23 (cited per function); the model comes either from a
preset in dsaops/models/ (a minimal config.json) or from the user's own config.json.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from dsaops import plan_input
from dsaops.errors import UserError

MODELS_DIR = Path(__file__).with_name("models")

# memory_pool.py DSATokenToKVPool: quant_block_size = 128, index K stored as uint8 with
# a 4-byte scale per block, rope always stored in bf16.
QUANT_BLOCK = 128
ROPE_STORAGE_BYTES = 2
# arg_groups/model_overrides/deepseek_v2.py: DSA pages are 64 * index_kpool tokens
# (CUDA and the ROCm preshuffle path).
DSA_PAGE_TOKENS = 64

# memory_pool.py DSATokenToKVPool: `assert index_head_dim == 128` (one index head of 128)
DSA_INDEX_HEAD_DIM = 128
LAYERS_MOST = 1 << 16                # far above any model; the sizing walks every layer

KV_LAYOUTS = ("bf16", "raw_fp8", "scaled_fp8")

# srt/configs/glm5_next.py Glm5NextTextConfig.__init__ defaults that sizing reads; a
# user's config.json may leave them out. index_* default to None there: required.
_GLM5_NEXT_DEFAULTS = {
    "num_hidden_layers": 45, "kv_lora_rank": 512, "qk_rope_head_dim": 0, "max_position_embeddings": 1013760,
    "num_nextn_predict_layers": 1, "linear_num_heads": 64, "linear_head_dim": 128, "linear_conv_kernel_dim": 4,
    "index_topk_freq": 1,
}
_GLM5_NEXT_ARCH = "Glm5NextForConditionalGeneration"
# The DSA architectures in model_config.py's multimodal_model_archs: SGLang reserves multimodal memory for
# them (ModelConfig.is_multimodal) whether or not the config carries a vision_config
MULTIMODAL_DSA_ARCHS = ("Dots3NoteForCausalLM", "PixtralForConditionalGeneration", _GLM5_NEXT_ARCH)


class ModelConfigError(UserError, ValueError):
    """A config that cannot be sized: the message names the key to fix (one line, exit 2)."""


@dataclass(frozen=True)
class ModelGeometry:
    name: str
    architecture: str
    num_layers: int
    full_attention_layers: tuple[int, ...]
    linear_layers: tuple[int, ...]
    indexer_layers: tuple[int, ...]        # full-attention layers that hold index K (not shared top-k)
    kv_lora_rank: int
    qk_rope_head_dim: int
    index_head_dim: int
    index_kpool: int
    draft_layers: int                      # NextN (MTP) layers: the EAGLE draft
    context_length: int
    linear_num_heads: int = 0
    linear_head_dim: int = 0
    linear_conv_kernel: int = 0
    multimodal: bool = False
    checkpoint_gib: float | None = None
    checkpoint_gib_basis: str = ""

    @property
    def page_tokens(self) -> int:
        return DSA_PAGE_TOKENS * self.index_kpool

    # ---- KV per token (pool_configurator.py DefaultPoolConfigurator._compute_cell_size) ----
    def attention_bytes_per_layer(self, layout: str) -> int:
        """kv_cache_configurator.py calculate_mla_kv_cache_dim times the element size."""
        dim = self.kv_lora_rank + self.qk_rope_head_dim
        if layout == "bf16":
            return dim * 2
        if layout == "raw_fp8":
            return dim
        if layout == "scaled_fp8":
            if self.kv_lora_rank % QUANT_BLOCK:  # kv_cache_configurator.py calculate_mla_kv_cache_dim asserts it
                raise ModelConfigError(f"the scaled fp8 KV layout needs kv_lora_rank a multiple of {QUANT_BLOCK}, not "
                                       f"{self.kv_lora_rank}: use tilelang backends (raw fp8) or --kv-cache-dtype bf16")
            return self.kv_lora_rank + self.kv_lora_rank // QUANT_BLOCK * 4 + self.qk_rope_head_dim * ROPE_STORAGE_BYTES
        raise ValueError(f"unknown KV layout {layout!r}; one of {KV_LAYOUTS}")

    @property
    def indexer_bytes_per_layer(self) -> int:
        """pool_configurator.py _compute_dsa_indexer_cell_size: ceil((d + d/128*4) / kpool) uint8."""
        return -(-(self.index_head_dim + self.index_head_dim // QUANT_BLOCK * 4) // self.index_kpool)

    def kv_bytes_per_token(self, layout: str, *, with_draft: bool = False) -> dict:
        attention = len(self.full_attention_layers) * self.attention_bytes_per_layer(layout)
        # Shared-top-k layers get a 0-row index buffer (_should_elide_dsa_index_k).
        indexer = len(self.indexer_layers) * self.indexer_bytes_per_layer
        draft = 0
        if with_draft and self.draft_layers:
            # _compute_cell_size's EAGLE branch for DSA: the target's latent KV scaled by
            # draft/target layers, plus the draft's own indexer on every draft layer.
            draft = (int(attention * self.draft_layers / len(self.full_attention_layers))
                     + self.draft_layers * self.indexer_bytes_per_layer)
        return {"attention_per_layer": self.attention_bytes_per_layer(layout),
                "attention_layers": len(self.full_attention_layers), "attention": attention,
                "indexer_per_layer": self.indexer_bytes_per_layer, "indexer_layers": len(self.indexer_layers),
                "indexer": indexer, "draft": draft, "total": attention + indexer + draft}

    def kv_pool_bytes(self, tokens: int, layout: str) -> int:
        """What the `KV Cache is allocated ... KV size` log line counts (memory_pool.py
        MLATokenToKVPool: size + page_size rows; index_key_cache.py IndexKeyCache:
        (size + page + 1) // page pages of page * indexer bytes)."""
        page = self.page_tokens
        latent = (tokens + page) * self.attention_bytes_per_layer(layout) * len(self.full_attention_layers)
        pages = (tokens + page + 1) // page
        index = pages * page * self.indexer_bytes_per_layer * len(self.indexer_layers)
        return latent + index

    # ---- mamba (KDA) state per request slot (configs/mamba_utils.py) ----
    def mamba_slot_bytes(self, linear_tp: int, *, ssm_bytes: int = 4, conv_bytes: int = 2) -> dict:
        """KimiLinearStateShape.create + BaseLinearStateParams.mamba_cache_per_req:
        conv (K-1, 3*H*D/T) in bf16, ssm (H/T, D, D) in --mamba-ssm-dtype (fp32 by default)."""
        if not self.linear_layers:
            return {"conv": 0, "ssm": 0, "total": 0, "layers": 0}
        heads, dim = self.linear_num_heads, self.linear_head_dim
        if heads % linear_tp or (heads * dim) % linear_tp:
            raise ModelConfigError(f"{heads} linear-attention heads do not split over an attention-TP size of "
                                   f"{linear_tp}; choose --tp-size / --attn-dp-size so tp/dp divides {heads}")
        conv = (self.linear_conv_kernel - 1) * 3 * heads * dim // linear_tp * conv_bytes
        ssm = heads // linear_tp * dim * dim * ssm_bytes
        n = len(self.linear_layers)
        return {"conv": conv * n, "ssm": ssm * n, "total": (conv + ssm) * n, "layers": n}


def presets() -> list[str]:
    return sorted(p.stem for p in MODELS_DIR.glob("*.json"))


def load_preset(name: str) -> ModelGeometry:
    if name not in presets():
        raise ModelConfigError(f"unknown model {name!r}; presets: {', '.join(presets())} (or pass --model-config)")
    return from_config(json.loads((MODELS_DIR / f"{name}.json").read_text()), name=name)


def load_config_file(path: str | Path) -> ModelGeometry:
    raw = plan_input.read_json(path, "model config", fix="pass the model's config.json",
                               error=ModelConfigError)
    return from_config(raw, name=Path(path).parent.name or str(path))


def _key(key: str) -> str:
    return f"model config {key!r}"


def _whole(cfg: dict, key: str, *, least: int = 1, most: int = plan_input.INT_MOST, default: int | None = None,
           label: str | None = None, why: str = "`dsaops plan` sizes DSA (MLA + indexer) models only") -> int:
    """cfg[key] as a whole number from `least` to `most`; `default` when it is absent or null (None: required)."""
    value = cfg.get(key)
    if value is None:
        if default is None:
            raise ModelConfigError(f"model config has no {label or key!r}: {why}")
        return default
    return plan_input.whole(value, _key(label or key), least=least, most=most, error=ModelConfigError)


def _linear_size(cfg: dict, key: str, flat: str) -> int:
    """linear_attn_config[key], else the flat glm5_next key (`flat`)."""
    lin = _typed(cfg, "linear_attn_config", dict, "an object", {})
    if lin.get(key) is not None:
        return _whole(lin, key, label=f"linear_attn_config.{key}")
    return _whole(cfg, flat, why=f"its linear-attention layers need it (or linear_attn_config.{key})")


def _typed(cfg: dict, key: str, kind: type, what: str, default=None):
    """cfg[key] if it is a `kind` (dict, list, str), `default` when absent or null."""
    value = cfg.get(key)
    if value is None:
        return default
    if not isinstance(value, kind):
        raise ModelConfigError(f"{_key(key)} must be {what}, not {plan_input.shown(value)}")
    return value


def _names(cfg: dict, key: str) -> list[str] | None:
    names = _typed(cfg, key, list, "a list of names")
    if names is not None and not all(isinstance(n, str) for n in names):
        raise ModelConfigError(f"{_key(key)} must be a list of names, not {plan_input.shown(names)}")
    return names


def from_config(raw: dict, *, name: str) -> ModelGeometry:
    """An HF config.json (text_config wins over top-level keys, as Glm5NextConfig merges them). Every
    key the sizing reads is checked (type, range, SGLang's own asserts): ModelConfigError names it."""
    if not isinstance(raw, dict):
        raise ModelConfigError(f"model config must be a JSON object, not a {type(raw).__name__}")
    meta = _typed(raw, "_dsaops", dict, "an object", {})
    arch = (_names(raw, "architectures") or [""])[0]
    cfg = {**raw, **_typed(raw, "text_config", dict, "an object", {})}
    if arch == _GLM5_NEXT_ARCH:
        cfg = {**_GLM5_NEXT_DEFAULTS, **{k: v for k, v in cfg.items() if v is not None}}

    _whole(cfg, "index_topk")  # model_config.py is_deepseek_dsa: a DSA model has index_topk
    num_layers = _whole(cfg, "num_hidden_layers", most=LAYERS_MOST)
    linear = _linear_layers(cfg, arch, num_layers)
    linear_set = set(linear)
    full = tuple(i for i in range(num_layers) if i not in linear_set)
    if not full:
        raise ModelConfigError(f"model config makes all {num_layers} layers linear attention: a DSA model has "
                               "full-attention layers (check linear_attn_config.kda_layers or layer_types)")
    index_head_dim = _whole(cfg, "index_head_dim")
    if index_head_dim != DSA_INDEX_HEAD_DIM:
        raise ModelConfigError(f"{_key('index_head_dim')} is {index_head_dim}: SGLang's DSA KV pool takes "
                               f"{DSA_INDEX_HEAD_DIM} only (memory_pool.py DSATokenToKVPool asserts it)")
    _skip_settings(cfg)
    return ModelGeometry(
        name=_typed(meta, "name", str, "a name", name), architecture=arch, num_layers=num_layers,
        full_attention_layers=full, linear_layers=linear,
        indexer_layers=tuple(i for i in full if not _skips_topk(cfg, i)),
        kv_lora_rank=_whole(cfg, "kv_lora_rank"), qk_rope_head_dim=_whole(cfg, "qk_rope_head_dim", least=0, default=0),
        index_head_dim=index_head_dim, index_kpool=_whole(cfg, "index_kpool", default=1),
        draft_layers=_whole(cfg, "num_nextn_predict_layers", least=0, default=0),
        context_length=_whole(cfg, "max_position_embeddings"),
        linear_num_heads=_linear_size(cfg, "num_heads", "linear_num_heads") if linear else 0,
        linear_head_dim=_linear_size(cfg, "head_dim", "linear_head_dim") if linear else 0,
        linear_conv_kernel=_linear_size(cfg, "short_conv_kernel_size", "linear_conv_kernel_dim") if linear else 0,
        multimodal=_typed(meta, "multimodal", bool, "true or false", _multimodal(raw, arch)),
        checkpoint_gib=(None if meta.get("checkpoint_gib") is None else plan_input.number(
            meta["checkpoint_gib"], _key("_dsaops.checkpoint_gib"), most=plan_input.GIB_MOST, error=ModelConfigError)),
        checkpoint_gib_basis=_typed(meta, "checkpoint_gib_basis", str, "text", ""),
    )


def _multimodal(raw: dict, arch: str) -> bool:
    """ModelConfig.is_multimodal: a multimodal architecture or a text_config sub-config (hf_config is
    not hf_text_config), unless the checkpoint declares itself language_model_only."""
    if _typed(raw, "language_model_only", bool, "true or false", False):
        return False
    return arch in MULTIMODAL_DSA_ARCHS or raw.get("text_config") is not None


def _linear_layers(cfg: dict, arch: str, num_layers: int) -> tuple[int, ...]:
    """glm5_next.py Glm5NextTextConfig: linear_attn_config.kda_layers, else layer_types,
    else every layer with index % 4 != 3. Other DSA architectures have none."""
    lin = _typed(cfg, "linear_attn_config", dict, "an object", {})
    if "kda_layers" in lin:
        kda = _typed(lin, "kda_layers", list, "a list of layer numbers", [])
        for layer in kda:  # layer numbers count from 0
            plan_input.whole(layer, f"{_key('linear_attn_config.kda_layers')} entry", least=0, most=num_layers - 1,
                             error=ModelConfigError)
        if len(set(kda)) != len(kda):
            raise ModelConfigError(f"{_key('linear_attn_config.kda_layers')} names a layer twice")
        return tuple(sorted(kda))
    if types := _names(cfg, "layer_types"):
        if len(types) != num_layers:
            raise ModelConfigError(f"{_key('layer_types')} has {len(types)} entries for {num_layers} layers "
                                   "(num_hidden_layers): give one per layer")
        return tuple(i for i, t in enumerate(types) if t == "linear_attention")
    if arch == _GLM5_NEXT_ARCH:
        return tuple(i for i in range(num_layers) if i % 4 != 3)
    return ()


def _skip_settings(cfg: dict) -> None:
    """The keys _skips_topk reads, checked once as dsa_layer_skips_topk asserts them (positive numbers)."""
    _names(cfg, "indexer_types")
    _typed(cfg, "index_topk_pattern", str, "a string of F and S")
    for key in ("cli_factor", "index_topk_freq", "index_skip_topk_offset"):
        _whole(cfg, key, default=1)


def _skips_topk(cfg: dict, layer: int) -> bool:
    """model_config.py dsa_layer_skips_topk: layers that reuse the previous top-k."""
    if (types := cfg.get("indexer_types")) is not None:
        return 0 <= layer < len(types) and types[layer] == "shared"
    if (cli := cfg.get("cli_factor") or 1) > 1:
        return layer % cli != 0
    if (pattern := cfg.get("index_topk_pattern")) is not None:
        return layer < len(pattern) and pattern[layer] == "S"
    freq = cfg.get("index_topk_freq") or 1
    if (offset := cfg.get("index_skip_topk_offset")) is not None:
        return max(layer - offset + 1, 0) % freq != 0
    return max(layer - 1, 0) % freq != 0
