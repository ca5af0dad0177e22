"""The per-row-scaled fp8 layout at reference level: quantization, decode over it,
and the accuracy claim benchmarks/fp8_row_scale_accuracy.py makes (CPU)."""
import importlib.util
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from dsaops.kernels import reference

FP8 = torch.float8_e4m3fn
_path = Path(__file__).parents[2] / "benchmarks" / "fp8_row_scale_accuracy.py"
_spec = importlib.util.spec_from_file_location("fp8_row_scale_accuracy", _path)
study = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(study)


def test_each_rows_max_lands_on_the_fp8_max_and_dequantizes_within_e4m3_precision():
    x = torch.randn((64, 512)) * torch.logspace(-4, 2, 64)[:, None]  # rows from 1e-4 to 1e2
    x[5] = 0
    x[6, 3] = float("inf")
    rows, scales = reference.quantize_rows_scaled(x)
    assert rows.dtype == FP8 and scales.shape == (64,)
    assert scales[5] == 1 and (rows[5].float() == 0).all()
    inf_byte = torch.tensor([float("inf")]).to(FP8).view(torch.uint8)[0]
    assert scales[6] == 1 and rows[6].view(torch.uint8)[3] == inf_byte  # unscaled: torch's plain cast
    live = [i for i in range(64) if i not in (5, 6)]
    assert (rows[live].float().abs().amax(dim=1) == torch.finfo(FP8).max).all()
    deq = rows.float() * scales[:, None]
    # 3 mantissa bits: half a step is 2^-4 of the value, for every row whatever its magnitude
    assert ((deq - x)[live].norm(dim=1) <= 2**-4 * x[live].norm(dim=1)).all()


def test_decode_over_the_scaled_pool_is_decode_over_its_dequantized_rows():
    kv = torch.randn((256, 512)) * 0.01
    rows, scales = reference.quantize_rows_scaled(kv)
    q = torch.randn((2, 16, 512))
    idx = torch.randint(0, 256, (2, 1, 64), dtype=torch.int32)
    idx[0, 0, :5] = -1
    out = reference.sparse_mla_decode_row_scaled(q, rows[:, None], scales, idx, 512**-0.5)
    want = reference.sparse_mla_decode(q, (rows.float() * scales[:, None])[:, None], idx, 512**-0.5)
    torch.testing.assert_close(out, want)
    with pytest.raises(ValueError, match=r"kv_scale must be float32 \[256\]"):
        reference.sparse_mla_decode_row_scaled(q, rows[:, None], scales[:10], idx, 1.0)


def test_row_scaling_wins_back_small_rows_and_gives_nothing_away_in_range():
    raw, scaled = study.errors(0.01, 1.0)  # rows near fp8's subnormals: raw e4m3 loses precision
    assert scaled < 0.6 * raw
    raw, scaled = study.errors(1.0, 1.0)   # control: rows already in range, both formats alike
    assert abs(scaled - raw) <= 0.1 * raw
