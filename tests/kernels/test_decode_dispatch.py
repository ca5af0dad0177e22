"""Host-side choices of the decode (tile per target, split over top-k, support predicate, input
checks, CLI), which run without a GPU."""
import dataclasses
import subprocess
import sys

import pytest
from dsaops.kernels import decode, decode_supported, splits, tiles
from dsaops.kernels.splits import choose_split, split_time

from dsaops import targets
from dsaops.cli import main as dsaops_main

FP8 = "float8_e4m3fn"


def test_importing_the_package_loads_neither_torch_nor_tilelang():
    code = ("import sys, dsaops.kernels as k; k.decode_supported(64, 512, 512, 2048, 'float8_e4m3fn'); "
            "print(sorted(m for m in ('torch', 'tilelang', 'triton') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


@pytest.mark.parametrize(("heads", "block_heads"), [(8, 16), (16, 16), (32, 32), (64, 64), (128, 64)])
@pytest.mark.parametrize("d_tail", tiles.D_TAILS)
def test_tiles_come_from_the_targets_table(heads, block_heads, d_tail):
    for name in ("sm_90", "sm_121", "gfx942"):
        t = targets.get(name)
        tile = tiles.choose(t, heads, d_tail=d_tail)
        want = block_heads
        if name == "sm_121" and block_heads == 64 and d_tail:
            want = 32  # 101,376 B hold no 64-head block of 576-byte rows with q's two halves
        if name == "gfx942" and block_heads >= 32:
            want = 16 if d_tail else 32  # its 64 KB of LDS: two or four blocks a query
        assert tile.heads_per_block == want
        if t.has("wgmma"):  # too few queries to fill the GPU with the query's own head blocks
            assert tiles.choose(t, heads, d_tail=d_tail, few_queries=True) == tiles.NARROW_TILES[16]
        assert tiles.smem_bytes(tile, d_tail) <= t.smem_per_block_bytes


def test_gb10_gets_smaller_tiles_than_hopper():
    hopper, gb10 = targets.get("sm_90"), targets.get("sm_121")
    for heads in tiles.HEAD_COUNTS:
        assert tiles.smem_bytes(tiles.choose(gb10, heads), 64) < tiles.smem_bytes(tiles.choose(hopper, heads), 64)
        assert tiles.smem_bytes(tiles.choose(hopper, heads), 64) > gb10.smem_per_block_bytes


def test_no_tile_fits_a_tiny_budget():
    tiny = dataclasses.replace(targets.get("sm_121"), smem_per_block_bytes=16384)
    with pytest.raises(ValueError, match="16384 B of shared memory"):
        tiles.choose(tiny, 64)


def test_hopper_takes_v_in_registers_for_the_raw_layout_only():
    hopper = targets.get("sm_90")
    for heads in tiles.HEAD_COUNTS:
        hb = tiles.heads_per_block(heads)
        assert tiles.choose(hopper, heads, d_tail=0) == (tiles.NARROW_TILES[hb] if hb < 64 else tiles.REGISTER_V_TILE)
        # 64 heads with a d_tail: two 128-row buffers of 576-byte rows and q's halves do not fit
        assert tiles.choose(hopper, heads, d_tail=64) == (tiles.NARROW_TILES[hb] if hb < 64
                                                          else tiles.REGISTER_V_TILE_64_ROWS)
        # too few queries: 16-head blocks, whatever the head count
        assert tiles.choose(hopper, heads, few_queries=True) == tiles.NARROW_TILES[16]
        assert not tiles.choose(hopper, heads, row_scaled=True).v_in_registers  # its P.V scales P per row
        for name in ("sm_121", "gfx942"):  # no wgmma: the register operand is a Hopper product's
            assert not tiles.choose(targets.get(name), heads).v_in_registers
    rows = {tile.block_rows for _, _, tile in tiles.configurations(hopper) if tile.v_in_registers}
    assert rows == {64, 128}  # both compiled in CI
    # the row-scaled layout's kernels upcast V in shared memory
    assert not any(t.v_in_registers for _, _, t in tiles.configurations(hopper, row_scaled=True))


def test_two_splits_run_as_a_cluster_of_the_hopper_128_row_tiles():
    """A call of two splits runs tiles.PAIRED's cluster kernel (the split merge in distributed shared
    memory): one for each 128-row V-in-registers tile, compiled in CI with the rest; nothing else pairs."""
    hopper = targets.get("sm_90")
    assert set(tiles.PAIRED) == {tiles.REGISTER_V_TILE, *tiles.NARROW_TILES.values()}
    for tile, paired in tiles.PAIRED.items():
        assert paired == dataclasses.replace(tile, pairs=True) and paired.name == tile.name + "_pair"
    listed = {tile for _, _, tile in tiles.configurations(hopper)}
    assert set(tiles.PAIRED.values()) <= listed
    others = [tiles.configurations(hopper, row_scaled=True), tiles.configurations(targets.get("sm_121")),
              tiles.configurations(targets.get("gfx942"))]
    assert not any(tile.pairs for configs in others for _, _, tile in configs)


def test_a_cluster_pair_needs_the_register_accumulator():
    for name in ("sm_121", "sm_90"):
        t = targets.get(name)
        tile = dataclasses.replace(tiles.choose(t, 64, row_scaled=True), pairs=True)
        with pytest.raises(ValueError, match="two-split cluster"):
            decode.program(t, tile, 0)


@pytest.mark.parametrize(("S", "heads", "few"), [(1, 64, True), (2, 64, True), (3, 64, False), (8, 64, False),
                                                 (2, 48, True), (3, 48, False), (1, 128, True), (2, 128, False),
                                                 (1, 100, True), (2, 100, False), (3, 32, True), (10, 32, True),
                                                 (11, 32, False), (16, 32, False), (10, 24, True), (11, 24, False)])
def test_few_queries_is_while_16_head_blocks_fill_few_waves(S, heads, few):
    """H200, top-k 2048: 16-head blocks of one-tile splits were faster up to one wave of them
    (S = 2 at H = 64, S = 1 at H = 128), and for a 32-head block up to 2.5 waves (S = 10 at H = 32)."""
    assert tiles.too_few_queries(S, heads, 2048, sm_count=132) is few


@pytest.mark.parametrize(("S", "heads", "want"), [(1, 16, (16, 128, 16)), (8, 16, (16, 128, 16)),
                                                  (1, 32, (16, 128, 16)), (2, 32, (16, 128, 16)),
                                                  (3, 32, (16, 128, 16)), (10, 32, (16, 128, 6)),
                                                  (11, 32, (32, 128, 8)), (1, 64, (16, 128, 16)),
                                                  (2, 64, (16, 128, 16)), (3, 64, (64, 128, 16)),
                                                  (8, 64, (64, 128, 16)), (1, 128, (16, 128, 16)),
                                                  (2, 128, (64, 128, 16))])
def test_small_batches_take_the_tile_and_splits_measured_fastest(S, heads, want):
    """(heads a block, rows a tile, splits) at top-k 2048 on the H200's 132 SMs, each the fastest of
    the 64-row, 128-row and 16-head tiles at 8 to 32 splits there (docs/perf-log/2026-12-02.md and
    2026-12-03.md)."""
    (_, _, tile, n), = decode.choose_plan(targets.get("sm_90"), S, heads, 2048, d_tail=0, sm_count=132)
    assert (tile.heads_per_block, tile.block_rows, n) == want


def test_v_in_registers_is_refused_where_it_was_not_written_for():
    for tile, row_scaled in ((tiles.REGISTER_V_TILE, True), (dataclasses.replace(tiles.REGISTER_V_TILE, block_rows=32), False),
                             (dataclasses.replace(tiles.REGISTER_V_TILE, heads_per_block=8), False),
                             (tiles.NARROW_TILES[16], True),
                             # a narrow tile's products take 64 rows a warpgroup
                             (dataclasses.replace(tiles.NARROW_TILES[16], block_rows=64), False)):
        with pytest.raises(ValueError, match="V from registers"):
            decode.program(targets.get("sm_90"), tile, 0, row_scaled=row_scaled)


@pytest.mark.parametrize(("S", "want"), [(1, 16), (16, 8), (48, 2), (64, 2), (80, 3), (100, 1), (128, 1), (160, 2),
                                         (192, 2), (256, 1), (320, 2), (384, 1), (448, 2), (512, 1)])
def test_the_split_fills_the_waves_of_sms(S, want):
    """H200, H=64, top-k 2048: one wave of blocks down to a tile a split at small batches; where one
    split a query leaves a wave part-filled (S = 80, 160, 192, 320, 448 on 132 SMs), more splits
    or cluster pairs that fill it. S = 100 keeps one split: 100 of 132 SMs busy, modeled no slower
    than any split of equal tiles once the merge's reads are counted."""
    few = tiles.too_few_queries(S, 64, 2048, sm_count=132)
    tile = tiles.choose(targets.get("sm_90"), 64, d_tail=0, few_queries=few)
    steps = 2048 // tile.block_rows
    n = choose_split(S, 64, steps, tile, sm_count=132)
    assert n == want
    assert 1 <= n <= tiles.MAX_SPLITS and -(-steps // n) * tile.block_rows <= tile.index_rows
    one = split_time(S, 64, steps, tile, 132, 1)
    assert split_time(S, 64, steps, tile, 132, n) <= one
    if S in (80, 160, 192):  # one split a query leaves most of a second wave idle
        assert split_time(S, 64, steps, tile, 132, n) < 0.85 * one


@pytest.mark.parametrize(("S", "heads", "want"), [(24, 16, 4), (36, 16, 3), (70, 16, 3), (136, 16, 3), (150, 16, 3),
                                                  (210, 32, 1), (96, 64, 1), (48, 128, 1)])
def test_the_wave_model_picks_the_split_count_measured_fastest(S, heads, want):
    """H200, top-k 2048, 128-row tiles: batch sizes where a block's fixed part of half a tile or of
    a whole one changes the model's split count; each `want` ran fastest of the counts forced there
    (docs/perf-log/2026-12-02.md), 3-18% ahead of the other. (The count of one launch: S = 136 to 210
    run as two, test_a_batch_past_whole_waves_runs_them_first_then_the_rest.)"""
    tile = tiles.choose(targets.get("sm_90"), heads, d_tail=0)
    assert choose_split(S, heads, 2048 // tile.block_rows, tile, sm_count=132) == want


@pytest.mark.parametrize(("S", "heads", "want"), [
    (140, 64, ((0, 132, 1), (132, 8, 16))), (160, 64, ((0, 132, 1), (132, 28, 4))),
    (300, 64, ((0, 264, 1), (264, 36, 3))), (80, 128, ((0, 66, 1), (66, 14, 4))),
    (160, 16, ((0, 132, 1), (132, 28, 4))),
    # one launch: whole waves (132, 256 = 132 + 124), or a rest that two splits fill (192 = 132 + 60)
    (132, 64, ((0, 132, 1),)), (256, 64, ((0, 256, 1),)), (192, 64, ((0, 192, 2),)), (64, 128, ((0, 64, 1),))])
def test_a_batch_past_whole_waves_runs_them_first_then_the_rest(S, heads, want):
    """(first query, queries, splits) of each launch at top-k 2048 on 132 SMs: one split a query
    leaves a part-filled last wave, two splits for all (S = 160 at H = 64: 26.25 tile times) leave
    one too; the whole waves first, then the rest in four splits, fill both (23.1)."""
    phases = decode.choose_plan(targets.get("sm_90"), S, heads, 2048, d_tail=0, sm_count=132)
    assert tuple((p.first, p.count, p.splits) for p in phases) == want
    assert len({p.tile.heads_per_block for p in phases}) == 1  # both launches of one tile family
    if len(phases) == 2:
        tile = phases[0].tile
        one = splits.split_time(S, heads, 16, tile, 132, splits.choose_split(S, heads, 16, tile, 132))
        two = sum(splits.split_time(p.count, heads, 16, tile, 132, p.splits) for p in phases)
        assert two < one * (1 - splits.TOLERANCE)


@pytest.mark.parametrize("heads", [64, 128])
def test_no_cluster_pairs_beside_another_launch(heads):
    """A launch of cluster pairs followed by another ran 4-26% slower than one launch on the H200,
    where the wave model had it ahead: two-launch plans keep to unpaired tiles (at H = 128, S = 287
    to 297 and every 66 after, and at H = 64, S = 573 to 594, would otherwise end in pairs)."""
    plans = [decode.choose_plan(targets.get("sm_90"), S, heads, 2048, d_tail=0, sm_count=132) for S in range(1, 601)]
    assert sum(len(p) == 2 for p in plans) > 100  # the check below has two-launch plans to look at
    assert not [p for p in plans if len(p) == 2 and any(phase.tile.pairs for phase in p)]


def test_the_wave_model():
    """split_time in tile times: whole waves of blocks, half the slots for cluster pairs, the merge's
    launch and reads for more splits; splits of unequal tiles (n not dividing the tiles) end with
    the longest."""
    tile = tiles.REGISTER_V_TILE
    fixed = splits.BLOCK_FIXED
    assert split_time(132, 64, 16, tile, 132, 1) == fixed + 16
    assert split_time(133, 64, 16, tile, 132, 1) == 2 * (fixed + 16)  # one block more: a second wave
    assert split_time(66, 64, 16, tile, 132, 2) == fixed + 8  # 66 pairs on 66 pairs of SMs, no merge
    assert split_time(67, 64, 16, tile, 132, 2) == 2 * (fixed + 8)
    # 44 queries x 3 splits of 6, 5 and 5 tiles: one wave; the merge reads 132 partials, one an SM
    merge = splits.MERGE_FIXED + splits.MERGE_PER_PARTIAL
    assert split_time(44, 64, 16, tile, 132, 3) == pytest.approx(fixed + 6 + merge)
    # a 16-head block's partial is a quarter of a 64-head one's
    narrow = split_time(1, 16, 16, tiles.NARROW_TILES[16], 132, 4)
    assert narrow == pytest.approx(fixed + 4 + splits.MERGE_FIXED + splits.MERGE_PER_PARTIAL / 132)


def test_each_split_count_gets_the_smallest_merge_that_holds_it():
    assert [tiles.combine_for(n).splits for n in (2, 4, 8, 16, 32)] == [4, 4, 16, 16, 32]
    assert tiles.COMBINES[-1].splits == tiles.MAX_SPLITS  # every count choose_split makes has a merge


def test_split_keeps_each_splits_row_ids_within_the_tile():
    """A split holds its row ids in shared memory: top-k beyond tile.index_rows forces more splits,
    even where one wave is already full."""
    tile = dataclasses.replace(tiles.choose(targets.get("sm_90"), 64), index_rows=1024)
    assert choose_split(256, 64, 2048 // tile.block_rows, tile, sm_count=132) == 2
    assert choose_split(256, 64, 1024 // tile.block_rows, tile, sm_count=132) == 1
    assert choose_split(1, 64, 8192 // tile.block_rows, tile, sm_count=132) == 32


@pytest.mark.parametrize(("args", "ok"), [
    ((64, 512, 512, 2048, FP8), True),
    ((16, 576, 512, 2048, "torch.float8_e4m3fn"), True),
    ((128, 576, 512, 64, "float8_e4m3fnuz"), False),  # HIP's fp8: no HIP kernels, SGLang's decode
    ((64, 512, 512, 2048, "bfloat16"), False),   # bf16 pool: SGLang's own kernel
    ((64, 544, 512, 2048, FP8), False),          # d_tail 32
    ((64, 256, 256, 2048, FP8), False),          # d_v 256
    ((0, 512, 512, 2048, FP8), False),
    ((64, 512, 512, tiles.MAX_TOPK, FP8), True),
    ((64, 512, 512, tiles.MAX_TOPK + 1, FP8), False),  # more rows than every split can hold ids for
])
def test_support_predicate(args, ok):
    assert decode_supported(*args) is ok


def test_cli_supports_exit_codes(capsys):
    assert dsaops_main(["kernels", "supports", "--heads", "64", "--d-qk", "512", "--topk", "2048"]) == 0
    assert dsaops_main(["kernels", "supports", "--heads", "64", "--d-qk", "544", "--topk", "2048"]) == 1
    assert capsys.readouterr().out.splitlines() == ["supported", "not supported: d_tail = d_qk - d_v = 32 (0 or 64)"]
    assert dsaops_main(["kernels", "supports", "--heads", "64", "--d-qk", "512", "--topk", "9000",
                        "--kv-dtype", "bfloat16"]) == 1
    assert capsys.readouterr().out == ("not supported: top-k 9000 (1 to 8192); kv dtype bfloat16 "
                                       "(a raw float8_e4m3fn pool; e4m3fnuz has no HIP kernels)\n")


@pytest.mark.parametrize("dtype", ["", " "])
def test_cli_supports_refuses_an_empty_kv_dtype(capsys, dtype):
    assert dsaops_main(["kernels", "supports", "--heads", "64", "--d-qk", "512", "--topk", "2048",
                        "--kv-dtype", dtype]) == 2
    err = "dsaops kernels: --kv-dtype is empty; give the KV pool's torch dtype (float8_e4m3fn for dsaops' kernel)\n"
    assert capsys.readouterr() == ("", err)


@pytest.mark.parametrize(("target", "message"), [("gfx942", "not an NVIDIA target"), ("sm_99", "valid targets")])
def test_cli_compile_refuses_bad_targets(capsys, target, message):
    assert dsaops_main(["kernels", "compile", "--target", target]) == 2
    assert message in capsys.readouterr().err


# /proc takes no new file or folder, even from root, to whom os.access says yes; /proc/self exists
@pytest.mark.parametrize("where", ["file", "under a file", "/proc/dsaops-tilelang", "/proc/self"])
def test_cli_compile_refuses_a_cache_dir_it_cannot_write_before_compiling(tmp_path, capsys, monkeypatch, where):
    from dsaops.kernels import cli

    monkeypatch.setattr(cli, "build", lambda *a, **k: pytest.fail("compiled despite a bad --cache-dir"))
    afile = tmp_path / "afile"
    afile.write_text("")
    cache = {"file": afile, "under a file": afile / "tilelang"}.get(where, where)
    assert dsaops_main(["kernels", "compile", "--target", "sm_90", "--cache-dir", str(cache), "--jobs", "1"]) == 2
    err = capsys.readouterr().err
    assert err == f"dsaops kernels: --cache-dir {cache} is not a folder you may write to or create; give one that is\n"


def test_cli_compile_refuses_an_empty_cache_dir(capsys, monkeypatch):
    from dsaops.kernels import cli

    monkeypatch.setattr(cli, "build", lambda *a, **k: pytest.fail("compiled into the default cache for --cache-dir ''"))
    assert dsaops_main(["kernels", "compile", "--target", "sm_90", "--cache-dir", "", "--jobs", "1"]) == 2
    assert capsys.readouterr().err == "dsaops kernels: --cache-dir is empty; give a folder you may write to or create\n"


def test_decode_input_errors_say_what_to_change():
    torch = pytest.importorskip("torch")
    from dsaops.kernels import sparse_mla_decode_fp8

    q = torch.zeros((2, 16, 512), dtype=torch.bfloat16)
    kv = torch.zeros((64, 1, 512), dtype=torch.float8_e4m3fn)
    idx = torch.zeros((2, 1, 64), dtype=torch.int32)
    with pytest.raises(ValueError, match="same GPU"):
        sparse_mla_decode_fp8(q, kv, idx, 1.0)
    with pytest.raises(ValueError, match=r"kv must be \[slots, 1, 512\]"):
        sparse_mla_decode_fp8(q, kv[:, :, :256].contiguous().view(64, 1, 256).repeat(1, 2, 1), idx, 1.0)
    with pytest.raises(ValueError, match="int32"):
        sparse_mla_decode_fp8(q, kv, idx.long(), 1.0)
    with pytest.raises(ValueError, match="d_v 256"):
        sparse_mla_decode_fp8(q, kv, idx, 1.0, d_v=256)
    with pytest.raises(ValueError, match="q must be bfloat16"):  # a cast to bf16 would hide it
        sparse_mla_decode_fp8(q.int(), kv, idx, 1.0)
    with pytest.raises(ValueError, match="same GPU"):  # fp16 is rounded to bf16, as documented
        sparse_mla_decode_fp8(q.half(), kv, idx, 1.0)


def test_zero_queries_return_empty_after_the_checks(monkeypatch):
    """An idle data-parallel rank decodes a batch of no tokens: empty results, no kernel, the checks
    that do not depend on S still made. q and indices pass as GPU tensors (no GPU here)."""
    torch = pytest.importorskip("torch")
    from dsaops.kernels import sparse_mla_decode_fp8

    class OnGpu(torch.Tensor):
        is_cuda = True  # the device check's question; everything else is the CPU tensor's

    monkeypatch.setattr(decode, "decode_with_tile", lambda *a, **k: pytest.fail("planned a launch for S = 0"))
    q = torch.zeros((0, 16, 576), dtype=torch.bfloat16).as_subclass(OnGpu)
    kv = torch.zeros((64, 1, 576), dtype=torch.float8_e4m3fn)
    idx = torch.zeros((0, 1, 64), dtype=torch.int32)
    out = sparse_mla_decode_fp8(q, kv, idx, 1.0)
    assert (type(out), out.shape, out.dtype, out.device) == (torch.Tensor, (0, 16, 512), torch.bfloat16, q.device)
    out, lse = sparse_mla_decode_fp8(q, kv, idx, 1.0, return_lse=True, topk_length=torch.zeros(0, dtype=torch.int32))
    assert (out.shape, lse.shape, lse.dtype) == ((0, 16, 512), (0, 16), torch.float32)
    with pytest.raises(ValueError, match="int32"):
        sparse_mla_decode_fp8(q, kv, idx.long(), 1.0)
    with pytest.raises(ValueError, match="same GPU"):
        sparse_mla_decode_fp8(q.as_subclass(torch.Tensor), kv, idx, 1.0)
    with pytest.raises(ValueError, match="contiguous"):
        sparse_mla_decode_fp8(q, torch.zeros((64, 1, 1152), dtype=torch.float8_e4m3fn)[:, :, ::2], idx, 1.0)
    with pytest.raises(ValueError, match="kv_scale"):
        sparse_mla_decode_fp8(q, kv, idx, 1.0, kv_scale=torch.ones(63))


def test_decode_preferred_follows_the_h200_measurements():
    """S x H >= 16: every BENCHMARKS.md case measured dsaops at least as fast as SGLang's fp8 kernel;
    the unmeasured H = 8, S = 1 stays on SGLang's."""
    from dsaops.kernels import decode_preferred

    for H in (16, 32, 64):
        for S in (1, 16, 64, 256):
            assert decode_preferred(S, H), (S, H)
    assert not decode_preferred(1, 8)
    assert decode_preferred(2, 8)
