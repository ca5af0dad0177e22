"""q as two e4m3 halves (kernels/q_halves.py, what decode_parts.split_q does in the kernel), on the
CPU: the split is exact for bf16 q, and the decode's arithmetic with it (emulated in fp32 torch) is
as accurate against attention over the original bf16 KV as fp32 attention over the raw fp8 KV
(the raw-KV floor), where q rounded to e4m3 is not."""
import math

import pytest

torch = pytest.importorskip("torch")

from dsaops.kernels import q_halves, reference
from dsaops.kernels.accuracy import rel_err

FP8 = torch.float8_e4m3fn
P_SHIFT = 8  # decode_regs.P_SHIFT (decode_regs imports TileLang; this file runs without it)


def rows_of_every_magnitude(seed=0):
    """bf16 rows [S, H, 576] from 2^-120 to 2^100 in size, values spread over 2^12 within a row, a
    row of zeros, and one with a single non-zero value."""
    g = torch.Generator().manual_seed(seed)
    q = torch.randn((6, 8, 576), generator=g) * torch.exp2(torch.randint(-12, 1, (6, 8, 576), generator=g).float())
    q *= torch.exp2(torch.linspace(-120, 100, 48)).view(6, 8, 1)
    q[0, 0] = 0
    q[0, 1] = 0
    q[0, 1, 7] = 3.0
    return q.bfloat16()


def test_the_halves_carry_bf16_q_exactly():
    q = rows_of_every_magnitude()
    hi, lo, scale = q_halves.split(q)
    x = q.float() * scale
    total = hi.float() + lo.float()
    big = x.abs() >= 0.25
    assert big.sum() > big.numel() // 2
    assert torch.equal(total[big], x[big])  # exact, not close
    assert (total - x).abs().max().item() <= 2.0**-10
    amax = x.abs().amax(dim=-1)
    live = q.float().abs().amax(dim=-1) >= 2.0**-119
    assert ((amax >= 128) & (amax < 256))[live].all()  # hi uses e4m3's range, never saturates
    assert (scale[0, 0] == 1).all() and (hi[0, 0].float() == 0).all() and (lo[0, 0].float() == 0).all()
    # the scale is a power of two, and so is its inverse (the kernel multiplies scores by it)
    mantissa, _ = torch.frexp(scale)
    assert (mantissa == 0.5).all() and torch.isfinite(1 / scale).all()
    # negative control: the high half alone is q rounded to e4m3, which loses bits
    assert not torch.equal(hi.float()[big], x[big])


def emulated_decode(q, kv, idx, sm_scale, q_mode, d_v=512):
    """The V-in-registers tiles' arithmetic in fp32 torch: q as its two halves (or, as a negative
    control, rounded to e4m3), P times 2^P_SHIFT as two e4m3 halves (lo taken in fp16, as the
    kernel does), row sums of the fp32 P, output rounded to bf16."""
    idx = idx[:, 0].long()
    rows = kv[:, 0].float()[idx.clamp(min=0)]
    if q_mode == "halves":
        hi, lo, scale = q_halves.split(q)
        q_used = (hi.float() + lo.float()) / scale
    else:
        q_used = q.to(FP8).float()
    scores = torch.einsum("shd,skd->shk", q_used, rows) * sm_scale
    scores = scores.masked_fill(~(idx >= 0)[:, None, :], float("-inf"))
    p = torch.exp2((scores - scores.amax(-1, keepdim=True)) * math.log2(math.e) + P_SHIFT)
    p_hi = p.to(FP8).float()
    p_lo = (p.half() - p_hi.half()).to(FP8).float()
    out = torch.einsum("shk,skd->shd", p_hi + p_lo, rows[..., :d_v]) / p.sum(-1, keepdim=True)
    return out.bfloat16().float()


def data(kind, S=4, H=16, topk=2048, slots=16384, d=512, seed=0):
    """(q bf16 [S, H, d], kv bf16 [slots, d], indices [S, 1, topk]): KV N(0, 1); KV N(0, 0.5^2) with
    8 outlier channels times 8; or N(0, 1) KV with each head's q aligned with 8 of its query's keys
    (peaked scores)."""
    g = torch.Generator().manual_seed(seed)
    kv = torch.randn((slots, d), generator=g)
    if kind == "outlier":
        kv *= 0.5
        kv[:, :8] *= 8
    kv = kv.bfloat16()
    idx = torch.stack([torch.randperm(slots, generator=g)[:topk] for _ in range(S)])
    q = torch.randn((S, H, d), generator=g)
    if kind == "peaked":
        q *= 0.5
        for s in range(S):
            for h in range(H):
                q[s, h] += 1.5 * kv[idx[s, torch.randperm(topk, generator=g)[:8]]].float().mean(0)
    return q.bfloat16(), kv, idx[:, None, :].to(torch.int32)


@pytest.mark.parametrize("kind", ["normal", "outlier", "peaked"])
def test_accurate_q_keeps_the_raw_kv_floor(kind):
    """Against fp32 attention over the bf16 KV with bf16 q: the emulated decode within 1.1x the
    raw-KV floor (fp32 attention over the fp8 KV with bf16 q); q rounded to e4m3 is not (negative
    control: 1.17x to 3.5x the floor on these data)."""
    q, kv, idx = data(kind)
    scale = 512**-0.5
    truth = reference.sparse_mla_decode(q, kv[:, None].float(), idx, scale)
    raw = kv[:, None].to(FP8)
    floor = rel_err(reference.sparse_mla_decode(q, raw, idx, scale), truth)
    assert floor > 0.005
    assert rel_err(emulated_decode(q, raw, idx, scale, "halves"), truth) <= 1.1 * floor
    assert rel_err(emulated_decode(q, raw, idx, scale, "rounded"), truth) > 1.1 * floor
