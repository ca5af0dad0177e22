"""How many splits of top-k a decode call runs: the count a model of waves finishes soonest.

A call runs S x (head blocks) x n blocks. Each SM holds one (every tile's shared memory is over
half an SM's), and the GPU starts them in grid order (head block fastest, then query, then split)
as SMs free up. Split k of n owns the query's tiles k, k + n, ... (decode_parts.load_row_ids), so
n need not divide the tiles and splits differ by at most one tile. A block costs its tiles plus a
fixed part (the q split, the row ids, the first gather's latency, the store); more than two
splits cost the merge kernel, which reads every split's partial back (64 KB a 64-head block), and
two splits of a tile in tiles.PAIRED run as 2-SM clusters that merge in the kernel. Everything is
in tile times of the tile in use; the constants are estimates from the H200's measurements (the
perf log has them), and only their ratios matter.

One launch splits every query alike, so a batch a little past whole waves of blocks splits them
all (H = 64, S = 160 on 132 SMs: two splits, 26 tile times). launches may instead run the
whole waves first, one split a query, and the rest after them in a second launch with its own
split count (132 unsplit, then 28 in four splits: 23 tile times).
"""
from __future__ import annotations

import heapq

from dsaops.kernels import tiles

# A block's fixed part, in 128-row tile times (~4 us a 64-head 128-row tile): a block past a full wave
# measured ~3.5 us more than its tiles. With 0.75 instead of 0.5 the model picks what ran fastest on the
# H200 where the two differ (docs/perf-log/2026-12-02.md): 8-18% faster at H = 16, S = 24 to 70, 10-13%
# at H = 64, S = 90 and 96 and H = 128, S = 48; 2% slower at H = 32, S = 140
BLOCK_FIXED = 0.75
# The merge kernel: its launch, mostly hidden by programmatic dependent launch, and the read of one
# 64-head split partial (64 KB) at a fair share of HBM, in 128-row tile times of a 64-head block
MERGE_FIXED = 0.5
MERGE_PER_PARTIAL = 0.45
MAX_WAVES = 8  # more blocks than this many waves of SMs only add fixed parts: not considered
# The fewest splits modeled within this of the fastest: more splits are more blocks and merge
# traffic that the model prices only roughly
TOLERANCE = 0.05


def split_time(S: int, heads: int, steps: int, tile, sm_count: int, n: int) -> float:
    """Modeled time of a call of n splits, in tile times: the last block's end, list-scheduled in
    grid order onto sm_count SMs (cluster pairs onto sm_count / 2), plus the merge kernel's."""
    blocks = S * -(-heads // tile.heads_per_block)
    per_128_rows = 128 / tile.block_rows  # the fixed parts are times, not tiles
    fixed = BLOCK_FIXED * per_128_rows
    paired = n == 2 and tile in tiles.PAIRED
    if paired:  # a query's two blocks together on two SMs, until the longer half ends
        durations = [fixed + -(-steps // 2)] * blocks
    else:  # grid order: split-major, so the longer splits (one tile more) come first
        durations = [fixed + -(-(steps - k) // n) for k in range(n) for _ in range(blocks)]
    free = [0.0] * (sm_count // 2 if paired else sm_count)
    end = 0.0
    for duration in durations:
        start = heapq.heappop(free)
        heapq.heappush(free, start + duration)
        end = max(end, start + duration)
    if n > 1 and not paired:
        partials = blocks * n * (tile.heads_per_block / 64)
        end += (MERGE_FIXED + MERGE_PER_PARTIAL * partials / sm_count) * per_128_rows
    return end


def choose_split(S: int, heads: int, steps: int, tile, sm_count: int) -> int:
    """Splits of the top-k range (`steps` = tiles of tile.block_rows rows a query): the count, from
    those whose splits hold their row ids (tile.index_rows each) and own a tile or more, the fewest
    that split_time finishes within TOLERANCE of the soonest."""
    blocks = S * -(-heads // tile.heads_per_block)
    least = -(-steps * tile.block_rows // tile.index_rows)
    most = max(least, min(tiles.MAX_SPLITS, steps, MAX_WAVES * sm_count // max(blocks, 1)))
    times = {n: split_time(S, heads, steps, tile, sm_count, n) for n in range(least, most + 1)}
    best = min(times.values())
    return min(n for n, t in times.items() if t <= best * (1 + TOLERANCE))


def launches(S: int, heads: int, steps: int, tile, sm_count: int) -> tuple[tuple[int, int, int], ...]:
    """(first query, queries, splits) of each launch of a call: one launch of choose_split's count,
    or as many queries as fill whole waves of SMs with their head blocks first and the rest after
    them in a second launch, each with choose_split's count for its queries. Two launches only where
    they are modeled faster by more than TOLERANCE, a margin that also pays for the second launch's
    start, and neither runs cluster pairs. A forced cluster tile (tile.pairs) runs its two splits."""
    if tile.pairs:
        return ((0, S, 2),)
    one = ((0, S, choose_split(S, heads, steps, tile, sm_count)),)
    per_wave = sm_count // -(-heads // tile.heads_per_block)
    lead = S // per_wave * per_wave if per_wave else 0
    if lead in (0, S):
        return one
    two = tuple((first, count, choose_split(count, heads, steps, tile, sm_count))
                for first, count in ((0, lead), (lead, S - lead)))
    # a launch of cluster pairs beside another, in either order, ran 4-26% slower than one launch on
    # the H200 where the model had it ahead (docs/perf-log/2026-12-03.md): programmatic dependent
    # launch, and without it the two launches still only add up (docs/perf-log/2026-12-06.md)
    if tile in tiles.PAIRED and any(n == 2 for *_, n in two):
        return one

    def modeled(plan):
        return sum(split_time(count, heads, steps, tile, sm_count, n) for _, count, n in plan)

    return two if modeled(two) < modeled(one) * (1 - TOLERANCE) else one
