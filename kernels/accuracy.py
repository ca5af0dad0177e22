"""Decode accuracy as a user meets it: errors against fp32 attention over the unquantized bf16 KV.

The truth is fp32 attention over the bf16 KV pool (before any fp8 rounding) with the bf16 q the
model produced. Against it (relative error, norm-wise over the whole output):

- raw_kv_floor: fp32 attention over the raw fp8 KV (each bf16 value cast to e4m3) with bf16 q.
  No kernel over that pool can do better; a kernel's own error is its distance beyond this floor.
- flashmla_format_floor: the same over FlashMLA's V32_NO_ROPE layout (quantize_v32_no_rope).
- q_rounded_err: raw fp8 KV with q rounded to e4m3, as a kernel that feeds QK^T with fp8 q does.
- q_halves_err: raw fp8 KV with q as two e4m3 halves hi + lo (q_halves), summed exactly.

Three kinds of data (make_case), GLM-5.3-Flash geometry (d = 512, sm_scale = 512^-0.5):
- "normal": KV and q N(0, 1); the scores are flat (every key gets a little).
- "outliers": KV N(0, 0.5^2) with channels 0-7 scaled x8, as MLA latents have; q N(0, 1).
- "peaked": KV N(0, 1); q = 0.25 x the sum of 8 keys from the query's own top-k + N(0, 1): about
  half of each head's softmax mass sits on those 8 keys.

In fp32 on the CPU, top-k 2,048 random rows a query, 256 to 1,024 (query, head) pairs, the figures
are, in per cent (raw floor / FlashMLA's format / q rounded / q halves): outliers 0.80 / 0.65 /
2.73 / 0.80; normal 2.45 / 2.34 / 3.63 / 2.45; peaked 3.5 / 3.4 / 4.2 / 3.5 (each within ~5%).
Rounding q costs 1.2x (peaked) to 3.4x (outliers) the floor; two e4m3 halves cost nothing
measurable.

The functions take CPU or CUDA tensors alike (the GPU tests and the benchmark call them on the GPU).
"""
from __future__ import annotations

import torch
from dsaops.kernels import reference

FP8 = torch.float8_e4m3fn
FP8_MAX = 448.0
D = 512
SM_SCALE = D**-0.5
DATA_KINDS = ("normal", "outliers", "peaked")
OUTLIER_SIGMA = 0.5
OUTLIER_CHANNELS = 8
OUTLIER_SCALE = 8.0
PEAK_KEYS = 8
PEAK_WEIGHT = 0.25
# FlashMLA's V32_NO_ROPE token: 512 e4m3 values, then one fp32 scale per 128 channels
V32_GROUP = 128
V32_ROW_BYTES = D + 4 * (D // V32_GROUP)  # 528
FLASHMLA_PAGE = 64  # tokens a page of the k_cache view FlashMLA reads ([pages, 64, 1, 528])
REFERENCES = ("raw_kv_floor", "flashmla_format_floor", "q_rounded_err", "q_halves_err")


def random_indices(S: int, slots: int, topk: int, generator, device="cpu") -> torch.Tensor:
    """[S, 1, topk] int32: for each query, topk distinct pool rows in random order."""
    rows = [torch.randperm(slots, generator=generator, device=device)[:topk] for _ in range(S)]
    return torch.stack(rows)[:, None].to(torch.int32).contiguous()


def make_kv(kind: str, slots: int, generator, device="cpu", width: int = D) -> torch.Tensor:
    """A bf16 KV pool [slots, 1, width] of one of DATA_KINDS."""
    if kind not in DATA_KINDS:
        raise ValueError(f"data kind must be one of {', '.join(DATA_KINDS)}, got {kind!r}")
    kv = torch.randn((slots, width), generator=generator, device=device)
    if kind == "outliers":
        kv *= OUTLIER_SIGMA
        kv[:, :OUTLIER_CHANNELS] *= OUTLIER_SCALE
    return kv.to(torch.bfloat16)[:, None].contiguous()


def make_q(kind: str, H: int, kv: torch.Tensor, indices: torch.Tensor, generator) -> torch.Tensor:
    """bf16 q [S, H, width] for the queries of `indices` over `kv` (make_kv's pool of the same kind)."""
    S, width = indices.shape[0], kv.shape[2]
    noise = torch.randn((S, H, width), generator=generator, device=kv.device)
    if kind != "peaked":
        return noise.to(torch.bfloat16)
    pick = torch.randint(0, indices.shape[2], (S, H * PEAK_KEYS), generator=generator, device=kv.device)
    rows = indices[:, 0].long().gather(1, pick)                       # [S, H * PEAK_KEYS] pool rows
    keys = kv[:, 0][rows].float().view(S, H, PEAK_KEYS, width)
    return (PEAK_WEIGHT * keys.sum(dim=2) + noise).to(torch.bfloat16)


def make_case(kind: str, S: int, H: int, slots: int, topk: int = 2048, seed: int = 0, device="cpu"):
    """(q bf16 [S, H, 512], kv bf16 [slots, 1, 512], indices int32 [S, 1, topk]) of one data kind."""
    g = torch.Generator(device=device).manual_seed(seed)
    kv = make_kv(kind, slots, g, device)
    indices = random_indices(S, slots, topk, g, device)
    return make_q(kind, H, kv, indices, g), kv, indices


def round_q(q: torch.Tensor) -> torch.Tensor:
    """q rounded to e4m3 and back to bf16 (exact): what an fp8 QK^T sees of a bf16 q."""
    return q.to(FP8).to(torch.bfloat16)


def q_halves(q: torch.Tensor) -> torch.Tensor:
    """hi + lo in fp32, hi = e4m3(q), lo = e4m3(q - hi): q as two fp8 products see it."""
    hi = q.float().to(FP8).float()
    return hi + (q.float() - hi).to(FP8).float()


def quantize_v32_no_rope(kv: torch.Tensor, chunk: int = 1 << 16) -> torch.Tensor:
    """FlashMLA's V32_NO_ROPE pool of a bf16/fp32 pool [slots, 1, 512]: [slots, 528] float8_e4m3fn
    bytes, each token 512 e4m3 values then four fp32 scales, one per 128 channels: scale =
    amax / 448, value = clamp(x * (1 / scale), +-448) cast to e4m3, as SGLang 0.5.23's
    quantize_k_cache writes it (kernels/ops/quantization/dsa_quant_k_cache.py). An all-zero group
    gets scale 0 and zeros (SGLang's 0 * inf would give NaN). Works in chunks of `chunk` tokens."""
    if kv.dim() != 3 or kv.shape[1:] != (1, D):
        raise ValueError(f"kv must be [slots, 1, {D}], got {tuple(kv.shape)}")
    out = torch.empty((kv.shape[0], V32_ROW_BYTES), dtype=torch.uint8, device=kv.device)
    for start in range(0, kv.shape[0], chunk):
        x = kv[start:start + chunk, 0].float().view(-1, D // V32_GROUP, V32_GROUP)
        scale = x.abs().amax(dim=2, keepdim=True) / FP8_MAX
        inverse = torch.where(scale > 0, 1.0 / scale, torch.zeros_like(scale))
        values = (x * inverse).clamp(-FP8_MAX, FP8_MAX).to(FP8)
        out[start:start + chunk, :D] = values.view(-1, D).view(torch.uint8)
        out[start:start + chunk, D:] = scale.view(-1, D // V32_GROUP).contiguous().view(torch.uint8)
    return out.view(FP8)


def dequantize_v32_no_rope(packed: torch.Tensor) -> torch.Tensor:
    """fp32 [slots, 1, 512] of a quantize_v32_no_rope pool."""
    raw = packed.view(torch.uint8)
    values = raw[:, :D].contiguous().view(FP8).float().view(-1, D // V32_GROUP, V32_GROUP)
    scales = raw[:, D:].contiguous().view(torch.float32)
    return (values * scales[:, :, None]).view(-1, 1, D)


def flashmla_pages(packed: torch.Tensor) -> torch.Tensor:
    """The k_cache view FlashMLA reads of a quantize_v32_no_rope pool: [pages, 64, 1, 528]; token
    t is page t // 64, slot t % 64, so FlashMLA's indices are the pool's row ids."""
    if packed.shape[0] % FLASHMLA_PAGE:
        raise ValueError(f"a FlashMLA pool holds whole pages of {FLASHMLA_PAGE} tokens, got {packed.shape[0]}")
    return packed.view(-1, FLASHMLA_PAGE, 1, V32_ROW_BYTES)


def gathered(pool: torch.Tensor, indices: torch.Tensor):
    """(rows [S * topk, 1, w] of pool in its dtype, local indices [S, 1, topk]): the rows each query
    reads, renumbered, so a reference costs what the queries read rather than the whole pool."""
    idx = indices[:, 0].long()
    rows = pool.view(torch.uint8)[idx.clamp(min=0).reshape(-1)].view(pool.dtype)
    local = torch.arange(idx.numel(), device=idx.device).view(idx.shape)
    return rows, torch.where(idx >= 0, local, -1)[:, None].to(torch.int32)


def rel_err(out, ref) -> float:
    """Relative error, norm-wise over the whole tensor."""
    return ((out.float() - ref.float()).norm() / ref.float().norm()).item()


def reference_outputs(q, kv, indices, sm_scale=SM_SCALE, names=("truth", *REFERENCES)) -> dict:
    """{name: fp32 output [S, H, 512]} of "truth" (fp32 attention over the bf16 pool `kv` with bf16
    q) and of the references in REFERENCES (the module docstring says what each one rounds)."""
    rows, local = gathered(kv, indices)
    raw = rows.to(FP8)
    inputs = {"truth": (q, rows), "raw_kv_floor": (q, raw), "q_rounded_err": (round_q(q), raw),
              "q_halves_err": (q_halves(q), raw)}
    out = {}
    for name in names:
        if name == "flashmla_format_floor":
            inputs[name] = (q, dequantize_v32_no_rope(quantize_v32_no_rope(rows)))
        qq, pool = inputs[name]
        out[name] = reference.sparse_mla_decode(qq, pool, local, sm_scale)
    return out


def reference_errors(q, kv, indices, sm_scale=SM_SCALE, names=REFERENCES) -> dict:
    """{name: error against truth} of the references in `names` (REFERENCES)."""
    outs = reference_outputs(q, kv, indices, sm_scale, ("truth", *names))
    return {name: rel_err(outs[name], outs["truth"]) for name in names}


def decode_errors(q, kv, indices, sm_scale, out, *, references=(), others=None, digits=None) -> dict:
    """A decode's errors: `out` [S, H, 512] is a kernel's output for bf16 q over the bf16 pool `kv`
    cast to raw e4m3, at `indices`. Relative errors, in this order:
    - err_vs_bf16: out against "truth" (fp32 attention over the bf16 KV with bf16 q);
    - raw_kv_floor: fp32 attention over the raw fp8 KV with bf16 q, against truth;
    - each reference named in `references` (REFERENCES) against truth;
    - each output in `others` ({key: output or None}: a peer's, a kernel fed other inputs) against
      truth, None where the output is None;
    - rel_err: out against the raw_kv_floor output (the kernel-only error).
    Rounded to `digits` decimals where given."""
    extra = tuple(name for name in references if name != "raw_kv_floor")
    refs = reference_outputs(q, kv, indices, sm_scale, ("truth", "raw_kv_floor", *extra))
    outs = {"err_vs_bf16": out, "raw_kv_floor": refs["raw_kv_floor"], **{name: refs[name] for name in extra},
            **(others or {})}
    errs = {key: None if o is None else rel_err(o, refs["truth"]) for key, o in outs.items()}
    errs["rel_err"] = rel_err(out, refs["raw_kv_floor"])
    return errs if digits is None else {key: None if e is None else round(e, digits) for key, e in errs.items()}
