"""sparse_mla_decode_fp8 against the fp32 reference, on a GPU (run with `make test-gpu`).

Error budget held to (spread case, the same bf16 q and fp8 kv in both): q enters QK^T as two e4m3
halves whose sum is q (kernels/q_halves.py); Hopper's fp8 wgmma adds the low half's products at its
accumulator's precision, which leaves each score at about bf16's 2^-8 relative; P rounds to fp16
(2^-11 relative) or on Hopper's V-in-registers tiles to two e4m3 halves (2^-8), each split's output
to bf16 (2^-9) and the final output to bf16 (2^-9): at most ~1% relative (norm-wise far less). The
test allows 1.0%. The error against attention over
the original bf16 KV, the raw-KV floor and FlashMLA's error are test_decode_accuracy_gpu.py's.
"""
import pytest

torch = pytest.importorskip("torch")

from dsaops.kernels import decode, reference, sparse_mla_decode_fp8, tiles
from dsaops.kernels.accuracy import rel_err
from dsaops.kernels.build import kernel_jobs
from dsaops.kernels.decode import decode_with_tile

from dsaops import targets

pytestmark = pytest.mark.gpu
FP8 = torch.float8_e4m3fn
D_V = 512
SLOTS = 1 << 16


def decode_on(target, q, kv, idx, scale, return_lse=False):
    """sparse_mla_decode_fp8 with the GPU's own kernels (target None), or another target's
    (decode.kernel_target: "sm_121@sm_90a" runs GB10's on a Hopper; the conftest's `target`)."""
    if target is None:
        return sparse_mla_decode_fp8(q, kv, idx, scale, return_lse=return_lse)
    return decode_with_tile(q, kv, idx, scale, D_V, return_lse, target=target)


def make(S, H, d_tail, topk, *, seed=0, slots=SLOTS):
    g = torch.Generator(device="cuda").manual_seed(seed)
    width = D_V + d_tail
    kv = torch.randn((slots, 1, width), generator=g, device="cuda").to(FP8)
    # bf16 q off e4m3's grid: the kernel carries it exactly (q's two e4m3 halves), so the reference
    # with the same q measures the kernel alone, the low halves included (fp8-valued q has none)
    q = torch.randn((S, H, width), generator=g, device="cuda").to(torch.bfloat16)
    # distinct rows per query, never slot 0 (tests that want it put it there)
    idx = torch.stack([torch.randperm(slots - 1, generator=g, device="cuda")[:topk] + 1 for _ in range(S)])
    return q, kv, idx[:, None, :].to(torch.int32).contiguous()


@pytest.mark.parametrize("H", [8, 16, 32, 64, 128])
@pytest.mark.parametrize("d_tail", [0, 64])
@pytest.mark.parametrize("S", [1, 37])
def test_spread_case_within_budget(H, d_tail, S, target):
    q, kv, idx = make(S, H, d_tail, 2048, seed=H + d_tail + S)
    scale = (D_V + d_tail) ** -0.5
    out, lse = decode_on(target, q, kv, idx, scale, return_lse=True)
    ref, ref_lse = reference.sparse_mla_decode(q, kv, idx, scale, return_lse=True)
    assert out.shape == (S, H, D_V) and out.dtype == torch.bfloat16
    assert torch.isfinite(out).all()
    assert rel_err(out, ref) <= 0.01
    assert (lse - ref_lse).abs().max().item() <= 1e-3


def test_wide_score_range_rescales_the_accumulator_mid_query(target):
    """sm_scale 1: scores spread over ~2^300, so the running max jumps by large factors across tiles
    and the accumulator's rescale is what keeps the output right (without it the output is off by
    far more than the bound). Each score carries q at about bf16's precision (2^-8 relative), which
    at sm_scale 1 moves a near one-hot softmax's weights by a few per cent: 3% holds that, not 1%."""
    q, kv, idx = make(16, 64, 0, 2048, seed=11)
    out, lse = decode_on(target, q, kv, idx, 1.0, return_lse=True)
    ref, ref_lse = reference.sparse_mla_decode(q, kv, idx, 1.0, return_lse=True)
    assert rel_err(out, ref) <= 0.03
    # scores of ~100 carry q at bf16's precision (2^-8 relative): so does an lse they dominate
    assert (lse - ref_lse).abs().max().item() <= 2**-8 * ref_lse.abs().max().item()


@pytest.mark.parametrize("S", [1, 64])  # a merge kernel's call (32 splits) and a cluster's (2)
def test_an_asked_for_lse_is_the_callers_own(S):
    """Calls that do not return the lse share one scratch for it (decode._plan); one that does gets
    its own tensor, which a later call of the same shape leaves alone."""
    q, kv, idx = make(S, 64, 0, 2048, seed=5)
    scale = D_V**-0.5
    _, lse = sparse_mla_decode_fp8(q, kv, idx, scale, return_lse=True)
    kept = lse.clone()
    q2, kv2, idx2 = make(S, 64, 0, 2048, seed=6)
    sparse_mla_decode_fp8(q2, kv2, idx2, scale)
    _, lse2 = sparse_mla_decode_fp8(q2, kv2, idx2, scale, return_lse=True)
    torch.cuda.synchronize()
    assert torch.equal(lse, kept)
    assert lse2.data_ptr() != lse.data_ptr() and not torch.equal(lse2, lse)


def test_topk_beyond_one_splits_row_ids_is_split_and_padded(target):
    """A top-k larger than a split's row-id buffer (tile.index_rows), not a multiple of the tile."""
    q, kv, idx = make(200, 64, 0, 3000, seed=12)
    out = decode_on(target, q, kv, idx, D_V**-0.5)
    assert rel_err(out, reference.sparse_mla_decode(q, kv, idx, D_V**-0.5)) <= 0.01


# Batches and head counts below reach several of the tiles the dispatch has on sm_90: 16-head blocks
# (few queries), the 64-row tile (d_tail 64), the 128-row tiles alone and as two-split clusters
# (S = 64: tiles.PAIRED);
# test_each_hopper_tile_matches_reference forces every one of them
@pytest.mark.parametrize(("S", "H"), [(8, 64), (64, 16)])
def test_scrambled_indices_fail_the_comparator(S, H, target):
    """Negative control: the comparator must see a wrong row set (>= 50% error)."""
    q, kv, idx = make(S, H, 0, 2048, seed=1)
    scrambled = torch.randint(0, SLOTS, idx.shape, device="cuda", dtype=torch.int32)
    out = decode_on(target, q, kv, scrambled, D_V**-0.5)
    assert rel_err(out, reference.sparse_mla_decode(q, kv, idx, D_V**-0.5)) >= 0.5


@pytest.mark.parametrize("S", [1, 64])
@pytest.mark.parametrize("H", [16, 64])
def test_one_hot_returns_the_row(S, H, target):
    """q equal to one row's key with a huge scale: softmax is exactly one-hot, out is that row's V."""
    _, kv, idx = make(S, H, 64, 2048, seed=2)
    pick = torch.randint(0, 2048, (S,), device="cuda")
    rows = kv[idx[:, 0, :].gather(1, pick[:, None]).squeeze(1).long(), 0]  # [S, 576] fp8
    q = rows[:, None, :].to(torch.bfloat16).expand(S, H, -1).contiguous()
    out = decode_on(target, q, kv, idx, 1000.0)
    want = rows[:, None, :D_V].float().expand_as(out)
    assert rel_err(out, want) <= 1e-6


@pytest.mark.parametrize("H", [16, 64])
def test_single_unmasked_index_is_exact_and_masked_rows_are_ignored(H, target):
    q, kv, idx = make(16, H, 0, 2048, seed=3)
    keep = torch.randint(0, 2048, (16,), device="cuda")
    masked = torch.full_like(idx, -1)
    masked.scatter_(2, keep[:, None, None], idx.gather(2, keep[:, None, None]))
    kv[0] = torch.full(kv[0].shape, float("nan"), device="cuda").to(FP8)  # what masked (-1) rows must never reach
    out = decode_on(target, q, kv, masked, D_V**-0.5)
    want = kv[masked.max(dim=2).values[:, 0].long(), 0, :D_V].float()[:, None, :].expand_as(out)
    assert rel_err(out, want) <= 1e-6


@pytest.mark.parametrize("S", [2, 48])
def test_random_masks_match_reference_and_all_masked_row_is_zero(S, target):
    q, kv, idx = make(S, 32, 64, 1024, seed=4)
    idx = torch.where(torch.rand(idx.shape, device="cuda") < 0.3, -1, idx).to(torch.int32)
    idx[0] = -1
    out, lse = decode_on(target, q, kv, idx, 576**-0.5, return_lse=True)
    ref = reference.sparse_mla_decode(q, kv, idx, 576**-0.5)
    assert not torch.isnan(out).any()
    assert (out[0] == 0).all() and torch.isneginf(lse[0]).all()
    assert rel_err(out[1:], ref[1:]) <= 0.01


@pytest.mark.parametrize(("S", "H"), [(64, 16), (64, 64), (33, 100)])
def test_two_splits_merge_in_their_cluster(S, H):
    """64 to 132 blocks take two splits a query, run as 2-block clusters that merge through
    distributed shared memory (tiles.PAIRED, decode_regs.cluster_pair), with no merge kernel: right
    for a query whose second split saw only masked rows, one whose first did, one with every row
    masked (zeros, lse -inf), and for a head count that pads its last head block (100 = 64 + 36).
    Split k owns the 128-row tiles k, k + 2, ... (decode_parts.load_row_ids)."""
    scale = D_V**-0.5
    q, kv, idx = make(S, H, 0, 2048, seed=21)
    tiles_of = idx.view(S, 1, 16, 128)
    tiles_of[1, 0, 1::2] = -1  # the second split's tiles
    tiles_of[2, 0, 0::2] = -1  # the first split's
    idx[3] = -1
    launches, *_ = decode._plan(torch.cuda.current_device(), S, H, 2048, D_V, D_V, None, False)
    (_, _, combine, n_split, _), = launches
    assert n_split == 2 and combine is None
    out, lse = sparse_mla_decode_fp8(q, kv, idx, scale, return_lse=True)
    ref, ref_lse = reference.sparse_mla_decode(q, kv, idx, scale, return_lse=True)
    assert rel_err(out[:3], ref[:3]) <= 0.01 and rel_err(out[4:], ref[4:]) <= 0.01
    assert (lse[:3] - ref_lse[:3]).abs().max().item() <= 1e-3 and (lse[4:] - ref_lse[4:]).abs().max().item() <= 1e-3
    assert (out[3] == 0).all() and torch.isneginf(lse[3]).all()


@pytest.mark.parametrize(("S", "H"), [(1, 64), (64, 64), (37, 16)])
def test_a_short_context_stops_after_its_last_valid_row(S, H, target):
    """SGLang pads a context shorter than top-k with -1 at the tail; each split stops after its last
    tile with a valid row (decode_parts.flag_tiles), its tiles interleaved with the other splits'.
    Right for 300 valid rows of 2,048, for a query whose only valid row is the last slot of top-k,
    for one with none (zeros, lse -inf), and whatever topk_length says."""
    scale = D_V**-0.5
    q, kv, idx = make(S, H, 0, 2048, seed=40)
    last = idx[0, 0, 2047].item()
    idx[:, 0, 300:] = -1
    idx[0, 0, :] = -1
    idx[0, 0, 2047] = last  # the last slot's row only
    empty = S - 1 if S > 1 else None
    if empty is not None:
        idx[empty] = -1
    out, lse = decode_on(target, q, kv, idx, scale, return_lse=True)
    ref, ref_lse = reference.sparse_mla_decode(q, kv, idx, scale, return_lse=True)
    keep = [s for s in range(S) if s != empty]
    assert rel_err(out[keep], ref[keep]) <= 0.01
    # query 0's lse is one score: QK^T carries q at bf16's precision (2^-8 relative), not better
    assert (lse[keep] - ref_lse[keep]).abs().max().item() <= 2**-8 * ref_lse[keep].abs().max().item()
    assert rel_err(out[0], kv[last, 0, :D_V].float().expand(H, -1)) <= 1e-6
    if empty is not None:
        assert (out[empty] == 0).all() and torch.isneginf(lse[empty]).all()
    for length in (torch.full((S,), 300), torch.ones(S)) if target is None else ():  # the valid count, a wrong one
        again = sparse_mla_decode_fp8(q, kv, idx, scale, topk_length=length.to(torch.int32).cuda())
        assert torch.equal(again, out)


@pytest.mark.parametrize(("S", "H"), [(140, 64), (80, 128), (160, 16)])
def test_whole_waves_then_the_rest_each_write_their_own_queries(S, H, target):
    """A batch past whole waves of blocks runs them in one launch and the rest in a second of more
    splits (splits.launches): each query's output and lse land in its own row, for a query with
    every row masked and one with 300 valid rows on either side of the seam."""
    scale = D_V**-0.5
    q, kv, idx = make(S, H, 0, 2048, seed=S + H)
    launches, *_ = decode._plan(torch.cuda.current_device(), S, H, 2048, D_V, D_V, None, False, target)
    assert len(launches) == 2
    seam = launches[0][0].stop
    empty = (seam - 1, S - 1)
    for s in empty:
        idx[s] = -1
    idx[seam - 2, 0, 300:] = -1
    idx[seam, 0, 300:] = -1
    out, lse = decode_on(target, q, kv, idx, scale, return_lse=True)
    ref, ref_lse = reference.sparse_mla_decode(q, kv, idx, scale, return_lse=True)
    keep = [s for s in range(S) if s not in empty]
    assert rel_err(out[keep], ref[keep]) <= 0.01
    assert (lse[keep] - ref_lse[keep]).abs().max().item() <= 1e-3
    for s in empty:
        assert (out[s] == 0).all() and torch.isneginf(lse[s]).all()


@pytest.mark.parametrize(("S", "topk"), [(4, 100), (48, 300)])
def test_first_and_last_slot_and_unpadded_topk(S, topk, target):
    """Indices at slot 0 and slots-1, and a top-k that is not a multiple of the row tile."""
    q, kv, idx = make(S, 16, 0, topk, seed=5)
    idx[:, 0, 0] = 0
    idx[:, 0, -1] = SLOTS - 1
    out = decode_on(target, q, kv, idx, D_V**-0.5)
    assert rel_err(out, reference.sparse_mla_decode(q, kv, idx, D_V**-0.5)) <= 0.01


@pytest.mark.parametrize(("S", "H"), [(8, 64), (64, 16)])
def test_q_of_any_magnitude_keeps_its_precision(S, H, target):
    """q's e4m3 halves are scaled a head (q_halves): q a thousand times smaller or larger than N(0, 1)
    gives the kernel-only error of the spread case, where q rounded to e4m3 errs several times more
    (negative control: the same comparator on the rounded q's reference)."""
    _, kv, idx = make(S, H, 0, 2048, seed=6)
    g = torch.Generator(device="cuda").manual_seed(60)
    for size in (1e-3, 1.0, 1e3):
        q = (size * torch.randn((S, H, D_V), generator=g, device="cuda")).to(torch.bfloat16)
        scale = D_V**-0.5 / size
        want = reference.sparse_mla_decode(q, kv, idx, scale)
        assert rel_err(decode_on(target, q, kv, idx, scale), want) <= 0.01, size
        rounded = reference.sparse_mla_decode(q.float().clamp(-448, 448).to(FP8).to(torch.bfloat16), kv, idx, scale)
        assert rel_err(rounded, want) > 0.02, size


def test_bad_input_says_what_to_change():
    q, kv, idx = make(1, 16, 0, 64, seed=7)
    with pytest.raises(ValueError, match="d_tail"):
        sparse_mla_decode_fp8(q[..., :500].contiguous(), kv, idx, 1.0)
    with pytest.raises(ValueError, match="int32"):
        sparse_mla_decode_fp8(q, kv, idx.long(), 1.0)
    with pytest.raises(ValueError, match=r"topk_length must be int32 \[1\]"):
        sparse_mla_decode_fp8(q, kv, idx, 1.0, topk_length=torch.ones(2, dtype=torch.int32, device="cuda"))


def test_zero_queries_return_empty_results():
    q, kv, idx = make(1, 16, 0, 64, seed=7)
    out, lse = sparse_mla_decode_fp8(q[:0], kv, idx[:0], 1.0, return_lse=True)
    assert (out.shape, out.dtype, out.device) == ((0, 16, D_V), torch.bfloat16, q.device)
    assert (lse.shape, lse.dtype, lse.device) == ((0, 16), torch.float32, q.device)


@pytest.mark.parametrize(("tile", "d_tail"),
                         kernel_jobs(targets.get("sm_90"), merges=False),
                         ids=lambda x: x.name if isinstance(x, tiles.Tile) else f"d_tail{x}")
@pytest.mark.parametrize("blocks", ["part", "several"])
@pytest.mark.parametrize("S", [1, 40])
def test_each_hopper_tile_matches_reference(tile, d_tail, blocks, S):
    """Each raw-layout tile the dispatch has on sm_90 for each d_tail (tiles.configurations: the
    V-in-registers tiles of 64 heads and the narrow ones, and their two-split clusters), forced at
    any batch size, with half a head block (the rest padded) or several: spread case, masked rows,
    an all-masked query."""
    H = tile.heads_per_block // 2 if blocks == "part" else 128
    q, kv, idx = make(S, H, d_tail, 2048, seed=100 + H + d_tail + S)
    idx = torch.where(torch.rand(idx.shape, device="cuda") < 0.2, -1, idx).to(torch.int32)
    idx[-1] = -1
    scale = (D_V + d_tail) ** -0.5
    out, lse = decode_with_tile(q, kv, idx, scale, D_V, True, tile=tile)
    ref, ref_lse = reference.sparse_mla_decode(q, kv, idx, scale, return_lse=True)
    assert not torch.isnan(out).any()
    assert (out[-1] == 0).all() and torch.isneginf(lse[-1]).all()
    if S > 1:
        assert rel_err(out[:-1], ref[:-1]) <= 0.01
        assert (lse[:-1] - ref_lse[:-1]).abs().max().item() <= 1e-3


def scaled_pool(slots, width, outlier, *, seed):
    """KV rows N(0, 1) with 8 outlier channels and a tenth of the rows at 1e-3 (raw e4m3's subnormals),
    written by write_kv_fp8 both ways: (bf16 rows, raw pool, row-scaled pool, its scales)."""
    from dsaops.kernels import write_kv_fp8

    g = torch.Generator(device="cuda").manual_seed(seed)
    x = torch.randn((slots, width), generator=g, device="cuda")
    x[:, :8] *= outlier
    x[::10] *= 1e-3
    x = x.bfloat16()
    loc = torch.arange(slots, device="cuda")
    raw = write_kv_fp8(torch.empty((slots, 1, width), dtype=FP8, device="cuda"), loc, x)
    scales = torch.empty(slots, device="cuda")
    scaled = write_kv_fp8(torch.empty((slots, 1, width), dtype=FP8, device="cuda"), loc, x, kv_scale=scales)
    return x, raw, scaled, scales


@pytest.mark.parametrize("H", [16, 64])
@pytest.mark.parametrize("d_tail", [0, 64])
@pytest.mark.parametrize("S", [1, 37])
def test_row_scaled_decode_matches_its_reference(H, d_tail, S):
    """The row-scaled layout, written by write_kv_fp8(kv_scale=...) and decoded with kv_scale, against the
    fp32 decode of the same scaled rows; masked rows ignored, an all-masked query gives zeros."""
    _, _, pool, scales = scaled_pool(SLOTS, D_V + d_tail, 30.0, seed=20 + H + S)
    q, _, idx = make(S, H, d_tail, 2048, seed=30 + H + S)
    idx = torch.where(torch.rand(idx.shape, device="cuda") < 0.2, -1, idx).to(torch.int32)
    idx[-1] = -1
    scale = (D_V + d_tail) ** -0.5
    out, lse = sparse_mla_decode_fp8(q, pool, idx, scale, return_lse=True, kv_scale=scales)
    ref, ref_lse = reference.sparse_mla_decode_row_scaled(q, pool, scales, idx, scale, return_lse=True)
    assert not torch.isnan(out).any() and (out[-1] == 0).all() and torch.isneginf(lse[-1]).all()
    if S > 1:
        assert rel_err(out[:-1], ref[:-1]) <= 0.01
        # outlier channels make scores of ~20 after sm_scale, which fp8 tensor cores accumulate to
        # ~2^-9 relative (the output's 1% above is the accuracy claim), so lse is held to 0.4%
        assert (lse[:-1] - ref_lse[:-1]).abs().max().item() <= 4e-3 * ref_lse[:-1].abs().max().item()


def test_row_scaled_layout_is_closer_to_bf16_kv_than_raw_fp8():
    """The row-scaled layout's claim on the real kernels: against the decode over bf16 KV, the row-scaled pool
    errs clearly less than the raw one on KV with 30x outlier channels and small rows; the
    comparator is not vacuous (the raw pool's error is well above the kernel's own 0.2%)."""
    x, raw, scaled, scales = scaled_pool(SLOTS, D_V, 30.0, seed=5)
    q, _, idx = make(16, 64, 0, 2048, seed=6)
    truth = reference.sparse_mla_decode(q, x[:, None].float(), idx, D_V**-0.5)
    err_raw = rel_err(sparse_mla_decode_fp8(q, raw, idx, D_V**-0.5), truth)
    err_scaled = rel_err(sparse_mla_decode_fp8(q, scaled, idx, D_V**-0.5, kv_scale=scales), truth)
    assert err_raw > 0.02 and err_scaled < 0.75 * err_raw, (err_raw, err_scaled)
