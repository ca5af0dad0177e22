"""The fp32 references against plain Python loops (the definitions, written the slow obvious way)."""
import math

import pytest
import torch
from dsaops.kernels import reference

FN = torch.float8_e4m3fn


def loop_decode(q, kv, indices, sm_scale, d_v):
    S, H, D = q.shape
    out = torch.zeros(S, H, d_v, dtype=torch.float64)
    lse = torch.full((S, H), -math.inf, dtype=torch.float64)
    for s in range(S):
        ids = [int(i) for i in indices[s, 0] if i >= 0]
        for h in range(H):
            scores = [sm_scale * sum(float(q[s, h, d]) * float(kv[i, 0, d]) for d in range(D)) for i in ids]
            if not scores:
                continue
            top = max(scores)
            weights = [math.exp(x - top) for x in scores]
            total = sum(weights)
            lse[s, h] = top + math.log(total)
            for w, i in zip(weights, ids):
                for d in range(d_v):
                    out[s, h, d] += w / total * float(kv[i, 0, d])
    return out, lse


@pytest.mark.parametrize("d_tail", [0, 4])
def test_decode_matches_loops(d_tail):
    g = torch.Generator().manual_seed(0)
    S, H, d_v, slots = 4, 3, 8, 20
    q = torch.randn(S, H, d_v + d_tail, generator=g).bfloat16()
    kv = torch.randn(slots, 1, d_v + d_tail, generator=g).to(FN)
    indices = torch.tensor([[[0, 5, 19, -1, 7]],       # slot 0, the last slot, a masked entry
                            [[3, 3, 4, 8, 9]],         # a repeated index counts twice
                            [[-1, -1, -1, -1, -1]],    # all masked
                            [[-1, 2, -1, -1, 11]]], dtype=torch.int32)
    out, lse = reference.sparse_mla_decode(q, kv, indices, 0.3, d_v=d_v, return_lse=True)
    want_out, want_lse = loop_decode(q, kv, indices, 0.3, d_v)
    assert out.dtype == torch.float32 and out.shape == (S, H, d_v) and lse.shape == (S, H)
    torch.testing.assert_close(out.double(), want_out, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(lse.double(), want_lse, rtol=1e-5, atol=1e-6)
    assert not out.isnan().any() and (out[2] == 0).all() and (lse[2] == -math.inf).all()
    assert torch.equal(reference.sparse_mla_decode(q, kv, indices, 0.3, d_v=d_v), out)
    # control: the comparison sees a wrong index
    scrambled = indices.clone()
    scrambled[0, 0, 1] = 6
    assert not torch.allclose(reference.sparse_mla_decode(q, kv, scrambled, 0.3, d_v=d_v)[0], out[0], atol=1e-3)


@pytest.mark.parametrize("change,message", [
    ({"indices": torch.tensor([[[0, 20]]], dtype=torch.int32)}, r"\[-1, 19\]"),
    ({"indices": torch.tensor([[[0, -2]]], dtype=torch.int32)}, r"\[-1, 19\]"),
    ({"indices": torch.zeros(1, 2, dtype=torch.int32)}, "indices must be"),
    ({"indices": torch.zeros(1, 1, 2)}, "integer"),
    ({"kv": torch.zeros(20, 1, 16)}, "row width equal"),
    ({"d_v": 13}, "d_v must be"),
    ({"q": torch.zeros(2, 12)}, "q must be"),
])
def test_decode_bad_input(change, message):
    args = {"q": torch.zeros(1, 2, 12), "kv": torch.zeros(20, 1, 12), "indices": torch.zeros(1, 1, 2, dtype=torch.int32),
            "sm_scale": 1.0, "d_v": 8} | change
    with pytest.raises(ValueError, match=message):
        reference.sparse_mla_decode(**args)


@pytest.mark.parametrize("d_rope", [0, 4])
def test_write_matches_loops(d_rope):
    g = torch.Generator().manual_seed(1)
    slots, n, d = 12, 5, 8 + d_rope
    pool = torch.randn(slots, 1, d, generator=g).to(FN)
    k_nope = torch.randn(n, 1, 8, generator=g).bfloat16()
    k_rope = torch.randn(n, d_rope, generator=g).bfloat16() if d_rope else None
    loc = torch.tensor([3, 0, 11, 7, 0])              # 0 is the skipped (reserved) slot, named twice
    want = pool.clone()
    for i in range(n):
        if loc[i] == 0:
            continue
        row = [float(x) for x in k_nope[i, 0]] + ([float(x) for x in k_rope[i]] if d_rope else [])
        for j, x in enumerate(row):
            want[loc[i], 0, j] = torch.tensor(x).to(FN)
    got = reference.write_kv_fp8(pool.clone(), loc, k_nope, k_rope, skip_index=0)
    assert torch.equal(got.view(torch.uint8), want.view(torch.uint8))


@pytest.mark.parametrize("loc,skip,message", [
    ([3, 3], None, "twice"), ([3, 12], None, r"\[0, 11\]"), ([-1, 2], None, r"\[0, 11\]"), ([0, 2], 5, None),
])
def test_write_bad_loc_changes_nothing(loc, skip, message):
    pool = torch.randn(12, 1, 8).to(FN)
    before = pool.clone()
    call = lambda: reference.write_kv_fp8(pool, torch.tensor(loc), torch.ones(2, 8), skip_index=skip)
    if message is None:                               # control: a good call does write
        call()
        assert not torch.equal(pool.view(torch.uint8), before.view(torch.uint8))
        return
    with pytest.raises(ValueError, match=message):
        call()
    assert torch.equal(pool.view(torch.uint8), before.view(torch.uint8))


def test_write_refuses_widths_and_dtypes():
    pool = torch.zeros(4, 1, 8, dtype=FN)
    with pytest.raises(ValueError, match="row width"):
        reference.write_kv_fp8(pool, torch.tensor([1]), torch.ones(1, 6))
    with pytest.raises(ValueError, match="float8_e4m3fn"):
        reference.write_kv_fp8(pool.float(), torch.tensor([1]), torch.ones(1, 8))


@pytest.mark.parametrize("n,pad", [(5, 4), (8, 4), (0, 4), (3, 1)])
def test_gather_matches_loops(n, pad):
    g = torch.Generator().manual_seed(2)
    pool = torch.randn(10, 1, 6, generator=g).to(FN)
    ids = torch.randint(-1, 10, (n,), generator=g)
    rows, out_ids = reference.gather_kv_rows(pool, ids, pad)
    padded = -(-n // pad) * pad
    want_rows = torch.zeros(padded, 1, 6, dtype=torch.uint8)
    want_ids = [-1] * padded
    for i in range(n):
        want_ids[i] = int(ids[i])
        if ids[i] >= 0:
            want_rows[i] = pool[ids[i]].view(torch.uint8)
    assert torch.equal(rows.view(torch.uint8), want_rows)
    assert out_ids.tolist() == want_ids and out_ids.dtype == torch.int32 and rows.dtype == FN


@pytest.mark.parametrize("ids,pad,message", [([10], 4, r"\[-1, 9\]"), ([1], 0, "pad_multiple"), ([[1]], 4, "1-D")])
def test_gather_bad_input(ids, pad, message):
    with pytest.raises(ValueError, match=message):
        reference.gather_kv_rows(torch.zeros(10, 1, 6, dtype=FN), torch.tensor(ids), pad)
