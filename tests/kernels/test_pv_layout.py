"""The order pv_registers.cuh reads V's rows in (k_row) and the order decode_regs stores P in
(k_position) are one order, and its 8-byte shared loads are free of bank conflicts. The .cuh's
index functions are evaluated here as written (their C expressions are valid Python), so an edit
to either side that breaks the pairing or brings the conflicts back fails on the CPU. The gather
writes each row where kv_offset reads it: checked on the CUDA TileLang generates, whose index
expressions are evaluated the same way. split_q writes q's halves by kv_offset too, into operands
that QK^T reads in TileLang's full-bank swizzle, and store_p writes P's halves (p_offset) where
P.V reads them: both checked against TileLang's own layout function."""
import itertools
import re

import pytest

pytest.importorskip("tilelang")

from dsaops.kernels import decode, decode_regs, tiles
from tilelang.layout import make_full_bank_swizzled_layout, make_half_bank_swizzled_layout

from tests.support.prerequisites import need_nvcc

SOURCE = decode_regs.PV_REGISTERS.read_text()
BANKS, BANK_BYTES = 32, 4


def as_python(expr, thread):
    """A C index expression (the .cuh's, or TileLang's generated CUDA) as Python: its integer casts
    gone, the thread index named `thread`."""
    return re.sub(r"\((?:int64_t|int)\)", "", expr).replace("threadIdx.x", thread)


def cuda_function(name, **values):
    """The return expression of `name` in pv_registers.cuh as a Python function of its free names."""
    body = re.search(rf"\b{name}\([^)]*\)\s*{{\s*(?:const int t = threadIdx\.x;\s*)?return ([^;]+);", SOURCE)
    assert body, f"{name} not found in pv_registers.cuh as a one-line return"
    expr = as_python(body.group(1), "t")
    return lambda **kw: eval(expr, {}, {**values, **kw})  # the repository's own C expression


KV_OFFSET = cuda_function("kv_offset", ROWS=128)
P_OFFSET = cuda_function("p_offset")
FIRST_COLUMN = cuda_function("first_column")
K_ROW = cuda_function("k_row")


def positions_in_row_order(p, j, t):
    return 16 * p + 4 * (t & 3) + j  # position 16p + 4(l % 4) + j read as that row: the layout before


def test_p_is_stored_where_v_is_read():
    for t in range(4):  # k_row depends on the lane's l % 4 only
        for p in range(2):
            for j in range(4):
                assert decode_regs.k_position(K_ROW(p=p, j=j, t=t)) == 16 * p + 4 * t + j
    for rows in (64, 128):
        assert sorted(decode_regs.k_position(r) for r in range(rows)) == list(range(rows))
        assert all(decode_regs.k_position(r) // 32 == r // 32 for r in range(rows))  # a k-step keeps its rows


def layout_offsets(make_layout, shape):
    """The byte offset function of an fp8 shared buffer of `shape` in `make_layout` (a TileLang layout):
    offset(*index) is where the layout keeps that element."""
    from tvm import arith, tirx  # TileLang's TVM

    layout = make_layout(tirx.decl_buffer(shape, "float8_e4m3fn", scope="shared"))
    out_shape = [int(n) for n in layout.get_output_shape()]
    analyzer = arith.Analyzer()

    def offset(*index):
        flat = 0
        for i, n in zip(layout.map_forward_index([tirx.const(x, "int32") for x in index]), out_shape):
            flat = flat * n + int(analyzer.simplify(i))
        return flat

    return offset


def p_store_mismatches(position):
    """Where p_offset (store_p's address of head h, tile row r in P's first half) differs from the
    byte a [2, 64, 128] fp8 buffer in TileLang's full-bank swizzle (the layout decode_regs annotates
    on P, which P.V's descriptor names) keeps for (0, h, position(r)): [] when they agree."""
    offset = layout_offsets(make_full_bank_swizzled_layout, (2, 64, 128))
    return [(h, r) for h in range(64) for r in range(128)
            if offset(0, h, position(r)) != P_OFFSET(h=h, r=r) or offset(1, h, position(r)) != 64 * 128 + P_OFFSET(h=h, r=r)]


def test_p_is_stored_where_pv_reads_it():
    assert p_store_mismatches(decode_regs.k_position) == []
    # store_p's 4-byte stores: rows r, r + 1, r + 8, r + 9 (r0 = r3 = 0) are four bytes in a row
    for h, r in itertools.product(range(64), range(128)):
        if r & 9 == 0:
            base = P_OFFSET(h=h, r=r)
            assert base % 4 == 0 and [P_OFFSET(h=h, r=r + d) - base for d in (1, 8, 9)] == [1, 2, 3]


def test_p_in_row_order_would_be_found():
    """Negative control: P's rows stored in row order instead of at their k_position."""
    assert len(p_store_mismatches(lambda r: r)) > 64 * 128 // 2


def worst_conflict(row_of):
    """The most distinct 4-byte words any bank serves in one half-warp's 8-byte loads of v_fragment
    (every warp, k-step, p and j): 1 is conflict-free."""
    worst = 0
    for half_warp, kk, p, j in itertools.product(range(16), range(4), range(2), range(4)):
        words = {}
        for t in range(16 * half_warp, 16 * half_warp + 16):
            offset = KV_OFFSET(r=32 * kk + row_of(p=p, j=j, t=t), c=FIRST_COLUMN(t=t))
            for word in (offset // BANK_BYTES, offset // BANK_BYTES + 1):
                words.setdefault(word % BANKS, set()).add(word)
        worst = max(worst, *(len(w) for w in words.values()))
    return worst


def test_v_loads_are_free_of_bank_conflicts():
    assert worst_conflict(K_ROW) == 1


def test_rows_in_order_would_conflict():
    """Negative control: the same check finds the two-way conflicts of rows read in k order."""
    assert worst_conflict(positions_in_row_order) == 2


# one tile of each V-in-registers shape, with and without the d_tail copy beside the gather
GATHER_TILES = ((tiles.REGISTER_V_TILE, 0), (tiles.REGISTER_V_TILE_64_ROWS, 64), (tiles.NARROW_TILES[16], 64),
                (tiles.NARROW_TILES[32], 0))
ROW_IDS = re.compile(r"\brid\[(i_\d+)\] = ids\[(.+)\];")
COPY = re.compile(r"cp_async_gs_conditional<16>\(\(&\(\(\(fp8_e4_t\*\)k_s\)\[(.+?)\]\)\), \(&\(kv\[(.+?)\]\)\)")
RID = re.compile(r"rid\[\(*(?:\(int64_t\))?(i_\d+)\)*\]")


def gather_mismatches(source, rows):
    """Where a gather of `source` (a decode kernel's CUDA, decode_parts.gather with ids_in_registers)
    writes a row other than the one whose id the thread loaded, or the bytes of another column than
    it reads, by kv_offset: [] when every copy lands where pv_registers.cuh reads it, each (row,
    16-byte column) of the tile once. The loop's copies are evaluated at t = 0."""
    kv_offset = cuda_function("kv_offset", ROWS=rows)
    loads = ROW_IDS.findall(source)
    copies = [(dest, src) for dest, src in COPY.findall(source) if RID.search(src)]
    assert loads and len(loads) == len(copies), "no gather with its row ids in registers in this source"
    bad = []
    for (load_var, position), (dest, src) in zip(loads, copies):
        copy_var = RID.search(src).group(1)
        # tx: the generated loop's own t is the pipeline's tile
        position, dest, column = (as_python(e, "tx") for e in (position, dest, RID.sub("0", src)))
        writes = set()  # (the row id's position, the column read, the shared-memory offset written)
        for tx, i in itertools.product(range(256), range(rows // 8)):
            writes.add((eval(position, {}, {"tx": tx, load_var: i, "t": 0}), eval(column, {}, {"tx": tx, copy_var: i}),
                        eval(dest, {}, {"tx": tx, copy_var: i, "t": 0})))
        first = min(p for p, _, _ in writes)  # the tile's first row id
        ring = {offset - kv_offset(r=p - first, c=c) for p, c, offset in writes}  # its ring buffer's start
        cells = {(p, c) for p, c, _ in writes}
        if len(ring) != 1 or min(ring) % (rows * 512) or len(cells) != len(writes) or len(cells) != rows * 32:
            bad.append((load_var, copy_var, sorted(ring)[:4], len(cells)))
    return bad


@pytest.fixture(scope="module")
def gather_sources():
    need_nvcc()
    target = decode.kernel_target("sm_90")  # loaded from the cache the compile tests fill
    return {(tile, d_tail): decode.compile_kernel(target, tile, d_tail).get_kernel_source()
            for tile, d_tail in GATHER_TILES}


@pytest.mark.parametrize("tile, d_tail", GATHER_TILES, ids=lambda x: getattr(x, "name", f"d_tail{x}"))
def test_each_thread_gathers_the_rows_whose_ids_it_loaded(gather_sources, tile, d_tail):
    assert gather_mismatches(gather_sources[tile, d_tail], tile.block_rows) == []


def test_rows_of_another_warp_would_be_found(gather_sources):
    """Negative control: warps loading their neighbours' row ids (the copy's partition unchanged)."""
    tile = tiles.REGISTER_V_TILE
    source = gather_sources[tile, 0]
    swapped = ROW_IDS.sub(lambda m: re.sub(r">> (\(int64_t\))?5\)", r">> \g<1>5 ^ 1)", m.group(0)), source)
    assert swapped != source
    assert len(gather_mismatches(swapped, tile.block_rows)) == 2  # the first tile's copy and the loop's


Q_ROWS = (32, 64)  # rows of the tiles' q operands: 32 heads or 16 stacked twice (hi above lo), 64 heads
DESCRIPTOR = re.compile(r"initialize_wgmma_descriptor<(\d+), \d+, \d+>\(desc_\w+, \(&\(\(\(fp8_e4_t\*\)(q_hi|q_lo)\)")


def split_q_mismatches(make_layout, rows):
    """Where split_q's 8-byte stores of q's halves (kv_offset<ROWS> at column 8c) would not hold the
    bytes that a [rows, 512] fp8 buffer in `make_layout` (a TileLang layout) keeps there: [] when
    every store lands whole where the layout puts its columns."""
    kv_offset = cuda_function("kv_offset", ROWS=rows)
    offset = layout_offsets(make_layout, (rows, 512))
    return [(r, c) for r in range(rows) for c in range(0, 512, 8)
            if offset(r, c) != kv_offset(r=r, c=c) or offset(r, c + 7) != kv_offset(r=r, c=c) + 7]


@pytest.mark.parametrize("rows", Q_ROWS)
def test_q_halves_are_stored_where_qk_reads_them(rows):
    assert split_q_mismatches(make_full_bank_swizzled_layout, rows) == []


def test_another_swizzle_would_be_found():
    """Negative control: TileLang's 64-byte swizzle keeps nearly all of q's columns elsewhere."""
    assert len(split_q_mismatches(make_half_bank_swizzled_layout, 64)) > 64 * 64 * 9 // 10


def test_the_kernels_read_q_in_the_full_bank_swizzle(gather_sources):
    """QK^T's descriptors of q's operands name the 128-byte swizzle (wgmma layout type 1), the layout
    split_q writes (TileLang's choice for these operands, which decode_regs' annotation pins)."""
    for source in gather_sources.values():
        layouts = DESCRIPTOR.findall(source)
        assert layouts and {layout for layout, _ in layouts} == {"1"}


SPLIT_Q = re.compile(r"dsaops_pv::split_q<(\d+), (\d+), (\d+)>\(.*?\(\(fp8_e4_t\*\)q_hi\)\[0\]\)\), "
                     r"\(&\(\(\(fp8_e4_t\*\)(q_hi|q_lo)\)\[0\]\)\), (\d+), ")


def split_q_call_mismatches(source, tile, d_tail):
    """Where a kernel's call of split_q differs from its tile: the heads, q's columns a head, the
    operand's rows (the kv_offset layout split_q writes in), and where the low half goes (its own
    operand, or rows heads.. of the stacked one). [] when the one call matches."""
    calls = SPLIT_Q.findall(source)
    assert len(calls) == 1, "not one split_q call in this source"
    heads, width, rows, lo, lo_row = calls[0]
    stacked = decode_regs.stacked_halves(tile)
    want = (tile.heads_per_block, 512 + d_tail, 2 * tile.heads_per_block if stacked else tile.heads_per_block,
            "q_hi" if stacked else "q_lo", tile.heads_per_block if stacked else 0)
    got = (int(heads), int(width), int(rows), lo, int(lo_row))
    return [(name, g, w) for name, g, w in zip(("heads", "width", "rows", "lo", "lo_row"), got, want) if g != w]


@pytest.mark.parametrize("tile, d_tail", GATHER_TILES, ids=lambda x: getattr(x, "name", f"d_tail{x}"))
def test_each_kernel_splits_q_into_its_own_operands(gather_sources, tile, d_tail):
    assert split_q_call_mismatches(gather_sources[tile, d_tail], tile, d_tail) == []
    assert int(SPLIT_Q.search(gather_sources[tile, d_tail]).group(3)) in Q_ROWS


def test_a_low_half_over_the_high_one_would_be_found(gather_sources):
    """Negative control: the stacked 16-head tile's low half written at row 0, over the high half."""
    tile, d_tail = tiles.NARROW_TILES[16], 64
    source = gather_sources[tile, d_tail]
    broken = SPLIT_Q.sub(lambda m: m.group(0).replace(f", {m.group(5)}, ", ", 0, "), source)
    assert broken != source
    assert split_q_call_mismatches(broken, tile, d_tail) == [("lo_row", 0, 16)]
