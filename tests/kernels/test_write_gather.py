"""write_kv_fp8 and gather_kv_rows: on CPU under the Triton interpreter (exact fp8 casts, see triton_interpreter),
and the same tests compiled for CUDA where a GPU is present (`gpu` marker)."""
from types import SimpleNamespace

import pytest
import torch
from dsaops.kernels import kv_gather, kv_write, reference

from tests.support.triton_interpreter import interpreted

FN = torch.float8_e4m3fn


@pytest.fixture(params=["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
def dev(request, monkeypatch):
    if request.param == "cpu":
        interpreted(kv_write, monkeypatch)
        interpreted(kv_gather, monkeypatch)
    return torch.device(request.param)


def every_bf16(rows=128, width=512):
    """All 65,536 bf16 bit patterns (NaNs, infinities, subnormals, +-0 and every finite value)."""
    return torch.arange(65536, dtype=torch.int32).to(torch.int16).view(torch.bfloat16).reshape(rows, width)


def random_pool(slots, width, dev, seed=0):
    """A pool full of random finite bytes, so that an untouched row is told from a written or zeroed one."""
    g = torch.Generator().manual_seed(seed)
    raw = torch.randint(0, 256, (slots, 1, width), dtype=torch.uint8, generator=g)
    raw[(raw & 0x7F) == 0x7F] = 0x11  # no NaN bytes: byte comparison stays simple
    return raw.view(FN).to(dev)


def as_bytes(t):
    return t.view(torch.uint8).cpu()


def test_write_every_bf16_value_bit_exact(dev):
    x = every_bf16().to(dev)
    pool = torch.zeros(200, 1, 512, dtype=FN, device=dev)
    loc = torch.randperm(200, generator=torch.Generator().manual_seed(1))[:128].to(dev)
    kv_write.write_kv_fp8(pool, loc, x)
    assert torch.equal(as_bytes(pool)[loc.cpu(), 0], as_bytes(x.to(FN)))


@pytest.mark.parametrize("dtype", [torch.float16, torch.float32])
def test_write_other_input_dtypes_bit_exact(dev, dtype):
    g = torch.Generator().manual_seed(2)
    x = (torch.randn(64, 512, generator=g) * torch.logspace(-10, 3, 512)).to(dtype)
    x[0, :4] = torch.tensor([500.0, -1000.0, float("inf"), float("nan")])
    x = x.to(dev)
    pool = torch.zeros(64, 1, 512, dtype=FN, device=dev)
    kv_write.write_kv_fp8(pool, torch.arange(64, device=dev), x)
    assert torch.equal(as_bytes(pool[:, 0]), as_bytes(x.to(FN)))


@pytest.mark.parametrize("with_rope", [False, True], ids=["nope", "nope+rope"])
@pytest.mark.parametrize("loc_dtype", [torch.int32, torch.int64])
def test_write_matches_reference_and_leaves_other_rows(dev, with_rope, loc_dtype):
    g = torch.Generator().manual_seed(3)
    slots, n, d_rope = 300, 70, 64 if with_rope else 0
    # SGLang hands over k_nope as a [N, 1, 512] slice of a wider row: rows not contiguous with each other.
    kv_a = torch.randn(n, 1, 512 + d_rope + 32, generator=g).bfloat16().to(dev)
    k_nope = kv_a[..., :512]
    k_rope = kv_a[..., 512:512 + d_rope] if with_rope else None
    loc = 1 + torch.randperm(slots - 2, generator=g)[:n]
    loc[5] = 0                           # SGLang's reserved padding slot: skipped
    loc[6] = slots - 1                   # the last slot is written
    loc = loc.to(loc_dtype).to(dev)
    before = random_pool(slots, 512 + d_rope, dev)
    got = before.clone()
    kv_write.write_kv_fp8(got, loc, k_nope, k_rope, skip_index=0)
    want = reference.write_kv_fp8(before.clone(), loc, k_nope, k_rope, skip_index=0)
    assert torch.equal(as_bytes(got), as_bytes(want))
    untouched = torch.ones(slots, dtype=torch.bool)
    untouched[loc.cpu()[loc.cpu() != 0].long()] = False
    assert untouched[0] and untouched.sum() == slots - (n - 1)
    assert torch.equal(as_bytes(got)[untouched], as_bytes(before)[untouched])
    assert not torch.equal(as_bytes(got)[~untouched], as_bytes(before)[~untouched])  # control: something was written


@pytest.mark.parametrize("with_rope", [False, True], ids=["nope", "nope+rope"])
def test_row_scaled_write_matches_reference_bytes_and_scales(dev, with_rope):
    """The row-scaled layout: rows from 1e-6 to 1e4 (raw e4m3 flushes the small ones and saturates the
    large), a zero row, rows holding inf and NaN; scales and bytes equal the reference's."""
    g = torch.Generator().manual_seed(7)
    slots, n, d_rope = 96, 40, 64 if with_rope else 0
    x = torch.randn(n, 512 + d_rope, generator=g) * torch.logspace(-6, 4, n)[:, None]
    x[3] = 0
    x[4, 7], x[5, 9] = float("inf"), float("nan")
    x = x.bfloat16().to(dev)
    k_nope, k_rope = x[:, :512], (x[:, 512:] if with_rope else None)
    loc = torch.randperm(slots, generator=g)[:n]
    loc[6] = 0  # skipped: neither its row nor its scale is written
    loc = loc.to(dev)
    before, scale_before = random_pool(slots, 512 + d_rope, dev), torch.rand(slots, generator=g).to(dev)
    got, got_scale = before.clone(), scale_before.clone()
    kv_write.write_kv_fp8(got, loc, k_nope, k_rope, skip_index=0, kv_scale=got_scale)
    want, want_scale = before.clone(), scale_before.clone()
    reference.write_kv_fp8(want, loc, k_nope, k_rope, skip_index=0, kv_scale=want_scale)
    assert torch.equal(as_bytes(got), as_bytes(want))
    assert torch.equal(got_scale.cpu(), want_scale.cpu())
    assert got_scale[0] == scale_before[0] and torch.equal(as_bytes(got)[0], as_bytes(before)[0])
    small = loc[0].item()  # the 1e-6 row: raw e4m3 would flush it to zeros, the scaled layout keeps it
    assert (got[small].float() != 0).sum() > 400 and got_scale[small] < 2**-20


def test_row_scaled_write_wants_one_float32_scale_a_row(dev):
    pool = torch.zeros(8, 1, 512, dtype=FN, device=dev)
    x = torch.ones(2, 512, dtype=torch.bfloat16, device=dev)
    for bad in (torch.ones(7, device=dev), torch.ones(8, dtype=torch.float16, device=dev),
                torch.ones(16, device=dev)[::2]):  # a strided view: the kernel would write other elements
        with pytest.raises(ValueError, match=r"kv_scale must be float32 \[8\]"):
            kv_write.write_kv_fp8(pool, torch.arange(2, device=dev), x, kv_scale=bad)
        assert (pool.float() == 0).all()


def test_write_without_skip_index_writes_slot_zero(dev):
    pool = torch.zeros(8, 1, 512, dtype=FN, device=dev)
    x = torch.full((1, 512), 2.0, dtype=torch.bfloat16, device=dev)
    kv_write.write_kv_fp8(pool, torch.tensor([0], device=dev), x)
    assert (pool[0].float() == 2.0).all() and (pool[1:].float() == 0).all()


def test_write_drops_loc_outside_the_pool(dev):
    before = random_pool(16, 512, dev)
    got = before.clone()
    x = torch.ones(3, 512, dtype=torch.bfloat16, device=dev)
    kv_write.write_kv_fp8(got, torch.tensor([3, 16, -2], device=dev), x)
    assert (got[3].float() == 1.0).all()
    keep = torch.arange(16) != 3
    assert torch.equal(as_bytes(got)[keep], as_bytes(before)[keep])


def bad_write_inputs(dev):
    pool = torch.zeros(8, 1, 512, dtype=FN, device=dev)
    loc = torch.arange(4, device=dev)
    x = torch.ones(4, 512, dtype=torch.bfloat16, device=dev)
    rope = torch.ones(4, 64, dtype=torch.bfloat16, device=dev)
    return {
        "pool not fp8": ({"pool": pool.to(torch.bfloat16)}, "pool dtype"),
        "pool not [slots, 1, d]": ({"pool": pool[:, 0]}, "pool must be"),
        "loc 2-D": ({"loc": loc[None]}, "loc must be"),
        "loc float": ({"loc": loc.float()}, "loc must be"),
        "loc on another device": ({"loc": torch.arange(4, device="meta")}, "move it"),
        "loc strided": ({"loc": torch.arange(8, device=dev)[::2]}, "loc must be contiguous"),
        "rows != len(loc)": ({"k_nope": x[:3]}, "one row per loc"),
        "k_nope integer": ({"k_nope": x.int()}, "bfloat16, float16 or float32"),
        "rope makes the row too wide": ({"k_rope": rope}, "must equal the pool row width"),
        "row too narrow": ({"k_nope": x[:, :448]}, "must equal the pool row width"),
    }, {"pool": pool, "loc": loc, "k_nope": x, "k_rope": None}


@pytest.mark.parametrize("case", list(bad_write_inputs("cpu")[0]))
def test_write_bad_input_says_what_to_change_and_changes_nothing(dev, case):
    cases, good = bad_write_inputs(dev)
    change, message = cases[case]
    args = {**good, **change}
    before = as_bytes(args["pool"]).clone()
    with pytest.raises(ValueError, match=message):
        kv_write.write_kv_fp8(**args)
    assert torch.equal(as_bytes(args["pool"]), before)


def test_fp8_dtype_comes_from_the_targets_table(monkeypatch):
    props = {"sm_90": SimpleNamespace(major=9, minor=0), "gfx942": SimpleNamespace(gcnArchName="gfx942:sramecc+:xnack-"),
             "sm_80": SimpleNamespace(major=8, minor=0)}
    cuda = torch.device("cuda", 0)
    for name, hip, want in [("sm_90", None, torch.float8_e4m3fn), ("gfx942", "6.4", torch.float8_e4m3fnuz),
                            ("sm_80", None, None)]:
        monkeypatch.setattr(torch.cuda, "get_device_properties", lambda _d, p=props[name]: p)
        monkeypatch.setattr(torch.version, "hip", hip)
        assert kv_write.fp8_dtype_for.__wrapped__(cuda) == want, name  # uncached: each fake device is cuda:0
    assert kv_write.fp8_dtype_for(torch.device("cpu")) is None


@pytest.mark.parametrize("dtype", [torch.float8_e4m3fn, torch.float8_e4m3fnuz])
def test_special_bytes_are_torchs(dtype):
    """The bytes the writer forces for overflow and NaN are what torch's cast gives, for every bf16 value
    (checked for e4m3fnuz here too, which the interpreter cannot run)."""
    x = every_bf16().flatten().float()
    over_bits, over_byte, nan_byte, signed = kv_write.special_bytes(dtype)
    magnitude = x.view(torch.int32) & 0x7FFFFFFF
    special = magnitude >= over_bits
    want = torch.where(magnitude > 0x7F800000, nan_byte, over_byte)
    if signed:
        want = want | (x.view(torch.int32) < 0).int() * 0x80
    got = x.to(dtype).view(torch.uint8).int()
    assert torch.equal(got[special], want[special])
    # below the threshold torch writes a finite value: the threshold is not set too high
    assert x[~special].to(dtype).float().isfinite().all()


def test_pool_dtype_other_than_the_targets_is_refused(monkeypatch):
    monkeypatch.setattr(kv_write, "fp8_dtype_for", lambda _d: torch.float8_e4m3fnuz)
    pool = torch.zeros(4, 1, 512, dtype=FN)
    with pytest.raises(ValueError, match="float8_e4m3fnuz.*targets.toml"):
        kv_write.write_kv_fp8(pool, torch.arange(2), torch.ones(2, 512))
    with pytest.raises(ValueError, match="float8_e4m3fnuz.*targets.toml"):
        kv_gather.gather_kv_rows(pool, torch.arange(2))


@pytest.mark.parametrize("n,pad,width", [(200, 128, 512), (256, 128, 512), (1, 128, 576), (70, 64, 512)])
def test_gather_matches_reference_with_tail_and_padding(dev, n, pad, width):
    slots = 400
    pool = random_pool(slots, width, dev, seed=n)
    g = torch.Generator().manual_seed(n)
    ids = torch.randperm(slots, generator=g)[:n].to(torch.int32)
    if n > 3:
        ids[:3] = torch.tensor([0, slots - 1, -1])  # slot 0, the last slot, a masked id
    ids = ids.to(dev)
    rows, out_ids = kv_gather.gather_kv_rows(pool, ids, pad)
    want_rows, want_ids = reference.gather_kv_rows(pool, ids, pad)
    padded = -(-n // pad) * pad
    assert rows.shape == (padded, 1, width) and rows.dtype == FN and out_ids.dtype == torch.int32
    assert torch.equal(as_bytes(rows), as_bytes(want_rows)) and torch.equal(out_ids.cpu(), want_ids.cpu())
    # every valid id, the tail past the last full multiple included, brings its own row
    valid = (ids >= 0).cpu()
    assert torch.equal(as_bytes(rows)[:n][valid], as_bytes(pool)[ids.cpu()[valid].long()])
    assert (as_bytes(rows)[n:] == 0).all() and (out_ids[n:] == -1).all()
    assert (as_bytes(rows)[:n][~valid] == 0).all()


def test_gather_empty_and_out_of_pool_ids(dev):
    pool = random_pool(8, 512, dev)
    rows, ids = kv_gather.gather_kv_rows(pool, torch.empty(0, dtype=torch.int64, device=dev))
    assert rows.shape == (0, 1, 512) and ids.shape == (0,)
    rows, ids = kv_gather.gather_kv_rows(pool, torch.tensor([2, 8, -5], device=dev), pad_multiple=4)
    assert torch.equal(as_bytes(rows[0]), as_bytes(pool[2])) and (as_bytes(rows[1:]) == 0).all()


def test_write_then_gather_round_trip(dev):
    x = torch.randn(40, 576, generator=torch.Generator().manual_seed(5)).bfloat16().to(dev)
    pool = random_pool(100, 576, dev)
    loc = torch.arange(99, 59, -1, device=dev)
    kv_write.write_kv_fp8(pool, loc, x[:, :512], x[:, 512:])
    rows, ids = kv_gather.gather_kv_rows(pool, loc)
    assert torch.equal(as_bytes(rows[:40, 0]), as_bytes(x.to(FN))) and torch.equal(ids[:40].cpu(), loc.int().cpu())


@pytest.mark.parametrize("change,message", [
    ({"pad_multiple": 0}, "pad_multiple"), ({"pad_multiple": True}, "pad_multiple"),
    ({"pad_multiple": 1.5}, "pad_multiple"), ({"slot_ids": torch.zeros(2, 2, dtype=torch.int32)}, "slot_ids"),
    ({"slot_ids": torch.zeros(2)}, "slot_ids"), ({"pool": torch.zeros(4, 1, 512)}, "pool dtype"),
    ({"slot_ids": torch.arange(4)[::2]}, "slot_ids must be contiguous"),
])
def test_gather_bad_input(change, message):
    args = {"pool": torch.zeros(4, 1, 512, dtype=FN), "slot_ids": torch.arange(2), "pad_multiple": 128} | change
    with pytest.raises(ValueError, match=message):
        kv_gather.gather_kv_rows(**args)


def test_interpreter_alone_gets_fp8_wrong(monkeypatch):
    """Why triton_interpreter exists; when Triton fixes its rounding this fails and the routing can go."""
    interpreted(kv_write, monkeypatch, exact_fp8=False)
    x = every_bf16()
    pool = torch.zeros(128, 1, 512, dtype=FN)
    kv_write.write_kv_fp8(pool, torch.arange(128), x)
    assert not torch.equal(as_bytes(pool[:, 0]), as_bytes(x.to(FN)))


@pytest.mark.gpu
def test_serving_sizes_on_gpu():
    """65,536 rows into a 2.4 GB pool (byte offsets past 2**31) and back, against torch's own cast and indexing."""
    slots, width, n = 1 << 22, 576, 65536
    pool = torch.zeros(slots, 1, width, dtype=FN, device="cuda")
    x = torch.randn(n, width, dtype=torch.bfloat16, device="cuda") * 100
    loc = 1 + torch.randperm(slots - 2, device="cuda")[:n]  # distinct slots, none of the two below
    loc[:2] = torch.tensor([slots - 1, 0])  # the last slot, and slot 0, which skip_index keeps
    kv_write.write_kv_fp8(pool, loc, x[:, :512], x[:, 512:], skip_index=0)
    raw = pool.view(torch.uint8)
    assert torch.equal(raw[loc[2:], 0], x[2:].to(FN).view(torch.uint8))
    assert torch.equal(raw[slots - 1, 0], x[0].to(FN).view(torch.uint8)) and (raw[0] == 0).all()
    rows, ids = kv_gather.gather_kv_rows(pool, loc.int())
    assert rows.shape == (n, 1, width) and torch.equal(ids, loc.int())
    assert torch.equal(rows.view(torch.uint8)[2:, 0], x[2:].to(FN).view(torch.uint8))
