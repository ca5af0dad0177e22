"""benchmarks/h200_decode.py's report machinery on the CPU: a --dry-run (CPU references stand in for
the kernels, timings FAKE) writes every section's JSON, the sweep PNG and the table; it never writes
the committed results; bad input and a missing GPU exit 2; each target is decided by its number.
The benchmark's numbers are measured on the H200, never here."""
import importlib.util
import json
from pathlib import Path

import pytest

pytest.importorskip("torch")

_path = Path(__file__).parents[2] / "benchmarks" / "h200_decode.py"
_spec = importlib.util.spec_from_file_location("h200_decode", _path)
bench = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(bench)

CASE_KEYS = {"H", "S", "topk", "dsaops_fp8_us", "sglang_fp8_us", "sglang_bf16_us", "roofline_us", "eager_host_us",
             "eager_host_us_median", "rel_err",  # the keys the results had before FlashMLA and accuracy joined
             "flashmla_us", "err_vs_bf16", "raw_kv_floor", "flashmla_err_vs_bf16", "same_input_us", "roofline_pct",
             "speedup_vs_flashmla", "speedup_vs_sglang_bf16", "speedup_vs_sglang_fp8"}


@pytest.fixture
def small(monkeypatch):
    monkeypatch.setitem(bench.DRY, "heads", (16,))
    monkeypatch.setitem(bench.DRY, "sweep", {64: (1, 2), 16: (1,)})


def test_dry_run_writes_every_section_with_fake_timings_marked(tmp_path, capsys, small):
    out = tmp_path / "r.json"
    assert bench.main(["--dry-run", "--out", str(out)]) == 0
    r = json.loads(out.read_text())
    assert r["dry_run"] is True and r["fake_timings"] is True and "dry run" in r["gpu"]
    assert r["sections"] == ["cases", "accuracy", "short", "sweep", "proxy", "kvcopy"]
    assert [(c["H"], c["S"]) for c in r["cases"]] == [(16, 1), (16, 2)]
    for c in r["cases"]:
        assert CASE_KEYS <= set(c), CASE_KEYS - set(c)
        assert c["speedup_vs_flashmla"] == round(c["flashmla_us"] / c["dsaops_fp8_us"], 2)
        assert c["rotation_sets"] >= 2 and 0 < c["rel_err"] < c["err_vs_bf16"]
    assert [a["data"] for a in r["accuracy"]] == ["normal", "outliers", "peaked"]
    for a in r["accuracy"]:
        assert {"data", "H", "S", "err_vs_bf16", "raw_kv_floor", "flashmla_err_vs_bf16", "q_rounded_err"} <= set(a)
        assert a["q_rounded_err"] > a["raw_kv_floor"] and a["kernel_q_rounded_err"] > a["err_vs_bf16"]
    short = r["short_context"]
    assert [(s["S"], s["valid"]) for s in short] == [(2, 2048), (2, 1024), (2, 300)]
    assert all(s["full_us"] == short[0]["dsaops_us"] and s["H"] == 64 for s in short)
    assert all(s["topk_length_us"] is not None for s in short)
    assert [(s["H"], s["S"]) for s in r["sweep"]] == [(64, 1), (64, 2), (16, 1)]
    assert all({"dsaops_us", "roofline_pct"} <= set(s) for s in r["sweep"])
    for p in r["proxy"]:
        assert "not a GB10 figure" in p["label"]
        assert p["gb10_floor_us"] == round(p["S"] * 2048 * 512 / 273e9 * 1e6, 2)
        assert p["sglang_fp8_us"] == next(c["sglang_fp8_us"] for c in r["cases"] if (c["H"], c["S"]) == (p["H"], p["S"]))
    assert r["kv_copy"] == []
    assert {t["target"] for t in r["targets"]} >= {"every case >= 1.3x faster than FlashMLA at H <= 64",
                                                   "short context <= 40% of full at 300 valid"}
    assert set(r["elapsed_s"]) == {"setup", *r["sections"]}
    png = tmp_path / "r-sweep.png"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    printed = capsys.readouterr().out.splitlines()
    table = max(i for i, line in enumerate(printed) if line.startswith("dry run (CPU stand-ins)"))
    assert "DRY RUN: FAKE TIMINGS" in printed[table]
    assert printed[-1].lstrip().startswith(("met", "MISSED", "not measured"))  # the table and targets print last
    assert len(printed) - table == 2 + len(r["cases"]) + len(r["targets"])


def test_a_dry_run_never_writes_the_committed_results(capsys):
    before = Path(bench.RESULTS).read_bytes()
    assert bench.main(["--dry-run", "--out", bench.RESULTS]) == 2
    assert "never go to" in capsys.readouterr().err
    assert Path(bench.RESULTS).read_bytes() == before


def test_the_committed_results_are_measured_ones():
    r = json.loads(Path(bench.RESULTS).read_text())
    assert "dry_run" not in r and "fake_timings" not in r and "H200" in r["gpu"]


@pytest.mark.parametrize(("argv", "message"), [
    (["--sections", "cases", "nosuch"], "unknown section(s) nosuch"),
    (["--dry-run", "--workers", "0"], "--workers must be >= 1"),
    (["--sections", "cases", "--out", "/proc/x/r.json"], "cannot write"),
])
def test_bad_input_is_one_line_and_exit_2(capsys, argv, message):
    assert bench.main(argv) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1


def test_without_a_gpu_a_real_run_stops_before_any_work(capsys, tmp_path):
    assert bench.main(["--sections", "cases", "--out", str(tmp_path / "r.json")]) == 2
    assert "no CUDA GPU here" in capsys.readouterr().err and not (tmp_path / "r.json").exists()


def _case(H, S, us, **peers):
    return {"H": H, "S": S, "dsaops_fp8_us": us, "roofline_pct": 50.0, "eager_host_us": 20.0, "rel_err": 0.002,
            **{f"speedup_vs_{k}": v for k, v in peers.items()}}


def test_targets_are_decided_by_their_numbers():
    result = {
        "cases": [_case(64, 1, 9.9, flashmla=1.31, sglang_bf16=9.0, sglang_fp8=2.0),
                  _case(64, 256, 150.0, flashmla=1.29, sglang_bf16=1.6, sglang_fp8=8.0),
                  _case(128, 64, 60.0, flashmla=1.16, sglang_bf16=1.4, sglang_fp8=4.0)],
        "sweep": [{"H": 64, "S": 100, "dsaops_us": 50.0, "roofline_pct": 38.0},
                  {"H": 64, "S": 32, "dsaops_us": 30.0, "roofline_pct": 10.0}],
        "short_context": [{"H": 64, "S": 64, "valid": 300, "dsaops_us": 20.0, "full_us": 40.0, "topk_length_us": 15.0}],
        "accuracy": [{"data": "outliers", "H": 64, "S": 16, "err_vs_bf16": 0.0092, "raw_kv_floor": 0.008},
                     {"data": "peaked", "H": 64, "S": 16, "err_vs_bf16": 0.0352, "raw_kv_floor": 0.035}],
    }
    got = {t["target"]: t for t in bench.targets(result)}
    assert got["H=64, S=256 <= 155 µs"]["met"] is True
    assert got["S=1 <= 10 µs"]["met"] is True and got["S=1 <= 10 µs"]["value"] == 9.9
    flash = got["every case >= 1.3x faster than FlashMLA at H <= 64"]
    assert flash["met"] is False and flash["value"] == 1.29 and flash["where"] == "H=64 S=256"
    assert got["every case >= 1.15x faster than FlashMLA at H = 128"]["met"] is True
    assert got["every case >= 1.5x faster than SGLang's bf16 kernel"]["where"] == "H=128 S=64"
    wide = got["no S >= 64 below 40% of roofline (cases and sweep)"]
    assert wide["met"] is False and wide["value"] == 38.0 and wide["where"] == "H=64 S=100"  # S=32 does not count
    short = got["short context <= 40% of full at 300 valid"]
    assert short["met"] is True and short["value"] == 37.5 and "topk_length" in short["where"]
    floor = got["error vs bf16 KV <= 1.1x the raw-KV floor (each data kind)"]
    assert floor["met"] is False and floor["where"] == "data=outliers H=64 S=16"
    assert got["write / gather >= 70% of copy at 65,536 rows"]["met"] is None  # not measured is not met


def test_make_puts_the_bundles_flashmla_on_the_gpu_path(tmp_path):
    """make test-gpu / make bench unpack the offline bundle (TileLang and FlashMLA as one site folder)
    once, again only when its BUNDLE manifest changes, and put the site on PYTHONPATH; with no bundle,
    nothing is unpacked and the benchmark's preflight says what is missing."""
    import subprocess
    import sys
    import tarfile

    repo = Path(__file__).parents[2]
    bundle, site = tmp_path / "bundle", tmp_path / "site"
    make = ["make", "-s", "-C", str(repo), "gpu-site", f"BUNDLE_DIR={bundle}", f"TILELANG_SITE={site}",
            f"GPU_PYTHON={sys.executable}"]
    subprocess.run(make, check=True)
    assert not site.exists()
    stage = tmp_path / "stage" / "site"
    (stage / "flash_mla").mkdir(parents=True)
    (stage / "flash_mla" / "__init__.py").write_text("")
    (stage / "BUNDLE").write_text("sgl-flash-mla 1.0.0\n")
    bundle.mkdir()
    (bundle / "BUNDLE").write_text("sgl-flash-mla 1.0.0\n")
    with tarfile.open(bundle / "site.tar.xz", "w:xz") as tar:
        tar.add(stage, arcname="site")
    subprocess.run(make, check=True)
    assert (site / "flash_mla" / "__init__.py").is_file()
    (site / "flash_mla" / "__init__.py").write_text("# kept\n")
    subprocess.run(make, check=True)  # same manifest: left alone
    assert (site / "flash_mla" / "__init__.py").read_text() == "# kept\n"
    dry = subprocess.run(["make", "-n", "-C", str(repo), "bench", f"TILELANG_SITE={site}"], capture_output=True,
                         text=True, check=True).stdout
    assert f":{site}" in next(line for line in dry.splitlines() if "h200_decode.py" in line)
