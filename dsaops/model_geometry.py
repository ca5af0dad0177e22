"""What one token and one request cost in memory for a DSA model, from its config.

Every formula follows SGLang 0.5.23 (cited per function); the model comes either from a
preset in dsaops/models/ (a minimal config.json) or from the user's own config.json.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

MODELS_DIR = Path(__file__).with_name("models")

# memory_pool.py DSATokenToKVPool: quant_block_size = 128, index K stored as uint8 with
# a 4-byte scale per block, rope always stored in bf16.
QUANT_BLOCK = 128
ROPE_STORAGE_BYTES = 2
# arg_groups/model_overrides/deepseek_v2.py: DSA pages are 64 * index_kpool tokens
# (CUDA and the ROCm preshuffle path).
DSA_PAGE_TOKENS = 64

KV_LAYOUTS = ("bf16", "raw_fp8", "scaled_fp8")

# srt/configs/glm5_next.py Glm5NextTextConfig.__init__ defaults that sizing reads; a
# user's config.json may leave them out. index_* default to None there: required.
_GLM5_NEXT_DEFAULTS = {
    "num_hidden_layers": 45, "kv_lora_rank": 512, "qk_rope_head_dim": 0, "max_position_embeddings": 1013760,
    "num_nextn_predict_layers": 1, "linear_num_heads": 64, "linear_head_dim": 128, "linear_conv_kernel_dim": 4,
    "index_topk_freq": 1,
}
_GLM5_NEXT_ARCH = "Glm5NextForConditionalGeneration"


class ModelConfigError(ValueError):
    """A config that cannot be sized: the message names the key to fix."""


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
    path = MODELS_DIR / f"{name}.json"
    if not path.is_file():
        raise ModelConfigError(f"unknown model {name!r}; presets: {', '.join(presets())} (or pass --model-config)")
    return from_config(json.loads(path.read_text()), name=name)


def load_config_file(path: str | Path) -> ModelGeometry:
    try:
        raw = json.loads(Path(path).read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise ModelConfigError(f"cannot read model config {path}: {e}") from None
    return from_config(raw, name=Path(path).parent.name or str(path))


def from_config(raw: dict, *, name: str) -> ModelGeometry:
    """An HF config.json (text_config wins over top-level keys, as Glm5NextConfig merges them)."""
    meta = raw.get("_dsaops", {})
    arch = (raw.get("architectures") or [""])[0]
    cfg = {**raw, **(raw.get("text_config") or {})}
    if arch == _GLM5_NEXT_ARCH:
        cfg = {**_GLM5_NEXT_DEFAULTS, **{k: v for k, v in cfg.items() if v is not None}}

    def need(key):
        if cfg.get(key) is None:
            raise ModelConfigError(f"model config has no {key!r}: `dsaops plan` sizes DSA (MLA + indexer) models only")
        return cfg[key]

    need("index_topk")  # model_config.py is_deepseek_dsa: a DSA model has index_topk
    num_layers = int(need("num_hidden_layers"))
    linear = _linear_layers(cfg, arch, num_layers)
    full = tuple(i for i in range(num_layers) if i not in set(linear))
    lin_cfg = cfg.get("linear_attn_config") or {}
    return ModelGeometry(
        name=meta.get("name", name), architecture=arch, num_layers=num_layers,
        full_attention_layers=full, linear_layers=linear,
        indexer_layers=tuple(i for i in full if not _skips_topk(cfg, i)),
        kv_lora_rank=int(need("kv_lora_rank")), qk_rope_head_dim=int(cfg.get("qk_rope_head_dim") or 0),
        index_head_dim=int(need("index_head_dim")), index_kpool=int(cfg.get("index_kpool") or 1),
        draft_layers=int(cfg.get("num_nextn_predict_layers") or 0),
        context_length=int(need("max_position_embeddings")),
        linear_num_heads=int(lin_cfg.get("num_heads", cfg.get("linear_num_heads", 0))) if linear else 0,
        linear_head_dim=int(lin_cfg.get("head_dim", cfg.get("linear_head_dim", 0))) if linear else 0,
        linear_conv_kernel=int(lin_cfg.get("short_conv_kernel_size", cfg.get("linear_conv_kernel_dim", 0))) if linear else 0,
        multimodal=bool(meta.get("multimodal", "vision_config" in raw)),
        checkpoint_gib=meta.get("checkpoint_gib"), checkpoint_gib_basis=meta.get("checkpoint_gib_basis", ""),
    )


def _linear_layers(cfg: dict, arch: str, num_layers: int) -> tuple[int, ...]:
    """glm5_next.py Glm5NextTextConfig: linear_attn_config.kda_layers, else layer_types,
    else every layer with index % 4 != 3. Other DSA architectures have none."""
    if (lin := cfg.get("linear_attn_config")) and "kda_layers" in lin:
        return tuple(sorted(lin["kda_layers"]))
    if cfg.get("layer_types"):
        return tuple(i for i, t in enumerate(cfg["layer_types"]) if t == "linear_attention")
    if arch == _GLM5_NEXT_ARCH:
        return tuple(i for i in range(num_layers) if i % 4 != 3)
    return ()


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
