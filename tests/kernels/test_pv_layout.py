"""The order pv_registers.cuh reads V's rows in (k_row) and the order decode_regs stores P in
(k_position) are one order, and its 8-byte shared loads are free of bank conflicts. The .cuh's
index functions are evaluated here as written (their C expressions are valid Python), so an edit
to either side that breaks the pairing or brings the conflicts back fails on the CPU."""
import itertools
import re

import pytest

pytest.importorskip("tilelang")

from dsaops.kernels import decode_regs

SOURCE = decode_regs.PV_REGISTERS.read_text()
BANKS, BANK_BYTES = 32, 4


def cuda_function(name, **values):
    """The return expression of `name` in pv_registers.cuh as a Python function of its free names."""
    body = re.search(rf"\b{name}\([^)]*\)\s*{{\s*(?:const int t = threadIdx\.x;\s*)?return ([^;]+);", SOURCE)
    assert body, f"{name} not found in pv_registers.cuh as a one-line return"
    expr = body.group(1).replace("threadIdx.x", "t")
    return lambda **kw: eval(expr, {}, {**values, **kw})  # the repository's own C expression


KV_OFFSET = cuda_function("kv_offset", ROWS=128)
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
