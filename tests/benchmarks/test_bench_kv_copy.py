"""benchmarks/bench_kv_copy.py runs end to end (kernels under the CPU interpreter, the GPU timer replaced by a
counter) and reports bytes and percentages consistently. Its timings are taken on the H200, never here."""
import importlib.util
from pathlib import Path

import pytest
from dsaops.kernels import kv_gather, kv_write

from tests.support.triton_interpreter import interpreted

_path = Path(__file__).parents[2] / "benchmarks" / "bench_kv_copy.py"
_spec = importlib.util.spec_from_file_location("bench_kv_copy", _path)
bench = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(bench)


def test_run_reports_every_kernel_width_and_sweep_tile(monkeypatch):
    interpreted(kv_write, monkeypatch)
    interpreted(kv_gather, monkeypatch)
    calls, tiles = [], (kv_write.BLOCK_M, kv_gather.BLOCK_M)
    monkeypatch.setattr(bench, "_bench_us", lambda fn: (calls.append(fn()), calls.append(fn()), 10.0)[-1])
    results = bench.run(rows=64, pool_rows=256, copy_tb_s=0.1, device="cpu")
    defaults = [r for r in results if r["default"]]
    assert [(r["kernel"], r["width"]) for r in defaults] == [
        ("write_kv_fp8", 512), ("gather_kv_rows", 512), ("write_kv_fp8", 576), ("gather_kv_rows", 576)]
    assert len(results) == 4 * 4 and len(calls) == 2 * len(results)
    write_512 = defaults[0]
    assert write_512["bytes"] == 64 * (512 * 2 + 8 + 512) and write_512["block_m"] == kv_write.BLOCK_M
    assert write_512["gb_s"] == round(write_512["bytes"] / 10.0 / 1e3, 1)
    assert write_512["pct_of_copy"] == round(100 * write_512["bytes"] / 10.0 / 1e3 / 100.0, 1)
    assert (kv_write.BLOCK_M, kv_gather.BLOCK_M) == tiles  # the sweep puts the defaults back
    assert "| gather_kv_rows | 64 | 576 |" in bench.markdown(results)


def test_a_failing_case_is_a_row_not_an_exception(monkeypatch):
    """The decode bench driver writes its JSON after calling run(): an error here must not lose its results."""
    def broken(fn):
        raise RuntimeError("no graph here")

    monkeypatch.setattr(bench, "_bench_us", broken)
    results = bench.run(rows=8, pool_rows=16, widths=(512,), sweep=False, copy_tb_s=1.0, device="cpu")
    assert [r["error"] for r in results] == ["RuntimeError: no graph here"] * 2
    assert "RuntimeError: no graph here" in bench.markdown(results)
    results = bench.run(rows=8, pool_rows=16, widths=(512,), copy_tb_s=1.0, device="no-such-device")
    assert [r["kernel"] for r in results] == ["setup"] and "error" in results[0]


@pytest.mark.parametrize("rows", ["0", "-5", str((1 << 20) + 1)])
def test_bad_rows_are_one_line_and_exit_2(capsys, rows):
    """Refused before torch loads: run() makes a failing case an error row, so on a GPU these ended 0."""
    assert bench.main(["--rows", rows]) == 2
    assert capsys.readouterr().err == (f"bench_kv_copy: --rows {rows}: give a whole number from 1 to 1048576 "
                                       "(the pool's rows)\n")


def test_alone_it_divides_by_the_decode_benchmarks_copy_ceiling(monkeypatch):
    """Without the caller's measurement the copy bandwidth is kernels/timing.py's, as in `make bench`: a
    graph-timed copy of its own read 2.71 TB/s on an H200 where that reads 4.22, and every share passed 100%."""
    from dsaops.kernels import timing

    interpreted(kv_write, monkeypatch)
    interpreted(kv_gather, monkeypatch)
    monkeypatch.setattr(timing, "copy_tb_s", lambda: 0.5)
    monkeypatch.setattr(bench, "_bench_us", lambda fn: (fn(), 10.0)[-1])
    row = bench.run(rows=8, pool_rows=16, widths=(512,), sweep=False, device="cpu")[0]
    assert row["copy_gb_s"] == 500.0 and row["pct_of_copy"] == round(100 * row["bytes"] / 10.0 / 1e3 / 500.0, 1)
