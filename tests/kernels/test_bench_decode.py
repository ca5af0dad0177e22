"""benchmarks/h200_decode.py's report machinery on the CPU: a --dry-run (CPU references stand in for
the kernels, timings FAKE) writes every section's JSON with its run, the sweep PNG and the table with
benchmarks/report.py's verdicts; benchmarks/report.py renders that JSON, every key under the name the
benchmark writes, marked fake; it never writes the committed results; bad input exits 2 (a missing
GPU: tests/benchmarks/test_run_info.py). The benchmark's numbers are measured on the H200, never here."""
import importlib.util
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks import report

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
    assert "targets" not in r and not any("within_1_1x_floor" in a for a in r["accuracy"])  # report.py judges
    assert r["date"] and r["commit"] and "cores" in r["machine"]
    assert r["command"] == f"python3 benchmarks/h200_decode.py --dry-run --out {out}"
    assert set(r["elapsed_s"]) == {"setup", *r["sections"]}
    png = tmp_path / "r-sweep.png"
    assert report.sweep_plot(out) == png and png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    printed = capsys.readouterr().out.splitlines()
    kvcopy = next(line for line in printed if line.startswith("kvcopy: not run"))
    assert (Path(__file__).parents[2] / kvcopy.split("(")[1].split()[0]).is_file(), kvcopy  # the test it names
    table = max(i for i, line in enumerate(printed) if line.startswith("dry run (CPU stand-ins)"))
    assert "DRY RUN: FAKE TIMINGS" in printed[table]
    assert len(printed) - table == 2 + len(r["cases"]) + len(report.DECODE_TARGETS)  # the table and targets last
    for line, target in zip(printed[-len(report.DECODE_TARGETS):], report.DECODE_TARGETS, strict=True):
        met, measured = target.verdict(r)                                 # the verdicts BENCHMARKS.md gives
        word = {True: "met", False: "MISSED", None: "not measured"}[met]
        assert line.lstrip().startswith(word + " ") and f" {target.name}: {measured} (limit " in line, line
    assert any(t.verdict(r)[0] is not None for t in report.DECODE_TARGETS)


def test_the_short_section_runs_the_contexts_and_batches_asked_for(tmp_path, capsys):
    out = tmp_path / "r.json"
    assert bench.main(["--dry-run", "--sections", "short", "--short-batches", "1", "3", "--short-valid", "128", "1",
                       "--out", str(out)]) == 0
    short = json.loads(out.read_text())["short_context"]
    assert [(s["S"], s["valid"]) for s in short] == [(S, v) for S in (1, 3) for v in (2048, 128, 1)]


@pytest.mark.parametrize("S", [1, 16, 64, 128])
def test_the_rotation_of_any_short_context_fits_an_80_gb_card(S):
    """A call's bytes count q and every row id, not the valid rows alone: 1 valid row a query at S = 16
    took 32,769 input sets, 38 GB of q and ids, and ran an H100 out of memory."""
    from dsaops.kernels import timing

    for valid in (1, *bench.SHORT_VALID):
        queries = timing.rotation_count(bench.call_bytes(S, bench.SHORT_HEADS, valid)) * S
        held = queries * (bench.SHORT_HEADS * bench.D_V * 2 + 2 * bench.TOPK * 4)   # q, the ids and their -1 copy
        assert held < 1 << 30, (S, valid, queries)


def test_report_renders_a_dry_run_under_the_names_the_benchmark_writes(tmp_path, small):
    out, page = tmp_path / "r.json", tmp_path / "r.md"
    assert bench.main(["--dry-run", "--out", str(out)]) == 0
    done = subprocess.run([sys.executable, str(Path(report.__file__)), "--decode", str(out), "--out", str(page)],
                          capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    r, text, pct = json.loads(out.read_text()), page.read_text(), report.pct
    assert "**DRY RUN: FAKE TIMINGS.**" in text and f"![µs and % of roofline against S]({tmp_path}/r-sweep.png)" in text
    for c in r["cases"]:
        assert (f"| {c['H']} | {c['S']} | {c['dsaops_fp8_us']} | {c['same_input_us']} | {c['flashmla_us']} | "
                f"{c['sglang_fp8_us']} | {c['sglang_bf16_us']} | {c['roofline_us']} |") in text
        assert (f"| {c['H']} | {c['S']} | {pct(c['rel_err'])} | {pct(c['err_vs_bf16'])} | {pct(c['raw_kv_floor'])} | "
                f"{pct(c['flashmla_err_vs_bf16'])} |") in text
    for a in r["accuracy"]:
        assert (f"| {a['data']} | {a['H']} | {a['S']} | {pct(a['err_vs_bf16'])} | {pct(a['raw_kv_floor'])} | "
                f"{a['err_vs_bf16'] / a['raw_kv_floor']:.2f}× | {pct(a['flashmla_err_vs_bf16'])} | "
                f"{pct(a['q_rounded_err'])} | {pct(a['flashmla_format_floor'])} | {pct(a['q_halves_err'])} | "
                f"{pct(a['kernel_q_rounded_err'])} | {pct(a['rel_err'])} |") in text
    for s in r["short_context"]:
        assert (f"| {s['H']} | {s['S']} | {s['valid']} | {s['dsaops_us']} | {s['full_us']} | "
                f"{100 * s['dsaops_us'] / s['full_us']:.0f}% | {s['topk_length_us']} | "
                f"{100 * s['topk_length_us'] / s['full_us']:.0f}% | {pct(s['rel_err'])} | "
                f"{pct(s['topk_length_rel_err'])} |") in text
    for p in r["sweep"]:
        assert f"| {p['H']} | {p['S']} | {p['dsaops_us']} | {p['roofline_us']} | {p['roofline_pct']:.0f}% |" in text
    assert r["proxy"][0]["label"] in text
    for p in r["proxy"]:
        assert (f"| {p['H']} | {p['S']} | {p['proxy_us']} | {p['sglang_fp8_us']} | "
                f"{p['sglang_fp8_us'] / p['proxy_us']:.2f}× | {p['gb10_floor_us']} | {pct(p['rel_err'])} | "
                f"{pct(p['err_vs_bf16'])} |") in text


def test_a_dry_run_never_writes_the_committed_results(capsys):
    before, plotted = Path(bench.RESULTS).read_bytes(), report.sweep_plot(bench.RESULTS).exists()
    assert bench.main(["--dry-run", "--out", bench.RESULTS]) == 2
    assert "never go to" in capsys.readouterr().err
    assert Path(bench.RESULTS).read_bytes() == before and report.sweep_plot(bench.RESULTS).exists() == plotted


def test_the_committed_results_are_measured_ones():
    r = json.loads(Path(bench.RESULTS).read_text())
    assert "dry_run" not in r and "fake_timings" not in r and "H200" in r["gpu"]


@pytest.mark.parametrize(("argv", "message"), [
    (["--sections", "cases", "nosuch"], "unknown section(s) nosuch"),
    (["--dry-run", "--workers", "0"], "--workers must be >= 1"),
    (["--sections", "cases", "--out", "/proc/x/r.json"], "cannot write"),
    (["--dry-run", "--sections", "cases", "--out", str(Path(__file__).parent)], "cannot write"),  # a folder
    (["--dry-run", "--sections", "cases", "--batches", "0"], "--batches 0"),
    (["--dry-run", "--sections", "cases", "--heads", "16", "-4"], "--heads -4"),
    (["--dry-run", "--sections", "cases", "--heads", "2000"], "--heads 2000"),
    (["--dry-run", "--sections", "short", "--short-valid", "2049"], "--short-valid 2049"),
    (["--dry-run", "--sections", "short", "--short-batches", "0"], "--short-batches 0"),
    (["--dry-run", "--sections", "cases", "--tiles", "64:x"], "--tiles '64:x'"),
    (["--dry-run", "--sections", "cases", "--tiles", "64:128:2:256:v"], "--tiles '64:128:2:256:v'"),
])
def test_bad_input_is_one_line_and_exit_2(capsys, argv, message):
    assert bench.main(argv) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1


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


@pytest.mark.parametrize("target", ["test-gpu", "bench", "selftest"])
@pytest.mark.parametrize("torch_found", [True, False], ids=["cpu-torch", "no-torch"])
def test_a_gpu_target_on_a_host_without_a_gpu_stops_in_one_line(tmp_path, target, torch_found):
    """Without a CUDA GPU pytest skipped every GPU test and `make test-gpu` passed; without torch it
    failed in tracebacks. Each GPU target stops first instead, saying what it needs."""
    import torch

    if torch.cuda.is_available():
        pytest.skip("this host has a CUDA GPU")
    repo = Path(__file__).parents[2]
    python = sys.executable if torch_found else f"{sys.executable} -S"  # -S: no site-packages, so no torch
    done = subprocess.run(["make", "-s", "-C", str(repo), target, f"GPU_PYTHON={python}",
                           f"BUNDLE_DIR={tmp_path / 'bundle'}", f"TILELANG_SITE={tmp_path / 'site'}"],
                          capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 2 and done.stdout == ""
    # make's own "make: ***" line, "make[1]: ***" when the tests run under `make test`
    said = [line for line in done.stderr.splitlines() if not re.match(r"make(\[\d+\])?: \*\*\*", line)]
    assert len(said) == 1 and "needs a CUDA GPU" in said[0], done.stderr
    assert ("no torch" if not torch_found else "sees no GPU") in said[0]


def test_a_run_that_fails_leaves_the_results_it_would_replace(tmp_path, capsys, small, monkeypatch):
    """The sections a failed run finished go to FILE.partial; the results file and its sweep PNG are
    replaced only by a run that ends."""
    out = tmp_path / "r.json"
    out.write_text('{"old": true}\n')

    def fails(run, result):
        raise RuntimeError("kvcopy broke")

    kvcopy = bench.run_kvcopy
    monkeypatch.setattr(bench, "run_kvcopy", fails)
    argv = ["--dry-run", "--out", str(out), "--sections", "cases", "sweep", "kvcopy"]
    with pytest.raises(RuntimeError, match="kvcopy broke"):
        bench.main(argv)
    assert out.read_text() == '{"old": true}\n' and not report.sweep_plot(out).exists()
    partial = json.loads((tmp_path / "r.json.partial").read_text())
    assert [c["S"] for c in partial["cases"]] == [1, 2] and partial["sweep"] and "kv_copy" not in partial
    assert f"{out} is unchanged" in capsys.readouterr().err
    monkeypatch.setattr(bench, "run_kvcopy", kvcopy)
    assert bench.main(argv) == 0
    assert json.loads(out.read_text())["kv_copy"] == [] and report.sweep_plot(out).exists()
    assert not (tmp_path / "r.json.partial").exists()


def test_a_new_bundle_replaces_the_unpacked_site_whole(tmp_path):
    """Unpacked over the old site, a new bundle left the old one's files importable beside its own, and
    an unpack that failed left a half site; a folder this target did not unpack is not touched."""
    import tarfile

    repo = Path(__file__).parents[2]
    bundle, site = tmp_path / "bundle", tmp_path / "site"
    bundle.mkdir()

    def make_bundle(manifest, module):
        stage = tmp_path / "stage" / manifest / "site"
        stage.mkdir(parents=True)
        (stage / module).write_text("")
        (stage / "BUNDLE").write_text(manifest)
        (bundle / "BUNDLE").write_text(manifest)
        with tarfile.open(bundle / "site.tar.xz", "w:xz") as tar:
            tar.add(stage, arcname="site")

    def gpu_site():
        return subprocess.run(["make", "-s", "-C", str(repo), "gpu-site", f"BUNDLE_DIR={bundle}",
                               f"TILELANG_SITE={site}"], capture_output=True, text=True, timeout=60, check=False)

    make_bundle("v1", "old.py")
    assert gpu_site().returncode == 0 and sorted(p.name for p in site.iterdir()) == ["BUNDLE", "old.py"]
    make_bundle("v2", "new.py")
    assert gpu_site().returncode == 0 and sorted(p.name for p in site.iterdir()) == ["BUNDLE", "new.py"]
    (bundle / "BUNDLE").write_text("v3")
    (bundle / "site.tar.xz").write_bytes(b"not xz")
    assert gpu_site().returncode != 0
    assert sorted(p.name for p in site.iterdir()) == ["BUNDLE", "new.py"] and (site / "BUNDLE").read_text() == "v2"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bundle", "site", "stage"]
    (site / "BUNDLE").unlink()  # now a folder of someone else's files
    make_bundle("v4", "v4.py")
    done = gpu_site()
    assert done.returncode != 0 and "TILELANG_SITE" in done.stderr and (site / "new.py").exists()


def test_two_makes_at_once_unpack_the_site_once_and_whole(tmp_path):
    """Two `make test-gpu` at once on one host: both unpacked into the one site.partial and one removed
    the site the other had just moved in, leaving none or a part of it while make said it was done."""
    import tarfile

    repo = Path(__file__).parents[2]
    bundle, site, stage = tmp_path / "bundle", tmp_path / "site", tmp_path / "stage" / "site"
    (stage / "pkg").mkdir(parents=True)
    for i in range(3000):   # enough files that the two unpacks overlap
        (stage / "pkg" / f"m{i}.py").write_text("")
    (stage / "BUNDLE").write_text("v1")
    bundle.mkdir()
    (bundle / "BUNDLE").write_text("v1")
    with tarfile.open(bundle / "site.tar.xz", "w:xz") as tar:
        tar.add(stage, arcname="site")
    make = ["make", "-s", "-C", str(repo), "gpu-site", f"BUNDLE_DIR={bundle}", f"TILELANG_SITE={site}"]
    for _ in range(3):
        shutil.rmtree(site, ignore_errors=True)
        runs = [subprocess.Popen(make, stderr=subprocess.PIPE, text=True) for _ in range(2)]
        assert [(r.wait(timeout=60), r.stderr.read()) for r in runs] == [(0, ""), (0, "")]
        assert len(list((site / "pkg").iterdir())) == 3000 and (site / "BUNDLE").read_text() == "v1"
        assert sorted(p.name for p in tmp_path.iterdir()) == ["bundle", "site", "stage"]
