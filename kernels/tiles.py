"""Tile choice per target, from the targets table (dsaops/targets.toml) alone.

A tile is what one compiled decode kernel is specialised for; everything else (S, H up to the
block's head count, top-k, pool size, split count) is a run-time shape. The shared-memory
estimate mirrors the buffers decode_regs.py and decode_smem.py allocate; CI compiles every tile and checks the
compiler's real figure against the budget too (the estimate only picks, the compiler decides).
Stdlib only: the CLI and the routing patch import this without torch or TileLang.
"""
from __future__ import annotations

import dataclasses
import itertools
from dataclasses import dataclass

D_V = 512
D_TAILS = (0, 64)
HEAD_COUNTS = (8, 16, 32, 64, 128)
MAX_SPLITS = 32  # most splits of top-k the host chooses (at most a warp: the merge takes one a lane)
# Preference order: pipelined first (one stage leaves every tile waiting out the gather's memory
# latency), then larger row tiles; the first that fits wins. (block_rows, stages)
_CANDIDATES = ((64, 2), (32, 2), (16, 2), (64, 1), (32, 1), (16, 1))
# Row ids a split keeps in shared memory, largest first: top-k 2048 (DSA's) in one split where it fits.
_INDEX_ROWS = (2048, 1024, 512, 256)
# What the compiled kernels hold beyond the buffers above (reduction workspaces, alignment): the
# compiler's figure minus this estimate was 512-1,536 B over every tile of both targets.
_COMPILER_EXTRA = 2560
MAX_TOPK = MAX_SPLITS * _INDEX_ROWS[-1]  # the most top-k rows a query may have (every tile, every split)


@dataclass(frozen=True)
class Tile:
    heads_per_block: int  # heads one block owns (16, 32 or 64): each KV tile is read once for all of them
    block_rows: int       # top-k rows gathered per pipeline step
    stages: int           # depth of the gather ring
    threads: int = 256    # two warpgroups: the 64 x 512 fp32 accumulator does not fit one
    index_rows: int = 2048  # most top-k rows one split owns: its row ids are held in shared memory
    v_in_registers: bool = False  # P.V with V's bytes moved from the fp8 tile into wgmma registers (pv_registers.cuh)
    pairs: bool = False  # two splits a query, a 2-CTA cluster merging them (decode_regs.cluster_pair)

    @property
    def name(self) -> str:
        return (f"h{self.heads_per_block}_r{self.block_rows}_s{self.stages}"
                + (f"_i{self.index_rows}" if self.index_rows != 2048 else "") + ("_vr" if self.v_in_registers else "")
                + ("_pair" if self.pairs else ""))

    @property
    def transposed_scores(self) -> bool:
        """Fewer heads than wgmma's M of 64 with V in registers: S^T = K . Q^T with the heads as the
        products' N (decode_regs' narrow tiles) instead of padded to 64."""
        return self.v_in_registers and self.heads_per_block < 64


def heads_per_block(heads: int) -> int:
    """All heads of a query in one block up to 64 (more than 64 split into 64-head blocks),
    rounded up to a power of two >= 16 (the tensor-core row granularity)."""
    if heads < 1:
        raise ValueError(f"heads must be >= 1, got {heads}")
    return min(64, max(16, 1 << (heads - 1).bit_length()))


def smem_bytes(tile: Tile, d_tail: int, d_v: int = D_V) -> int:
    """Shared memory of the decode kernel for this tile, dynamic and static (decode_regs, decode_smem)."""
    width = d_v + d_tail
    hb, br = tile.heads_per_block, tile.block_rows
    # Q as two e4m3 halves (decode_parts.split_q), its scales and, where TileLang reduces them, its
    # largest |q| a head
    return (2 * hb * width + (4 if tile.v_in_registers else 8) * hb
            + tile.stages * br * width  # gathered fp8 rows, one buffer per stage
            + (0 if tile.v_in_registers else br * d_v * 2)  # V upcast to fp16
            + (2 * hb * 128 if tile.v_in_registers else hb * br * 2)  # P: two e4m3 halves 128 rows wide, or fp16
            + 4 * tile.index_rows + 4 * tile.index_rows // br  # row ids, masked tiles
            # transposed scores: the row max exchanges 4 B a thread for each head it holds (hb / 4),
            # where other tiles' reductions exchange 4 B (counted in the extra)
            + (tile.threads * (hb - 4) if tile.transposed_scores else 0)
            + _COMPILER_EXTRA)


# Hopper, raw layout, 64 heads a block: P.V with V in registers (pv_registers.cuh). Without a V
# buffer 128-row tiles fit, which halve the barriers and reductions a row; with a d_tail, two
# 128-row stages of 576-byte rows and q's halves exceed sm_90's budget: 64-row tiles.
REGISTER_V_TILE = Tile(64, 128, 2, v_in_registers=True)
REGISTER_V_TILE_64_ROWS = Tile(64, 64, 2, v_in_registers=True)
# Hopper, raw layout, 16 or 32 heads a block (H <= 32, and every H for too few queries): scores and
# P.V computed transposed, the heads as wgmma's N, instead of padded to 64 (decode_regs' narrow tiles)
NARROW_TILES = {hb: Tile(hb, 128, 2, v_in_registers=True) for hb in (16, 32)}
# Each 128-row tile above as a cluster of two splits that merge through distributed shared memory:
# the dispatch's kernel where a call has two splits (no merge kernel, no partial through L2). The
# 64-row tile has none: two splits of it run the merge kernel.
PAIRED = {tile: dataclasses.replace(tile, pairs=True) for tile in (REGISTER_V_TILE, *NARROW_TILES.values())}


def too_few_queries(S: int, heads: int, topk: int, sm_count: int) -> bool:
    """Whether S queries are so few that 16-head blocks of the narrow tile beat the query's own
    head blocks: for 64-head blocks, while one block for every 128 top-k rows of each 16 heads fills
    at most one wave of SMs; for a 32-head block (H = 17 to 32), whose own tile runs QK^T as two
    products, up to 2.5 waves. On the H200 (132 SMs, top-k 2048, rotated), 16-head blocks ran
    H = 64 at S = 1 and 2 in 9.6 and 11.6 us (the 64-row tile, heads padded: 10.9, 11.8) and H = 128
    at S = 1 in 11.5 (11.7), where at H = 64, S = 3 and H = 128, S = 2 the query's own blocks were 3%
    faster; and H = 32 at S = 1 to 10 in 9.5-16.4 us, 5-16% faster than the 32-head tile or the padded
    one, equal at S = 12 (18.3) and 11% slower at S = 16 (20.5 against 18.5)."""
    narrow = NARROW_TILES[16]
    one_tile_blocks = S * -(-heads // narrow.heads_per_block) * -(-topk // narrow.block_rows)
    waves = 2.5 if heads_per_block(heads) == 32 else 1
    return one_tile_blocks <= waves * sm_count


@dataclass(frozen=True)
class Combine:
    """The split merge (decode_merge.combine_program) for up to `splits` splits: a call of n_split <=
    splits runs it, with splits / 4 thread groups a block, of which the first ceil(n_split / 4)
    read rows; the smallest merge that holds a call keeps the idle ones few."""
    splits: int

    @property
    def name(self) -> str:
        return f"combine_s{self.splits}"


COMBINES = (Combine(4), Combine(16), Combine(MAX_SPLITS))


def combine_for(n_split: int) -> Combine:
    """The merge a call of n_split splits (2..MAX_SPLITS) runs: the smallest that holds them."""
    return next(c for c in COMBINES if n_split <= c.splits)


def choose(target, heads: int, d_tail: int = 64, row_scaled: bool = False, few_queries: bool = False) -> Tile:
    """The tile the dispatch uses for `heads` on `target` (a dsaops.targets.Target).

    d_tail: the MLA layout's tail (the dispatch passes the call's; 64 by default, the larger).
    row_scaled: a tile for the row-scaled layout (decode_smem, V upcast in shared memory).
    few_queries: the batch is too small to fill the GPU with the query's own head blocks
    (too_few_queries): 16-head blocks.
    """
    hb = heads_per_block(heads)
    budget = target.smem_per_block_bytes
    if target.has("wgmma") and not row_scaled:
        # 16 or 32 heads a block: the narrow tiles, the heads as the products' N instead of padded to
        # 64; 16 for any head count with too few queries. The 64-row tile where the preferred one
        # does not fit (a 64-head block with a d_tail: REGISTER_V_TILE_64_ROWS)
        preferred = NARROW_TILES[16] if few_queries else NARROW_TILES.get(hb, REGISTER_V_TILE)
        for tile in (preferred, REGISTER_V_TILE_64_ROWS):
            if smem_bytes(tile, d_tail) <= budget:
                return tile
    if hb == 32 and target.has("wgmma"):
        # (the row-scaled layout's upcast kernel) a 32-head block leaves wgmma's products half empty
        # and measured slower than 64 heads with 32 of them padded
        hb = 64
    # Fewer heads a block (each KV tile then read once per head block) only where no tile of all
    # the heads fits: gfx942's 64 KB of LDS.
    head_blocks = [hb >> i for i in range(hb.bit_length()) if hb >> i >= 16]
    for block_heads, (rows, stages), index_rows in itertools.product(head_blocks, _CANDIDATES, _INDEX_ROWS):
        # 8 warps over a tile under 64 x 64 leave each warp too few rows/columns for mma: use 4; a
        # 64-lane wavefront's MFMA takes 16 x 16, so a 16-row tile of 16 heads gets one wavefront
        threads = 256 if rows >= 64 or block_heads >= 64 else 128
        if target.warp_lanes == 64 and rows < 32 and block_heads < 32:
            threads = 64
        tile = Tile(block_heads, rows, stages, threads=threads, index_rows=index_rows)
        if smem_bytes(tile, d_tail) <= budget:
            return tile
    raise ValueError(f"no decode tile for {heads} heads fits {target.name}'s {budget} B of shared memory")


def configurations(target, row_scaled: bool = False) -> list[tuple[int, int, Tile]]:
    """Every (heads, d_tail, tile) the dispatch can choose on `target` for the raw layout, or the
    row-scaled one (top-k and S are symbolic; every batch size's tile and its two-split cluster
    (PAIRED) included)."""
    chosen = [(h, dt, choose(target, h, d_tail=dt, row_scaled=row_scaled, few_queries=few))
              for h in HEAD_COUNTS for dt in D_TAILS for few in (False, True)]
    return list(dict.fromkeys(chosen + [(h, dt, PAIRED[tile]) for h, dt, tile in chosen if tile in PAIRED]))
