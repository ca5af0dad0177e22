"""q as two e4m3 halves, in torch: the split decode_parts.split_q performs in the kernel, for the
tests and for anyone checking the kernel's QK^T by hand.

Each (query, head) row of q is multiplied by a power of two that puts its largest |q| in
[128, 256), then hi = e4m3(x) and lo = e4m3(x - hi). For bf16 q, hi + lo is x exactly wherever
|x| >= 2^-2 (x - hi has at most 4 significant bits, on e4m3's grid down to its subnormals' 2^-9)
and within 2^-10 below that, so QK^T as two fp8 products sees q at bf16's precision.
"""
from __future__ import annotations

import torch

SMALLEST_EXPONENT = 8  # biased float32 exponent below which a row keeps scale 1 (its inverse would be subnormal)


def pow2_scales(q: torch.Tensor) -> torch.Tensor:
    """[..., d] -> [..., 1] float32: 2^(7 - e) for a row whose largest |q| is m * 2^e (1 <= m < 2),
    from the exponent bits as the kernel computes it; 1 where that largest |q| is below 2^-119."""
    amax = q.float().abs().amax(dim=-1, keepdim=True)
    exponent = amax.view(torch.int32) >> 23
    scale = ((261 - exponent) << 23).view(torch.float32)
    return torch.where(exponent >= SMALLEST_EXPONENT, scale, torch.ones_like(scale))


def split(q: torch.Tensor, dtype=torch.float8_e4m3fn) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(hi, lo, scale) with hi + lo ~= q * scale, hi and lo in `dtype`, scale [..., 1] float32."""
    scale = pow2_scales(q)
    x = q.float() * scale
    hi = x.to(dtype)
    return hi, (x - hi.float()).to(dtype), scale
